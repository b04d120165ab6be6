//! Pooling models over HTTP, as vLLM serves them: `POST /v1/embeddings` (OpenAI), `/score` and
//! `/v1/score`, `/rerank`, `/v1/rerank` and `/v2/rerank` (Jina / Cohere shape), `/classify` and
//! `/v1/classify`, plus `/v1/models`, `/health`, `/version` and Prometheus `/metrics`.
//!
//! An embedding model answers embeddings, and scores pairs by the cosine of their embeddings; a
//! classifier answers classify, and (with one label: a cross-encoder) scores pairs read as one
//! sequence, `[CLS] a [SEP] b [SEP]`. Requests are tokenized and validated in the handler, then
//! queued to one batching thread that runs the model over as many queued sequences as fit in its
//! token budget per forward pass.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use ferrite_engine::EngineStats;
use ferrite_models::pooling::{
    classifier_activation, cosine, LoadedPoolingModel, PoolingInput, PoolingTask, ScoreActivation,
};
use ferrite_tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::error::{parse_json, ApiError};
use crate::metrics::{Finish, Metrics};
use crate::protocol::Usage;
use crate::{finish_router, random_id, serve_router, unix_now, with_common_routes, Served, ServedModel, ServerConfig};

/// What `ferrite serve --task` asks of a pooling model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeTask {
    /// Sentence embeddings (`/v1/embeddings`; `/score`, `/rerank` by cosine).
    Embed,
    /// Class probabilities (`/classify`).
    Classify,
    /// Pair relevance (`/score`, `/rerank`) from a one-label cross-encoder.
    Score,
}

impl ServeTask {
    pub fn as_str(self) -> &'static str {
        match self {
            ServeTask::Embed => "embed",
            ServeTask::Classify => "classify",
            ServeTask::Score => "score",
        }
    }

    /// The task a model serves when `--task` is not given: embed for embedding models, score
    /// for one-label classifiers (cross-encoders), classify for the rest.
    pub fn infer(model: &LoadedPoolingModel) -> ServeTask {
        match model.info().task {
            PoolingTask::Embed => ServeTask::Embed,
            PoolingTask::Classify if model.info().labels.len() == 1 => ServeTask::Score,
            PoolingTask::Classify => ServeTask::Classify,
        }
    }

    /// Whether `model` can serve this task (embed needs an embedding model, classify and score
    /// need a classifier; score also accepts an embedding model, by cosine).
    pub fn check(self, model: &LoadedPoolingModel) -> Result<(), String> {
        let arch = &model.info().architecture;
        match (self, model.info().task) {
            (ServeTask::Embed, PoolingTask::Embed) | (ServeTask::Classify, PoolingTask::Classify) => Ok(()),
            (ServeTask::Score, PoolingTask::Embed) => Ok(()),
            (ServeTask::Score, PoolingTask::Classify) if model.info().labels.len() == 1 => Ok(()),
            (ServeTask::Score, PoolingTask::Classify) => Err(format!(
                "--task score needs a cross-encoder with one output label; {arch} has {}",
                model.info().labels.len()
            )),
            (task, kind) => Err(format!(
                "--task {} needs {} model; {arch} is {} model",
                task.as_str(),
                kind_name(task.needs()),
                kind_name(kind)
            )),
        }
    }

    fn needs(self) -> PoolingTask {
        match self {
            ServeTask::Embed => PoolingTask::Embed,
            ServeTask::Classify | ServeTask::Score => PoolingTask::Classify,
        }
    }
}

fn kind_name(kind: PoolingTask) -> &'static str {
    match kind {
        PoolingTask::Embed => "an embedding",
        PoolingTask::Classify => "a classification",
    }
}

/// Sequences queued for the model, and the thread that runs them in batches.
struct Batcher {
    tx: mpsc::Sender<Job>,
    queued: Arc<AtomicUsize>,
    limit: usize,
    counters: Arc<BatchCounters>,
}

/// What the pooling thread reports to `/metrics`.
#[derive(Default)]
struct BatchCounters {
    /// Sequences in the forward pass now running.
    running: AtomicUsize,
    /// Tokens of the sequences the model has run.
    prompt_tokens: AtomicU64,
}

struct Job {
    inputs: Vec<PoolingInput>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// Keeps a request's sequences in the queue count until it is answered or dropped.
struct QueueSlot {
    queued: Arc<AtomicUsize>,
    n: usize,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.n, Ordering::AcqRel);
    }
}

impl Batcher {
    fn start(model: Arc<LoadedPoolingModel>, max_batch_tokens: usize, limit: usize) -> Batcher {
        let (tx, rx) = mpsc::channel::<Job>();
        let counters = Arc::new(BatchCounters::default());
        let worker_counters = counters.clone();
        std::thread::Builder::new()
            .name("ferrite-pooling".into())
            .spawn(move || worker(&model, &rx, max_batch_tokens.max(1), &worker_counters))
            .expect("spawning the pooling thread");
        Batcher { tx, queued: Arc::new(AtomicUsize::new(0)), limit: limit.max(1), counters }
    }

    /// Runs `inputs` (already validated) through the model: one output per input, in order.
    async fn run(&self, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>, ApiError> {
        let n = inputs.len();
        if n > self.limit {
            return Err(ApiError::bad_request(format!(
                "This request has {n} inputs; the server accepts at most {} at once.",
                self.limit
            )));
        }
        let before = self.queued.fetch_add(n, Ordering::AcqRel);
        let _slot = QueueSlot { queued: self.queued.clone(), n };
        if before + n > self.limit {
            return Err(ApiError::unavailable(format!(
                "The server is overloaded ({before} sequences queued, limit {}); retry later.",
                self.limit
            )));
        }
        let (reply, answer) = oneshot::channel();
        self.tx.send(Job { inputs, reply }).map_err(|_| ApiError::internal("the pooling thread has stopped"))?;
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(ApiError::internal(e)),
            Err(_) => Err(ApiError::internal("the pooling thread dropped the request")),
        }
    }
}

/// Takes every job waiting (up to the token budget), runs their sequences in forward passes of
/// at most `max_batch_tokens` tokens each (a longer sequence runs alone), and answers each job.
fn worker(model: &LoadedPoolingModel, rx: &mpsc::Receiver<Job>, max_batch_tokens: usize, counters: &BatchCounters) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match rx.recv() {
                Ok(job) => pending.push_back(job),
                Err(_) => return,
            }
        }
        while let Ok(job) = rx.try_recv() {
            pending.push_back(job);
        }
        // Jobs whose sequences fit the budget together (at least one).
        let mut jobs = Vec::new();
        let mut tokens = 0;
        while let Some(job) = pending.front() {
            let t: usize = job.inputs.iter().map(|s| s.ids.len()).sum();
            if !jobs.is_empty() && tokens + t > max_batch_tokens {
                break;
            }
            tokens += t;
            jobs.push(pending.pop_front().expect("front exists"));
        }
        let jobs: Vec<Job> = jobs.into_iter().filter(|j| !j.reply.is_closed()).collect();
        let flat: Vec<PoolingInput> = jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
        let started = Instant::now();
        counters.running.store(flat.len(), Ordering::Release);
        let result = run_chunks(model, &flat, max_batch_tokens);
        counters.running.store(0, Ordering::Release);
        if result.is_ok() {
            let ran: usize = flat.iter().map(|s| s.ids.len()).sum();
            counters.prompt_tokens.fetch_add(ran as u64, Ordering::Relaxed);
        }
        tracing::debug!(
            requests = jobs.len(),
            sequences = flat.len(),
            tokens,
            ms = started.elapsed().as_millis() as u64,
            "pooling batch"
        );
        match result {
            Ok(outputs) => {
                let mut outputs = outputs.into_iter();
                for job in jobs {
                    let mine: Vec<Vec<f32>> = outputs.by_ref().take(job.inputs.len()).collect();
                    let _ = job.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pooling batch failed");
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

fn run_chunks(
    model: &LoadedPoolingModel,
    flat: &[PoolingInput],
    max_batch_tokens: usize,
) -> Result<Vec<Vec<f32>>, String> {
    let mut out = Vec::with_capacity(flat.len());
    let mut start = 0;
    while start < flat.len() {
        let (mut end, mut tokens) = (start, 0);
        while end < flat.len() && (end == start || tokens + flat[end].ids.len() <= max_batch_tokens) {
            tokens += flat[end].ids.len();
            end += 1;
        }
        out.extend(model.forward(&flat[start..end]).map_err(|e| e.to_string())?);
        start = end;
    }
    Ok(out)
}

pub struct PoolingState {
    model: Arc<LoadedPoolingModel>,
    tokenizer: Arc<Tokenizer>,
    served: ServedModel,
    task: ServeTask,
    batcher: Batcher,
    score_activation: ScoreActivation,
    metrics: Metrics,
}

impl PoolingState {
    /// `max_model_len` caps the tokens of one input (the model's own limit when larger);
    /// `max_batch_tokens` is the token budget of one forward pass.
    pub fn new(
        model: LoadedPoolingModel,
        tokenizer: Tokenizer,
        config: ServerConfig,
        task: ServeTask,
        max_model_len: Option<usize>,
        max_batch_tokens: usize,
    ) -> Result<Arc<PoolingState>, String> {
        task.check(&model)?;
        let model = Arc::new(model);
        let max_model_len = max_model_len.map_or(model.max_model_len, |m| m.min(model.max_model_len));
        let vocab_bound = tokenizer.vocab_size().min(model.info().vocab_size);
        let batcher =
            Batcher::start(model.clone(), max_batch_tokens.max(max_model_len), config.max_num_seqs + config.max_queue);
        Ok(Arc::new(PoolingState {
            score_activation: ScoreActivation::from_config(&model.config),
            model,
            tokenizer: Arc::new(tokenizer),
            served: ServedModel::new(config, max_model_len, vocab_bound),
            task,
            batcher,
            metrics: Metrics::default(),
        }))
    }

    fn is_embedding(&self) -> bool {
        self.model.info().task == PoolingTask::Embed
    }

    /// vLLM's `truncate_prompt_tokens`: -1 means the model's length, larger than it is an error.
    fn truncation(&self, value: Option<i64>) -> Result<Option<usize>, ApiError> {
        match value {
            None => Ok(None),
            Some(-1) => Ok(Some(self.served.max_model_len)),
            Some(k) if k < 1 => {
                Err(ApiError::invalid("truncate_prompt_tokens", format!("truncate_prompt_tokens must be -1 or at least 1, got {k}")))
            }
            Some(k) if k as u64 > self.served.max_model_len as u64 => Err(ApiError::invalid(
                "truncate_prompt_tokens",
                format!(
                    "truncate_prompt_tokens value ({k}) is greater than max_model_len ({}). Please, select a smaller truncation size.",
                    self.served.max_model_len
                ),
            )),
            Some(k) => Ok(Some(k as usize)),
        }
    }

    fn check_length(&self, n: usize, param: &str) -> Result<(), ApiError> {
        if n == 0 {
            return Err(ApiError::invalid(param, "The input is empty (no tokens)."));
        }
        if n > self.served.max_model_len {
            return Err(ApiError::invalid(
                param,
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {n} tokens in the input. Please reduce the length of the input.",
                    self.served.max_model_len
                ),
            ));
        }
        Ok(())
    }

    fn encode_text(
        &self,
        text: &str,
        truncate: Option<usize>,
        add_special: bool,
        param: &str,
    ) -> Result<PoolingInput, ApiError> {
        let ids = if add_special {
            self.tokenizer.encode_truncated(text, truncate)
        } else {
            self.tokenizer.encode(text, false).map(|mut ids| {
                if let Some(k) = truncate {
                    ids.truncate(k);
                }
                ids
            })
        }
        .map_err(|e| ApiError::invalid(param, e.to_string()))?;
        self.check_length(ids.len(), param)?;
        Ok(ids.into())
    }

    fn encode_ids(&self, ids: &[i64], truncate: Option<usize>, param: &str) -> Result<PoolingInput, ApiError> {
        let mut ids = self.served.check_token_ids(ids, param)?;
        if let Some(k) = truncate {
            // vLLM keeps the last `k` tokens of a token-id prompt.
            ids = ids.split_off(ids.len().saturating_sub(k));
        }
        self.check_length(ids.len(), param)?;
        Ok(ids.into())
    }

    fn encode_input(
        &self,
        input: Input,
        truncate: Option<usize>,
        add_special: bool,
    ) -> Result<Vec<PoolingInput>, ApiError> {
        let inputs = match input {
            Input::Text(t) => vec![self.encode_text(&t, truncate, add_special, "input")?],
            Input::Texts(ts) => {
                ts.iter().map(|t| self.encode_text(t, truncate, add_special, "input")).collect::<Result<_, _>>()?
            }
            Input::Ids(ids) => vec![self.encode_ids(&ids, truncate, "input")?],
            Input::IdLists(lists) => {
                lists.iter().map(|ids| self.encode_ids(ids, truncate, "input")).collect::<Result<_, _>>()?
            }
        };
        if inputs.is_empty() {
            return Err(ApiError::invalid("input", "The input list is empty."));
        }
        Ok(inputs)
    }

    fn encode_pair(&self, a: &str, b: &str, truncate: Option<usize>) -> Result<PoolingInput, ApiError> {
        let (ids, type_ids) =
            self.tokenizer.encode_pair(a, b, truncate).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.check_length(ids.len(), "text_2")?;
        Ok(PoolingInput { ids, type_ids: Some(type_ids) })
    }

    /// Relevance of each `(a, b)` pair and the prompt tokens used: a cross-encoder's activated
    /// logit, or the cosine of an embedding model's embeddings.
    async fn score_pairs(
        &self,
        pairs: &[(&str, &str)],
        truncate: Option<usize>,
    ) -> Result<(Vec<f32>, usize), ApiError> {
        if self.is_embedding() {
            let mut inputs = Vec::with_capacity(pairs.len() * 2);
            for (a, b) in pairs {
                inputs.push(self.encode_text(a, truncate, true, "text_1")?);
                inputs.push(self.encode_text(b, truncate, true, "text_2")?);
            }
            let tokens = inputs.iter().map(|s| s.ids.len()).sum();
            let out = self.batcher.run(inputs).await?;
            let scores = out.chunks(2).map(|p| cosine(&p[0], &p[1]) as f32).collect();
            return Ok((scores, tokens));
        }
        if self.model.info().labels.len() != 1 {
            return Err(ApiError::bad_request(format!(
                "Scoring needs a cross-encoder with one output label; this model has {}.",
                self.model.info().labels.len()
            )));
        }
        let inputs: Vec<PoolingInput> =
            pairs.iter().map(|(a, b)| self.encode_pair(a, b, truncate)).collect::<Result<_, _>>()?;
        let tokens = inputs.iter().map(|s| s.ids.len()).sum();
        let out = self.batcher.run(inputs).await?;
        Ok((out.iter().map(|l| self.score_activation.apply(l[0])).collect(), tokens))
    }
}

/// `input`: a string, a list of strings, a list of token ids, or a list of token-id lists.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Input,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
    pub truncate_prompt_tokens: Option<i64>,
    pub add_special_tokens: Option<bool>,
    /// vLLM's override of the pooler's normalisation.
    pub normalize: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum EmbeddingData {
    Float(Vec<f32>),
    /// Little-endian f32 bytes, base64 (what the `openai` client asks for by default).
    Base64(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct Embedding {
    pub index: usize,
    pub object: &'static str,
    pub embedding: EmbeddingData,
}

#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<Embedding>,
    pub usage: Usage,
}

/// `text_1` / `text_2`: one text or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(s) => vec![s],
            Texts::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ScoreRequest {
    pub model: Option<String>,
    pub text_1: Texts,
    pub text_2: Texts,
    pub truncate_prompt_tokens: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoreResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<ScoreData>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// Keep the best `top_n` (0 or absent: all).
    pub top_n: Option<i64>,
    pub return_documents: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankResult {
    pub index: usize,
    pub document: Option<RerankDocument>,
    pub relevance_score: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankUsage {
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClassificationRequest {
    pub model: Option<String>,
    pub input: Input,
    pub truncate_prompt_tokens: Option<i64>,
    pub add_special_tokens: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassificationData {
    pub index: usize,
    pub label: Option<String>,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassificationResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<ClassificationData>,
    pub usage: Usage,
}

fn prompt_tokens(inputs: &[PoolingInput]) -> usize {
    inputs.iter().map(|s| s.ids.len()).sum()
}

fn unsupported(state: &PoolingState, api: &str) -> ApiError {
    ApiError::bad_request(format!(
        "The model does not support {api} API (served with --task {}; {} is {} model)",
        state.task.as_str(),
        state.model.info().architecture,
        kind_name(state.model.info().task)
    ))
}

async fn embeddings(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: EmbeddingRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if !state.is_embedding() {
        return Err(unsupported(&state, "Embeddings"));
    }
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format must be `float` or `base64`, got `{other}`"),
            ))
        }
    };
    let dimensions = match req.dimensions {
        None => None,
        Some(d) => {
            let hidden = state.model.info().hidden_size;
            let d = usize::try_from(d).unwrap_or(0);
            state
                .model
                .pooler
                .check_dimensions(state.served.model_name(), d, hidden)
                .map_err(|m| ApiError::invalid("dimensions", m))?;
            Some(d)
        }
    };
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let inputs = state.encode_input(req.input, truncate, req.add_special_tokens.unwrap_or(true))?;
    let tokens = prompt_tokens(&inputs);
    let outputs = state.batcher.run(inputs).await?;
    let data = outputs
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            state.model.finish_embedding(&mut v, dimensions, req.normalize);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                EmbeddingData::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                EmbeddingData::Float(v)
            };
            Embedding { index, object: "embedding", embedding }
        })
        .collect();
    let response = EmbeddingResponse {
        id: format!("embd-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    };
    Ok(Json(response).into_response())
}

/// vLLM's pairing: one `text_1` against every `text_2`, or two lists of the same length zipped.
fn pairs<'a>(text_1: &'a [String], text_2: &'a [String]) -> Result<Vec<(&'a str, &'a str)>, ApiError> {
    if text_1.is_empty() {
        return Err(ApiError::invalid("text_1", "At least one text element must be given"));
    }
    if text_2.is_empty() {
        return Err(ApiError::invalid("text_2", "At least one text_pair element must be given"));
    }
    if text_1.len() > 1 && text_1.len() != text_2.len() {
        return Err(ApiError::bad_request("text_1 and text_2 lists must have the same length"));
    }
    Ok(text_2
        .iter()
        .enumerate()
        .map(|(i, b)| (text_1[if text_1.len() == 1 { 0 } else { i }].as_str(), b.as_str()))
        .collect())
}

async fn score(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ScoreRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.task == ServeTask::Classify {
        return Err(unsupported(&state, "Score"));
    }
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let (t1, t2) = (req.text_1.into_vec(), req.text_2.into_vec());
    let pairs = pairs(&t1, &t2)?;
    let (scores, tokens) = state.score_pairs(&pairs, truncate).await?;
    let data =
        scores.into_iter().enumerate().map(|(index, score)| ScoreData { index, object: "score", score }).collect();
    Ok(Json(ScoreResponse {
        id: format!("score-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}

async fn rerank(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: RerankRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.task == ServeTask::Classify {
        return Err(unsupported(&state, "Rerank"));
    }
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents", "At least one document must be given"));
    }
    let top_n = match req.top_n {
        None | Some(0) => req.documents.len(),
        Some(n) if n < 0 => return Err(ApiError::invalid("top_n", format!("top_n must be at least 0, got {n}"))),
        Some(n) => (n as usize).min(req.documents.len()),
    };
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let pairs: Vec<(&str, &str)> = req.documents.iter().map(|d| (req.query.as_str(), d.as_str())).collect();
    let (scores, tokens) = state.score_pairs(&pairs, truncate).await?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Best first; equal scores keep document order.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let with_docs = req.return_documents.unwrap_or(true);
    let results = order
        .into_iter()
        .take(top_n)
        .map(|i| RerankResult {
            index: i,
            document: with_docs.then(|| RerankDocument { text: req.documents[i].clone() }),
            relevance_score: scores[i],
        })
        .collect();
    Ok(Json(RerankResponse {
        id: format!("rerank-{}", random_id()),
        model: state.served.model_name().to_owned(),
        usage: RerankUsage { total_tokens: tokens },
        results,
    })
    .into_response())
}

async fn classify(
    State(state): State<Arc<PoolingState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ClassificationRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    if state.is_embedding() {
        return Err(unsupported(&state, "Classification"));
    }
    let truncate = state.truncation(req.truncate_prompt_tokens)?;
    let inputs = state.encode_input(req.input, truncate, req.add_special_tokens.unwrap_or(true))?;
    let tokens = prompt_tokens(&inputs);
    let labels = &state.model.info().labels;
    let data = state
        .batcher
        .run(inputs)
        .await?
        .into_iter()
        .enumerate()
        .map(|(index, logits)| {
            let probs = classifier_activation(&logits);
            let best = probs.iter().enumerate().fold(0, |b, (i, p)| if *p > probs[b] { i } else { b });
            ClassificationData { index, label: labels.get(best).cloned(), num_classes: probs.len(), probs }
        })
        .collect();
    Ok(Json(ClassificationResponse {
        id: format!("classify-{}", random_id()),
        object: "list",
        created: unix_now(),
        model: state.served.model_name().to_owned(),
        data,
        usage: Usage::new(tokens, 0),
    })
    .into_response())
}

impl Served for PoolingState {
    const GENERATES: bool = false;

    fn served(&self) -> &ServedModel {
        &self.served
    }

    fn in_flight(&self) -> usize {
        self.batcher.queued.load(Ordering::Acquire)
    }
}

pub fn pooling_router(state: Arc<PoolingState>) -> Router {
    let routes = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/score", post(score))
        .route("/v1/score", post(score))
        .route("/rerank", post(rerank))
        .route("/v1/rerank", post(rerank))
        .route("/v2/rerank", post(rerank))
        .route("/classify", post(classify))
        .route("/v1/classify", post(classify))
        .route_layer(middleware::from_fn_with_state(state.clone(), record_request))
        .route("/metrics", get(metrics_text));
    finish_router(with_common_routes(routes), state)
}

/// A pooling request's latency and, when it succeeded, its success: a pooling request ends
/// once, so its reason is `stop`, as in vLLM.
async fn record_request(State(state): State<Arc<PoolingState>>, request: Request, next: Next) -> Response {
    let arrival = Instant::now();
    let response = next.run(request).await;
    if response.status().is_success() {
        state.metrics.record_finished(Finish::Stop, arrival, None, 0);
    }
    response
}

/// The generation server's exposition, from the pooling thread's counters: sequences running
/// and queued, prompt tokens, request successes and latencies (no KV cache, no generated tokens).
async fn metrics_text(State(state): State<Arc<PoolingState>>) -> Response {
    let counters = &state.batcher.counters;
    let running = counters.running.load(Ordering::Acquire);
    let stats = EngineStats {
        num_running: running,
        num_waiting: state.batcher.queued.load(Ordering::Acquire).saturating_sub(running),
        prompt_tokens_total: counters.prompt_tokens.load(Ordering::Relaxed),
        ..Default::default()
    };
    let body = state.metrics.render(state.served.model_name(), &stats);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// Serves a pooling model until `shutdown` resolves, then gives in-flight requests up to
/// `grace` to finish.
pub async fn serve_pooling(
    listener: TcpListener,
    state: Arc<PoolingState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    serve_router(listener, pooling_router(state.clone()), state, shutdown, grace).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_take_every_openai_shape() {
        let shape = |j: &str| serde_json::from_str::<EmbeddingRequest>(j).unwrap().input;
        assert!(matches!(shape(r#"{"input":"hi"}"#), Input::Text(_)));
        assert!(matches!(shape(r#"{"input":["a","b"]}"#), Input::Texts(v) if v.len() == 2));
        assert!(matches!(shape(r#"{"input":[1,2,3]}"#), Input::Ids(v) if v == [1, 2, 3]));
        assert!(matches!(shape(r#"{"input":[[1],[2,3]]}"#), Input::IdLists(v) if v.len() == 2));
    }

    #[test]
    fn score_pairs_broadcast_one_query() {
        let one = vec!["q".to_string()];
        let docs = vec!["a".to_string(), "b".to_string()];
        assert_eq!(pairs(&one, &docs).unwrap(), vec![("q", "a"), ("q", "b")]);
        assert_eq!(pairs(&docs, &docs).unwrap(), vec![("a", "a"), ("b", "b")]);
        let three = vec!["x".to_string(), "y".to_string(), "z".to_string()];
        assert!(pairs(&three, &docs).is_err());
        assert!(pairs(&one, &[]).is_err());
    }
}
