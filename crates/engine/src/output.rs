//! What a request stream yields: vLLM's `RequestOutput` / `CompletionOutput`, as deltas.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// A token's log-probability under the model's raw distribution (log-softmax of the logits
/// before penalties, temperature or truncation: vLLM's default `raw_logprobs` mode).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    pub logprob: f32,
    /// 1-based: how many vocabulary entries have a logprob at least this token's.
    pub rank: usize,
    /// The requested number of most likely `(token, logprob)`, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// Cancelled by the client.
    Abort,
    /// The engine failed while running the request.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }
}

/// What ended a `Stop`-finished sequence other than EOS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    String(String),
    TokenId(u32),
}

/// One of the request's `n` sequences: what it produced since the previous output.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionOutput {
    pub index: usize,
    /// Text delta.
    pub text: String,
    /// Token delta (the stop token or the token completing a stop string included).
    pub token_ids: Vec<u32>,
    /// One entry per token of `token_ids` when `logprobs` was requested.
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
}

impl CompletionOutput {
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }
}

/// When the request reached each stage, for TTFT / TPOT / end-to-end latency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestMetrics {
    pub arrival_time: Instant,
    /// First step that computed any of its tokens.
    pub first_scheduled_time: Option<Instant>,
    pub first_token_time: Option<Instant>,
    pub last_token_time: Option<Instant>,
    pub finished_time: Option<Instant>,
    /// Tokens generated so far, over all sequences.
    pub num_generation_tokens: usize,
}

impl RequestMetrics {
    pub fn new(arrival_time: Instant) -> RequestMetrics {
        RequestMetrics {
            arrival_time,
            first_scheduled_time: None,
            first_token_time: None,
            last_token_time: None,
            finished_time: None,
            num_generation_tokens: 0,
        }
    }

    pub fn time_to_first_token(&self) -> Option<Duration> {
        Some(self.first_token_time?.duration_since(self.arrival_time))
    }

    pub fn queue_time(&self) -> Option<Duration> {
        Some(self.first_scheduled_time?.duration_since(self.arrival_time))
    }

    pub fn e2e_latency(&self) -> Option<Duration> {
        Some(self.finished_time?.duration_since(self.arrival_time))
    }

    /// Mean time per output token after the first (vLLM's TPOT).
    pub fn time_per_output_token(&self) -> Option<Duration> {
        let decode = self.last_token_time?.duration_since(self.first_token_time?);
        let steps = self.num_generation_tokens.checked_sub(1).filter(|&s| s > 0)?;
        Some(decode / steps as u32)
    }
}

/// One streamed update of a request. Text, tokens and logprobs are deltas;
/// [`RequestOutput::merge`] folds a stream into the cumulative result.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    pub request_id: String,
    pub prompt_token_ids: Arc<[u32]>,
    /// Sent once, with the first generated token: `None` for the first prompt token (it has no
    /// context), then one entry per prompt token.
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    /// The sequences that changed in this update.
    pub outputs: Vec<CompletionOutput>,
    /// Every sequence has finished; this is the last update.
    pub finished: bool,
    /// Prompt tokens served from the prefix cache (first sequence).
    pub num_cached_tokens: usize,
    pub metrics: RequestMetrics,
    /// Why the engine failed the request (`FinishReason::Error`).
    pub error: Option<String>,
}

impl RequestOutput {
    /// Appends a later delta of the same request, so that `self` becomes cumulative.
    pub fn merge(&mut self, delta: RequestOutput) {
        if delta.prompt_logprobs.is_some() {
            self.prompt_logprobs = delta.prompt_logprobs;
        }
        for out in delta.outputs {
            match self.outputs.iter_mut().find(|o| o.index == out.index) {
                Some(acc) => {
                    acc.text.push_str(&out.text);
                    acc.token_ids.extend(out.token_ids);
                    match (&mut acc.logprobs, out.logprobs) {
                        (Some(a), Some(b)) => a.extend(b),
                        (a @ None, b) => *a = b,
                        (Some(_), None) => {}
                    }
                    acc.finish_reason = out.finish_reason.or(acc.finish_reason);
                    acc.stop_reason = out.stop_reason.or(acc.stop_reason.take());
                }
                None => self.outputs.push(out),
            }
        }
        self.outputs.sort_by_key(|o| o.index);
        self.finished = delta.finished;
        self.num_cached_tokens = delta.num_cached_tokens.max(self.num_cached_tokens);
        self.metrics = delta.metrics;
        if delta.error.is_some() {
            self.error = delta.error;
        }
    }
}
