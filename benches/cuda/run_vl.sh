#!/usr/bin/env bash
# The vision-language benchmark in one command: ferrite serving image chats against transformers
# on the same random-init Qwen2.5-VL-7B-shaped checkpoint (benches/cuda/vl_bench.py: time to
# first token for one 1024x1024 image plus ~64 text tokens, output throughput at concurrency 8
# with one image each), merged into OUTDIR/cuda-vl.json. From the repo root on the GPU machine,
# with the ferrite binary at .probe/ferrite:
#
#   bash benches/cuda/run_vl.sh "$OUT"
#
# Knobs (environment): SHAPE (qwen2.5-vl-7b), IMAGE_SIZE, CONCURRENCY, OUTPUT_LEN, TTFT_REPS,
# TEXT_ONLY_WORDS (a text-only prompt of about the image prompt's length, timed beside it),
# SKIP_BASELINE=1, FERRITE, FERRITE_SERVE_ARGS, PYTHON, PORT, TINY=1 (shrunk widths: smoke
# tests only), CKPT. Files in OUTDIR: cuda-vl.json, cuda-vl.log, cuda-vl-serve.log.
set -uo pipefail

OUTDIR=${1:?usage: run_vl.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHAPE=${SHAPE:-qwen2.5-vl-7b}
IMAGE_SIZE=${IMAGE_SIZE:-1024}
CONCURRENCY=${CONCURRENCY:-8}
OUTPUT_LEN=${OUTPUT_LEN:-128}
TTFT_REPS=${TTFT_REPS:-5}
PYTHON=${PYTHON:-python3}
FERRITE=${FERRITE:-.probe/ferrite}
FERRITE_SERVE_ARGS=${FERRITE_SERVE_ARGS---gpu-memory-utilization 0.9}
FERRITE_DEVICE=${FERRITE_DEVICE:-cuda}
PORT=${PORT:-8123}
TINY=${TINY:-}
CKPT=${CKPT:-/tmp/ferrite-bench/$SHAPE${TINY:+-tiny}}
WORK=/tmp/ferrite-bench/cuda-vl
URL=http://127.0.0.1:$PORT
read -r -a SERVE_EXTRA <<<"$FERRITE_SERVE_ARGS"
BENCH=(--image-size "$IMAGE_SIZE" --concurrency "$CONCURRENCY" --output-len "$OUTPUT_LEN" --ttft-reps "$TTFT_REPS")

mkdir -p "$OUTDIR" "$WORK"
exec > >(tee "$OUTDIR/cuda-vl.log") 2>&1
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
GPU=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
say "device: ${GPU:-cpu}"

"$PYTHON" "$HERE/make_checkpoint.py" --shape "$SHAPE" --out "$CKPT" ${TINY:+--tiny} >"$WORK/checkpoint.json" \
    || { say "make_checkpoint.py failed"; exit 1; }
cat "$WORK/checkpoint.json"

healthy() { "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$URL/health" 2>/dev/null; }
if healthy; then
    say "something already serves $URL; not benchmarking it"
    exit 1
fi
"$FERRITE" serve --model "$CKPT" --device "$FERRITE_DEVICE" --dtype bf16 --port "$PORT" --max-model-len 4096 \
    --max-num-seqs 64 "${SERVE_EXTRA[@]}" >"$OUTDIR/cuda-vl-serve.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 240); do
    healthy && break
    kill -0 "$SERVER_PID" 2>/dev/null || { say "server died"; tail -20 "$OUTDIR/cuda-vl-serve.log"; exit 1; }
    sleep 1
done
healthy || { say "server not healthy after 240 s"; kill -KILL "$SERVER_PID"; exit 1; }
say "ferrite healthy"
timeout 300 "$PYTHON" "$HERE/vl_bench.py" client --base-url "$URL" "${BENCH[@]}" --text-only-words "${TEXT_ONLY_WORDS:-700}" \
    >"$WORK/ferrite.json" \
    || say "client failed"
cat "$WORK/ferrite.json"
kill -INT "$SERVER_PID"
(sleep 60 && kill -KILL "$SERVER_PID") >/dev/null 2>&1 &
wait "$SERVER_PID" 2>/dev/null
say "server stopped"

if [[ -z ${SKIP_BASELINE:-} ]]; then
    timeout 400 "$PYTHON" "$HERE/vl_bench.py" baseline --model "$CKPT" --device "$FERRITE_DEVICE" "${BENCH[@]}" \
        >"$WORK/baseline.json" || say "baseline failed"
    cat "$WORK/baseline.json"
fi

"$PYTHON" - "$WORK" "$OUTDIR/cuda-vl.json" "${GPU:-cpu}" <<'PY'
import json, sys, time
from pathlib import Path

work, out, gpu = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def load(name):
    try:
        return json.loads((work / name).read_text())
    except (OSError, ValueError):
        return None
ferrite, baseline = load("ferrite.json"), load("baseline.json")
report = {"benchmark": "vision-language serving: one image per request", "device": gpu,
          "date": time.strftime("%Y-%m-%d"), "checkpoint": load("checkpoint.json"),
          "ferrite": ferrite, "baseline_transformers": baseline}
if ferrite and baseline:
    report["ratios"] = {  # > 1: ferrite better
        "ttft": baseline["ttft_ms"]["median"] / ferrite["ttft_ms"]["median"],
        "output_tok_s": ferrite["output_tok_s"] / baseline["output_tok_s"],
    }
out.write_text(json.dumps(report, indent=2))
print(json.dumps(report.get("ratios")))
PY
