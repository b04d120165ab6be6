#!/usr/bin/env bash
# The MoE run: run_serving.sh on Qwen3-30B-A3B's shape with its depth cut to LAYERS (default 8;
# the full 48 layers are 61 GB, more than the device's disk holds beside the 8B), at
# concurrency / batch 1 and 32. Writes OUTDIR/cuda-moe.json (+ .log, -serve.log); the other
# knobs are run_serving.sh's.
#
#   bash benches/cuda/run_moe.sh "$OUT"
exec env SHAPE=qwen3-30b-a3b LAYERS="${LAYERS:-8}" CONCURRENCY="${CONCURRENCY:-1,32}" TAG="${TAG:-cuda-moe}" \
    bash "$(dirname "${BASH_SOURCE[0]}")/run_serving.sh" "$@"
