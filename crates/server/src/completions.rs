//! `POST /v1/completions`: prompts as text or token ids, one or many; `echo`, `logprobs`, `n`,
//! `stream` with `stream_options.include_usage`.
//!
//! Choice `i` of prompt `p` is reported as index `p * n + i`, as vLLM numbers them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, SelectAll, StreamExt};
use serde_json::Value;

use crate::admission::{Admission, Permit};
use crate::error::{parse_json, ApiError};
use crate::generate::{self, Prompt, Step, Tracked};
use crate::logprobs::{self, Position};
use crate::params::{self, Requested};
use crate::protocol::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, StopReason, Usage, UsageReport,
};
use crate::sse::{done_event, json_event, json_event_raw};
use crate::{off_runtime, random_id, unix_now, AppState};

/// OpenAI's default for `/v1/completions` (chat's default is "the rest of the context").
const DEFAULT_MAX_TOKENS: i64 = 16;

pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    match run(state, body, arrival).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// Per-request facts every chunk needs.
struct Context {
    state: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    echo: bool,
    logprobs: bool,
    return_token_ids: bool,
    tokens_as_ids: bool,
    /// `echo` with `max_tokens: 0`: the generated token is dropped.
    scoring: bool,
    prompt_logprobs: Option<usize>,
    prompts: Vec<Prompt>,
}

async fn run(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = body?;
    // Parsing and tokenizing long prompts take CPU time that must not stall the other
    // connections (and /health) on the async runtime.
    let (req, prompts) = off_runtime({
        let state = state.clone();
        move || {
            let req: CompletionRequest = parse_json(&body)?;
            state.served.check_model(req.model.as_deref())?;
            if req.suffix.is_some() {
                return Err(ApiError::invalid("suffix", "suffix is not currently supported"));
            }
            let mut prompts = parse_prompts(&state, &req.prompt, req.add_special_tokens.unwrap_or(true))?;
            for p in &mut prompts {
                params::truncate_prompt(p, &req.sampling, state.served.max_model_len, &state.tokenizer)?;
            }
            Ok((req, prompts))
        }
    })
    .await?;
    // `echo` with `max_tokens: 0` scores the prompt (its logprobs) and generates nothing, as in
    // vLLM. The engine always samples once a prompt is in, so it is asked for one token, which
    // the response leaves out.
    let scoring = req.echo.unwrap_or(false) && req.max_tokens == Some(0);
    let max_tokens =
        if scoring { 1 } else { params::check_max_tokens("max_tokens", req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS))? };
    let logprobs =
        req.logprobs.map(|v| params::check_logprobs("logprobs", v, state.client.max_logprobs())).transpose()?;
    let echo = req.echo.unwrap_or(false);
    let prompt_logprobs = params::prompt_logprobs(&req.sampling, state.client.max_logprobs())?;
    // Echoed logprobs and `prompt_logprobs` come from the same prompt pass: it ranks the larger k.
    let prompt_pass = [logprobs.filter(|_| echo), prompt_logprobs].into_iter().flatten().max();
    let sampling = params::build(
        &req.sampling,
        Requested { max_tokens: Some(max_tokens), logprobs, prompt_logprobs: prompt_pass },
        &state.served.config.sampling_defaults,
    )?;
    let requests = generate::process_off_runtime(&state, &prompts, &sampling).await?;
    let permit = Admission::acquire(&state, prompts.len() * sampling.n)?;
    let ctx = Context {
        id: format!("cmpl-{}", random_id()),
        created: unix_now(),
        model: state.served.model_name().to_string(),
        n: sampling.n,
        echo,
        logprobs: logprobs.is_some(),
        return_token_ids: req.sampling.return_token_ids.unwrap_or(false),
        tokens_as_ids: req.sampling.return_tokens_as_token_ids.unwrap_or(false),
        scoring,
        prompt_logprobs,
        prompts,
        state: state.clone(),
    };
    let streams = generate::submit(&state, &ctx.id, requests, arrival)?;
    if req.stream.unwrap_or(false) {
        Ok(stream_response(ctx, streams, permit, UsageReport::of(req.stream_options.as_ref())))
    } else {
        Ok(Json(collect(ctx, streams).await?).into_response())
    }
}

fn parse_prompts(state: &AppState, prompt: &Value, add_special_tokens: bool) -> Result<Vec<Prompt>, ApiError> {
    const SHAPE: &str = "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists";
    let text_prompt = |s: &str| -> Result<Prompt, ApiError> {
        let ids =
            state.tokenizer.encode(s, add_special_tokens).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok(Prompt::new(ids, Some(s.to_string())))
    };
    let ids_prompt = |items: &[Value]| -> Result<Prompt, ApiError> {
        let raw = items
            .iter()
            .map(|v| v.as_i64().ok_or_else(|| ApiError::invalid("prompt", SHAPE)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Prompt::new(state.served.check_token_ids(&raw, "prompt")?, None))
    };
    let prompts = match prompt {
        Value::String(s) => vec![text_prompt(s)?],
        Value::Array(items) if items.is_empty() => return Err(ApiError::invalid("prompt", "prompt must not be empty")),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.iter().map(|v| text_prompt(v.as_str().unwrap_or_default())).collect::<Result<_, _>>()?
        }
        Value::Array(items) if items.iter().all(Value::is_number) => vec![ids_prompt(items)?],
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| ids_prompt(v.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::invalid("prompt", SHAPE)),
    };
    if prompts.iter().any(|p| p.ids.is_empty()) {
        return Err(ApiError::invalid("prompt", "The decoder prompt cannot be empty"));
    }
    Ok(prompts)
}

/// A choice as it accumulates.
#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Option<CompletionLogprobs>,
    /// Running character offset for `text_offset`.
    offset: usize,
    tokens: usize,
    /// Whether the echoed prompt has been put in front yet.
    started: bool,
    finish_reason: Option<&'static str>,
    stop_reason: Option<StopReason>,
    token_ids: Vec<u32>,
    /// vLLM's `prompt_logprobs` of the choice's prompt.
    prompt_logprobs: Option<Vec<Option<serde_json::Map<String, Value>>>>,
}

impl Context {
    /// Applies one engine step to the choices; returns the stream choices it produced (deltas
    /// with nothing new and no finish reason are dropped, as vLLM drops them).
    fn apply(&self, choices: &mut [Choice], step: Step) -> Vec<CompletionChoice> {
        let tokenizer = &self.state.tokenizer;
        let prompt = &self.prompts[step.prompt];
        let mut out = Vec::new();
        let mut prompt_logprobs = step.prompt_logprobs;
        let prompt_entries = match (self.prompt_logprobs, &prompt_logprobs) {
            (Some(k), Some(positions)) => Some(logprobs::prompt_entries(tokenizer, positions, k)),
            _ => None,
        };
        for mut d in step.deltas {
            if self.scoring {
                d.text.clear();
                d.token_ids.clear();
                d.logprobs = None;
                d.finish_reason = d.finish_reason.map(|_| "length");
                d.stop_reason = None;
            }
            let index = d.prompt * self.n + d.index;
            let Some(c) = choices.get_mut(index) else {
                continue;
            };
            let mut text = String::new();
            let mut lp = self.logprobs.then(CompletionLogprobs::default);
            let first = !c.started;
            if first {
                c.prompt_logprobs.clone_from(&prompt_entries);
            }
            if !c.started {
                c.started = true;
                if self.echo {
                    match &prompt.text {
                        Some(t) => text.push_str(t),
                        None => text.push_str(&tokenizer.decode(&prompt.ids, false).unwrap_or_default()),
                    }
                    if let Some(lp) = lp.as_mut() {
                        let positions = prompt_logprobs.take().unwrap_or_default();
                        logprobs::extend_completion(lp, self.names(), &prompt.ids, &positions, &mut c.offset);
                    }
                }
            }
            text.push_str(&d.text);
            if let Some(lp) = lp.as_mut() {
                let positions: Vec<Option<Position>> = d.logprobs.unwrap_or_default().into_iter().map(Some).collect();
                logprobs::extend_completion(lp, self.names(), &d.token_ids, &positions, &mut c.offset);
            }
            c.tokens += d.token_ids.len();
            if text.is_empty() && d.token_ids.is_empty() && d.finish_reason.is_none() {
                continue;
            }
            c.text.push_str(&text);
            if self.return_token_ids {
                c.token_ids.extend_from_slice(&d.token_ids);
            }
            if let Some(new) = &lp {
                match c.logprobs.as_mut() {
                    Some(all) => append_logprobs(all, new),
                    None => c.logprobs = Some(new.clone()),
                }
            }
            if d.finish_reason.is_some() {
                c.finish_reason = d.finish_reason;
                c.stop_reason = d.stop_reason.clone();
            }
            out.push(CompletionChoice {
                index,
                text,
                logprobs: lp,
                finish_reason: d.finish_reason,
                stop_reason: d.stop_reason,
                prompt_token_ids: (self.return_token_ids && first).then(|| prompt.ids.clone()),
                token_ids: self.return_token_ids.then_some(d.token_ids),
                prompt_logprobs: if first { prompt_entries.clone() } else { None },
            });
        }
        out
    }

    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        }
    }

    fn names(&self) -> logprobs::Names<'_> {
        logprobs::Names { tokenizer: &self.state.tokenizer, as_ids: self.tokens_as_ids }
    }

    /// One choice's usage so far: its prompt and the tokens it generated.
    fn choice_usage(&self, choices: &[Choice], index: usize) -> Usage {
        let prompt = self.prompts.get(index / self.n.max(1)).map_or(0, |p| p.ids.len());
        Usage::new(prompt, choices.get(index).map_or(0, |c| c.tokens))
    }

    fn usage(&self, choices: &[Choice]) -> Usage {
        let prompt_tokens = self.prompts.iter().map(|p| p.ids.len()).sum();
        Usage::new(prompt_tokens, choices.iter().map(|c| c.tokens).sum())
    }
}

fn append_logprobs(all: &mut CompletionLogprobs, new: &CompletionLogprobs) {
    all.text_offset.extend_from_slice(&new.text_offset);
    all.token_logprobs.extend_from_slice(&new.token_logprobs);
    all.tokens.extend(new.tokens.iter().cloned());
    all.top_logprobs.extend(new.top_logprobs.iter().cloned());
}

async fn collect(ctx: Context, mut streams: SelectAll<Tracked>) -> Result<CompletionResponse, ApiError> {
    let mut choices: Vec<Choice> = (0..ctx.prompts.len() * ctx.n).map(|_| Choice::default()).collect();
    while let Some(step) = streams.next().await {
        if let Some(message) = &step.error {
            return Err(ApiError::internal(message.clone()));
        }
        ctx.apply(&mut choices, step);
    }
    let usage = ctx.usage(&choices);
    let out = choices
        .into_iter()
        .enumerate()
        .map(|(index, c)| CompletionChoice {
            index,
            text: c.text,
            logprobs: c.logprobs,
            finish_reason: c.finish_reason,
            stop_reason: c.stop_reason,
            prompt_token_ids: ctx.return_token_ids.then(|| ctx.prompts[index / ctx.n.max(1)].ids.clone()),
            token_ids: ctx.return_token_ids.then_some(c.token_ids),
            prompt_logprobs: c.prompt_logprobs,
        })
        .collect();
    Ok(ctx.response(out, Some(usage)))
}

fn stream_response(ctx: Context, streams: SelectAll<Tracked>, permit: Permit, usage: UsageReport) -> Response {
    let choices: Vec<Choice> = (0..ctx.prompts.len() * ctx.n).map(|_| Choice::default()).collect();
    // The permit lives in the stream state, so the request counts against the bound until the
    // last chunk is sent or the client goes away.
    let state = Some((ctx, streams, choices, permit));
    let events = stream::unfold(state, move |state| async move {
        let (ctx, mut streams, mut choices, permit) = state?;
        match streams.next().await {
            Some(Step { error: Some(message), .. }) => {
                Some((vec![json_event_raw(ApiError::internal(message).to_json()), done_event()], None))
            }
            Some(step) => {
                let events: Vec<Event> = ctx
                    .apply(&mut choices, step)
                    .into_iter()
                    .map(|c| {
                        let so_far = usage.continuous.then(|| ctx.choice_usage(&choices, c.index));
                        json_event(&ctx.response(vec![c], so_far))
                    })
                    .collect();
                Some((events, Some((ctx, streams, choices, permit))))
            }
            None => {
                let mut events = Vec::new();
                if usage.at_end {
                    events.push(json_event(&ctx.response(Vec::new(), Some(ctx.usage(&choices)))));
                }
                events.push(done_event());
                drop(permit);
                Some((events, None))
            }
        }
    })
    .flat_map(stream::iter)
    .map(Ok::<_, Infallible>);
    Sse::new(events).into_response()
}
