//! `ferrite serve` for pooling models (`--task embed|classify|score`, or inferred from an
//! encoder architecture such as `BertModel`): the embeddings / score / rerank / classify API of
//! `ferrite_server::pooling` instead of the generation engine.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::ValueEnum;
use ferrite_models::config::RawConfig;
use ferrite_models::pooling::{self, load_pooling_model};
use ferrite_models::LoadOptions;
use ferrite_server::cors::CorsLayer;
use ferrite_server::pooling::{PoolingState, ServeTask};
use ferrite_server::ServerConfig;
use ferrite_tokenizer::Tokenizer;

use crate::serve::ServeArgs;

/// What `ferrite serve` runs the model for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    /// Text generation (/v1/completions, /v1/chat/completions).
    Generate,
    /// Sentence embeddings (/v1/embeddings; /score and /rerank by cosine).
    Embed,
    /// Class probabilities (/classify).
    Classify,
    /// Pair relevance from a cross-encoder (/score, /rerank).
    Score,
}

/// The pooling task to serve, `Some(None)` to infer it from the model, or `None` for generation.
/// Without `--task`, an architecture that only has a pooling constructor is a pooling model.
pub fn pooling_task(args: &ServeArgs) -> Result<Option<Option<ServeTask>>> {
    Ok(match args.task {
        Some(TaskArg::Generate) => None,
        Some(TaskArg::Embed) => Some(Some(ServeTask::Embed)),
        Some(TaskArg::Classify) => Some(Some(ServeTask::Classify)),
        Some(TaskArg::Score) => Some(Some(ServeTask::Score)),
        None => {
            let config = args.model.join("config.json");
            if args.model.is_dir() && config.exists() {
                let arch = RawConfig::from_file(&config)?.architecture()?;
                pooling::is_pooling_only(&arch).then_some(None)
            } else {
                None
            }
        }
    })
}

pub fn run(args: ServeArgs, task: Option<ServeTask>, cors: CorsLayer) -> Result<()> {
    let model_root = args.model.display().to_string();
    if !args.model.is_dir() {
        bail!("pooling models load from a checkpoint directory (config.json + safetensors), not {model_root}");
    }
    if args.device.device != ferrite_tensor::Device::Cpu {
        bail!("pooling models run on the CPU only (--device {:?} is for generative models)", args.device.device);
    }
    let opts = LoadOptions { dtype: args.dtype.dtype(), progress: true, ..Default::default() };
    let model = load_pooling_model(&args.model, &opts).with_context(|| format!("loading {model_root}"))?;
    let tokenizer = Tokenizer::from_dir(Path::new(&args.model))
        .with_context(|| format!("loading the tokenizer of {model_root}"))?;
    let task = task.unwrap_or_else(|| ServeTask::infer(&model));
    let served_model_names =
        if args.served_model_name.is_empty() { vec![model_root.clone()] } else { args.served_model_name.clone() };
    let config = ServerConfig {
        served_model_names,
        model_root,
        api_key: args.api_key.clone(),
        max_num_seqs: args.max_num_seqs,
        max_queue: args.max_queue,
        sampling_defaults: Default::default(),
        cors,
        request_id_headers: args.enable_request_id_headers,
    };
    tracing::info!(
        task = task.as_str(),
        arch = %model.info().architecture,
        pooling = model.pooler.pooling.as_str(),
        normalize = model.pooler.normalize,
        "serving a pooling model"
    );
    let state = PoolingState::new(model, tokenizer, config, task, args.max_model_len, args.max_num_batched_tokens)
        .map_err(anyhow::Error::msg)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let grace = Duration::from_secs_f64(args.shutdown_timeout);
    runtime.block_on(async {
        let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("resolving --host {}", args.host))?
            .next()
            .with_context(|| format!("--host {} resolves to no address", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        tracing::info!(model = %args.model.display(), "listening on http://{local}");
        ferrite_server::pooling::serve_pooling(listener, state, crate::serve::shutdown_signal(), grace)
            .await
            .context("serving")
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    tracing::info!("server stopped");
    Ok(())
}
