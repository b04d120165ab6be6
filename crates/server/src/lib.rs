//! ferrite's OpenAI-compatible HTTP server, shaped after vLLM's: `/v1/models`,
//! `/v1/completions`, `/v1/chat/completions` (JSON or SSE), `/tokenize`, `/detokenize`,
//! `/health`, `/version` and Prometheus `/metrics`.
//!
//! A request is parsed here (wire-format checks only), tokenized (chat messages through the
//! model's chat template), validated once by the engine, and handed to it as one engine request
//! per prompt. The engine's delta
//! stream is turned into OpenAI JSON or SSE chunks. Dropping that stream (the client went away,
//! or the handler future was cancelled) aborts the engine request and frees its KV blocks, so
//! no request outlives its connection.

mod admission;
mod chat;
mod chat_output;
mod completions;
pub mod connections;
pub mod content_format;
pub mod cors;
pub mod error;
mod generate;
pub mod images;
mod logprobs;
pub mod media;
pub mod metrics;
mod params;
mod responses;
pub use params::SamplingDefaults;
pub mod pooling;
pub mod protocol;
mod sse;
mod structured;
pub mod tls;
mod tokenize;

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ferrite_engine::EngineClient;
use ferrite_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tower_http::cors::CorsLayer;

use crate::admission::Admission;
use crate::connections::Bounded;
use crate::content_format::{ContentFormat, ContentFormatOption};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protocol::{ModelCard, ModelList, ModelPermission};

/// Bodies above this are refused with 413 before they are parsed (a token-id prompt for a
/// 128k-token context is about 1 MiB of JSON).
const MAX_BODY_BYTES: usize = 64 << 20;
/// How long requests cut at the shutdown timeout get to send their error to their clients.
const CUT_FLUSH: Duration = Duration::from_secs(1);

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
    /// Sampling values for the fields a request leaves out (the model's generation config).
    pub sampling_defaults: SamplingDefaults,
    /// Cross-origin requests (browsers), as vLLM's `--allowed-origins` and related flags set them.
    pub cors: CorsLayer,
    /// Every response carries `X-Request-Id`: the request's own, else a fresh one (vLLM's
    /// `--enable-request-id-headers`).
    pub request_id_headers: bool,
    /// One log line per request (off with vLLM's `--disable-log-requests`).
    pub log_requests: bool,
    /// HTTPS instead of HTTP (vLLM's `--ssl-certfile` and `--ssl-keyfile`).
    pub tls: Option<tls::Tls>,
    /// Tool calling, reasoning and chat templates from requests.
    pub chat: ChatOptions,
    /// Connections served at once and the keep-alive time of an idle one.
    pub connections: connections::ConnectionLimits,
    /// Images and videos in chat messages: what the model takes and how they are fetched.
    pub media: media::MediaOptions,
}

/// vLLM's chat front-end switches.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    /// `tool_choice: "auto"` (the default with `tools`) is served (`--enable-auto-tool-choice`).
    pub enable_auto_tool_choice: bool,
    /// `--tool-call-parser`: one of `ferrite_parsers::tool::PARSERS`.
    pub tool_call_parser: Option<String>,
    /// `--reasoning-parser`: one of `ferrite_parsers::reasoning::PARSERS`.
    pub reasoning_parser: Option<String>,
    /// A request's own `chat_template` is used (`--trust-request-chat-template`).
    pub trust_request_chat_template: bool,
    /// `tool_choice: "none"` leaves the tools out of the prompt (`--exclude-tools-when-tool-choice-none`).
    pub exclude_tools_when_tool_choice_none: bool,
}

/// What the generation and the pooling server share about the model they serve: the names it
/// answers to, its context length and vocabulary bound, and when it was loaded.
pub(crate) struct ServedModel {
    pub(crate) config: ServerConfig,
    pub(crate) max_model_len: usize,
    /// Token ids at or above this are out of vocabulary (the smaller of the tokenizer's and the
    /// model's vocabularies: an id either cannot map would fail in the embedding or detokenizer).
    pub(crate) vocab_bound: usize,
    pub(crate) created: u64,
}

impl ServedModel {
    pub(crate) fn new(config: ServerConfig, max_model_len: usize, vocab_bound: usize) -> ServedModel {
        ServedModel { config, max_model_len, vocab_bound, created: unix_now() }
    }

    pub(crate) fn model_name(&self) -> &str {
        self.config.served_model_names.first().map(String::as_str).unwrap_or("")
    }

    /// vLLM answers a `model` it does not serve with 404; an absent `model` means the default.
    pub(crate) fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if !self.config.served_model_names.iter().any(|n| n == m) => Err(ApiError {
                param: Some("model".into()),
                ..ApiError::not_found(format!("The model `{m}` does not exist."))
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn check_token_ids(&self, ids: &[i64], param: &str) -> Result<Vec<u32>, ApiError> {
        ids.iter()
            .map(|&id| match u32::try_from(id) {
                Ok(v) if (v as usize) < self.vocab_bound => Ok(v),
                _ => Err(ApiError::invalid(param, format!("Token id {id} is out of vocabulary"))),
            })
            .collect()
    }
}

/// A server's state as the routes, middleware and shutdown that both servers share see it.
pub(crate) trait Served: Send + Sync + 'static {
    /// Whether the model generates text: `/v1/models` then allows sampling and logprobs.
    const GENERATES: bool;

    fn served(&self) -> &ServedModel;

    /// Sequences admitted and not yet answered, logged when shutdown starts draining.
    fn in_flight(&self) -> usize;

    /// Ends the requests still open when the shutdown timeout expires, each with an error its
    /// client can read (a stream's error event and `[DONE]`).
    fn cut_open_requests(&self) {}
}

pub struct AppState {
    client: EngineClient,
    tokenizer: Arc<Tokenizer>,
    served: ServedModel,
    metrics: Metrics,
    admission: Admission,
    /// Set when the shutdown timeout expires: open requests end with an error.
    closing: tokio::sync::watch::Sender<bool>,
    /// `/v1/responses` kept for `previous_response_id`.
    responses: responses::Store,
    /// Fetches the media of chat messages.
    media: media::Fetcher,
    /// How message content reaches the model's own chat template (a request's template is
    /// resolved on its own).
    content_format: ContentFormat,
}

impl AppState {
    pub fn new(client: EngineClient, config: ServerConfig) -> Arc<AppState> {
        let tokenizer = client.tokenizer();
        let max_model_len = client.max_model_len();
        let vocab_bound = tokenizer.vocab_size().min(client.model_info().vocab_size);
        let admission = Admission::new(config.max_num_seqs + config.max_queue);
        let media = media::Fetcher::new(&config.media);
        let content_format = match tokenizer.chat_template() {
            Some(template) => {
                let format = config.media.content_format.resolve(template.source());
                if config.media.content_format == ContentFormatOption::Auto {
                    tracing::info!(
                        format = format.name(),
                        "detected the chat template's content format; --chat-template-content-format overrides it"
                    );
                }
                format
            }
            None => ContentFormat::String,
        };
        Arc::new(AppState {
            client,
            tokenizer,
            served: ServedModel::new(config, max_model_len, vocab_bound),
            metrics: Metrics::new(max_model_len),
            admission,
            closing: tokio::sync::watch::Sender::new(false),
            responses: responses::Store::default(),
            media,
            content_format,
        })
    }
}

impl Served for AppState {
    const GENERATES: bool = true;

    fn served(&self) -> &ServedModel {
        &self.served
    }

    fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    fn cut_open_requests(&self) {
        self.closing.send_replace(true);
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

pub fn router(state: Arc<AppState>) -> Router {
    let routes = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/responses", post(responses::handle))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize));
    finish_router(with_common_routes(routes), state)
}

/// Adds what both servers answer besides their own routes: `/health`, `/version`,
/// `/v1/models`, a JSON 404 for any other path and a JSON 405 for a wrong method.
pub(crate) fn with_common_routes<S: Served>(routes: Router<Arc<S>>) -> Router<Arc<S>> {
    routes
        .route("/health", get(health))
        // vLLM's SageMaker-style liveness route, as /health.
        .route("/ping", get(health).post(health))
        .route("/load", get(load::<S>))
        .route("/server_info", get(server_info::<S>))
        .route("/version", get(version))
        .route("/v1/models", get(models::<S>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

/// Puts the API-key check, the body limit and, when asked for, the request-id header in front
/// of every route, CORS in front of them all (a browser's preflight carries no key), then the
/// state.
pub(crate) fn finish_router<S: Served>(routes: Router<Arc<S>>, state: Arc<S>) -> Router {
    let config = &state.served().config;
    let routes = routes
        .layer(middleware::from_fn_with_state(state.clone(), authenticate::<S>))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES));
    let routes = if config.request_id_headers { routes.layer(middleware::from_fn(request_id_header)) } else { routes };
    routes.layer(config.cors.clone()).with_state(state)
}

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

async fn request_id_header(request: Request, next: Next) -> Response {
    let given = request.headers().get(&X_REQUEST_ID).cloned();
    let mut response = next.run(request).await;
    if let Some(id) = given.or_else(|| HeaderValue::try_from(random_id()).ok()) {
        response.headers_mut().insert(X_REQUEST_ID, id);
    }
    response
}

/// Serves until `shutdown` resolves, then stops accepting connections and gives in-flight
/// requests up to `grace` to finish before returning.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    serve_router(listener, router(state.clone()), state, shutdown, grace).await
}

/// `serve` and `pooling::serve_pooling` alike: serves `app` (over TLS when the config has it)
/// until `shutdown` resolves, then drains in-flight requests for up to `grace`.
pub(crate) async fn serve_router<S: Served>(
    listener: TcpListener,
    app: Router,
    state: Arc<S>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let limits = state.served().config.connections;
    match state.served().config.tls.clone() {
        Some(tls) => serve_on(Bounded::new(tls.listen(listener)?, limits), app, state, shutdown, grace).await,
        None => {
            // Without TCP_NODELAY the first streamed chunk after the response headers waits for
            // the client's delayed ACK (40 ms on Linux): that was the whole TTFT of a short prompt.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
                }
            });
            serve_on(Bounded::new(listener, limits), app, state, shutdown, grace).await
        }
    }
}

async fn serve_on<S: Served, L>(
    listener: Bounded<L>,
    app: Router,
    state: Arc<S>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let drained = state.clone();
    let app = app.layer(middleware::from_fn(connections::track_requests));
    let app = app.into_make_service_with_connect_info::<connections::Connection>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!(in_flight = drained.in_flight(), "shutting down: draining in-flight requests");
        let _ = stopping_tx.send(());
    });
    let deadline = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return result,
        () = deadline => {}
    }
    tracing::warn!(grace_s = grace.as_secs_f64(), "in-flight requests did not finish in time; closing them");
    state.cut_open_requests();
    // The cut requests send their last events; connections still open after that are closed.
    let _ = tokio::time::timeout(CUT_FLUSH, &mut server).await;
    Ok(())
}

/// `--api-key` guards the OpenAI routes only (`/v1/...`), as vLLM does: health checks and
/// Prometheus scrapers need no key.
async fn authenticate<S: Served>(State(state): State<Arc<S>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.served().config.api_key {
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

/// vLLM's `/server_info`: what the server was started with (the settings a client can act on).
async fn server_info<S: Served>(State(state): State<Arc<S>>) -> Json<serde_json::Value> {
    let served = state.served();
    let c = &served.config;
    Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "model": c.model_root,
        "served_model_names": c.served_model_names,
        "max_model_len": served.max_model_len,
        "max_num_seqs": c.max_num_seqs,
        "max_queue": c.max_queue,
        "generates": S::GENERATES,
        "api_key_required": c.api_key.is_some(),
    }))
}

/// vLLM's `/load`: the requests the server is working on.
async fn load<S: Served>(State(state): State<Arc<S>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "server_load": state.in_flight() }))
}

/// Runs CPU-heavy request work (JSON parsing, chat templates, tokenization of long prompts) on
/// the blocking pool: on the async runtime, two 10 MB prompts froze `/health` for seconds.
pub(crate) async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| ApiError::internal(format!("request worker failed: {e}")))?
}

async fn version() -> Json<serde_json::Value> {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") }))
}

async fn models<S: Served>(State(state): State<Arc<S>>) -> Json<ModelList> {
    let served = state.served();
    let data = served
        .config
        .served_model_names
        .iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created: served.created,
            owned_by: "ferrite",
            root: served.config.model_root.clone(),
            parent: None,
            max_model_len: served.max_model_len,
            permission: vec![ModelPermission {
                id: format!("modelperm-{}", random_id()),
                object: "model_permission",
                created: served.created,
                allow_create_engine: false,
                allow_sampling: S::GENERATES,
                allow_logprobs: S::GENERATES,
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
    let body = state.metrics.render(state.served.model_name(), &state.client.stats());
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
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A state with no model behind it, to exercise the shared routes and middleware alone.
    struct Bare {
        served: ServedModel,
    }

    impl Served for Bare {
        const GENERATES: bool = false;

        fn served(&self) -> &ServedModel {
            &self.served
        }

        fn in_flight(&self) -> usize {
            0
        }
    }

    /// One model named `m`, no key, vLLM's CORS defaults, no request-id headers.
    fn config() -> ServerConfig {
        ServerConfig {
            served_model_names: vec!["m".into()],
            model_root: String::new(),
            api_key: None,
            max_num_seqs: 1,
            max_queue: 0,
            sampling_defaults: Default::default(),
            cors: cors::Cors::default().layer().unwrap(),
            request_id_headers: false,
            log_requests: true,
            tls: None,
            chat: ChatOptions::default(),
            connections: connections::ConnectionLimits {
                max_connections: 4,
                keep_alive: connections::DEFAULT_KEEP_ALIVE,
            },
            media: Default::default(),
        }
    }

    /// `app` served on a loopback port.
    struct Server {
        addr: std::net::SocketAddr,
    }

    impl Server {
        async fn start(app: Router) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            Server { addr }
        }

        /// One HTTP/1.1 request with an empty body: the status and the response body.
        async fn request(&self, method: &str, path: &str, auth: Option<&str>) -> (u16, String) {
            let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
            let (status, _, body) = self.exchange(method, path, &auth).await;
            (status, body)
        }

        /// A request with `extra` header lines: the status, the lowercased response head, the body.
        async fn exchange(&self, method: &str, path: &str, extra: &str) -> (u16, String, String) {
            let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
            let head =
                format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n{extra}\r\n");
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut raw = String::new();
            stream.read_to_string(&mut raw).await.unwrap();
            let status = raw[9..12].parse().unwrap();
            let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
            (status, head.to_ascii_lowercase(), body.to_string())
        }
    }

    #[tokio::test]
    async fn shared_routes_answer_with_json_errors_and_check_the_key_on_v1() {
        let config = ServerConfig {
            served_model_names: vec!["m".into(), "alias".into()],
            model_root: "/models/m".into(),
            api_key: Some("k".into()),
            request_id_headers: true,
            ..config()
        };
        let state = Arc::new(Bare { served: ServedModel::new(config, 128, 1000) });
        let routes = Router::new().route("/v1/echo", post(|| async { "echo" }));
        let server = Server::start(finish_router(with_common_routes(routes), state)).await;

        assert_eq!(server.request("GET", "/health", None).await, (200, String::new()));
        let (status, body) = server.request("GET", "/version", None).await;
        assert_eq!(status, 200);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["version"], env!("CARGO_PKG_VERSION"));

        for auth in [None, Some("Bearer j"), Some("Bearer kk"), Some("k")] {
            let (status, body) = server.request("GET", "/v1/models", auth).await;
            assert_eq!(status, 401, "{auth:?}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["type"], "AuthenticationError");
            assert_eq!(v["error"]["message"], "Unauthorized");
        }
        let (status, body) = server.request("GET", "/v1/models", Some("Bearer k")).await;
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["m", "alias"]);
        assert_eq!(v["data"][0]["root"], "/models/m");
        assert_eq!(v["data"][0]["max_model_len"], 128);
        assert_eq!(v["data"][0]["permission"][0]["allow_sampling"], false);
        assert_eq!(server.request("POST", "/v1/echo", Some("Bearer k")).await, (200, "echo".into()));

        // The key guards /v1 only; unknown paths are a JSON 404 either way.
        let (status, body) = server.request("GET", "/nope", None).await;
        assert_eq!(status, 404);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["message"], "Route GET /nope not found");
        assert_eq!(v["error"]["type"], "NotFoundError");
        assert_eq!(server.request("GET", "/v1/nope", None).await.0, 401);
        assert_eq!(server.request("GET", "/v1/nope", Some("Bearer k")).await.0, 404);

        // Request ids: the client's is echoed, else each response gets a fresh one.
        let (_, head, _) = server.exchange("GET", "/health", "X-Request-Id: abc-1\r\n").await;
        assert!(head.contains("\r\nx-request-id: abc-1"), "{head}");
        let id = |head: String| head.lines().find_map(|l| l.strip_prefix("x-request-id: ").map(str::to_string));
        let (first, second) =
            (id(server.exchange("GET", "/health", "").await.1), id(server.exchange("GET", "/health", "").await.1));
        assert!(first.as_ref().is_some_and(|f| f.len() == 32) && first != second, "{first:?} {second:?}");

        // A browser's preflight needs no key; the answers (errors included) carry CORS headers.
        let preflight = "Origin: http://app.example\r\nAccess-Control-Request-Method: POST\r\n";
        let (status, head, _) = server.exchange("OPTIONS", "/v1/chat/completions", preflight).await;
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("access-control-allow-origin: *"), "{head}");
        assert!(head.contains("access-control-allow-methods: *"), "{head}");
        let (status, head, _) = server.exchange("GET", "/v1/models", "Origin: http://app.example\r\n").await;
        assert_eq!(status, 401);
        assert!(head.contains("access-control-allow-origin: *"), "{head}");
    }

    #[tokio::test]
    async fn cors_lists_and_credentials_follow_the_flags() {
        let cors = cors::Cors {
            allowed_origins: vec!["http://good.example".into()],
            allow_credentials: true,
            allowed_methods: vec!["post".into()],
            allowed_headers: vec!["*".into()],
        };
        let config = ServerConfig { cors: cors.layer().unwrap(), ..config() };
        let state = Arc::new(Bare { served: ServedModel::new(config, 128, 1000) });
        let server = Server::start(finish_router(with_common_routes(Router::new()), state)).await;
        let ask = |origin: &str| {
            format!("Origin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: x-custom\r\n")
        };
        let (_, head, _) = server.exchange("OPTIONS", "/v1/models", &ask("http://good.example")).await;
        assert!(head.contains("access-control-allow-origin: http://good.example"), "{head}");
        assert!(head.contains("access-control-allow-credentials: true"), "{head}");
        assert!(head.contains("access-control-allow-methods: post"), "{head}");
        assert!(head.contains("access-control-allow-headers: x-custom"), "{head}");
        let (_, head, _) = server.exchange("OPTIONS", "/v1/models", &ask("http://evil.example")).await;
        assert!(!head.contains("access-control-allow-origin"), "{head}");
        let (_, head, _) = server.exchange("GET", "/health", "X-Request-Id: abc\r\n").await;
        assert!(!head.contains("x-request-id"), "{head}");
    }

    /// Two connection slots and a 300 ms keep-alive: silent and trickling clients are closed,
    /// which frees the slot a waiting client needs; a request slower than the keep-alive is
    /// not cut.
    #[tokio::test]
    async fn idle_connections_are_closed_and_their_slots_reused() {
        let limits = connections::ConnectionLimits { max_connections: 2, keep_alive: Duration::from_millis(300) };
        let state =
            Arc::new(Bare { served: ServedModel::new(ServerConfig { connections: limits, ..config() }, 128, 1000) });
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            "done"
        };
        let app = finish_router(with_common_routes(Router::new().route("/slow", get(slow))), state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let never = std::future::pending::<()>();
        tokio::spawn(serve_router(listener, app, state, never, Duration::from_secs(1)));
        let connect = || tokio::net::TcpStream::connect(addr);
        let read_all = |mut c: tokio::net::TcpStream| async move {
            let mut out = String::new();
            tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut out)).await.unwrap().unwrap();
            out
        };

        // Two silent clients hold both slots; a third client's request waits until they are cut.
        let (silent_a, silent_b) = (connect().await.unwrap(), connect().await.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut third = connect().await.unwrap();
        third.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let started = std::time::Instant::now();
        assert!(read_all(third).await.starts_with("HTTP/1.1 200"));
        assert!(started.elapsed() >= Duration::from_millis(200), "answered before a slot was free");
        assert_eq!(read_all(silent_a).await, "");
        assert_eq!(read_all(silent_b).await, "");

        // A client trickling its request head is cut, though bytes keep arriving.
        let mut trickle = connect().await.unwrap();
        trickle.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
        let mut cut = false;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if trickle.write_all(b"X-A: b\r\n").await.is_err() {
                cut = true;
                break;
            }
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), trickle.read_to_end(&mut rest)).await.unwrap();
        assert!(cut || read.is_err() || rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));

        // A request served for longer than the keep-alive is answered, and the idle connection
        // after it is closed.
        let mut keep = connect().await.unwrap();
        keep.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let answer = read_all(keep).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"), "{answer}");
    }

    #[test]
    fn served_model_checks_names_and_token_ids() {
        let config = config();
        let served = ServedModel::new(config, 16, 10);
        assert_eq!(served.model_name(), "m");
        assert!(served.check_model(None).is_ok() && served.check_model(Some("m")).is_ok());
        let e = served.check_model(Some("x")).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (StatusCode::NOT_FOUND, Some("model")));
        assert_eq!(served.check_token_ids(&[0, 9], "p").unwrap(), [0, 9]);
        for bad in [10, -1, 1 << 40] {
            assert_eq!(served.check_token_ids(&[bad], "p").unwrap_err().param.as_deref(), Some("p"));
        }
    }

    #[test]
    fn key_comparison_needs_equal_length_and_bytes() {
        assert!(constant_time_eq(b"Bearer k", b"Bearer k"));
        assert!(!constant_time_eq(b"Bearer j", b"Bearer k"));
        assert!(!constant_time_eq(b"Bearer", b"Bearer k"));
    }
}
