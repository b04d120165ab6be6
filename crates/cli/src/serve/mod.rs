//! `ferrite serve`: load a checkpoint, start the engine (generation, or pooling for embedding,
//! classification and scoring models), and serve the OpenAI-compatible API until SIGINT or
//! SIGTERM, then drain in-flight requests (bounded) and exit 0.

mod args;
mod compat;
mod generate;
mod pooling;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ferrite_server::connections::ConnectionLimits;
use ferrite_server::cors::CorsLayer;
use ferrite_server::media::MediaOptions;
use ferrite_server::tls::Tls;
use ferrite_server::{SamplingDefaults, ServerConfig};
use tokio::net::TcpListener;

pub use args::{DTypeArg, DeviceArgs, ServeArgs};
pub use compat::dequantizes;

pub use compat::expand_short_aliases;

/// When `serve` began, for the start-up time the log reports once the server listens.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

pub fn run(mut args: ServeArgs) -> Result<()> {
    STARTED.get_or_init(std::time::Instant::now);
    args.resolve_model()?;
    args.vllm.check(&args.model)?;
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        bail!("--shutdown-timeout must be a non-negative number of seconds");
    }
    let cors = args::cors_layer(&args)?;
    // Checked before the (slow) model load, so that a bad certificate fails at once.
    let tls = match (&args.ssl_certfile, &args.ssl_keyfile) {
        (Some(cert), Some(key)) => {
            Some(Tls::load(cert, key).map_err(anyhow::Error::msg).context("--ssl-certfile/--ssl-keyfile")?)
        }
        _ => None,
    };
    let connections = args.connection_limits()?;
    let media = args.media_options()?;
    match pooling::task(&args)? {
        Some(task) => pooling::run(args, task, Frontend { cors, tls, connections, media }),
        None => generate::run(args, Frontend { cors, tls, connections, media }),
    }
}

/// The HTTP side the flags ask for, checked before the model loads.
pub struct Frontend {
    cors: CorsLayer,
    tls: Option<Tls>,
    connections: ConnectionLimits,
    media: MediaOptions,
}

/// What the flags say about the server, apart from the engine.
fn server_config(args: &ServeArgs, frontend: Frontend, sampling_defaults: SamplingDefaults) -> ServerConfig {
    let model_root = args.model_id.clone();
    let served_model_names =
        if args.served_model_name.is_empty() { vec![model_root.clone()] } else { args.served_model_name.clone() };
    ServerConfig {
        served_model_names,
        model_root,
        api_key: args.api_key(),
        max_num_seqs: args.max_num_seqs,
        max_queue: args.max_queue,
        sampling_defaults,
        cors: frontend.cors,
        tls: frontend.tls,
        request_id_headers: args.enable_request_id_headers,
        log_requests: !args.vllm.disable_log_requests,
        chat: args.vllm.chat_options(),
        connections: frontend.connections,
        media: frontend.media,
    }
}

/// Starts the async runtime, binds `--host`/`--port` and runs `serve` on the listener with the
/// shutdown signal and grace period. Connections still open past the grace period are cut when
/// the runtime shuts down; their engine requests abort as their streams drop.
fn serve_on<F, Fut>(args: &ServeArgs, serve: F) -> Result<()>
where
    F: FnOnce(TcpListener, Duration) -> Fut,
    Fut: Future<Output = std::io::Result<()>>,
{
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let grace = Duration::from_secs_f64(args.shutdown_timeout);
    runtime.block_on(async {
        let addr: SocketAddr = tokio::net::lookup_host((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("resolving --host {}", args.host))?
            .next()
            .with_context(|| format!("--host {} resolves to no address", args.host))?;
        let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let startup_s = STARTED.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
        tracing::info!(model = %args.model.display(), startup_s, "listening on http://{local}");
        serve(listener, grace).await.context("serving")
    })?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
