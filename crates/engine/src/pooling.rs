//! Pooling models (embedding, classification, cross-encoder scoring) run by the engine: a
//! [`PoolingEngine`] owns one batching thread that runs the model over as many queued sequences
//! as fit its token budget per forward pass, and [`PoolingClient`]s (the server) queue already
//! tokenized sequences to it, with the same admission bound and counters as generation.
//!
//! Pooling runs beside the generation [`Scheduler`](crate::core::Scheduler), not through
//! it: a pooling request is one prefill with no KV cache to keep, so it needs none of the
//! scheduler's block accounting, chunking or preemption.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use ferrite_models::pooling::{LoadedPoolingModel, PoolerConfig, PoolingInfo};
use ferrite_models::LoadOptions;
use ferrite_tensor::DType;
use ferrite_tokenizer::Tokenizer;
use tokio::sync::oneshot;

use crate::engine::EngineStats;
use crate::error::{EngineError, Result};

pub use ferrite_models::pooling::{classifier_activation, cosine, PoolingInput, PoolingTask, ScoreActivation};

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
    pub fn infer(info: &PoolingInfo) -> ServeTask {
        match info.task {
            PoolingTask::Embed => ServeTask::Embed,
            PoolingTask::Classify if info.labels.len() == 1 => ServeTask::Score,
            PoolingTask::Classify => ServeTask::Classify,
        }
    }

    /// Whether a model can serve this task (embed needs an embedding model, classify and score
    /// need a classifier; score also accepts an embedding model, by cosine).
    pub fn check(self, info: &PoolingInfo) -> std::result::Result<(), String> {
        let arch = &info.architecture;
        match (self, info.task) {
            (ServeTask::Embed, PoolingTask::Embed) | (ServeTask::Classify, PoolingTask::Classify) => Ok(()),
            (ServeTask::Score, PoolingTask::Embed) => Ok(()),
            (ServeTask::Score, PoolingTask::Classify) if info.labels.len() == 1 => Ok(()),
            (ServeTask::Score, PoolingTask::Classify) => Err(format!(
                "--task score needs a cross-encoder with one output label; {arch} has {}",
                info.labels.len()
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

/// "an embedding" / "a classification", for messages that say what a model is.
pub fn kind_name(kind: PoolingTask) -> &'static str {
    match kind {
        PoolingTask::Embed => "an embedding",
        PoolingTask::Classify => "a classification",
    }
}

/// Whether the checkpoint directory `dir` holds a model that only has a pooling constructor (an
/// encoder such as `BertModel`), and so is served as a pooling model without `--task`.
pub fn is_pooling_only(dir: &Path) -> Result<bool> {
    let config = dir.join("config.json");
    if !(dir.is_dir() && config.exists()) {
        return Ok(false);
    }
    let arch = ferrite_models::loading::config::RawConfig::from_file(&config)?.architecture()?;
    Ok(ferrite_models::registry::is_pooling_only(&arch))
}

/// How a pooling engine batches and admits requests.
#[derive(Debug, Clone, Copy)]
pub struct PoolingConfig {
    /// Caps the tokens of one input (the model's own limit when larger).
    pub max_model_len: Option<usize>,
    /// The token budget of one forward pass (at least one input's worth).
    pub max_num_batched_tokens: usize,
    /// Sequences queued or running at once beyond which requests are refused, as
    /// `max_num_seqs + max_queue` bounds generation.
    pub max_num_seqs: usize,
    pub max_queue: usize,
}

struct Job {
    inputs: Vec<PoolingInput>,
    reply: oneshot::Sender<std::result::Result<Vec<Vec<f32>>, String>>,
}

enum Command {
    Run(Job),
    Shutdown,
}

/// What the pooling thread reports to `/metrics`.
#[derive(Default)]
struct Counters {
    /// Sequences in the forward pass now running.
    running: AtomicUsize,
    /// Tokens of the sequences the model has run.
    prompt_tokens: AtomicU64,
    /// Sequences admitted and not yet answered.
    queued: AtomicUsize,
}

struct Shared {
    commands: mpsc::Sender<Command>,
    model: Arc<LoadedPoolingModel>,
    tokenizer: Arc<Tokenizer>,
    task: ServeTask,
    max_model_len: usize,
    limit: usize,
    score_activation: ScoreActivation,
    counters: Arc<Counters>,
}

/// A cheap, thread-safe handle to a running pooling engine.
#[derive(Clone)]
pub struct PoolingClient {
    shared: Arc<Shared>,
}

/// Owns the pooling thread; dropping it lets the forward pass in progress finish, then stops
/// the thread (requests still queued are answered with an error).
pub struct PoolingEngine {
    client: PoolingClient,
    thread: Option<JoinHandle<()>>,
}

impl PoolingEngine {
    /// Loads a pooling model from a checkpoint directory (config.json, safetensors, tokenizer
    /// and, optionally, a sentence-transformers config) and starts an engine on it; `task`
    /// defaults to what the model is for.
    pub fn load(dir: &Path, dtype: DType, task: Option<ServeTask>, config: PoolingConfig) -> Result<PoolingEngine> {
        let opts = LoadOptions { dtype, progress: true, ..Default::default() };
        let model = ferrite_models::load_pooling_model(dir, &opts)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        PoolingEngine::new(model, Arc::new(tokenizer), task, config)
    }

    pub fn new(
        model: LoadedPoolingModel,
        tokenizer: Arc<Tokenizer>,
        task: Option<ServeTask>,
        config: PoolingConfig,
    ) -> Result<PoolingEngine> {
        let task = task.unwrap_or_else(|| ServeTask::infer(model.info()));
        task.check(model.info()).map_err(EngineError::Config)?;
        let max_model_len = config.max_model_len.map_or(model.max_model_len, |m| m.min(model.max_model_len));
        let max_batch_tokens = config.max_num_batched_tokens.max(max_model_len).max(1);
        tracing::info!(
            task = task.as_str(),
            arch = %model.info().architecture,
            pooling = model.pooler.pooling.as_str(),
            normalize = model.pooler.normalize,
            "serving a pooling model"
        );
        let model = Arc::new(model);
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel();
        let (worker_model, worker_counters) = (model.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name("ferrite-pooling".into())
            .spawn(move || worker(&worker_model, &rx, max_batch_tokens, &worker_counters))
            .map_err(|e| EngineError::Config(format!("cannot start the pooling thread: {e}")))?;
        let shared = Shared {
            commands: tx,
            score_activation: ScoreActivation::from_config(&model.config),
            model,
            tokenizer,
            task,
            max_model_len,
            limit: (config.max_num_seqs + config.max_queue).max(1),
            counters,
        };
        Ok(PoolingEngine { client: PoolingClient { shared: Arc::new(shared) }, thread: Some(thread) })
    }

    pub fn client(&self) -> PoolingClient {
        self.client.clone()
    }
}

impl Drop for PoolingEngine {
    fn drop(&mut self) {
        let _ = self.client.shared.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the pooling thread panicked");
            }
        }
    }
}

/// Keeps a request's sequences in the queue count until it is answered or dropped.
struct QueueSlot {
    counters: Arc<Counters>,
    n: usize,
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.counters.queued.fetch_sub(self.n, Ordering::AcqRel);
    }
}

impl PoolingClient {
    /// Runs `inputs` (tokenized and checked against [`PoolingClient::max_model_len`]) through
    /// the model: one output per input, in order. For embedding models that is the pooled state
    /// (finish it with [`PoolingClient::finish_embedding`]), for classifiers the logits.
    pub async fn run(&self, inputs: Vec<PoolingInput>) -> Result<Vec<Vec<f32>>> {
        let s = &self.shared;
        let n = inputs.len();
        if n > s.limit {
            return Err(EngineError::TooManyInputs { inputs: n, limit: s.limit });
        }
        let before = s.counters.queued.fetch_add(n, Ordering::AcqRel);
        let _slot = QueueSlot { counters: s.counters.clone(), n };
        if before + n > s.limit {
            return Err(EngineError::Overloaded { queued: before, limit: s.limit });
        }
        let (reply, answer) = oneshot::channel();
        s.commands
            .send(Command::Run(Job { inputs, reply }))
            .map_err(|_| EngineError::Internal("the pooling thread has stopped".into()))?;
        match answer.await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(EngineError::BatchFailed(e)),
            Err(_) => Err(EngineError::Internal("the pooling thread dropped the request".into())),
        }
    }

    pub fn task(&self) -> ServeTask {
        self.shared.task
    }

    pub fn info(&self) -> &PoolingInfo {
        self.shared.model.info()
    }

    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.shared.tokenizer.clone()
    }

    /// Tokens one input may hold.
    pub fn max_model_len(&self) -> usize {
        self.shared.max_model_len
    }

    pub fn pooler(&self) -> &PoolerConfig {
        &self.shared.model.pooler
    }

    /// How a cross-encoder's logit becomes a relevance score.
    pub fn score_activation(&self) -> ScoreActivation {
        self.shared.score_activation
    }

    /// Validates a requested `dimensions` (Matryoshka) as vLLM does; `model` names the model in
    /// the message.
    pub fn check_dimensions(&self, model: &str, dimensions: usize) -> std::result::Result<(), String> {
        self.pooler().check_dimensions(model, dimensions, self.info().hidden_size)
    }

    /// Cuts a pooled state to `dimensions`, then L2-normalises it if `normalize` (the pooler's
    /// setting unless overridden).
    pub fn finish_embedding(&self, v: &mut Vec<f32>, dimensions: Option<usize>, normalize: Option<bool>) {
        self.shared.model.finish_embedding(v, dimensions, normalize);
    }

    /// Sequences admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.shared.counters.queued.load(Ordering::Acquire)
    }

    /// The generation engine's counters that apply to pooling: sequences running and waiting,
    /// and prompt tokens (no KV cache, no generated tokens).
    pub fn stats(&self) -> EngineStats {
        let c = &self.shared.counters;
        let running = c.running.load(Ordering::Acquire);
        EngineStats {
            num_running: running,
            num_waiting: c.queued.load(Ordering::Acquire).saturating_sub(running),
            prompt_tokens_total: c.prompt_tokens.load(Ordering::Relaxed),
            ..Default::default()
        }
    }
}

/// Takes every job waiting (up to the token budget), runs their sequences in forward passes of
/// at most `max_batch_tokens` tokens each (a longer sequence runs alone), and answers each job.
fn worker(model: &LoadedPoolingModel, rx: &mpsc::Receiver<Command>, max_batch_tokens: usize, counters: &Counters) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match rx.recv() {
                Ok(Command::Run(job)) => pending.push_back(job),
                Ok(Command::Shutdown) | Err(_) => return,
            }
        }
        while let Ok(command) = rx.try_recv() {
            match command {
                Command::Run(job) => pending.push_back(job),
                // The queued jobs' replies drop here: their callers get an error.
                Command::Shutdown => return,
            }
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
) -> std::result::Result<Vec<Vec<f32>>, String> {
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
