#!/usr/bin/env bash
# The CUDA serving benchmark in one command: ferrite (`serve` + `bench`) against transformers
# `generate` on the same random-init checkpoint, merged into OUTDIR/$TAG.json. Run from the repo
# root on the GPU machine, with the ferrite binary at .probe/ferrite:
#
#   bash benches/cuda/run_serving.sh "$OUT"
#
# Knobs (environment): SHAPE (llama-3.1-8b | qwen3-30b-a3b), LAYERS (cut the depth),
# CONCURRENCY (levels = baseline batch sizes), INPUT_LEN, OUTPUT_LEN, SKIP_FERRITE=1,
# SKIP_BASELINE=1 (a skipped part's last results in $WORK, if any, are merged again),
# FERRITE (binary), BENCH_CLIENT (binary running `bench`; FERRITE by default, so an A/B of two
# servers can share one client), FERRITE_DEVICE (cuda | cpu), FERRITE_SERVE_ARGS (extra `serve` flags),
# BASELINE_ARGS (extra torch_baseline.py flags, e.g. "--no-compile --time-budget 300"),
# LEVEL_TIMEOUT (seconds per bench level), PYTHON, PORT, TAG (output names), TINY=1 (shrunk
# widths: smoke tests only), CKPT (checkpoint directory), W4A16=GROUP (the decoder's linear
# weights as compressed-tensors W4A16 in groups of GROUP), FP8_DYNAMIC=1 (as compressed-tensors
# FP8_DYNAMIC).
# Files in OUTDIR: $TAG.json (the report), $TAG.log (this script's output), $TAG-serve.log.
set -uo pipefail

OUTDIR=${1:?usage: run_serving.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHAPE=${SHAPE:-llama-3.1-8b}
LAYERS=${LAYERS:-}
CONCURRENCY=${CONCURRENCY:-1,8,32,128}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-256}
PYTHON=${PYTHON:-python3}
FERRITE=${FERRITE:-.probe/ferrite}
BENCH_CLIENT=${BENCH_CLIENT:-$FERRITE}
FERRITE_DEVICE=${FERRITE_DEVICE:-cuda}
FERRITE_SERVE_ARGS=${FERRITE_SERVE_ARGS---gpu-memory-utilization 0.9}  # set but empty: no extra flags
BASELINE_ARGS=${BASELINE_ARGS:-}
LEVEL_TIMEOUT=${LEVEL_TIMEOUT:-120}
PORT=${PORT:-8123}
TAG=${TAG:-cuda-serving}
TINY=${TINY:-}
W4A16=${W4A16:-}
FP8_DYNAMIC=${FP8_DYNAMIC:-}
CKPT=${CKPT:-/tmp/ferrite-bench/$SHAPE${LAYERS:+-l$LAYERS}${TINY:+-tiny}${W4A16:+-w4a16-g$W4A16}${FP8_DYNAMIC:+-fp8-dynamic}}
# Raw parts live outside OUTDIR (only a few files come back from the device) and survive
# between calls on a warm machine, which is what lets SKIP_* rerun one part.
WORK=/tmp/ferrite-bench/$TAG
URL=http://127.0.0.1:$PORT
IFS=, read -r -a LEVELS <<<"$CONCURRENCY"
read -r -a SERVE_EXTRA <<<"$FERRITE_SERVE_ARGS"
read -r -a BASELINE_EXTRA <<<"$BASELINE_ARGS"

mkdir -p "$OUTDIR" "$WORK"
exec > >(tee "$OUTDIR/$TAG.log") 2>&1
failed=()
notes=()
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

# cudarc dlopens cuBLAS and NVRTC; the torch venv's nvidia wheels carry them.
if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader

say "checkpoint $SHAPE${LAYERS:+ ($LAYERS layers)} in $CKPT"
"$PYTHON" "$HERE/make_checkpoint.py" --shape "$SHAPE" --out "$CKPT" ${LAYERS:+--layers "$LAYERS"} ${TINY:+--tiny} \
    ${W4A16:+--w4a16 "$W4A16"} ${FP8_DYNAMIC:+--fp8-dynamic} \
    >"$WORK/checkpoint.json" || { say "make_checkpoint.py failed"; exit 1; }
cat "$WORK/checkpoint.json"

healthy() { "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$URL/health" 2>/dev/null; }

SERVER_PID=
stop_server() {
    [[ -n $SERVER_PID ]] || return 0
    kill -INT "$SERVER_PID" 2>/dev/null
    # SIGINT drains in-flight requests (--shutdown-timeout, 30 s); past 60 s it is stuck.
    (sleep 60 && kill -KILL "$SERVER_PID") >/dev/null 2>&1 &
    local watchdog=$! status
    wait "$SERVER_PID" 2>/dev/null
    status=$?
    kill "$watchdog" 2>/dev/null
    say "server stopped (exit status $status)"
    SERVER_PID=
}
trap stop_server EXIT

SERVE_CMD=("$FERRITE" serve --model "$CKPT" --device "$FERRITE_DEVICE" --dtype bf16 --port "$PORT"
    --max-num-seqs 256 --max-model-len 4096 "${SERVE_EXTRA[@]}")
BENCH_CMD=("$BENCH_CLIENT" bench --base-url "$URL" --input-len "$INPUT_LEN" --vocab-size 1000 --runs 1)

run_ferrite() {
    rm -f "$WORK"/ferrite-c*.json
    if healthy; then
        say "something already answers on $URL (a server left from an earlier run?); not benchmarking it"
        return 1
    fi
    say "+ ${SERVE_CMD[*]}"
    local start=$SECONDS
    NO_COLOR=1 "${SERVE_CMD[@]}" >"$OUTDIR/$TAG-serve.log" 2>&1 &
    SERVER_PID=$!
    until healthy; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID"
            say "ferrite serve exited (status $?) before /health answered; the end of its log:"
            tail -n 40 "$OUTDIR/$TAG-serve.log"
            SERVER_PID=
            return 1
        fi
        if ((SECONDS - start > 180)); then
            say "ferrite serve not healthy after 180 s; the end of its log:"
            tail -n 40 "$OUTDIR/$TAG-serve.log"
            return 1
        fi
        sleep 0.5
    done
    say "server healthy after $((SECONDS - start)) s"
    # Warm-ups (kernel compiles, first allocations) at both ends of the range, with another seed
    # so that the measured prompts do not hit the prefix cache.
    local max=0 c
    for c in "${LEVELS[@]}"; do ((c > max)) && max=$c; done
    for c in 1 "$max"; do
        timeout "$LEVEL_TIMEOUT" "${BENCH_CMD[@]}" --concurrency "$c" --num-prompts "$c" --output-len 8 --seed 1 \
            >/dev/null || { say "warm-up at concurrency $c failed"; return 1; }
    done
    say "warm-ups done"
    for c in "${LEVELS[@]}"; do
        # One request per concurrent client (4 at least, so that the c1 medians mean something)
        # keeps every level to about one batch's generation time.
        say "+ ${BENCH_CMD[*]} --output-len $OUTPUT_LEN --concurrency $c --num-prompts $((c > 4 ? c : 4))"
        timeout "$LEVEL_TIMEOUT" "${BENCH_CMD[@]}" --output-len "$OUTPUT_LEN" --concurrency "$c" --num-prompts $((c > 4 ? c : 4)) \
            >"$WORK/ferrite-c$c.json" || { say "bench at concurrency $c failed"; rm -f "$WORK/ferrite-c$c.json"; return 1; }
    done
    stop_server
    say "ferrite done"
}

BASELINE_CMD=("$PYTHON" "$HERE/torch_baseline.py" --model "$CKPT" --batches "$CONCURRENCY" --input-len "$INPUT_LEN"
    --output-len "$OUTPUT_LEN" --json "$WORK/baseline.json" "${BASELINE_EXTRA[@]}")

if [[ -n ${SKIP_FERRITE:-} ]]; then
    notes+=("ferrite part skipped in this run; its results (if any) are from an earlier run")
else
    run_ferrite || failed+=(ferrite)
    stop_server
fi

if [[ -n ${SKIP_BASELINE:-} ]]; then
    notes+=("baseline part skipped in this run; its results (if any) are from an earlier run")
else
    rm -f "$WORK/baseline.json"
    say "+ ${BASELINE_CMD[*]}"
    "${BASELINE_CMD[@]}" || failed+=(baseline)
fi

ferrite_files=()
for c in "${LEVELS[@]}"; do [[ -s $WORK/ferrite-c$c.json ]] && ferrite_files+=("$WORK/ferrite-c$c.json"); done
for part in "${failed[@]}"; do notes+=("the $part part failed; see $TAG.log"); done
note_args=()
for n in "${notes[@]}"; do note_args+=(--note "$n"); done
"$PYTHON" "$HERE/merge.py" --bench "$TAG" --checkpoint "$WORK/checkpoint.json" --ferrite "${ferrite_files[@]}" \
    --baseline "$WORK/baseline.json" --out "$OUTDIR/$TAG.json" "${note_args[@]}" \
    --command "serve=${SERVE_CMD[*]}" \
    --command "bench=${BENCH_CMD[*]} --output-len $OUTPUT_LEN --concurrency C --num-prompts max(C,4)" \
    --command "baseline=${BASELINE_CMD[*]}" || failed+=(merge)
say "wrote $OUTDIR/$TAG.json"
((${#failed[@]} == 0)) || { say "failed parts: ${failed[*]}"; exit 1; }
