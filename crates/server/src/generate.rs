//! Submitting prompts to the engine and reading back their deltas, shared by both endpoints.
//!
//! Each prompt becomes one engine request; their streams are merged so a request with several
//! prompts streams them side by side. Every stream carries a [`Tracker`] that records the
//! latency histograms and, when dropped before its choices finish, counts them as aborted.
//! Dropping the merged stream drops the engine streams, which aborts the engine requests.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use ferrite_engine::{
    CompletionOutput, ProcessedRequest, PromptInput, RequestOutput, RequestStream, SamplingParams, VisualInput,
};
use futures::stream::{SelectAll, Stream, StreamExt};

use crate::error::ApiError;
use crate::logprobs::Position;
use crate::media::FetchedMedia;
use crate::metrics::{Finish, FinishedChoice};
use crate::params::engine_error;
use crate::protocol::StopReason;
use crate::AppState;

/// A prompt ready for the engine: its ids, its text when the client sent text, and the media a
/// chat request brought.
#[derive(Clone)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub text: Option<String>,
    /// A chat request's images and videos, fetched, in message order; see [`engine_input`].
    pub media: Vec<FetchedMedia>,
    /// The request's `mm_processor_kwargs` (vLLM's per-request multimodal processor settings).
    pub mm_processor_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// The media processed for the engine, their placeholders expanded in `ids`
    /// ([`crate::images::ImageProcessing::apply`]).
    pub visuals: Vec<VisualInput>,
    /// `Some(add_special_tokens)` where `ids` are `text` tokenized so (a chat prompt, not
    /// truncated): a prompt whose image placeholders are rewritten once its images are processed
    /// (Gemma 3's pan-and-scan crops) is tokenized again the same way.
    pub tokenized_with_special_tokens: Option<bool>,
}

impl Prompt {
    /// A prompt of text or token ids alone.
    pub fn new(ids: Vec<u32>, text: Option<String>) -> Prompt {
        Prompt {
            ids,
            text,
            media: Vec::new(),
            mm_processor_kwargs: None,
            visuals: Vec::new(),
            tokenized_with_special_tokens: None,
        }
    }
}

/// One delta of one choice, in the server's terms.
pub struct Delta {
    /// The prompt it belongs to.
    pub prompt: usize,
    /// The choice's index within that prompt (0..n).
    pub index: usize,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub logprobs: Option<Vec<Position>>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<StopReason>,
}

/// What one engine step sent for one prompt.
pub struct Step {
    pub prompt: usize,
    /// Prompt logprobs, on the first step of a prompt that asked for them; `None` at the first
    /// position, which has no context.
    pub prompt_logprobs: Option<Vec<Option<Position>>>,
    pub deltas: Vec<Delta>,
    /// Set when the engine failed the request; the step is its last.
    pub error: Option<String>,
}

#[derive(Default)]
struct ChoiceTiming {
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    tokens: usize,
    finished: bool,
}

struct Tracker {
    state: Arc<AppState>,
    /// The engine request's id, for logs.
    id: String,
    arrival: Instant,
    /// When the engine first scheduled the request, once an output says so.
    scheduled: Option<Instant>,
    prompt_tokens: usize,
    first_token_seen: bool,
    choices: Vec<ChoiceTiming>,
}

impl Tracker {
    fn observe(&mut self, out: &CompletionOutput, finish: Option<Finish>) {
        let now = Instant::now();
        let Some(choice) = self.choices.get_mut(out.index) else {
            return;
        };
        if !out.token_ids.is_empty() {
            if !self.first_token_seen {
                self.first_token_seen = true;
                self.state.metrics.record_first_token(now.duration_since(self.arrival));
            }
            if let Some(previous) = choice.last_token {
                self.state.metrics.record_inter_token(now.duration_since(previous));
            }
            choice.first_token.get_or_insert(now);
            choice.last_token = Some(now);
            choice.tokens += out.token_ids.len();
        }
        if let (Some(finish), false) = (finish, choice.finished) {
            choice.finished = true;
            let finished = self.finished(finish, &self.choices[out.index]);
            self.state.metrics.record_finished(finished);
        }
    }

    fn finished(&self, finish: Finish, choice: &ChoiceTiming) -> FinishedChoice {
        FinishedChoice {
            finish,
            arrival: self.arrival,
            scheduled: self.scheduled,
            first_token: choice.first_token,
            last_token: choice.last_token,
            prompt_tokens: self.prompt_tokens,
            generation_tokens: choice.tokens,
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let unfinished = self.choices.iter().filter(|c| !c.finished).count();
        if unfinished > 0 {
            tracing::info!(request_id = %self.id, unfinished, "dropped unfinished (client gone or shutdown): aborted");
        }
        for c in self.choices.iter().filter(|c| !c.finished) {
            self.state.metrics.record_finished(self.finished(Finish::Abort, c));
        }
    }
}

/// An engine stream tagged with its prompt index and tracked.
pub struct Tracked {
    prompt: usize,
    inner: RequestStream,
    tracker: Tracker,
    /// Resolves when the server's shutdown timeout expires with the request still open.
    cut: Pin<Box<dyn Future<Output = ()> + Send>>,
    was_cut: bool,
}

/// The error a request gets when the shutdown timeout cuts it: a stream ends with it and
/// `[DONE]` instead of a dropped connection.
const CUT_AT_SHUTDOWN: &str = "the server shut down before this request finished (--shutdown-timeout expired)";

impl Stream for Tracked {
    type Item = Step;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Step>> {
        let this = self.get_mut();
        if this.was_cut {
            return Poll::Ready(None);
        }
        if this.cut.as_mut().poll(cx).is_ready() {
            this.was_cut = true;
            let error = Some(CUT_AT_SHUTDOWN.to_string());
            return Poll::Ready(Some(Step { prompt: this.prompt, prompt_logprobs: None, deltas: Vec::new(), error }));
        }
        match this.inner.poll_next_unpin(cx) {
            Poll::Ready(Some(out)) => Poll::Ready(Some(this.step(out))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Tracked {
    fn step(&mut self, out: RequestOutput) -> Step {
        self.tracker.scheduled = self.tracker.scheduled.or(out.metrics.first_scheduled_time);
        let deltas = out
            .outputs
            .into_iter()
            .map(|o| {
                let (finish_reason, finish) = finish_of(&o);
                self.tracker.observe(&o, finish);
                let stop_reason = stop_reason_of(&o);
                Delta {
                    prompt: self.prompt,
                    index: o.index,
                    logprobs: o.logprobs.map(|lps| lps.into_iter().map(position).collect()),
                    stop_reason,
                    finish_reason,
                    text: o.text,
                    token_ids: o.token_ids,
                }
            })
            .collect();
        Step {
            prompt: self.prompt,
            prompt_logprobs: out.prompt_logprobs.map(|lps| lps.into_iter().map(|p| p.map(position)).collect()),
            deltas,
            error: out.error,
        }
    }
}

/// Has the engine validate one request per prompt, before any is started (and before
/// admission), so a bad request starts nothing.
/// [`process`] on a blocking thread: compiling a structured-output grammar can take a second,
/// which must not stall the async runtime (and `/health`).
pub async fn process_off_runtime(
    state: &Arc<AppState>,
    prompts: &[Prompt],
    params: &SamplingParams,
) -> Result<Vec<ProcessedRequest>, ApiError> {
    let (state, prompts, params) = (state.clone(), prompts.to_vec(), params.clone());
    crate::off_runtime(move || process(&state, &prompts, &params)).await
}

pub fn process(
    state: &AppState,
    prompts: &[Prompt],
    params: &SamplingParams,
) -> Result<Vec<ProcessedRequest>, ApiError> {
    prompts
        .iter()
        .map(|prompt| state.client.process(engine_input(prompt)?, params.clone()).map_err(engine_error))
        .collect()
}

/// What the engine gets for a prompt: its ids, with its images and videos once processed.
fn engine_input(prompt: &Prompt) -> Result<PromptInput, ApiError> {
    if let Some(item) = prompt.media.first() {
        return Err(ApiError::internal(format!("{}: the {} was not processed", item.location, item.kind.modality())));
    }
    if prompt.visuals.is_empty() {
        return Ok(PromptInput::Tokens(prompt.ids.clone()));
    }
    Ok(PromptInput::Multimodal { tokens: prompt.ids.clone(), visuals: prompt.visuals.clone() })
}

/// Starts the engine requests [`process`] accepted, one per prompt. An error part-way drops
/// (and so aborts) the requests already started.
pub fn submit(
    state: &Arc<AppState>,
    request_id: &str,
    requests: Vec<ProcessedRequest>,
    arrival: Instant,
) -> Result<SelectAll<Tracked>, ApiError> {
    let prompts = requests.len();
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt().len()).sum();
    let Some(params) = requests.first().map(|r| r.params().clone()) else {
        return Ok(futures::stream::select_all(Vec::new()));
    };
    let mut streams = Vec::with_capacity(requests.len());
    for (i, request) in requests.into_iter().enumerate() {
        let id = format!("{request_id}-{i}");
        let prompt_tokens = request.prompt().len();
        let inner = state.client.add_processed(id.clone(), request).map_err(engine_error)?;
        let choices = (0..params.n).map(|_| ChoiceTiming::default()).collect();
        let tracker = Tracker {
            state: state.clone(),
            id,
            arrival,
            scheduled: None,
            prompt_tokens,
            first_token_seen: false,
            choices,
        };
        let mut closing = state.closing.subscribe();
        let cut = Box::pin(async move {
            // A dropped sender (the server gone) cuts nothing: the connection is gone too.
            if closing.wait_for(|&closing| closing).await.is_err() {
                std::future::pending::<()>().await;
            }
        });
        streams.push(Tracked { prompt: i, inner, tracker, cut, was_cut: false });
    }
    if state.served.config.log_requests {
        tracing::info!(
            request_id,
            prompts,
            prompt_tokens,
            n = params.n,
            max_tokens = params.max_tokens,
            temperature = params.temperature,
            "request submitted"
        );
    }
    Ok(futures::stream::select_all(streams))
}

fn finish_of(o: &CompletionOutput) -> (Option<&'static str>, Option<Finish>) {
    use ferrite_engine::FinishReason;
    match o.finish_reason {
        Some(FinishReason::Stop) => (Some("stop"), Some(Finish::Stop)),
        Some(FinishReason::Length) => (Some("length"), Some(Finish::Length)),
        Some(FinishReason::Abort) => (Some("abort"), Some(Finish::Abort)),
        Some(FinishReason::Error) => (Some("error"), Some(Finish::Error)),
        None => (None, None),
    }
}

fn stop_reason_of(o: &CompletionOutput) -> Option<StopReason> {
    use ferrite_engine::StopReason as E;
    match &o.stop_reason {
        Some(E::TokenId(id)) => Some(StopReason::Token(*id)),
        Some(E::String(s)) => Some(StopReason::Text(s.clone())),
        None => None,
    }
}

fn position(lp: ferrite_engine::TokenLogprob) -> Position {
    Position { token: lp.token_id, logprob: lp.logprob, rank: lp.rank, top: lp.top }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MediaKind;

    #[test]
    fn processed_images_go_to_the_engine_and_unprocessed_media_never_does() {
        let plain = Prompt::new(vec![1, 2], None);
        assert!(matches!(engine_input(&plain), Ok(PromptInput::Tokens(ids)) if ids == [1, 2]));
        let image = VisualInput {
            visual: ferrite_engine::Visual::Image,
            pixel_values: vec![0.0; 4].into(),
            grid_thw: [1, 2, 2],
            hash: 7,
        };
        let with_image = Prompt { visuals: vec![image.clone()], ..plain.clone() };
        assert!(matches!(
            engine_input(&with_image),
            Ok(PromptInput::Multimodal { tokens, visuals }) if tokens == [1, 2] && visuals == [image]
        ));
        let fetched = FetchedMedia {
            kind: MediaKind::Image,
            location: "messages[0].content[1]".into(),
            encoded: vec![vec![0u8; 4].into()],
            mime: None,
        };
        let e = engine_input(&Prompt { media: vec![fetched], ..plain }).err().unwrap();
        assert_eq!(e.message, "messages[0].content[1]: the image was not processed");
    }
}
