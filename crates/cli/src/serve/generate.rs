//! `ferrite serve` for text generation: `/v1/completions` and `/v1/chat/completions` over the
//! generation engine.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferrite_engine::{EngineConfig, SpeculativeConfig, LLM};
use ferrite_server::images::ImageProcessing;
use ferrite_server::media::ModelMedia;
use ferrite_server::{AppState, SamplingDefaults};

use super::ServeArgs;

pub fn run(args: ServeArgs, frontend: super::Frontend) -> Result<()> {
    // Before the (slow) model load, so that a bad --generation-config fails at once.
    let sampling_defaults = sampling_defaults(&args)?;
    let speculative = args.vllm.speculative_config.as_deref().map(SpeculativeConfig::parse).transpose()?;
    let dtype = args.dtype.dtype_on(args.device.device);
    let config = EngineConfig {
        block_size: args.block_size,
        kv_cache_memory: args.kv_cache_memory.unwrap_or(EngineConfig::default().kv_cache_memory),
        max_num_batched_tokens: args.max_num_batched_tokens,
        disable_chunked_mm_input: args.vllm.disable_chunked_mm_input,
        max_num_seqs: args.max_num_seqs,
        max_model_len: args.max_model_len,
        enable_prefix_caching: !args.no_enable_prefix_caching,
        seed: args.seed,
        max_logprobs: args.max_logprobs()?,
        structured_outputs: args.vllm.structured_outputs()?,
        max_unread_outputs: Some(EngineConfig::SERVER_MAX_UNREAD_OUTPUTS),
        quantization: args.vllm.quantization.clone(),
        dequantize_weights: super::compat::dequantizes(&args.vllm.load_format),
        speculative,
        ..EngineConfig::default()
    };
    let mut config = args.device.apply(dtype, args.kv_cache_memory.is_some(), config);
    config.kv_cache_dtype = args.vllm.kv_cache_dtype(dtype, args.device.device)?;
    let overrides = args.tokenizer_overrides()?;
    let llm = LLM::with_tokenizer(&args.model, dtype, config, &overrides)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let mut frontend = frontend;
    if let Some(vision) = &llm.client().model_info().vision {
        frontend.media.model = vision_media(&args, vision)?;
    }
    let state = AppState::new(llm.client(), super::server_config(&args, frontend, sampling_defaults));
    super::serve_on(&args, |listener, grace| {
        ferrite_server::serve(listener, state, super::args::shutdown_signal(), grace)
    })?;
    // The engine stops only after the server's connections are gone.
    drop(llm);
    tracing::info!("server stopped");
    Ok(())
}

/// What a vision-language model takes: images (and videos), through its processors, and the text
/// an image or a video stands as in a string-content chat template.
fn vision_media(args: &ServeArgs, vision: &ferrite_engine::VisionInfo) -> Result<ModelMedia> {
    let processing =
        ImageProcessing::from_model_dir(&args.model, vision.image_token_id, vision.patch_size, vision.video_token_id)
            .map_err(anyhow::Error::msg)?;
    Ok(ModelMedia {
        accepts_images: true,
        image_placeholder: Some(vision.placeholder.into()),
        video_placeholder: vision.video_placeholder.map(Into::into),
        images: Some(Arc::new(processing)),
    })
}

/// The sampling defaults `--generation-config` asks for.
fn sampling_defaults(args: &ServeArgs) -> Result<SamplingDefaults> {
    let dir = match args.generation_config.as_str() {
        "vllm" => return Ok(SamplingDefaults::default()),
        // A GGUF file carries no generation config.
        "auto" if !args.model.is_dir() => return Ok(SamplingDefaults::default()),
        "auto" => args.model.clone(),
        other => PathBuf::from(other),
    };
    let file = dir.join("generation_config.json");
    if !file.exists() {
        if args.generation_config != "auto" {
            bail!("--generation-config {}: no generation_config.json there", args.generation_config);
        }
        return Ok(SamplingDefaults::default());
    }
    let name = file.display().to_string();
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {name}"))?;
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parsing {name}"))?;
    let defaults = SamplingDefaults::from_generation_config(&value, &name).map_err(anyhow::Error::msg)?;
    if !defaults.is_empty() {
        tracing::warn!(
            ?defaults,
            "sampling defaults overridden by the model's generation config; --generation-config vllm keeps the engine's"
        );
    }
    Ok(defaults)
}
