//! `ferrite generate`: one prompt through the engine, its text streamed to stdout as it is
//! generated, a one-line summary on stderr.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ferrite_engine::{EngineConfig, PromptInput, RequestOutput, SamplingParams, LLM};
use ferrite_tokenizer::ChatMessage;

use crate::serve::{DTypeArg, DeviceArgs};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json) or a .gguf file;
    /// defaults to SmolLM2-135M-Instruct, downloaded on first use.
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long)]
    pub prompt: String,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 keeps every token.
    #[arg(long, default_value_t = 0)]
    pub top_k: i32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past EOS until --max-tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[arg(long, value_enum, default_value = "auto")]
    pub dtype: DTypeArg,
    /// auto, or dequantized to dequantize quantized matrices at load instead of multiplying
    /// them quantized (GGUF blocks on CPU, 4-bit packed weights on CUDA); gguf-dequantized is
    /// its older spelling for a GGUF file.
    #[arg(long, default_value = "auto", value_parser = ["auto", "gguf", "safetensors", "dequantized", "gguf-dequantized"])]
    pub load_format: String,
    /// As `serve --quantization`: the checkpoint's own method when left out, or fp8 to quantize
    /// an unquantized checkpoint as it loads.
    #[arg(long, short = 'q')]
    pub quantization: Option<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Runs synchronously (it blocks on the engine's stream), so call it outside an async runtime.
pub fn run(args: GenerateArgs) -> Result<()> {
    let dtype = args.dtype.dtype_on(args.device.device);
    let config = EngineConfig {
        kv_cache_memory: 1 << 30,
        dequantize_weights: crate::serve::dequantizes(&args.load_format),
        quantization: args.quantization.clone(),
        ..EngineConfig::default()
    };
    let config = args.device.apply(dtype, true, config);
    let model = match &args.model {
        Some(model) => crate::hub::resolve(model, None, None)?,
        None => crate::default_model::resolve()?,
    };
    let llm = LLM::new(&model, dtype, config).with_context(|| format!("loading {}", model.display()))?;
    let prompt = if args.chat {
        let ids = llm
            .tokenizer()
            .encode_chat(&[ChatMessage::new("user", args.prompt.clone())], true)
            .context("rendering the chat template")?;
        PromptInput::Tokens(ids)
    } else {
        PromptInput::Text(args.prompt.clone())
    };
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        max_tokens: Some(args.max_tokens),
        ignore_eos: args.ignore_eos,
        ..SamplingParams::default()
    };
    let mut stream = llm.client().add_request("generate".into(), prompt, params)?;
    let mut stdout = std::io::stdout().lock();
    let mut last: Option<RequestOutput> = None;
    while let Some(out) = stream.blocking_next() {
        for o in &out.outputs {
            stdout.write_all(o.text.as_bytes())?;
        }
        stdout.flush()?;
        last = Some(out);
    }
    writeln!(stdout)?;
    let last = last.context("the engine returned no output")?;
    if let Some(error) = &last.error {
        anyhow::bail!("generation failed: {error}");
    }
    let m = &last.metrics;
    let finish = last.outputs.first().and_then(|o| o.finish_reason).map_or("none", |f| f.as_str());
    let ms = |d: Option<std::time::Duration>| d.map_or("-".to_string(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
    let decode_rate = m
        .time_per_output_token()
        .map_or("-".to_string(), |t| format!("{:.1} tok/s", 1.0 / t.as_secs_f64().max(f64::MIN_POSITIVE)));
    eprintln!(
        "{} prompt + {} generated tokens, finish {finish}; TTFT {}, decode {decode_rate}, total {}",
        last.prompt_token_ids.len(),
        m.num_generation_tokens,
        ms(m.time_to_first_token()),
        ms(m.e2e_latency()),
    );
    Ok(())
}
