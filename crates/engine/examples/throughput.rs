//! Output-token throughput of the full engine at several concurrencies, printed as JSON.
//!
//! ```text
//! cargo run --release -p ferrite-engine --example throughput -- \
//!     --model /tmp/llama-1b --dtype bf16 --concurrency 1,8,32 --prompt-len 32 --output-len 32
//! ```
//! Each level submits `c` requests at once (random prompts, distinct so the prefix cache never
//! hits, EOS ignored, greedy) and times them from submission to the last token.

use std::error::Error;
use std::time::{Duration, Instant};

use ferrite_engine::{EngineConfig, PromptInput, RequestOutput, SamplingParams, LLM};
use ferrite_tensor::DType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::json;

struct Args {
    model: String,
    dtype: DType,
    concurrency: Vec<usize>,
    prompt_len: usize,
    output_len: usize,
    /// Prompt ids are drawn below this (the tokenizer's vocabulary for a random checkpoint).
    prompt_vocab: u32,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        model: String::new(),
        dtype: DType::BF16,
        concurrency: vec![1, 8, 32],
        prompt_len: 32,
        output_len: 32,
        prompt_vocab: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => args.model = value,
            "--dtype" => args.dtype = DType::parse(&value).ok_or_else(|| format!("unknown dtype {value}"))?,
            "--concurrency" => args.concurrency = value.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--prompt-len" => args.prompt_len = value.parse()?,
            "--output-len" => args.output_len = value.parse()?,
            "--prompt-vocab" => args.prompt_vocab = value.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if args.model.is_empty() {
        return Err("--model is required".into());
    }
    Ok(args)
}

fn median(mut v: Vec<Duration>) -> Option<Duration> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

fn ms(d: Option<Duration>) -> serde_json::Value {
    d.map_or(serde_json::Value::Null, |d| json!(d.as_secs_f64() * 1e3))
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = parse()?;
    let load = Instant::now();
    let config = EngineConfig { kv_cache_memory: 2 << 30, ..EngineConfig::default() };
    let llm = LLM::new(&args.model, args.dtype, config)?;
    let load_s = load.elapsed().as_secs_f64();
    let client = llm.client();
    let mut rng = ChaCha20Rng::seed_from_u64(0);
    let mut prompt =
        |len: usize| PromptInput::Tokens((0..len).map(|_| rng.random_range(3..args.prompt_vocab)).collect());
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(args.output_len) };
    // Touch every weight page once before timing.
    llm.generate(vec![prompt(8)], &SamplingParams { ignore_eos: true, ..SamplingParams::greedy(2) })?;

    let mut levels = Vec::new();
    for &c in &args.concurrency {
        let prompts: Vec<PromptInput> = (0..c).map(|_| prompt(args.prompt_len)).collect();
        let hits_before = client.stats().prefix_cache_hits;
        let start = Instant::now();
        let outputs: Vec<RequestOutput> = llm.generate(prompts, &params)?;
        let elapsed = start.elapsed().as_secs_f64();
        let generated: usize = outputs.iter().map(|o| o.outputs[0].token_ids.len()).sum();
        let tpot = median(outputs.iter().filter_map(|o| o.metrics.time_per_output_token()).collect());
        let level = json!({
            "concurrency": c,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "elapsed_s": elapsed,
            "output_tokens": generated,
            "output_tok_s": generated as f64 / elapsed,
            "median_ttft_ms": ms(median(outputs.iter().filter_map(|o| o.metrics.time_to_first_token()).collect())),
            "median_tpot_ms": ms(tpot),
            "decode_tok_s_per_seq": tpot.map(|t| 1.0 / t.as_secs_f64()),
            "prefix_cache_hit_tokens": client.stats().prefix_cache_hits - hits_before,
        });
        eprintln!("{level}");
        levels.push(level);
    }
    let info = client.model_info();
    let report = json!({
        "engine": "ferrite",
        "model": args.model,
        "architecture": info.architecture,
        "weight_bytes": info.weight_bytes,
        "dtype": args.dtype.to_string(),
        "threads": rayon::current_num_threads(),
        "load_s": load_s,
        "levels": levels,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
