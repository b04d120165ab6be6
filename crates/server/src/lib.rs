//! ferrite's OpenAI-compatible HTTP server, shaped after vLLM's: `/v1/models`,
//! `/v1/completions`, `/v1/chat/completions` (JSON or SSE), `/tokenize`, `/detokenize`,
//! `/health`, `/version` and Prometheus `/metrics`.
//!
//! A request is parsed and validated here, tokenized (chat messages through the model's chat
//! template), and handed to the engine as one engine request per prompt. The engine's delta
//! stream is turned into OpenAI JSON or SSE chunks. Dropping that stream (the client went away,
//! or the handler future was cancelled) aborts the engine request and frees its KV blocks, so
//! no request outlives its connection.

mod admission;
mod chat;
mod completions;
pub mod error;
mod generate;
mod logprobs;
pub mod metrics;
mod params;
pub mod pooling;
pub mod protocol;
mod sse;
mod tokenize;

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferrite_engine::EngineClient;
use ferrite_tokenizer::Tokenizer;
use tokio::net::TcpListener;

use crate::admission::Admission;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protocol::{ModelCard, ModelList, ModelPermission};

/// Bodies above this are refused with 413 before they are parsed (a token-id prompt for a
/// 128k-token context is about 1 MiB of JSON).
const MAX_BODY_BYTES: usize = 64 << 20;

/// What `ferrite serve` decides about the server, apart from the engine.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Names clients may put in `model`; the first is the one responses report.
    pub served_model_names: Vec<String>,
    /// Where the model came from, reported as `root` by `/v1/models`.
    pub model_root: String,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Sequences the engine runs at once (its `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Sequences that may wait beyond those running before new requests get 503.
    pub max_queue: usize,
}

pub struct AppState {
    client: EngineClient,
    tokenizer: Arc<Tokenizer>,
    config: ServerConfig,
    metrics: Metrics,
    admission: Admission,
    max_model_len: usize,
    /// Token ids at or above this are out of vocabulary (the smaller of the tokenizer's and the
    /// model's vocabularies: an id either cannot map would fail in the embedding or detokenizer).
    vocab_bound: usize,
    created: u64,
}

impl AppState {
    pub fn new(client: EngineClient, config: ServerConfig) -> Arc<AppState> {
        let tokenizer = client.tokenizer();
        let max_model_len = client.max_model_len();
        let vocab_bound = tokenizer.vocab_size().min(client.model_info().vocab_size);
        let admission = Admission::new(config.max_num_seqs + config.max_queue);
        Arc::new(AppState {
            client,
            tokenizer,
            config,
            metrics: Metrics::default(),
            admission,
            max_model_len,
            vocab_bound,
            created: unix_now(),
        })
    }

    fn model_name(&self) -> &str {
        self.config.served_model_names.first().map(String::as_str).unwrap_or("")
    }

    /// vLLM answers a `model` it does not serve with 404; an absent `model` means the default.
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if !self.config.served_model_names.iter().any(|n| n == m) => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::not_found(format!("The model `{m}` does not exist."))
            }),
            _ => Ok(()),
        }
    }

    fn check_token_ids(&self, ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
        ids.iter()
            .map(|&id| match u32::try_from(id) {
                Ok(v) if (v as usize) < self.vocab_bound => Ok(v),
                _ => Err(ApiError::invalid(param, format!("Token id {id} is out of vocabulary"))),
            })
            .collect()
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then stops accepting connections and gives in-flight
/// requests up to `grace` to finish before returning.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(state.clone())).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!(in_flight = state.admission.in_flight(), "shutting down: draining in-flight requests");
        let _ = stopping_tx.send(());
    });
    let deadline = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        result = server.into_future() => result,
        () = deadline => {
            tracing::warn!(grace_s = grace.as_secs_f64(), "in-flight requests did not finish in time; closing them");
            Ok(())
        }
    }
}

/// `--api-key` guards the OpenAI routes only (`/v1/...`), as vLLM does: health checks and
/// Prometheus scrapers need no key.
async fn authenticate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        if request.uri().path().starts_with("/v1") {
            let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            let expected = format!("Bearer {key}");
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), expected.as_bytes())) {
                return ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
            }
        }
    }
    next.run(request).await
}

/// Compares without an early exit, so response timing does not reveal how much of a guessed
/// key was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }))
}

async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let data = state
        .config
        .served_model_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created: state.created,
            owned_by: "ferrite",
            root: state.config.model_root.clone(),
            parent: None,
            max_model_len: state.max_model_len,
            permission: vec![ModelPermission {
                id: format!("modelperm-{}", random_id()),
                object: "model_permission",
                created: state.created,
                allow_create_engine: false,
                allow_sampling: true,
                allow_logprobs: true,
                allow_search_indices: false,
                allow_view: true,
                allow_fine_tuning: false,
                organization: "*",
                group: None,
                is_blocking: false,
            }],
        })
        .collect();
    Json(ModelList { object: "list", data })
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    let body = state.metrics.render(state.model_name(), &state.client.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!("Route {} {} not found", request.method(), request.uri().path()))
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("Method {} is not allowed for {}", request.method(), request.uri().path()),
    )
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn key_comparison_needs_equal_length_and_bytes() {
        assert!(constant_time_eq(b"Bearer k", b"Bearer k"));
        assert!(!constant_time_eq(b"Bearer j", b"Bearer k"));
        assert!(!constant_time_eq(b"Bearer", b"Bearer k"));
    }
}
