#!/usr/bin/env bash
# FP8 KV cache (issue 37) in one call: the Llama-3.1-8B shape's bf16 checkpoint served with
# `--kv-cache-dtype fp8` (keys and values kept as e4m3 bytes, scales 1.0) and with the default
# bf16 cache, `run_serving.sh` (ferrite only) for each; one report, OUTDIR/cuda-kv-fp8.json, with
# each leg's KV capacity in tokens (the engine's "KV cache allocated" log line) and, per
# concurrency, output tok/s, TPOT and TTFT and the FP8 leg's ratios to the bf16 one. The other
# knobs are run_serving.sh's.
#
#   bash benches/cuda/run_kv_fp8.sh "$OUT"
set -uo pipefail
OUTDIR=${1:?usage: run_kv_fp8.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SHAPE=${SHAPE:-llama-3.1-8b} CONCURRENCY=${CONCURRENCY:-1,32,128} SKIP_BASELINE=1
PYTHON=${PYTHON:-python3}
SERVE=${FERRITE_SERVE_ARGS:---gpu-memory-utilization 0.9}
FERRITE_SERVE_ARGS="$SERVE --kv-cache-dtype fp8" TAG=kv-fp8 bash "$HERE/run_serving.sh" "$OUTDIR"
FERRITE_SERVE_ARGS="$SERVE" TAG=kv-bf16 bash "$HERE/run_serving.sh" "$OUTDIR"
"$PYTHON" - "$OUTDIR" <<'PY'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
legs = {}
for name in ("fp8", "bf16"):
    report = out / f"kv-{name}.json"
    log = out / f"kv-{name}-serve.log"
    capacity = re.findall(r"capacity_tokens=(\d+)", log.read_text()) if log.exists() else []
    legs[name] = {
        "capacity_tokens": int(capacity[-1]) if capacity else None,
        "levels": {lv["concurrency"]: lv for lv in (json.loads(report.read_text()) if report.exists() else {})
                   .get("ferrite", {}).get("levels", [])},
    }
rows = []
for c in sorted(set(legs["fp8"]["levels"]) | set(legs["bf16"]["levels"])):
    row = {"concurrency": c}
    for name, leg in legs.items():
        lv = leg["levels"].get(c)
        for key in ("output_tok_s", "median_tpot_ms", "median_ttft_ms"):
            row[f"{name}_{key}"] = lv[key] if lv else None
    if row["fp8_output_tok_s"] and row["bf16_output_tok_s"]:
        row["fp8_over_bf16_output_tok_s"] = row["fp8_output_tok_s"] / row["bf16_output_tok_s"]
    rows.append(row)
cap = [legs[n]["capacity_tokens"] for n in ("fp8", "bf16")]
report = {
    "bench": "cuda-kv-fp8",
    "workload": "run_serving.sh: random prompts, greedy, ferrite bench per concurrency (see kv-*.json)",
    "baseline": "the same binary and checkpoint served with the default (bf16) KV cache, same call",
    "capacity_tokens": {"fp8": cap[0], "bf16": cap[1], "ratio": cap[0] / cap[1] if all(cap) else None},
    "comparison": rows,
}
(out / "cuda-kv-fp8.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps(report, indent=1))
PY
