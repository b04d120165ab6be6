"""Writes a random EAGLE-3 head for a target checkpoint (benches/cuda/run_spec.sh with EAGLE3=1),
in the Hugging Face layout (LlamaForCausalLMEagle3): one Llama layer of the target's width whose
attention reads twice it, `fc` from three target layers' inputs, a draft vocabulary of
DRAFT_VOCAB tokens mapped into the target's by `d2t`, the target's embeddings shared, the sizes of
the public EAGLE-3 heads for Llama-3.1-8B (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: 32k draft tokens).

Random weights agree with nothing, so its drafts are rejected: a run measures what drafting and
verifying cost per step, and a real head's speed-up is that ratio times its mean accepted length.

    python3 benches/cuda/eagle3_checkpoint.py --target /tmp/spec-target --out /tmp/spec-eagle3

Prints one JSON line: the head's parameters and bytes.
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

DRAFT_VOCAB = 32000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cfg = json.loads((args.target / "config.json").read_text())
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim") or h // heads
    draft_vocab = min(DRAFT_VOCAB, vocab)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    t = {
        "midlayer.self_attn.q_proj.weight": rand(heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, heads * hd),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "fc.weight": rand(h, 3 * h),
        "lm_head.weight": rand(draft_vocab, h),
    }
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        t[f"midlayer.{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    t["norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    chosen = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
    t["d2t"] = chosen - torch.arange(draft_vocab)
    t["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, chosen, True)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(t, args.out / "model.safetensors", metadata={"format": "pt"})
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_theta", "rope_scaling", "hidden_act")
    head_cfg = {k: cfg[k] for k in keys if k in cfg}
    head_cfg.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                    draft_vocab_size=draft_vocab, tie_word_embeddings=False)
    (args.out / "config.json").write_text(json.dumps(head_cfg, indent=2))
    params = sum(v.numel() for k, v in t.items() if k not in ("d2t", "t2d"))
    print(json.dumps({"head_parameters": params, "head_bytes": 2 * params, "draft_vocab": draft_vocab}))


if __name__ == "__main__":
    main()
