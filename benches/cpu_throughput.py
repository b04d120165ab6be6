"""CPU throughput of ferrite against transformers on a random-weight 1B-shaped Llama.

Measures, in one run on this machine:
- ferrite output tokens/s at 1, 8 and 32 concurrent requests (bf16 weights), showing what
  continuous batching buys;
- single-stream decode tokens/s for ferrite and for transformers (torch.set_num_threads to the
  core count), in bf16 and f32, and their ratio (>1 = ferrite faster);
- a copy-bandwidth estimate and the decode roofline it implies (weight bytes read per token).

    .venv-oracle/bin/python benches/cpu_throughput.py            # writes benches/results/cpu-<date>.json

The checkpoint is made by tools/bench/make_random_llama.py (outside the repository, /tmp/llama-1b).
Prompts are 32 random token ids, 32 tokens are generated with EOS ignored, greedy, no prefix-cache hits.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "target" / "release" / "examples" / "throughput"


def ferrite(model: Path, dtype: str, concurrency: str, prompt_len: int, output_len: int) -> dict:
    cmd = [str(EXAMPLE), "--model", str(model), "--dtype", dtype, "--concurrency", concurrency,
           "--prompt-len", str(prompt_len), "--output-len", str(output_len)]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def transformers_decode(model_dir: Path, dtype: torch.dtype, prompt_len: int, output_len: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (1, prompt_len), generator=gen)

    def timed(new_tokens: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - start

    timed(2)  # warm-up: page in the weights, pick kernels
    first = min(timed(1) for _ in range(2))  # prefill + first token
    full = timed(output_len)
    decode_s = max(full - first, 1e-9)
    result = {
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_len": prompt_len,
        "output_len": output_len,
        "ttft_ms": first * 1e3,
        "median_tpot_ms": decode_s / (output_len - 1) * 1e3,
        "decode_tok_s": (output_len - 1) / decode_s,
    }
    del model
    return result


def copy_bandwidth_gbs() -> float:
    src = np.ones(1 << 28, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for _ in range(4):
        np.copyto(dst, src)
    return 2 * 4 * src.nbytes / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("/tmp/llama-1b"))
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if not (args.model / "model.safetensors").exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "bench" / "make_random_llama.py"), "--out", str(args.model)], check=True)
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "ferrite-engine", "--example", "throughput"], cwd=REPO, check=True)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    load_before = os.getloadavg()

    ours_bf16 = ferrite(args.model, "bf16", "1,8,32", args.prompt_len, args.output_len)
    ours_f32 = ferrite(args.model, "f32", "1", args.prompt_len, args.output_len)
    hf_bf16 = transformers_decode(args.model, torch.bfloat16, args.prompt_len, args.output_len)
    hf_f32 = transformers_decode(args.model, torch.float32, args.prompt_len, args.output_len)

    def single(report: dict) -> float:
        return next(level for level in report["levels"] if level["concurrency"] == 1)["decode_tok_s_per_seq"]

    bandwidth = copy_bandwidth_gbs()
    # Other work on a shared machine steals cores from both engines alike; the load average says
    # how much the absolute numbers (less so the same-run ratios) are to be trusted.
    load = {"before": load_before, "after": os.getloadavg()}
    by_c = {level["concurrency"]: level["output_tok_s"] for level in ours_bf16["levels"]}
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": threads,
                    "copy_bandwidth_gbs": bandwidth, "torch": torch.__version__, "load_average_1m_5m_15m": load},
        "workload": {"model": "random Llama, hidden 2048, 16 layers, 32/8 heads, intermediate 8192, vocab 32000",
                     "prompt_len": args.prompt_len, "output_len": args.output_len, "sampling": "greedy, ignore_eos",
                     "prefix_cache_hits": sum(level["prefix_cache_hit_tokens"] for level in ours_bf16["levels"])},
        "ferrite": {"bf16": ours_bf16, "f32": ours_f32},
        "transformers": {"bf16": hf_bf16, "f32": hf_f32},
        "single_stream_decode_tok_s": {
            "ferrite_bf16": single(ours_bf16), "transformers_bf16": hf_bf16["decode_tok_s"],
            "ferrite_f32": single(ours_f32), "transformers_f32": hf_f32["decode_tok_s"],
            "ratio_bf16": single(ours_bf16) / hf_bf16["decode_tok_s"],
            "ratio_f32": single(ours_f32) / hf_f32["decode_tok_s"],
            "roofline_bf16": bandwidth * 1e9 / ours_bf16["weight_bytes"],
            "roofline_f32": bandwidth * 1e9 / ours_f32["weight_bytes"],
        },
        "batching_output_tok_s": {str(c): v for c, v in sorted(by_c.items())},
        "batching_gain_c32_over_c1": by_c.get(32, 0) / by_c[1] if 1 in by_c else None,
    }
    out = args.out or REPO / "benches" / "results" / f"cpu-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["single_stream_decode_tok_s"], indent=2))
    print(json.dumps(result["batching_output_tok_s"], indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
