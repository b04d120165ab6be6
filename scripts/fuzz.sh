#!/usr/bin/env bash
# The fuzz targets of outside data (issue 34), each run for longer than CI runs it.
#   scripts/fuzz.sh            # 20000 cases per target
#   CASES=200000 scripts/fuzz.sh
# CI runs every target with its own bounded number of cases through `scripts/test.sh`. A failure
# prints proptest's shrunk input; make it a regression test next to the code it broke.
set -euo pipefail
cd "$(dirname "$0")/.."
export PROPTEST_CASES="${CASES:-20000}"
run() { echo "== $*"; cargo test "$@"; }
run -p ferrite-tokenizer --test hostile_templates
run -p ferrite-tokenizer --test hostile_tokenizer_files
run -p ferrite-structured --test hostile_constraints
run -p ferrite-models --test hostile_configs
run -p ferrite-models --lib -- gguf::tests weights::hostile quant::tests::hostile
run -p ferrite-server --lib -- params::tests::hostile
run -p ferrite-engine --lib -- spec_decode::tests::hostile
run -p ferrite --test hostile_bodies
