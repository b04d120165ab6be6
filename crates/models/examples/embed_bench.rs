//! Embeddings per second of a pooling model on CPU, tokenization included (as
//! sentence-transformers' `encode` includes it). Driven by `benches/embeddings_cpu.py`:
//!
//! ```text
//! cargo run --release -p ferrite-models --example embed_bench -- \
//!     --model DIR --text-file F --batch 64 --iters 3 [--warmup 1] [--forward-tokens 2048]
//! ```
//! Prints one JSON object: batch, tokens per input, iterations, seconds, embeddings/s.

use std::path::PathBuf;
use std::time::Instant;

use ferrite_models::pooling::EmbeddingModel;
use ferrite_models::{load_pooling_model, LoadOptions};
use ferrite_tokenizer::Tokenizer;

fn main() {
    let mut model = None;
    let mut text_file = None;
    let (mut batch, mut iters, mut warmup) = (1usize, 10usize, 1usize);
    let mut forward_tokens = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value())),
            "--text-file" => text_file = Some(PathBuf::from(value())),
            "--batch" => batch = value().parse().expect("--batch N"),
            "--iters" => iters = value().parse().expect("--iters N"),
            "--warmup" => warmup = value().parse().expect("--warmup N"),
            "--forward-tokens" => forward_tokens = Some(value().parse().expect("--forward-tokens N")),
            other => panic!("unknown flag {other}"),
        }
    }
    let dir = model.expect("--model DIR");
    let text = std::fs::read_to_string(text_file.expect("--text-file F")).expect("reading --text-file");
    let text = text.trim_end_matches('\n');
    let mut model =
        load_pooling_model(&dir, &LoadOptions { progress: false, ..Default::default() }).expect("loading the model");
    if let Some(t) = forward_tokens {
        model.max_forward_tokens = t;
    }
    let tokenizer = Tokenizer::from_dir(&dir).expect("loading the tokenizer");
    let texts = vec![text.to_owned(); batch];
    let run = || {
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| tokenizer.encode_truncated(t, Some(model.max_model_len)).expect("tokenizing"))
            .collect();
        let out = model.embed(&ids).expect("embedding");
        assert_eq!(out.len(), batch);
        ids[0].len()
    };
    for _ in 0..warmup {
        run();
    }
    let start = Instant::now();
    let mut tokens = 0;
    for _ in 0..iters {
        tokens = run();
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "batch": batch,
            "tokens_per_input": tokens,
            "iters": iters,
            "seconds": seconds,
            "embeddings_per_s": (batch * iters) as f64 / seconds,
            "threads": rayon::current_num_threads(),
            "forward_tokens": model.max_forward_tokens,
        })
    );
}
