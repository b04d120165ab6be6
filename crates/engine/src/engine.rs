//! The engine loop on its own thread, and the handles requests come in through.
//!
//! [`EngineClient::add_request`] validates and tokenizes on the caller's thread
//! ([`EngineClient::process`]), then hands the request to the loop over a channel and returns a [`RequestStream`] of deltas. The loop repeats
//! schedule -> execute -> update -> detokenize, and blocks on the channel when idle.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Instant;

use ferrite_models::{CausalLM, DraftHead, ModelInfo};
use ferrite_structured::{Grammar, GrammarCompiler, JsonOptions, StructuredError, StructuredOutputs};
use ferrite_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc as tokio_mpsc;

use crate::config::{CacheConfig, EngineConfig};
use crate::core::scheduler::{EngineCoreOutput, SchedulerConfig};
use crate::core::{ReqId, Request, Scheduler};
use crate::detokenizer::Detokenizer;
use crate::draft_model::DraftModel;
use crate::eagle::EagleDrafter;
use crate::error::{EngineError, Result};
use crate::output::{CompletionOutput, FinishReason, RequestMetrics, RequestOutput, StopReason, TokenLogprob};
use crate::params::{MultimodalInputs, RequestSampling, SamplingParams, VisualInput};
use crate::runner::ModelRunner;
use crate::spec_decode::SpeculativeMethod;

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Tokenized with the tokenizer's special tokens (BOS and the like), as `tokenizer(text)`.
    Text(String),
    Tokens(Vec<u32>),
    /// Token ids with each image's and video's placeholders expanded (one placeholder token per
    /// embedding it becomes), and the images and videos in prompt order.
    Multimodal {
        tokens: Vec<u32>,
        visuals: Vec<VisualInput>,
    },
}

/// A snapshot of the engine's counters (cheap: copied out of a mutex the loop updates per step).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    /// Prompt tokens looked up in the prefix cache, and how many were found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub num_preemptions: u64,
    pub finished_requests: u64,
    /// Decode steps captured and replayed as CUDA graphs.
    pub cuda_graphs: crate::GraphCounts,
    /// Tokens each step computed (vLLM's `iteration_tokens_total` histogram).
    pub iteration_tokens: IterationTokens,
    /// Drafts proposed and accepted (speculative decoding).
    pub spec_decode: crate::SpecDecodeStats,
    /// Images and videos encoded, and encodings served from the encoder cache.
    pub encoder_cache: crate::EncoderCacheStats,
}

/// A histogram of the tokens per engine step, in vLLM's buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IterationTokens {
    /// Steps per bucket of [`IterationTokens::BOUNDS`] (not cumulative); the last is past them all.
    pub counts: [u64; IterationTokens::BOUNDS.len() + 1],
    pub sum: u64,
}

impl IterationTokens {
    pub const BOUNDS: [u64; 13] = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

    fn observe(&mut self, tokens: usize) {
        let tokens = tokens as u64;
        let slot = Self::BOUNDS.iter().position(|&b| tokens <= b).unwrap_or(Self::BOUNDS.len());
        self.counts[slot] += 1;
        self.sum += tokens;
    }
}

/// A request the engine has tokenized and validated, not yet queued.
pub struct ProcessedRequest {
    prompt: Vec<u32>,
    /// Normalized.
    params: SamplingParams,
    children: Vec<Arc<RequestSampling>>,
    arrival: Instant,
}

impl ProcessedRequest {
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }
}

struct NewRequest {
    parent: u64,
    request_id: String,
    prompt: Arc<[u32]>,
    /// The detokenizer's view: stop strings, special tokens, min_tokens.
    params: SamplingParams,
    children: Vec<Arc<RequestSampling>>,
    sender: tokio_mpsc::UnboundedSender<RequestOutput>,
    /// Outputs sent and not yet taken by the [`RequestStream`].
    unread: Arc<AtomicUsize>,
    arrival: Instant,
}

enum Command {
    Add(Box<NewRequest>),
    Abort(u64),
    AbortById(String),
    Shutdown,
}

struct Shared {
    commands: mpsc::Sender<Command>,
    tokenizer: Arc<Tokenizer>,
    model_info: ModelInfo,
    cache: CacheConfig,
    max_model_len: usize,
    stats: Arc<Mutex<EngineStats>>,
    next_parent: AtomicU64,
    /// The tokenizer's EOS, then the generation config's other end-of-sequence ids.
    eos_token_id: Option<u32>,
    extra_eos_token_ids: Vec<u32>,
    /// Draws the seeds of requests that bring none: from `EngineConfig::seed` when set, so a
    /// restarted engine gives its requests the same seeds in the same order.
    request_seeds: Mutex<rand::rngs::StdRng>,
    max_logprobs: usize,
    /// Tokens one step may compute: an image that must be computed in one chunk
    /// ([`SchedulerConfig::disable_chunked_mm_input`], `whole_media`) may not be longer.
    max_num_batched_tokens: usize,
    whole_media: bool,
    structured_defaults: JsonOptions,
    /// Built on the first structured request: it indexes the whole vocabulary.
    grammar_compiler: OnceLock<std::result::Result<GrammarCompiler, String>>,
}

/// vLLM's tokenization of `bad_words`: each word as is (leading spaces stripped) and with one
/// leading space, the second kept only when it is a different token sequence of the same
/// length (so that " word" is banned too where the tokenizer merges the space into the word).
fn bad_words_token_ids(tokenizer: &Tokenizer, words: &[String]) -> Result<Vec<Vec<u32>>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    for word in words {
        let bare = tokenizer.encode(word.trim_start(), false)?;
        let spaced = tokenizer.encode(&format!(" {}", word.trim_start()), false)?;
        let distinct = spaced.first() != bare.first() && spaced.len() == bare.len();
        if !bare.is_empty() {
            out.push(bare);
        }
        if distinct && !spaced.is_empty() {
            out.push(spaced);
        }
    }
    Ok(out)
}

/// A drafter loaded beside the target, as its speculative config names it.
pub enum LoadedDrafter {
    /// `draft_model`: a smaller checkpoint of a supported family.
    Model(Box<dyn CausalLM>),
    /// `eagle` / `eagle3`: a head on the target's hidden states.
    Head(Box<dyn DraftHead>),
}

/// A draft model fit to draft for a target of `target`: no recurrent state (it could not be
/// rolled back past a rejected draft) and no token the target cannot take.
fn check_draft_model(target: &ModelInfo, draft: Box<dyn CausalLM>) -> Result<Box<dyn CausalLM>> {
    let d = draft.info();
    let bad = |m: String| Err(EngineError::Config(format!("--speculative-config: the draft model {m}")));
    if !d.state_layers.is_empty() {
        return bad(format!(
            "{} has recurrent layers, whose state cannot be rolled back past a rejected draft",
            d.architecture
        ));
    }
    if d.kv_layers.is_empty() {
        return bad(format!("{} is not a decoder with a KV cache", d.architecture));
    }
    if d.vocab_size > target.vocab_size {
        return bad(format!(
            "{}'s vocabulary ({} tokens) is larger than the target's ({}): it must share the target's tokenizer",
            d.architecture, d.vocab_size, target.vocab_size
        ));
    }
    Ok(draft)
}

/// A cheap, thread-safe handle to a running engine.
#[derive(Clone)]
pub struct EngineClient {
    shared: Arc<Shared>,
}

/// Owns the engine thread; dropping it aborts what is in flight and stops the loop.
pub struct Engine {
    client: EngineClient,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    pub fn new(model: Box<dyn CausalLM>, tokenizer: Arc<Tokenizer>, config: EngineConfig) -> Result<Engine> {
        Engine::with_drafter(model, None, tokenizer, config)
    }

    /// [`Engine::new`] with the draft model or head its speculative config names, loaded by the
    /// caller.
    pub fn with_drafter(
        model: Box<dyn CausalLM>,
        drafter: Option<LoadedDrafter>,
        tokenizer: Arc<Tokenizer>,
        config: EngineConfig,
    ) -> Result<Engine> {
        let info = model.info().clone();
        let config = if config.enable_prefix_caching && model.rotary_depends_on_length() {
            tracing::warn!(
                architecture = %info.architecture,
                "prefix caching off: this model's rotary frequencies depend on the sequence length, so cached \
                 keys of a shared prefix would not be the ones transformers computes"
            );
            EngineConfig { enable_prefix_caching: false, ..config }
        } else {
            config
        };
        // The draft model and its config, checked against the target; or the draft head.
        let method = config.speculative.as_ref().map(|s| &s.method);
        let (draft, own_head) = match (drafter, method) {
            (Some(LoadedDrafter::Model(draft)), Some(SpeculativeMethod::DraftModel(d))) => {
                (Some((check_draft_model(&info, draft)?, d.clone())), None)
            }
            (Some(LoadedDrafter::Head(head)), Some(SpeculativeMethod::Eagle(..))) => (None, Some(head)),
            (None, Some(SpeculativeMethod::DraftModel(d) | SpeculativeMethod::Eagle(_, d))) => {
                return Err(EngineError::Config(format!(
                    "--speculative-config: the draft checkpoint {} was not loaded",
                    d.model.display()
                )))
            }
            (Some(_), _) => {
                return Err(EngineError::Config("a draft was given that the speculative config does not name".into()))
            }
            (None, _) => (None, None),
        };
        // The cache memory is known only after profiling on a GPU: check the rest first.
        let max_model_len = config.max_model_len(&info)?;
        let config = EngineConfig {
            kv_cache_memory: crate::memory::kv_budget(model.as_ref(), &config, max_model_len)?,
            ..config
        };
        // A draft model's or an MTP head's KV cache has the target's blocks: each block holds the
        // keys of both.
        let mut sizing = info.clone();
        if let Some((draft, _)) = &draft {
            sizing.kv_layers.extend(draft.info().kv_layers.iter().cloned());
        }
        // The drafter that reads the target's hidden states: its head's KV layer, and the head
        // when it is not the target's own.
        let head = match (&config.speculative, own_head) {
            (_, Some(head)) => Some((head.kv_layer(), Some(head))),
            (Some(spec), None) if spec.method == SpeculativeMethod::Mtp => {
                let head = model.mtp().ok_or_else(|| {
                    EngineError::Config(format!(
                        "--speculative-config: {} has no multi-token-prediction head ferrite can run (method `mtp`)",
                        info.architecture
                    ))
                })?;
                Some((head.kv_layer(), None))
            }
            _ => None,
        };
        if let Some((spec, _)) = &head {
            sizing.kv_layers.push(*spec);
        }
        let (cache, max_model_len) = config.resolve(&sizing)?;
        let num_lookahead_tokens = match &config.speculative {
            Some(spec) if spec.method.runs_a_model() => spec.num_speculative_tokens,
            _ => 0,
        };
        let draft = draft
            .map(|(draft, d)| {
                let draft_len =
                    d.max_model_len.unwrap_or(usize::MAX).min(draft.info().max_position_embeddings).min(max_model_len);
                let (blocks, block_size) = (cache.num_blocks, cache.block_size);
                let budget = config.max_num_batched_tokens;
                DraftModel::new(
                    draft,
                    config.device,
                    cache.dtype,
                    blocks,
                    block_size,
                    num_lookahead_tokens,
                    draft_len,
                    budget,
                )
            })
            .transpose()?;
        let eagle = head
            .map(|(spec, own)| {
                let (blocks, block_size) = (cache.num_blocks, cache.block_size);
                EagleDrafter::new(own, spec, config.device, cache.dtype, blocks, block_size, num_lookahead_tokens)
            })
            .transpose()?;
        let recompute_at = model.rotary_recompute_at();
        let runner = ModelRunner::new(model, draft, eagle, &cache, &config, max_model_len)?;
        let sched_config = SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            max_model_len,
            block_size: cache.block_size,
            num_blocks: cache.num_blocks,
            enable_prefix_caching: config.enable_prefix_caching,
            recompute_at,
            num_state_slots: cache.state_slots,
            num_state_snapshots: cache.state_snapshots,
            state_backups: cache.state_backups > 0,
            disable_chunked_mm_input: config.disable_chunked_mm_input
                || info.vision.as_ref().is_some_and(|v| v.bidirectional),
            max_num_encoder_input_tokens: config.max_num_batched_tokens,
            num_lookahead_tokens,
        };
        tracing::info!(
            blocks = cache.num_blocks,
            block_size = cache.block_size,
            dtype = %cache.dtype,
            capacity_tokens = cache.capacity_tokens(),
            max_model_len,
            "engine KV cache allocated"
        );
        let eos_token_id = tokenizer
            .eos_token()
            .and_then(|t| tokenizer.token_to_id(t))
            .or_else(|| tokenizer.eos_token_ids().first().copied());
        let extra_eos_token_ids =
            tokenizer.eos_token_ids().iter().copied().filter(|&id| Some(id) != eos_token_id).collect();
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(EngineStats { kv_blocks_total: cache.num_blocks, ..Default::default() }));
        let mut scheduler = Scheduler::new(sched_config);
        if let Some(spec) = &config.speculative {
            scheduler.enable_speculation(spec);
        }
        scheduler.share_encoder_cache(runner.shared_encoder_cache());
        let core = EngineCore {
            scheduler,
            sched_config,
            runner,
            processor: OutputProcessor::new(tokenizer.clone(), config.max_unread_outputs),
            commands: rx,
            stats: stats.clone(),
            next_req: 0,
            step_index: 0,
            iteration_tokens: IterationTokens::default(),
            speculative: config.speculative.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || core.run())
            .map_err(|e| EngineError::Config(format!("cannot start the engine thread: {e}")))?;
        let shared = Shared {
            commands: tx,
            tokenizer,
            model_info: info,
            cache,
            max_model_len,
            stats,
            next_parent: AtomicU64::new(0),
            eos_token_id,
            extra_eos_token_ids,
            max_logprobs: config.max_logprobs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            whole_media: sched_config.disable_chunked_mm_input,
            structured_defaults: config.structured_outputs.clone(),
            grammar_compiler: OnceLock::new(),
            request_seeds: Mutex::new(match config.seed {
                Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
                None => rand::rngs::StdRng::from_rng(&mut rand::rng()),
            }),
        };
        Ok(Engine { client: EngineClient { shared: Arc::new(shared) }, thread: Some(thread) })
    }

    pub fn client(&self) -> EngineClient {
        self.client.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.client.shared.commands.send(Command::Shutdown);
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the engine thread panicked");
            }
        }
    }
}

impl EngineClient {
    /// Validates and queues a request: [`EngineClient::process`] then
    /// [`EngineClient::add_processed`].
    pub fn add_request(
        &self,
        request_id: String,
        prompt: PromptInput,
        params: SamplingParams,
    ) -> Result<RequestStream> {
        self.add_processed(request_id, self.process(prompt, params)?)
    }

    /// Tokenizes and validates a request, the one place a request is checked (as vLLM's input
    /// processor): the sampling parameters, the prompt and stop tokens against the vocabulary,
    /// the context length and the KV cache. Errors here are the request's fault (HTTP 400).
    pub fn process(&self, prompt: PromptInput, params: SamplingParams) -> Result<ProcessedRequest> {
        let arrival = Instant::now();
        let s = &self.shared;
        params.validate(s.max_logprobs)?;
        let (prompt, images): (Vec<u32>, Vec<VisualInput>) = match prompt {
            PromptInput::Text(text) => (s.tokenizer.encode(&text, true)?, Vec::new()),
            PromptInput::Tokens(ids) => (ids, Vec::new()),
            PromptInput::Multimodal { tokens, visuals } => (tokens, visuals),
        };
        let multimodal = self.place_images(&prompt, images)?;
        let vocab = s.model_info.vocab_size;
        if prompt.is_empty() {
            return Err(EngineError::InvalidPrompt("the prompt is empty".into()));
        }
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidPrompt(format!("token id {bad} is out of vocabulary (size {vocab})")));
        }
        // A stop token either vocabulary cannot map could never be produced and detokenized.
        let stop_bound = vocab.min(s.tokenizer.vocab_size());
        if let Some(bad) = params.stop_token_ids.iter().find(|&&t| t as usize >= stop_bound) {
            return Err(EngineError::invalid(
                "stop_token_ids",
                format!("token id {bad} is out of vocabulary (size {stop_bound})"),
            ));
        }
        let max_model_len = s.max_model_len;
        if prompt.len() >= max_model_len {
            return Err(EngineError::PromptTooLong { prompt_tokens: prompt.len(), max_model_len });
        }
        let max_tokens = params.max_tokens.unwrap_or(max_model_len - prompt.len());
        if prompt.len() + max_tokens > max_model_len {
            return Err(EngineError::ContextLengthExceeded { prompt_tokens: prompt.len(), max_tokens, max_model_len });
        }
        // The last sampled token is never fed back, so it needs no slot.
        let needed_tokens = prompt.len() + max_tokens - 1;
        if needed_tokens.div_ceil(s.cache.block_size) > s.cache.num_blocks {
            return Err(EngineError::CacheTooSmall {
                prompt_tokens: prompt.len(),
                max_tokens,
                needed_tokens,
                capacity_tokens: s.cache.capacity_tokens(),
            });
        }

        for (param, ids) in [
            ("logit_bias", params.logit_bias.iter().map(|(id, _)| *id).collect::<Vec<_>>()),
            ("allowed_token_ids", params.allowed_token_ids.clone().unwrap_or_default()),
        ] {
            let bad: Vec<u32> = ids.into_iter().filter(|&id| id as usize >= vocab).collect();
            if !bad.is_empty() {
                return Err(EngineError::invalid(
                    param,
                    format!("token id(s) {bad:?} are out of vocabulary (size {vocab})"),
                ));
            }
        }
        let bad_words_token_ids = bad_words_token_ids(&s.tokenizer, &params.bad_words)?;
        let grammar = params.structured_outputs.as_ref().map(|spec| self.compile(spec)).transpose()?;
        let params = params.normalized();
        let mut stop_token_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            stop_token_ids.extend(s.extra_eos_token_ids.iter().filter(|id| !params.stop_token_ids.contains(id)));
        }
        let mut min_tokens_mask: Vec<u32> =
            s.eos_token_id.into_iter().chain(s.extra_eos_token_ids.iter().copied()).collect();
        min_tokens_mask
            .extend(params.stop_token_ids.iter().filter(|id| !min_tokens_mask.contains(id)).collect::<Vec<_>>());
        // vLLM gives sequence i of a seeded request the seed `seed + i`.
        let base_seed = params.seed.unwrap_or_else(|| {
            let mut seeds = s.request_seeds.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            seeds.random()
        });
        let children = (0..params.n)
            .map(|i| {
                Arc::new(RequestSampling {
                    params: SamplingParams { n: 1, ..params.clone() },
                    max_tokens,
                    eos_token_id: if params.ignore_eos { None } else { s.eos_token_id },
                    stop_token_ids: stop_token_ids.clone(),
                    min_tokens_mask: min_tokens_mask.clone(),
                    seed: base_seed.wrapping_add(i as u64),
                    grammar: grammar.clone(),
                    bad_words_token_ids: bad_words_token_ids.clone(),
                    multimodal: multimodal.clone(),
                })
            })
            .collect();
        Ok(ProcessedRequest { prompt, params, children, arrival })
    }

    /// Pairs each image and video with the run of placeholder tokens it fills: the n-th image
    /// the n-th run of image placeholders, the n-th video the n-th run of video placeholders,
    /// each run exactly as long as its item's embedding. Where each temporal patch of a video
    /// has a run of its own ([`VisionInfo::video_runs_per_step`](ferrite_models::VisionInfo)),
    /// each patch is an item: placed, encoded and cached alone, which the tower allows because it
    /// attends within a frame only. Where each row of an image is closed by a token of its own
    /// ([`VisionInfo::row_breaks`](ferrite_models::VisionInfo)), an image's run is its rows and
    /// those tokens, which must follow the image's grid.
    fn place_images(&self, prompt: &[u32], visuals: Vec<VisualInput>) -> Result<Option<Arc<MultimodalInputs>>> {
        let Some(vision) = &self.shared.model_info.vision else {
            if visuals.is_empty() {
                return Ok(None);
            }
            return Err(EngineError::InvalidPrompt(format!(
                "{} does not accept image input",
                self.shared.model_info.architecture
            )));
        };
        let visuals: Vec<VisualInput> = match vision.video_runs_per_step {
            true => visuals.into_iter().flat_map(VisualInput::temporal_steps).collect(),
            false => visuals,
        };
        let ids: Vec<u32> = [Some(vision.image_token_id), vision.video_token_id].into_iter().flatten().collect();
        // Each placeholder token's runs, in prompt order.
        let mut runs: HashMap<u32, VecDeque<std::ops::Range<usize>>> =
            ids.iter().map(|&id| (id, vision.placeholder_runs(prompt, id).into())).collect();
        let mut placed = Vec::with_capacity(visuals.len());
        for (k, item) in visuals.into_iter().enumerate() {
            let kind = item.visual.modality();
            let id = vision.token_id(item.visual).ok_or_else(|| {
                EngineError::InvalidPrompt(format!(
                    "{} does not accept {kind} input",
                    self.shared.model_info.architecture
                ))
            })?;
            let tokens = vision.placeholder_tokens(item.grid_thw);
            let queue = runs.get_mut(&id).expect("a queue per placeholder token");
            let run = queue.pop_front().ok_or_else(|| {
                EngineError::InvalidPrompt(format!("{kind} {k} has no placeholder tokens (id {id}) in the prompt"))
            })?;
            if run.len() < tokens || tokens == 0 {
                return Err(EngineError::InvalidPrompt(format!(
                    "{kind} {k} becomes {tokens} embeddings but its placeholder run at position {} has {} tokens",
                    run.start,
                    run.len()
                )));
            }
            if self.shared.whole_media && tokens > self.shared.max_num_batched_tokens {
                return Err(EngineError::InvalidPrompt(format!(
                    "{kind} {k} becomes {tokens} embeddings, which are computed in one step (this model's image \
                     attention or --disable-chunked-mm-input), but a step computes at most {} tokens \
                     (--max-num-batched-tokens)",
                    self.shared.max_num_batched_tokens
                )));
            }
            if vision.row_breaks && id == vision.image_token_id {
                let columns = item.grid_thw[2] / vision.spatial_merge_size;
                let span = &prompt[run.start..run.start + tokens];
                let follows_grid = span.iter().enumerate().all(|(i, &t)| (t == id) == ((i + 1) % (columns + 1) != 0));
                if !follows_grid {
                    return Err(EngineError::InvalidPrompt(format!(
                        "{kind} {k} is rows of {columns} placeholders (id {id}), each followed by one other token, \
                         but its run at position {} is not",
                        run.start
                    )));
                }
            }
            // Adjacent items of a kind make one run: the next takes the rest of it.
            if run.len() > tokens {
                queue.push_front(run.start + tokens..run.end);
            }
            placed.push((item, run.start..run.start + tokens));
        }
        if let Some((id, _)) = runs.iter().find(|(_, queue)| !queue.is_empty()) {
            return Err(EngineError::InvalidPrompt(format!(
                "the prompt has more placeholder tokens (id {id}) than its {} images and videos fill",
                placed.len()
            )));
        }
        Ok((!placed.is_empty()).then(|| Arc::new(MultimodalInputs { items: placed })))
    }

    fn compile(&self, spec: &StructuredOutputs) -> Result<Arc<Grammar>> {
        let s = &self.shared;
        let compiler = s.grammar_compiler.get_or_init(|| {
            let eos: Vec<u32> = s.eos_token_id.into_iter().chain(s.extra_eos_token_ids.iter().copied()).collect();
            GrammarCompiler::new(&s.tokenizer, s.model_info.vocab_size, &eos, s.structured_defaults.clone())
                .map_err(|e| e.to_string())
        });
        let compiler = compiler.as_ref().map_err(|e| EngineError::invalid("structured_outputs", e.clone()))?;
        match compiler.compile(spec) {
            Ok(grammar) => Ok(Arc::new(grammar)),
            Err(StructuredError::Invalid(m)) => Err(EngineError::Grammar(m)),
            Err(e) => Err(EngineError::invalid("structured_outputs", e.to_string())),
        }
    }

    /// Queues a request [`EngineClient::process`] accepted; fails only with
    /// [`EngineError::EngineStopped`].
    pub fn add_processed(&self, request_id: String, request: ProcessedRequest) -> Result<RequestStream> {
        let s = &self.shared;
        let ProcessedRequest { prompt, params, children, arrival } = request;
        let parent = s.next_parent.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = tokio_mpsc::unbounded_channel();
        let unread = Arc::new(AtomicUsize::new(0));
        let request = NewRequest {
            parent,
            request_id: request_id.clone(),
            prompt: prompt.into(),
            params,
            children,
            sender,
            unread: unread.clone(),
            arrival,
        };
        s.commands.send(Command::Add(Box::new(request))).map_err(|_| EngineError::EngineStopped)?;
        Ok(RequestStream { request_id, parent, receiver, unread, commands: s.commands.clone(), finished: false })
    }

    /// Aborts every in-flight request with this id; they finish with `FinishReason::Abort`.
    pub fn abort(&self, request_id: &str) {
        let _ = self.shared.commands.send(Command::AbortById(request_id.to_string()));
    }

    pub fn stats(&self) -> EngineStats {
        *self.shared.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.shared.tokenizer.clone()
    }

    pub fn model_info(&self) -> &ModelInfo {
        &self.shared.model_info
    }

    pub fn max_model_len(&self) -> usize {
        self.shared.max_model_len
    }

    /// Most logprobs a request may ask for per token.
    pub fn max_logprobs(&self) -> usize {
        self.shared.max_logprobs
    }

    pub fn cache_config(&self) -> CacheConfig {
        self.shared.cache
    }
}

/// The outputs of one request, as deltas, ending with one whose `finished` is set. Usable as a
/// `futures::Stream` or, outside an async runtime, through [`RequestStream::blocking_next`].
/// Dropping it before the end aborts the request.
pub struct RequestStream {
    request_id: String,
    parent: u64,
    receiver: tokio_mpsc::UnboundedReceiver<RequestOutput>,
    unread: Arc<AtomicUsize>,
    commands: mpsc::Sender<Command>,
    finished: bool,
}

impl RequestStream {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Waits for the next output; `None` after the last one. Panics inside an async runtime (use
    /// the `Stream` impl there).
    pub fn blocking_next(&mut self) -> Option<RequestOutput> {
        let out = self.receiver.blocking_recv();
        self.observe(&out);
        out
    }

    fn observe(&mut self, out: &Option<RequestOutput>) {
        if out.is_some() {
            self.unread.fetch_sub(1, Ordering::Relaxed);
        }
        if out.as_ref().is_none_or(|o| o.finished) {
            self.finished = true;
        }
    }
}

impl futures::Stream for RequestStream {
    type Item = RequestOutput;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RequestOutput>> {
        let polled = self.receiver.poll_recv(cx);
        if let Poll::Ready(out) = &polled {
            self.observe(out);
        }
        polled
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Abort(self.parent));
        }
    }
}

struct ChildState {
    req_id: ReqId,
    detokenizer: Detokenizer,
    finished: bool,
    has_output: bool,
}

struct ParentState {
    request_id: String,
    prompt: Arc<[u32]>,
    sender: tokio_mpsc::UnboundedSender<RequestOutput>,
    unread: Arc<AtomicUsize>,
    children: Vec<ChildState>,
    metrics: RequestMetrics,
    want_logprobs: bool,
    /// Gathered over prefill chunks of sequence 0; sent with its first token.
    prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    num_cached_tokens: usize,
}

impl ParentState {
    fn output(&self, outputs: Vec<CompletionOutput>) -> RequestOutput {
        RequestOutput {
            request_id: self.request_id.clone(),
            prompt_token_ids: self.prompt.clone(),
            prompt_logprobs: None,
            outputs,
            finished: self.children.iter().all(|c| c.finished),
            num_cached_tokens: self.num_cached_tokens,
            metrics: self.metrics,
            error: None,
        }
    }
}

/// Turns engine-core outputs into request deltas: detokenizes, applies stop strings, streams.
struct OutputProcessor {
    tokenizer: Arc<Tokenizer>,
    parents: HashMap<u64, ParentState>,
    /// Sequence id -> (parent, index).
    children: HashMap<ReqId, (u64, usize)>,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
    finished_requests: u64,
    max_unread_outputs: Option<usize>,
}

impl OutputProcessor {
    fn new(tokenizer: Arc<Tokenizer>, max_unread_outputs: Option<usize>) -> OutputProcessor {
        OutputProcessor {
            max_unread_outputs,
            tokenizer,
            parents: HashMap::new(),
            children: HashMap::new(),
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
            finished_requests: 0,
        }
    }

    fn add(&mut self, req: &NewRequest, child_ids: &[ReqId]) {
        let children = child_ids
            .iter()
            .enumerate()
            .map(|(index, &req_id)| {
                self.children.insert(req_id, (req.parent, index));
                ChildState {
                    req_id,
                    detokenizer: Detokenizer::new(&self.tokenizer, &req.prompt, &req.params),
                    finished: false,
                    has_output: false,
                }
            })
            .collect();
        self.parents.insert(
            req.parent,
            ParentState {
                request_id: req.request_id.clone(),
                prompt: req.prompt.clone(),
                sender: req.sender.clone(),
                unread: req.unread.clone(),
                children,
                metrics: RequestMetrics::new(req.arrival),
                want_logprobs: req.params.logprobs.is_some(),
                // The first prompt token has no context, hence no logprob.
                prompt_logprobs: req.params.prompt_logprobs.map(|_| vec![None]),
                num_cached_tokens: 0,
            },
        );
    }

    fn mark_scheduled(&mut self, req: ReqId, now: Instant) {
        if let Some(p) = self.children.get(&req).and_then(|(p, _)| self.parents.get_mut(p)) {
            p.metrics.first_scheduled_time.get_or_insert(now);
        }
    }

    /// Streams one step's outputs. Returns the sequences a stop string ended, and those whose
    /// client went away; both must leave the scheduler.
    fn process(&mut self, outputs: Vec<EngineCoreOutput>) -> (Vec<ReqId>, Vec<ReqId>) {
        let now = Instant::now();
        let mut stopped = Vec::new();
        let mut order: Vec<u64> = Vec::new();
        let mut deltas: HashMap<u64, Vec<CompletionOutput>> = HashMap::new();
        let mut prompt_logprobs_ready: Vec<u64> = Vec::new();
        for o in outputs {
            let Some(&(pid, index)) = self.children.get(&o.req_id) else {
                continue;
            };
            let Some(parent) = self.parents.get_mut(&pid) else {
                continue;
            };
            if index == 0 {
                parent.num_cached_tokens = o.num_cached_tokens;
                if let (Some(acc), Some(lps)) = (&mut parent.prompt_logprobs, o.new_prompt_logprobs) {
                    acc.extend(lps.into_iter().map(Some));
                }
            }
            if o.new_token_ids.is_empty() {
                continue;
            }
            let child = &mut parent.children[index];
            if !child.has_output {
                child.has_output = true;
                self.prompt_tokens_total += parent.prompt.len() as u64;
                if index == 0 && parent.prompt_logprobs.is_some() {
                    prompt_logprobs_ready.push(pid);
                }
            }
            self.generation_tokens_total += o.new_token_ids.len() as u64;
            parent.metrics.first_token_time.get_or_insert(now);
            parent.metrics.last_token_time = Some(now);
            parent.metrics.num_generation_tokens += o.new_token_ids.len();
            let stop_terminated = o.finish_reason == Some(FinishReason::Stop);
            let mut finish_reason = o.finish_reason;
            let mut stop_reason = o.stop_reason;
            if let Some(stop) = child.detokenizer.update(&self.tokenizer, &o.new_token_ids, stop_terminated) {
                if finish_reason.is_none() {
                    stopped.push(child.req_id);
                }
                finish_reason = Some(FinishReason::Stop);
                stop_reason = Some(StopReason::String(stop));
            }
            child.finished = finish_reason.is_some();
            let text = child.detokenizer.next_delta(child.finished);
            let logprobs = parent.want_logprobs.then(|| o.new_logprobs.into_iter().collect());
            if !deltas.contains_key(&pid) {
                order.push(pid);
            }
            deltas.entry(pid).or_default().push(CompletionOutput {
                index,
                text,
                token_ids: o.new_token_ids,
                logprobs,
                finish_reason,
                stop_reason,
            });
        }
        let mut disconnected = Vec::new();
        for pid in order {
            let Some(outs) = deltas.remove(&pid) else {
                continue;
            };
            let Some(parent) = self.parents.get_mut(&pid) else {
                continue;
            };
            let mut out = parent.output(outs);
            if prompt_logprobs_ready.contains(&pid) {
                out.prompt_logprobs = parent.prompt_logprobs.take();
            }
            if out.finished {
                parent.metrics.finished_time = Some(now);
                out.metrics = parent.metrics;
            }
            let finished = out.finished;
            // Counted before the send, so that the reader's decrement never comes first.
            let unread = parent.unread.fetch_add(1, Ordering::Relaxed) + 1;
            let sent = parent.sender.send(out).is_ok();
            if !sent || (!finished && self.max_unread_outputs.is_some_and(|max| unread > max)) {
                if sent {
                    tracing::warn!(
                        request_id = %parent.request_id,
                        unread,
                        "aborting a request whose client stopped reading its outputs"
                    );
                }
                // The stream then ends without a finished output: its reader sees an abort.
                disconnected.extend(parent.children.iter().filter(|c| !c.finished).map(|c| c.req_id));
                self.remove(pid);
            } else if finished {
                self.remove(pid);
            }
        }
        (stopped, disconnected)
    }

    fn remove(&mut self, pid: u64) {
        if let Some(parent) = self.parents.remove(&pid) {
            for c in &parent.children {
                self.children.remove(&c.req_id);
            }
            self.finished_requests += 1;
        }
    }

    fn parents_with_id(&self, request_id: &str) -> Vec<u64> {
        self.parents.iter().filter(|(_, p)| p.request_id == request_id).map(|(&id, _)| id).collect()
    }

    fn parent_of(&self, req: ReqId) -> Option<u64> {
        self.children.get(&req).map(|&(p, _)| p)
    }

    /// Ends a request before its sequences finished (abort or failure) and tells the client.
    /// Returns the sequences still in the scheduler.
    fn terminate(&mut self, pid: u64, reason: FinishReason, error: Option<String>) -> Vec<ReqId> {
        let Some(parent) = self.parents.get_mut(&pid) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut open = Vec::new();
        let mut outs = Vec::new();
        for (index, c) in parent.children.iter_mut().enumerate().filter(|(_, c)| !c.finished) {
            c.finished = true;
            open.push(c.req_id);
            outs.push(CompletionOutput {
                index,
                text: c.detokenizer.next_delta(true),
                token_ids: Vec::new(),
                logprobs: parent.want_logprobs.then(Vec::new),
                finish_reason: Some(reason),
                stop_reason: None,
            });
        }
        parent.metrics.finished_time = Some(now);
        let mut out = parent.output(outs);
        out.error = error;
        let _ = parent.sender.send(out);
        self.remove(pid);
        open
    }

    fn all_parents(&self) -> Vec<u64> {
        self.parents.keys().copied().collect()
    }
}

struct EngineCore {
    scheduler: Scheduler,
    sched_config: SchedulerConfig,
    runner: ModelRunner,
    processor: OutputProcessor,
    commands: mpsc::Receiver<Command>,
    stats: Arc<Mutex<EngineStats>>,
    next_req: ReqId,
    step_index: u64,
    iteration_tokens: IterationTokens,
    speculative: Option<crate::SpeculativeConfig>,
}

impl EngineCore {
    fn run(mut self) {
        loop {
            if !self.scheduler.has_unfinished_requests() {
                // Idle: sleep until a command arrives (or every client is gone).
                match self.commands.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
            let mut shutdown = false;
            while let Ok(cmd) = self.commands.try_recv() {
                if !self.handle(cmd) {
                    shutdown = true;
                    break;
                }
            }
            if shutdown {
                break;
            }
            if self.scheduler.has_unfinished_requests() {
                let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
                if let Err(panic) = stepped {
                    let message = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    self.recover(format!("engine step panicked: {message}"));
                }
            }
            self.publish_stats();
        }
        for pid in self.processor.all_parents() {
            self.processor.terminate(pid, FinishReason::Abort, None);
        }
        self.publish_stats();
    }

    /// Applies one command; `false` on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Add(req) => {
                let ids: Vec<ReqId> = (0..req.children.len() as u64).map(|i| self.next_req + i).collect();
                self.next_req += ids.len() as u64;
                self.processor.add(&req, &ids);
                for (&id, sampling) in ids.iter().zip(&req.children) {
                    self.scheduler.add_request(Request::new(id, &req.prompt, sampling.clone()));
                }
            }
            Command::Abort(pid) => self.abort(pid),
            Command::AbortById(request_id) => {
                for pid in self.processor.parents_with_id(&request_id) {
                    self.abort(pid);
                }
            }
            Command::Shutdown => return false,
        }
        true
    }

    fn abort(&mut self, pid: u64) {
        let open = self.processor.terminate(pid, FinishReason::Abort, None);
        self.scheduler.finish_requests(&open, FinishReason::Abort);
    }

    fn step(&mut self) {
        let span = tracing::debug_span!("step", index = self.step_index);
        let _guard = span.enter();
        self.step_index += 1;
        let so = {
            let _s = tracing::debug_span!("schedule").entered();
            self.scheduler.schedule()
        };
        if so.total_num_scheduled_tokens > 0 {
            self.iteration_tokens.observe(so.total_num_scheduled_tokens);
        }
        let now = Instant::now();
        for new in &so.scheduled_new_reqs {
            self.processor.mark_scheduled(new.req_id, now);
        }
        let result = {
            let _s = tracing::debug_span!("execute_model", tokens = so.total_num_scheduled_tokens).entered();
            self.runner.execute_model(&so)
        };
        if so.total_num_scheduled_tokens == 0 {
            // Admission guarantees every request fits the cache alone, so an empty step with
            // work waiting is a bookkeeping fault: fail what waits rather than spin.
            let waiting = self.scheduler.unfinished_request_ids();
            tracing::error!(requests = waiting.len(), "nothing could be scheduled");
            self.fail(&waiting, "the scheduler could not fit the request in the KV cache".into());
            return;
        }
        match result {
            Ok(mut out) => {
                let model_drafts = std::mem::take(&mut out.draft_token_ids);
                let outputs = self.scheduler.update_from_output(&so, out);
                let (stopped, disconnected) = self.processor.process(outputs);
                self.scheduler.finish_requests(&stopped, FinishReason::Stop);
                self.scheduler.finish_requests(&disconnected, FinishReason::Abort);
                self.scheduler.propose_drafts(model_drafts);
            }
            Err(e) => {
                tracing::error!(error = %e, "model step failed");
                let ids: Vec<ReqId> = so.num_scheduled_tokens.iter().map(|&(id, _)| id).collect();
                self.fail(&ids, e.to_string());
                self.scheduler.evict_free_cached_blocks();
            }
        }
    }

    /// Fails the requests these sequences belong to (all their sequences).
    fn fail(&mut self, seqs: &[ReqId], message: String) {
        let mut parents: Vec<u64> = seqs.iter().filter_map(|&id| self.processor.parent_of(id)).collect();
        parents.sort_unstable();
        parents.dedup();
        for pid in parents {
            let open = self.processor.terminate(pid, FinishReason::Error, Some(message.clone()));
            self.scheduler.finish_requests(&open, FinishReason::Error);
        }
    }

    /// After a panic the bookkeeping cannot be trusted: fail everything and start clean.
    fn recover(&mut self, message: String) {
        tracing::error!(%message, "recovering the engine");
        for pid in self.processor.all_parents() {
            self.processor.terminate(pid, FinishReason::Error, Some(message.clone()));
        }
        self.scheduler = Scheduler::new(self.sched_config);
        if let Some(spec) = &self.speculative {
            self.scheduler.enable_speculation(spec);
        }
        self.scheduler.share_encoder_cache(self.runner.shared_encoder_cache());
        self.runner.reset();
    }

    fn publish_stats(&self) {
        let kv = self.scheduler.kv_cache();
        let prefix = kv.stats();
        let stats = EngineStats {
            num_running: self.scheduler.num_running(),
            num_waiting: self.scheduler.num_waiting(),
            kv_blocks_total: kv.pool().num_blocks(),
            kv_blocks_used: kv.pool().num_blocks() - kv.num_free_blocks(),
            prefix_cache_queries: prefix.queries,
            prefix_cache_hits: prefix.hits,
            prompt_tokens_total: self.processor.prompt_tokens_total,
            generation_tokens_total: self.processor.generation_tokens_total,
            num_preemptions: self.scheduler.num_preemptions(),
            finished_requests: self.processor.finished_requests,
            cuda_graphs: self.runner.graph_counts(),
            iteration_tokens: self.iteration_tokens,
            spec_decode: self.scheduler.spec_decode_stats(),
            encoder_cache: self.runner.encoder_cache_stats(),
        };
        *self.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = stats;
    }
}
