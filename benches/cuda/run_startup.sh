#!/usr/bin/env bash
# Start-up time of `ferrite serve --device cuda` (issue 35): process start to a healthy /health
# for the Llama-3.1-8B shape with the weights in the page cache, for a baseline binary and the
# candidate, each started cold (no kernel cache, no driver JIT cache) and then warm (restarts).
# Run from the repo root on the GPU machine:
#
#   BASE=path/to/old/ferrite FERRITE=path/to/new/ferrite bash benches/cuda/run_startup.sh "$OUT"
#
# Writes $OUT/startup.json (healthy seconds per run, and the phases the log reports) and each
# run's log as $OUT/<binary>-<run>.log.
set -uo pipefail
OUT=${1:?usage: run_startup.sh OUTDIR}
BASE=${BASE:?BASE: the baseline ferrite binary}
FERRITE=${FERRITE:?FERRITE: the candidate ferrite binary}
CKPT=${CKPT:-/tmp/ferrite-bench/llama-3.1-8b}
PORT=${PORT:-8190}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
"$PYTHON" "$(dirname "$0")/make_checkpoint.py" --shape llama-3.1-8b --out "$CKPT" > "$OUT/checkpoint.json"
cat "$CKPT"/*.safetensors > /dev/null  # the page cache holds the weights for every run
KCACHE=$(mktemp -d)
run() {  # binary tag
    local t0 pid
    t0=$(date +%s.%N)
    FERRITE_LOG=info FERRITE_CACHE_DIR=$KCACHE "$1" serve --model "$CKPT" --device cuda --dtype bf16 --port "$PORT" \
        --max-num-seqs 256 --max-model-len 4096 --gpu-memory-utilization 0.9 > "$OUT/$2.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1800); do
        "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    echo "$2 $("$PYTHON" -c "import time; print(round(time.time() - $t0, 2))")" >> "$OUT/healthy.txt"
    kill -TERM $pid; wait $pid
}
: > "$OUT/healthy.txt"
rm -rf ~/.nv/ComputeCache "$KCACHE"/*; run "$BASE" base-cold; run "$BASE" base-warm
rm -rf ~/.nv/ComputeCache "$KCACHE"/*; run "$FERRITE" new-cold; run "$FERRITE" new-warm; run "$FERRITE" new-warm2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
"$PYTHON" "$(dirname "$0")/startup_report.py" "$OUT" "$GPU" > "$OUT/startup.json"
cat "$OUT/startup.json"
