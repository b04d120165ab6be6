//! The pooling engine: a decoder served as an embedding model (`--task embed`) gives, through
//! the engine's batching thread, the embeddings the models-level path gives, and its admission
//! and task checks refuse what they should.

use std::path::PathBuf;
use std::sync::Arc;

use ferrite_engine::pooling::{cosine, PoolingInput, ServeTask};
use ferrite_engine::{DType, EngineError, PoolingConfig, PoolingEngine};
use ferrite_models::{load_pooling_model, LoadOptions};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn config() -> PoolingConfig {
    PoolingConfig { max_model_len: None, max_num_batched_tokens: 64, max_num_seqs: 8, max_queue: 8 }
}

/// The transformers cases of the Llama fixture used as an embedding model.
fn cases() -> Vec<(Vec<u32>, Vec<f32>)> {
    let path = fixtures().join("pooling/llama-causal-embed.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let list = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<f64>>();
    golden["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = list(&c["ids"]).into_iter().map(|x| x as u32).collect();
            let last = list(&c["last"]).into_iter().map(|x| x as f32).collect();
            (ids, last)
        })
        .collect()
}

#[test]
fn decoder_with_task_embed_matches_the_models_path() {
    let dir = fixtures().join("models/llama");
    let engine = PoolingEngine::load(&dir, DType::F32, Some(ServeTask::Embed), config()).unwrap();
    let client = engine.client();
    let cases = cases();
    let inputs: Vec<PoolingInput> = cases.iter().map(|(ids, _)| ids.clone().into()).collect();
    let reference = load_pooling_model(&dir, &LoadOptions { progress: false, ..Default::default() })
        .unwrap()
        .embed_inputs(&inputs, None)
        .unwrap();

    // One request per case, all at once, so the thread batches them under its token budget.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = Arc::new(client);
    let outputs: Vec<Vec<f32>> = runtime.block_on(async {
        let tasks: Vec<_> = inputs
            .iter()
            .map(|input| {
                let (client, input) = (client.clone(), input.clone());
                tokio::spawn(async move { client.run(vec![input]).await })
            })
            .collect();
        let mut out = Vec::new();
        for task in tasks {
            let mut v = task.await.unwrap().unwrap().remove(0);
            client.finish_embedding(&mut v, None, None);
            out.push(v);
        }
        out
    });

    for (((ids, last), ours), theirs) in cases.iter().zip(&outputs).zip(&reference) {
        let err = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(err < 1e-5, "{} tokens: engine and models path differ by {err}", ids.len());
        assert!(cosine(ours, last) > 0.99999, "{} tokens: not transformers' last-token state", ids.len());
    }
    assert_eq!(client.stats().prompt_tokens_total, cases.iter().map(|(ids, _)| ids.len() as u64).sum::<u64>());
    assert_eq!(client.in_flight(), 0);
}

#[test]
fn admission_and_task_checks() {
    let dir = fixtures().join("models/llama");
    let err = PoolingEngine::load(&dir, DType::F32, Some(ServeTask::Classify), config()).err().unwrap();
    assert!(err.to_string().contains("needs a classification model"), "{err}");

    let small = PoolingConfig { max_num_seqs: 1, max_queue: 1, ..config() };
    let engine = PoolingEngine::load(&dir, DType::F32, None, small).unwrap();
    let client = engine.client();
    assert_eq!(client.task(), ServeTask::Embed);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let three = vec![PoolingInput::from(vec![5u32]); 3];
    let err = runtime.block_on(client.run(three)).unwrap_err();
    assert!(matches!(err, EngineError::TooManyInputs { inputs: 3, limit: 2 }), "{err}");
    assert!(err.is_request_error());
}
