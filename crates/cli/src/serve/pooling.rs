//! `ferrite serve` for pooling models (`--task embed|classify|score`, or inferred from an
//! encoder architecture such as `BertModel`): the embeddings / score / rerank / classify API of
//! `ferrite_server::pooling` over the engine's pooling engine.

use anyhow::{bail, Context, Result};
use ferrite_engine::pooling::{is_pooling_only, ServeTask};
use ferrite_engine::{Device, PoolingConfig, PoolingEngine};
use ferrite_server::pooling::PoolingState;

use super::args::{ServeArgs, TaskArg};

/// The pooling task to serve, `Some(None)` to infer it from the model, or `None` for generation.
/// Without `--task`, an architecture that only has a pooling constructor is a pooling model.
pub fn task(args: &ServeArgs) -> Result<Option<Option<ServeTask>>> {
    Ok(match args.task {
        Some(TaskArg::Generate) => None,
        Some(TaskArg::Embed) => Some(Some(ServeTask::Embed)),
        Some(TaskArg::Classify) => Some(Some(ServeTask::Classify)),
        Some(TaskArg::Score) => Some(Some(ServeTask::Score)),
        None => is_pooling_only(&args.model)?.then_some(None),
    })
}

pub fn run(args: ServeArgs, task: Option<ServeTask>, frontend: super::Frontend) -> Result<()> {
    let model_root = args.model.display().to_string();
    if !args.model.is_dir() {
        bail!("pooling models load from a checkpoint directory (config.json + safetensors), not {model_root}");
    }
    if args.tokenizer.is_some() || args.chat_template.is_some() {
        bail!("--tokenizer and --chat-template are for generative models; pooling models use their own tokenizer");
    }
    if args.device.device != Device::Cpu {
        bail!("pooling models run on the CPU only (--device {:?} is for generative models)", args.device.device);
    }
    let config = PoolingConfig {
        max_model_len: args.max_model_len,
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs: args.max_num_seqs,
        max_queue: args.max_queue,
    };
    let engine = PoolingEngine::load(&args.model, args.dtype.dtype(), task, config)
        .with_context(|| format!("loading {model_root}"))?;
    let state = PoolingState::new(engine.client(), super::server_config(&args, frontend, Default::default()));
    super::serve_on(&args, |listener, grace| {
        ferrite_server::pooling::serve_pooling(listener, state, super::args::shutdown_signal(), grace)
    })?;
    drop(engine);
    tracing::info!("server stopped");
    Ok(())
}
