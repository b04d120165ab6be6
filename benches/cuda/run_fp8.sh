#!/usr/bin/env bash
# FP8 against bf16 on the Llama-3.1-8B shape in one call: `run_serving.sh` (ferrite only) on the
# shape's bf16 checkpoint served with `--quantization fp8` (each decoder linear weight rounded to
# e4m3 per output channel at load and kept as bytes on the GPU, inputs quantized per token: vLLM's
# online FP8), on the same shape written as a compressed-tensors FP8_DYNAMIC checkpoint, and on
# the bf16 checkpoint served as bf16; one report with the ratios and the single-stream rooflines,
# OUTDIR/cuda-fp8.json (+ each run's .json, .log, -serve.log). The other knobs are run_serving.sh's.
#
#   bash benches/cuda/run_fp8.sh "$OUT"
set -uo pipefail
OUTDIR=${1:?usage: run_fp8.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SHAPE=${SHAPE:-llama-3.1-8b} CONCURRENCY=${CONCURRENCY:-1,8,32,128} SKIP_BASELINE=1
PYTHON=${PYTHON:-python3}
SERVE=${FERRITE_SERVE_ARGS:---gpu-memory-utilization 0.9}
# The FP8 kernels are opt-in until the CUDA battery has passed on a GPU (LoadOptions::fp8_kernels).
FERRITE_FP8_KERNELS=1 FERRITE_SERVE_ARGS="$SERVE --quantization fp8" TAG=fp8-online bash "$HERE/run_serving.sh" "$OUTDIR"
if [ -z "${SKIP_DYNAMIC:-}" ]; then  # SKIP_DYNAMIC=1 leaves out the FP8_DYNAMIC checkpoint's leg
    FERRITE_FP8_KERNELS=1 FERRITE_SERVE_ARGS="$SERVE" FP8_DYNAMIC=1 TAG=fp8-dynamic bash "$HERE/run_serving.sh" "$OUTDIR"
fi
FERRITE_SERVE_ARGS="$SERVE" TAG=fp8-bf16 bash "$HERE/run_serving.sh" "$OUTDIR"
"$PYTHON" - "$OUTDIR" "$HERE" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
sys.path.insert(0, sys.argv[2])
runs = {}
for name in ("online", "dynamic", "bf16"):
    path = out / f"fp8-{name}.json"
    runs[name] = json.loads(path.read_text()) if path.exists() else None
levels = {}
for name, report in runs.items():
    for level in (report or {}).get("ferrite", {}).get("levels", []):
        levels.setdefault(level["concurrency"], {})[name] = level
comparison = []
for c, by in sorted(levels.items()):
    row = {"concurrency": c}
    for name, level in by.items():
        row[f"{name}_output_tok_s"] = level["output_tok_s"]
        row[f"{name}_median_tpot_ms"] = level["median_tpot_ms"]
        row[f"{name}_median_ttft_ms"] = level["median_ttft_ms"]
    if "online" in by and "bf16" in by:
        row["fp8_over_bf16"] = by["online"]["output_tok_s"] / by["bf16"]["output_tok_s"]
    if "dynamic" in by and "bf16" in by:
        row["fp8_dynamic_checkpoint_over_bf16"] = by["dynamic"]["output_tok_s"] / by["bf16"]["output_tok_s"]
    comparison.append(row)
first = next((r for r in runs.values() if r), {})


def rooflines(checkpoint):
    """Single-stream tok/s at the copy bandwidth for the bytes one decode step reads: every decoder
    linear weight (one byte and a 4-byte scale per row in FP8, two bytes in bf16), the bf16 LM
    head and norms; the embedding table is not read whole (one row is gathered)."""
    if not checkpoint:
        return None
    from torch_baseline import copy_bandwidth_gbs
    cfg = json.loads((Path(checkpoint["dir"]) / "config.json").read_text())
    hidden, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads, kv_heads, inter = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    rows = layers * (heads * head_dim + 2 * kv_heads * head_dim + hidden + 2 * inter + hidden)
    linear = layers * (hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter)
    head = vocab * hidden
    norms = (2 * layers + 1) * hidden
    bandwidth = copy_bandwidth_gbs()
    step = {"fp8": linear + 4 * rows + 2 * (head + norms), "bf16": 2 * (linear + head + norms)}
    return {
        "copy_bandwidth_gbs": bandwidth,
        "decode_bytes_per_token": step,
        "roofline_tok_s": {name: bandwidth * 1e9 / b for name, b in step.items()},
        "definition": " ".join(rooflines.__doc__.split()),
    }


roof = rooflines(first.get("checkpoint"))
single = {}
for name, key in (("online", "fp8"), ("dynamic", "fp8"), ("bf16", "bf16")):
    level = levels.get(1, {}).get(name)
    if level and roof:
        tok_s = level["decode_tok_s_per_seq"]
        single[name] = {"decode_tok_s": tok_s, "fraction_of_roofline": tok_s / roof["roofline_tok_s"][key]}
ratio = lambda c: next((r.get("fp8_over_bf16") for r in comparison if r["concurrency"] == c), None)
c1, c32 = ratio(1), ratio(32)
report = {
    "bench": "cuda-fp8",
    "date": first.get("date"),
    "device": first.get("device"),
    "workload": first.get("workload"),
    "baseline": "ferrite serving the same bf16 checkpoint without --quantization, same machine, same run",
    "fp8": "--quantization fp8: decoder linear weights e4m3 with one f32 scale per output channel, inputs "
           "quantized per token (FP8 GEMV for up to 4 rows, cuBLASLt FP8 GEMM past that); embeddings and "
           "LM head bf16; random values",
    "checkpoints": {name: (r or {}).get("checkpoint") for name, r in runs.items()},
    "commands": {name: (r or {}).get("commands") for name, r in runs.items()},
    "comparison": comparison,
    "roofline": roof,
    "single_stream": single,
    "targets": {
        "c1_fp8_over_bf16": {"goal": 1.7, "measured": c1, "met": c1 is not None and c1 >= 1.7},
        "c32_fp8_over_bf16": {"goal": 1.3, "measured": c32, "met": c32 is not None and c32 >= 1.3},
        "c1_fp8_fraction_of_roofline": {
            "goal": 0.85,
            "measured": single.get("online", {}).get("fraction_of_roofline"),
            "met": single.get("online", {}).get("fraction_of_roofline", 0) >= 0.85,
        },
    },
}
(out / "cuda-fp8.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps(comparison, indent=1))
PY
