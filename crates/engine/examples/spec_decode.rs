//! Speculative decoding on real weights, printed as JSON: for prompts that quote their context
//! (code to edit, text to repeat or summarise), greedy generation with and without
//! `--speculative-config` (`ngram`, or `suffix`, whose global tree learns from the responses
//! before), one request at a time, on this machine's CPU. Reports output tok/s of both, their
//! ratio, the drafts' acceptance by position, and checks that both produced the same tokens.
//!
//! ```text
//! cargo run --release -p ferrite-engine --example spec_decode -- \
//!     --model "$(target/release/ferrite default-model)" --method ngram --k 4 --output-len 96
//! ```

use std::error::Error;
use std::time::Instant;

use ferrite_engine::{EngineConfig, PromptInput, SamplingParams, SpeculativeConfig, LLM};
use ferrite_tensor::DType;
use serde_json::json;

const PROMPTS: &[(&str, &str)] = &[
    (
        "code_edit",
        "Here is a Python function:\n\ndef total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        \
         subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n\n\
         The same function with type hints and a docstring:\n\ndef total_price(",
    ),
    (
        "repeat_list",
        "Shopping list: apples, bread, milk, eggs, butter, cheese, tomatoes, onions, rice, coffee, tea, sugar.\n\
         The same shopping list, one item per line:\n- apples\n-",
    ),
    (
        "summary_quote",
        "The committee met on Tuesday to review the budget. After a long discussion, the committee approved \
         the new budget for the library, which adds funding for evening opening hours and for a children's \
         reading program. The committee also asked the treasurer to report on the costs every three months.\n\n\
         Summary, quoting the decision: The committee approved",
    ),
];

fn main() -> Result<(), Box<dyn Error>> {
    let mut model = String::new();
    let (mut k, mut output_len, mut lookup_min, mut lookup_max) = (4usize, 96usize, 2usize, 4usize);
    let mut method = String::from("ngram");
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--model" => model = value,
            "--method" => method = value,
            "--k" => k = value.parse()?,
            "--output-len" => output_len = value.parse()?,
            "--prompt-lookup-min" => lookup_min = value.parse()?,
            "--prompt-lookup-max" => lookup_max = value.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if model.is_empty() {
        return Err("--model is required".into());
    }
    let spec_json = match method.as_str() {
        "ngram" => format!(
            r#"{{"method": "ngram", "num_speculative_tokens": {k}, "prompt_lookup_min": {lookup_min}, "prompt_lookup_max": {lookup_max}}}"#
        ),
        "suffix" => format!(r#"{{"method": "suffix", "num_speculative_tokens": {k}}}"#),
        other => return Err(format!("--method {other}: ngram or suffix").into()),
    };
    let spec = SpeculativeConfig::parse(&spec_json)?;
    let config = EngineConfig { kv_cache_memory: 256 << 20, ..EngineConfig::default() };
    let plain = LLM::new(&model, DType::F32, config.clone())?;
    let speculative = LLM::new(&model, DType::F32, EngineConfig { speculative: Some(spec), ..config })?;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(output_len) };
    let run = |llm: &LLM, prompt: &str| -> Result<(Vec<u32>, f64), Box<dyn Error>> {
        let start = Instant::now();
        let out = llm.generate(vec![PromptInput::Text(prompt.into())], &params)?;
        Ok((out[0].outputs[0].token_ids.clone(), start.elapsed().as_secs_f64()))
    };
    // Warm both engines (thread pools, first allocations) before timing, on a prompt of its own
    // so that no measured response is already in suffix decoding's tree.
    const WARM_UP: &str = "Once upon a time, in a small village by the sea, there lived";
    run(&plain, WARM_UP)?;
    run(&speculative, WARM_UP)?;
    let before = speculative.client().stats().spec_decode;
    let mut cases = Vec::new();
    let (mut plain_s, mut spec_s, mut tokens) = (0.0, 0.0, 0usize);
    for (name, prompt) in PROMPTS {
        let (want, t_plain) = run(&plain, prompt)?;
        let s0 = speculative.client().stats().spec_decode;
        let (got, t_spec) = run(&speculative, prompt)?;
        let s1 = speculative.client().stats().spec_decode;
        if got != want {
            return Err(format!("{name}: speculation changed the output").into());
        }
        plain_s += t_plain;
        spec_s += t_spec;
        tokens += want.len();
        cases.push(json!({
            "prompt": name,
            "output_tokens": want.len(),
            "plain_tok_s": want.len() as f64 / t_plain,
            "speculative_tok_s": got.len() as f64 / t_spec,
            "speedup": t_plain / t_spec,
            "drafts": s1.num_drafts - s0.num_drafts,
            "draft_tokens": s1.num_draft_tokens - s0.num_draft_tokens,
            "accepted_tokens": s1.num_accepted_tokens - s0.num_accepted_tokens,
        }));
    }
    let after = speculative.client().stats().spec_decode;
    let per_pos: Vec<f64> = (0..k)
        .map(|p| {
            let drafts = (after.num_drafts - before.num_drafts).max(1) as f64;
            (after.num_accepted_tokens_per_pos[p] - before.num_accepted_tokens_per_pos[p]) as f64 / drafts
        })
        .collect();
    let report = json!({
        "benchmark": format!("{method} speculative decoding, one request at a time, greedy, f32 on the CPU"),
        "model": model,
        "machine": format!("{} CPU threads ({})", std::thread::available_parallelism()?.get(), std::env::consts::ARCH),
        "baseline": "the same engine without --speculative-config, same run",
        "speculative_config": serde_json::from_str::<serde_json::Value>(&spec_json)?,
        "outputs_identical": true,
        "output_tokens": tokens,
        "plain_tok_s": tokens as f64 / plain_s,
        "speculative_tok_s": tokens as f64 / spec_s,
        "speedup": plain_s / spec_s,
        "acceptance_rate": (after.num_accepted_tokens - before.num_accepted_tokens) as f64
            / (after.num_draft_tokens - before.num_draft_tokens).max(1) as f64,
        "accepted_per_draft_by_position": per_pos,
        "cases": cases,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
