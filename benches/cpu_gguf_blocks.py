#!/usr/bin/env python3
"""GGUF on CPU: matrices kept in their ggml blocks against the same file dequantized at load.

Runs `ferrite generate` (greedy, --ignore-eos) on one GGUF file, alternating the two load formats
pair by pair so that a machine whose speed drifts affects both alike, and prints JSON: each
run's decode tok/s and TTFT as ferrite reports them, the process's peak RSS, the medians, and the
ratio of the medians. The baseline is the same binary with --load-format gguf-dequantized.

    python benches/cpu_gguf_blocks.py --ferrite target/release/ferrite \
        --model "$(target/release/ferrite default-model)" --pairs 10 > result.json
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from datetime import date

DECODE = re.compile(r"TTFT ([0-9.]+) ms, decode ([0-9.]+) tok/s")


def run(ferrite, model, load_format, prompt, tokens):
    cmd = [ferrite, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(tokens),
           "--temperature", "0", "--ignore-eos", "--load-format", load_format]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # wait4 gives this child's own peak RSS (getrusage would give the largest child's so far).
    _, status, usage = os.wait4(proc.pid, 0)
    out, err = proc.stdout.read(), proc.stderr.read()
    if status != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{err}")
    m = DECODE.search(err)
    if not m:
        sys.exit(f"no decode figure in the output of {' '.join(cmd)}:\n{err}")
    return {"ttft_ms": float(m.group(1)), "decode_tok_s": float(m.group(2)),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "text": out}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ferrite", required=True)
    ap.add_argument("--model", required=True, help="a .gguf file")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", default="The history of the Roman empire")
    ap.add_argument("--prefill-repeat", type=int, default=100,
                    help="also time the first token of a prompt of this many copies of a 10-token sentence")
    args = ap.parse_args()

    formats = {"kept": "gguf", "dequantized": "gguf-dequantized"}
    run(args.ferrite, args.model, "gguf", args.prompt, 8)  # warm-up: the file into the page cache
    runs = {name: [] for name in formats}
    for _ in range(args.pairs):
        for name, load_format in formats.items():
            runs[name].append(run(args.ferrite, args.model, load_format, args.prompt, args.tokens))
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            "decode_tok_s_median": statistics.median(r["decode_tok_s"] for r in rs),
            "decode_tok_s_min": min(r["decode_tok_s"] for r in rs),
            "decode_tok_s_max": max(r["decode_tok_s"] for r in rs),
            "ttft_ms_median": statistics.median(r["ttft_ms"] for r in rs),
            "peak_rss_mib_median": statistics.median(r["peak_rss_mib"] for r in rs),
        }
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * args.prefill_repeat)
    prefill = {name: [] for name in formats}
    for _ in range(max(args.pairs // 2, 1)):
        for name, load_format in formats.items():
            prefill[name].append(run(args.ferrite, args.model, load_format, long_prompt, 8)["ttft_ms"])
    kept, deq = summary["kept"], summary["dequantized"]
    print(json.dumps({
        "bench": "cpu-gguf-blocks",
        "date": date.today().isoformat(),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs",
        "model": os.path.basename(args.model),
        "command": f"ferrite generate --prompt {args.prompt!r} --max-tokens {args.tokens} --temperature 0 "
                   "--ignore-eos --load-format gguf|gguf-dequantized",
        "baseline": "the same binary and file with --load-format gguf-dequantized (f32 weights)",
        "pairs": args.pairs,
        "summary": summary,
        "decode_speedup_median": round(kept["decode_tok_s_median"] / deq["decode_tok_s_median"], 3),
        "memory_ratio_median": round(kept["peak_rss_mib_median"] / deq["peak_rss_mib_median"], 3),
        "long_prompt_ttft_ms": {
            "prompt": f"{args.prefill_repeat} copies of 'The quick brown fox jumps over the lazy dog.'",
            **{name: {"median": statistics.median(v), "runs": v} for name, v in prefill.items()},
        },
        "runs": {name: [{k: v for k, v in r.items() if k != "text"} for r in rs] for name, rs in runs.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
