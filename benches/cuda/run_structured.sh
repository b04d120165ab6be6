#!/usr/bin/env bash
# Structured-output overhead on one GPU: one `ferrite serve` on the Llama-3.1-8B shape, then
# `ferrite bench` at each CONCURRENCY level without a constraint and with a json_schema
# response_format, alternating (plain, schema, plain, schema) so that drift hits both alike, and
# the grammar-mask times per step from the server's debug log. Run from the repo root on the GPU
# machine with the binary at $FERRITE (default .probe/ferrite):
#
#   bash benches/cuda/run_structured.sh "$OUT"
#
# The schema (an array of at least 200 strings) keeps every request inside the grammar for all
# OUTPUT_LEN tokens, so each step of a constrained run computes a real mask. Writes
# $OUTDIR/$TAG.json (the report) and $OUTDIR/$TAG-serve.log.
set -uo pipefail
OUTDIR=${1:?usage: run_structured.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FERRITE=${FERRITE:-.probe/ferrite}
CONCURRENCY=${CONCURRENCY:-1,32}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-256}
PORT=${PORT:-8124}
TAG=${TAG:-cuda-structured}
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
TINY=${TINY:-}  # set: shrunk widths and the CPU, a smoke test of this script
CKPT=${CKPT:-/tmp/ferrite-bench/llama-3.1-8b${TINY:+-tiny}}
if [[ -n $TINY ]]; then MEMORY="--kv-cache-memory 256MiB"; else MEMORY="--gpu-memory-utilization 0.9"; fi
WORK=/tmp/ferrite-bench/$TAG
mkdir -p "$OUTDIR" "$WORK"
if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
"$PYTHON" "$HERE/make_checkpoint.py" --shape llama-3.1-8b --out "$CKPT" ${TINY:+--tiny} >"$WORK/checkpoint.json" || exit 1
SCHEMA='{"response_format": {"type": "json_schema", "json_schema": {"name": "list", "schema": {"type": "array", "items": {"type": "string"}, "minItems": 200}}}}'
URL=http://127.0.0.1:$PORT
FERRITE_LOG=info,ferrite_engine::runner=debug NO_COLOR=1 "$FERRITE" serve --model "$CKPT" --device "$DEVICE" --dtype bf16 \
    --port "$PORT" --max-num-seqs 256 --max-model-len 4096 $MEMORY >"$OUTDIR/$TAG-serve.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER' EXIT
for _ in $(seq 360); do
    python3 -c "import urllib.request; urllib.request.urlopen('$URL/health', timeout=2)" 2>/dev/null && break
    kill -0 $SERVER 2>/dev/null || { tail -n 30 "$OUTDIR/$TAG-serve.log"; exit 1; }
    sleep 0.5
done
bench() {  # $1 = output file, $2 = output length, then extra flags
    local out=$1 len=$2; shift 2
    timeout 300 "$FERRITE" bench --base-url "$URL" --input-len "$INPUT_LEN" --output-len "$len" \
        --vocab-size 1000 --runs 1 --concurrency "$CONCURRENCY" "$@" >"$out"
}
bench "$WORK/warmup.json" 8 --seed 1 --extra-body "$SCHEMA" || { tail -n 30 "$OUTDIR/$TAG-serve.log"; exit 1; }
for round in 1 2; do
    bench "$WORK/plain-$round.json" "$OUTPUT_LEN" --seed $((10 + round)) || exit 1
    echo "--- schema round $round" >>"$OUTDIR/$TAG-serve.log"
    bench "$WORK/schema-$round.json" "$OUTPUT_LEN" --seed $((20 + round)) --extra-body "$SCHEMA" || exit 1
    echo "--- end schema round $round" >>"$OUTDIR/$TAG-serve.log"
done
python3 - "$WORK" "$OUTDIR/$TAG-serve.log" "$OUTDIR/$TAG.json" "$SCHEMA" <<'PY'
import json, re, statistics, subprocess, sys
work, log, out, schema = sys.argv[1:]
def levels(path):
    return {r["concurrency"]: r["median_run"] for r in json.load(open(path))["results"]}
runs = {kind: [levels(f"{work}/{kind}-{i}.json") for i in (1, 2)] for kind in ("plain", "schema")}
report = {"bench": "structured-outputs", "checkpoint": json.load(open(f"{work}/checkpoint.json")),
          "device": subprocess.run("nvidia-smi --query-gpu=name --format=csv,noheader || uname -m", shell=True,
                                   capture_output=True, text=True).stdout.strip(),
          "extra_body": json.loads(schema), "levels": []}
for c in sorted(runs["plain"][0]):
    tok = {k: [r[c]["output_tok_per_s"] for r in runs[k]] for k in runs}
    report["levels"].append({"concurrency": c, "plain_output_tok_s": tok["plain"], "schema_output_tok_s": tok["schema"],
                             "overhead": 1 - statistics.median(tok["schema"]) / statistics.median(tok["plain"])})
steps = [(float(m.group(1)), float(m.group(2)), int(s.group(1)))
         for line in open(log, errors="replace")
         if (m := re.search(r"mask_ms=([\d.]+) mask_wait_ms=([\d.]+)", line)) and (s := re.search(r"seqs=(\d+)", line)) and float(m.group(1)) > 0]
by_seqs = {}
for fill, wait, seqs in steps:
    by_seqs.setdefault(seqs, []).append((fill, wait))
report["mask_ms_per_step"] = {str(n): {"steps": len(v), "median_fill_ms": statistics.median(f for f, _ in v),
                                       "median_wait_ms": statistics.median(w for _, w in v)}
                              for n, v in sorted(by_seqs.items()) if len(v) >= 10}
json.dump(report, open(out, "w"), indent=2)
print(json.dumps(report["levels"]), json.dumps(report["mask_ms_per_step"]))
PY
