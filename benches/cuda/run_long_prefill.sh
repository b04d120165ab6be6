#!/usr/bin/env bash
# Long-prompt time to first token (issue 35), a baseline server against a candidate on one
# machine: two binaries (BASE, FERRITE), or one binary served as is and with NEW_ENV in its
# environment (a kernel switch under test). Each serves the Llama-3.1-8B shape (LAYERS cuts the depth; attention's share per layer is the
# same at any depth) with --max-model-len 33000, and `ferrite bench` sends single prompts of each
# of LENS tokens (concurrency 1, one output token, 3 prompts of random ids, median TTFT; no
# prefix-cache hits). `prefill_matmul_time.py` times the same prompts' linear layers with cuBLAS
# in the same run: the floor TTFT is compared with. Run from the repo root on the GPU machine:
#
#   BASE=old/ferrite FERRITE=new/ferrite bash benches/cuda/run_long_prefill.sh "$OUT"
#   NEW_ENV="FERRITE_SOME_SWITCH=1" bash benches/cuda/run_long_prefill.sh "$OUT"   # .probe/ferrite both
#
# Writes $OUT/long-prefill.json and each server's log as $OUT/long-prefill-<base|new>.log.
set -uo pipefail
OUT=${1:?usage: run_long_prefill.sh OUTDIR}
FERRITE=${FERRITE:-.probe/ferrite}
BASE=${BASE:-$FERRITE}
NEW_ENV=${NEW_ENV:-}  # the candidate's extra environment
LAYERS=${LAYERS:-}
LENS=${LENS:-2048,8192,16384,32768}
CHUNK=${CHUNK:-2048}
PORT=${PORT:-8191}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CKPT=${CKPT:-/tmp/ferrite-bench/llama-3.1-8b${LAYERS:+-l$LAYERS}}
mkdir -p "$OUT"
WORK=$(mktemp -d)
if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
"$PYTHON" "$HERE/make_checkpoint.py" --shape llama-3.1-8b ${LAYERS:+--layers "$LAYERS"} --out "$CKPT" > "$WORK/checkpoint.json" || exit 1
"$PYTHON" "$HERE/prefill_matmul_time.py" --model "$CKPT" --lens "$LENS" --chunk "$CHUNK" > "$WORK/matmul.json" || exit 1
IFS=, read -r -a LEN_LIST <<<"$LENS"
healthy() { "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; }
run() {  # binary tag [VAR=value...]
    local pid n start=$SECONDS
    env NO_COLOR=1 "${@:3}" "$1" serve --model "$CKPT" --device cuda --dtype bf16 --port "$PORT" --max-num-seqs 8 \
        --max-model-len 33000 --max-num-batched-tokens "$CHUNK" --gpu-memory-utilization 0.9 > "$OUT/long-prefill-$2.log" 2>&1 &
    pid=$!
    until healthy; do
        kill -0 $pid 2>/dev/null && ((SECONDS - start < 240)) || { echo "$2: server not healthy"; kill $pid 2>/dev/null; return 1; }
        sleep 0.5
    done
    timeout 120 "$FERRITE" bench --base-url "http://127.0.0.1:$PORT" --input-len 2048 --output-len 1 --concurrency 1 \
        --num-prompts 2 --runs 1 --seed 7 > /dev/null
    for n in "${LEN_LIST[@]}"; do
        timeout 300 "$FERRITE" bench --base-url "http://127.0.0.1:$PORT" --input-len "$n" --output-len 1 --concurrency 1 \
            --num-prompts 3 --runs 1 --vocab-size 1000 > "$WORK/$2-$n.json" || echo "$2 at $n tokens failed"
    done
    kill -INT $pid; wait $pid
}
run "$BASE" base
read -r -a NEW_VARS <<<"$NEW_ENV"
run "$FERRITE" new "${NEW_VARS[@]}"
export CANDIDATE="$FERRITE ${NEW_ENV:-(no extra environment)}"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
"$PYTHON" - "$WORK" "$OUT" "$GPU" "$LENS" <<'PY'
import json, os, sys
from pathlib import Path
work, out, gpu, lens = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
matmul = json.loads((work / "matmul.json").read_text())
def ttft(tag, n):
    p = work / f"{tag}-{n}.json"
    if not p.exists():
        return None
    return json.loads(p.read_text())["results"][0]["median_run"]["median_ttft_ms"] / 1e3
rows = []
for n in lens:
    base, new, mm = ttft("base", n), ttft("new", n), matmul["seconds"][n]
    rows.append({
        "prompt_tokens": int(n),
        "base_ttft_s": base,
        "new_ttft_s": new,
        "speedup": base / new if base and new else None,
        "new_prefill_tok_s": int(n) / new if new else None,
        "matmul_s": mm,
        "new_ttft_over_matmul": new / mm if new else None,
    })
report = {
    "bench": "cuda-long-prefill",
    "device": gpu,
    "checkpoint": json.loads((work / "checkpoint.json").read_text()),
    "workload": "one prompt of random token ids at a time (concurrency 1, 3 prompts, median TTFT, 1 output token), "
                f"chunked prefill of {matmul['chunk']} tokens, bf16",
    "baseline": "the BASE ferrite binary (default kernels) on the same machine and checkpoint, same run",
    "candidate": os.environ.get("CANDIDATE", ""),
    "matmul": "the decoder's linear layers over the same prompt in the same chunks, torch bf16 matmul (cuBLAS), same run",
    "rows": rows,
}
(out / "long-prefill.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps(rows, indent=1))
PY
