#!/usr/bin/env bash
# The hybrid run: run_serving.sh on the Qwen3.5 dense text shape (24 Gated DeltaNet + 8 gated
# attention layers, 9B parameters), at concurrency / batch 1 and 32; the transformers baseline runs
# eagerly (its GDN kernels are torch fallbacks on the device) under a 150 s budget. Writes
# OUTDIR/cuda-hybrid.json (+ .log, -serve.log); the other knobs are run_serving.sh's.
#
#   bash benches/cuda/run_hybrid.sh "$OUT"
exec env SHAPE="${SHAPE:-qwen3.5-9b}" CONCURRENCY="${CONCURRENCY:-1,32}" TAG="${TAG:-cuda-hybrid}" \
    BASELINE_ARGS="${BASELINE_ARGS:---no-compile --time-budget 150}" \
    bash "$(dirname "${BASH_SOURCE[0]}")/run_serving.sh" "$@"
