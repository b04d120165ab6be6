#!/usr/bin/env bash
# W4A16 against bf16 on the Llama-3.1-8B shape in one call: `run_serving.sh` (ferrite only) on the
# shape's W4A16 checkpoint (decoder linear weights packed 4-bit, group 128, kept packed on the GPU)
# and then on its bf16 checkpoint, at concurrency 1 and 32; one report with the ratios,
# OUTDIR/cuda-w4a16.json (+ each run's .json, .log, -serve.log). The other knobs are
# run_serving.sh's (GROUP sets the W4A16 group size).
#
#   bash benches/cuda/run_w4a16.sh "$OUT"
set -uo pipefail
OUTDIR=${1:?usage: run_w4a16.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SHAPE=${SHAPE:-llama-3.1-8b} CONCURRENCY=${CONCURRENCY:-1,32} SKIP_BASELINE=1
GROUP=${GROUP:-128}
PYTHON=${PYTHON:-python3}
W4A16=$GROUP TAG=w4a16-kept bash "$HERE/run_serving.sh" "$OUTDIR"
TAG=w4a16-bf16 bash "$HERE/run_serving.sh" "$OUTDIR"
"$PYTHON" - "$OUTDIR" "$GROUP" <<'PY'
import json, sys
from pathlib import Path

out, group = Path(sys.argv[1]), int(sys.argv[2])
runs = {}
for name in ("kept", "bf16"):
    path = out / f"w4a16-{name}.json"
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
    if "kept" in by and "bf16" in by:
        row["w4a16_over_bf16"] = by["kept"]["output_tok_s"] / by["bf16"]["output_tok_s"]
    comparison.append(row)
first = next((r for r in runs.values() if r), {})
c1 = next((r.get("w4a16_over_bf16") for r in comparison if r["concurrency"] == 1), None)
report = {
    "bench": "cuda-w4a16",
    "date": first.get("date"),
    "device": first.get("device"),
    "workload": first.get("workload"),
    "baseline": "ferrite serving the same shape's bf16 checkpoint, same machine, same run",
    "w4a16": f"compressed-tensors pack-quantized, symmetric 4-bit, group {group}, decoder linear layers "
             "(embeddings and LM head bf16); random values",
    "checkpoints": {name: (r or {}).get("checkpoint") for name, r in runs.items()},
    "commands": {name: (r or {}).get("commands") for name, r in runs.items()},
    "comparison": comparison,
    "targets": {"c1_w4a16_over_bf16": {"goal": 2.5, "measured": c1, "met": c1 is not None and c1 >= 2.5}},
}
(out / "cuda-w4a16.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps(comparison, indent=1))
PY
