#!/usr/bin/env bash
# Draft-model speculative decoding on the Llama-3.1-8B shape (issue 30), ferrite only: the same
# target served without speculation, then with a draft model at each k in K_LIST, `ferrite bench`
# at each concurrency, and the drafts' acceptance from /metrics. The pair comes from
# spec_checkpoints.py (the draft is the target's first DRAFT_LAYERS layers and the target's later
# layers add nothing), so drafts are accepted at the ceiling: the report is the speed-up the
# machinery gives when drafts are right, against the cost of proposing and verifying them.
# Run from the repo root on the GPU machine:
#
#   bash benches/cuda/run_spec.sh "$OUT"      # about 5 min
#
# With EAGLE3=1 the variants are a random EAGLE-3 head (eagle3_checkpoint.py) at each k instead: its
# drafts are rejected, so the run measures what EAGLE-3 drafting and verifying cost per step.
#
# Writes $OUT/cuda-spec.json (one entry per variant and concurrency) and each server's log.
set -uo pipefail
OUT=${1:?usage: run_spec.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FERRITE=${FERRITE:-.probe/ferrite}
PYTHON=${PYTHON:-python3}
DRAFT_LAYERS=${DRAFT_LAYERS:-4}
K_LIST=${K_LIST:-2,4}
CONCURRENCY=${CONCURRENCY:-1,8}
INPUT_LEN=${INPUT_LEN:-512}
OUTPUT_LEN=${OUTPUT_LEN:-256}
PORT=${PORT:-8124}
TINY=${TINY:-}                       # set: shrunken widths, for a smoke test on a CPU
FERRITE_DEVICE=${FERRITE_DEVICE:-cuda}
TARGET=${TARGET:-/tmp/ferrite-bench/spec-target}
DRAFT=${DRAFT:-/tmp/ferrite-bench/spec-draft-l$DRAFT_LAYERS}
EAGLE3=${EAGLE3:-}
HEAD=${HEAD:-/tmp/ferrite-bench/spec-eagle3}
URL=http://127.0.0.1:$PORT
IFS=, read -r -a LEVELS <<<"$CONCURRENCY"
IFS=, read -r -a KS <<<"$K_LIST"
mkdir -p "$OUT"
if NV=$("$PYTHON" -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null); then
    LD_LIBRARY_PATH=$(find "$NV" \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' \) -printf '%h\n' | sort -u | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
"$PYTHON" "$HERE/make_checkpoint.py" --shape llama-3.1-8b --out "$TARGET" ${TINY:+--tiny} > "$OUT/checkpoint.json" || exit 1
if [[ -n $EAGLE3 ]]; then
    "$PYTHON" "$HERE/eagle3_checkpoint.py" --target "$TARGET" --out "$HEAD" > "$OUT/draft.json" || exit 1
else
    "$PYTHON" "$HERE/spec_checkpoints.py" --checkpoint "$TARGET" --layers "$DRAFT_LAYERS" --draft "$DRAFT" > "$OUT/draft.json" || exit 1
fi
say "pair ready: $(cat "$OUT/draft.json")"
healthy() { "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$URL/health" 2>/dev/null; }
BENCH=("$FERRITE" bench --base-url "$URL" --input-len "$INPUT_LEN" --vocab-size 1000 --runs 1)
: > "$OUT/runs.txt"
variant() {  # tag [speculative-config]
    local tag=$1 pid start c
    local extra=()
    [[ -n ${2:-} ]] && extra=(--speculative-config "$2")
    say "+ serve $tag ${extra[*]}"
    NO_COLOR=1 "$FERRITE" serve --model "$TARGET" --device "$FERRITE_DEVICE" --dtype bf16 --port "$PORT" --max-num-seqs 64 \
        --max-model-len 4096 --gpu-memory-utilization 0.9 "${extra[@]}" > "$OUT/$tag-serve.log" 2>&1 &
    pid=$!
    start=$SECONDS
    until healthy; do
        kill -0 $pid 2>/dev/null || { say "$tag: server exited"; tail -n 30 "$OUT/$tag-serve.log"; return 1; }
        ((SECONDS - start > 180)) && { say "$tag: not healthy after 180 s"; kill -KILL $pid; return 1; }
        sleep 0.5
    done
    timeout 120 "${BENCH[@]}" --concurrency 8 --num-prompts 8 --output-len 8 --seed 1 > /dev/null
    for c in "${LEVELS[@]}"; do
        timeout 180 "${BENCH[@]}" --output-len "$OUTPUT_LEN" --concurrency "$c" --num-prompts $((c > 4 ? c : 4)) \
            > "$OUT/$tag-c$c.json" || say "$tag: bench at concurrency $c failed"
    done
    "$PYTHON" -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "$URL/metrics" \
        > "$OUT/$tag-metrics.txt"
    echo "$tag" >> "$OUT/runs.txt"
    kill -INT $pid; (sleep 60 && kill -KILL $pid) >/dev/null 2>&1 & wait $pid
    say "$tag done"
}
variant plain
for k in "${KS[@]}"; do
    if [[ -n $EAGLE3 ]]; then
        variant "eagle3-k$k" "{\"method\": \"eagle3\", \"model\": \"$HEAD\", \"num_speculative_tokens\": $k}"
    else
        variant "draft-k$k" "{\"model\": \"$DRAFT\", \"num_speculative_tokens\": $k}"
    fi
done
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
GPU=${GPU:-$(uname -m) CPU}
"$PYTHON" - "$OUT" "$GPU" "${EAGLE3:+eagle3}" > "$OUT/cuda-spec.json" <<'PY'
import json, re, sys, time
from pathlib import Path
out, gpu, eagle3 = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "eagle3"
drafter = ("a random EAGLE-3 head: every draft rejected, so speedup_vs_plain is the cost of a speculative step"
           if eagle3 else "a draft model the target agrees with: drafts accepted at the ceiling")
report = {"date": time.strftime("%Y-%m-%d"), "device": gpu, "shape": "llama-3.1-8b bf16, random weights",
          "drafter": drafter, "draft": json.loads((out / "draft.json").read_text()),
          "baseline": "the same target without speculation", "variants": {}}
for tag in (out / "runs.txt").read_text().split():
    metrics = {}
    for line in (out / f"{tag}-metrics.txt").read_text().splitlines():
        m = re.match(r"(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens)_total)(?:\{[^}]*\})?\s+(\S+)", line)
        if m:
            metrics[m.group(1)] = float(m.group(2))
    entry = {"levels": {}}
    if metrics:
        entry["acceptance"] = metrics.get("vllm:spec_decode_num_accepted_tokens_total", 0) / max(
            metrics.get("vllm:spec_decode_num_draft_tokens_total", 0), 1)
        entry["metrics"] = metrics
    for f in sorted(out.glob(f"{tag}-c*.json")):
        try:
            entry["levels"][f.stem.split("-c")[-1]] = json.loads(f.read_text())
        except ValueError:
            pass
    report["variants"][tag] = entry
def tok_s(level):
    try:
        return level["results"][0]["median_run"]["output_tok_per_s"]
    except (KeyError, IndexError, TypeError):
        return None
plain = report["variants"].get("plain", {}).get("levels", {})
for tag, entry in report["variants"].items():
    for c, level in entry["levels"].items():
        base, got = tok_s(plain.get(c)), tok_s(level)
        if base and got:
            entry.setdefault("speedup_vs_plain", {})[c] = round(got / base, 3)
print(json.dumps(report, indent=1))
PY
cat "$OUT/cuda-spec.json" | head -c 3000
