"""Writes a random-weight Llama checkpoint of a real shape, for speed measurements only.

Speed does not depend on weight values, so a 1B-shaped Llama (hidden 2048, 16 layers, 32 heads /
8 KV heads, intermediate 8192, vocab 32000) with random weights stands in for a real one. The
tokenizer files are copied from the llama test fixture (vocabulary 1000: prompts are token ids
below 1000; generated ids above it simply decode to nothing).

    .venv-oracle/bin/python tools/bench/make_random_llama.py --out /tmp/llama-1b

The checkpoint (about 2.2 GB in bf16) belongs outside the repository; nothing here commits it.
"""

import argparse
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "models" / "llama"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/llama-1b"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if (args.out / "model.safetensors").exists():
        print(f"{args.out} already exists")
        return
    config = LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(config).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURE / name, args.out / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {params / 1e9:.2f}B parameters, bf16")


if __name__ == "__main__":
    main()
