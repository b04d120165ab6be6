//! `POST /v1/chat/completions`: messages rendered with the model's chat template, then
//! generated like a single-prompt completion. Streams open with one role chunk per choice,
//! carry content deltas, and end each choice with a chunk holding its `finish_reason`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ferrite_tokenizer::ChatMessage;
use futures::stream::{self, SelectAll, StreamExt};

use crate::admission::{Admission, Permit};
use crate::error::{parse_json, ApiError};
use crate::generate::{self, Prompt, Step, Tracked};
use crate::logprobs;
use crate::params::{self, Requested};
use crate::protocol::{
    ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta, ChatLogprobs,
    ChatMessageOut, ChatStreamChoice, MessageContent, RequestMessage, StopReason, Usage,
};
use crate::sse::{done_event, json_event, json_event_raw};
use crate::{off_runtime, random_id, unix_now, AppState};

pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    match run(state, body, arrival).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// Messages as the chat template sees them: text parts are joined with newlines, as vLLM does.
pub fn template_messages(messages: &[RequestMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must contain at least one message"));
    }
    messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => parts
                    .iter()
                    .map(|p| match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => Ok(t.as_str()),
                        ("text", None) => Err(ApiError::invalid("messages", "a text content part needs `text`")),
                        (other, _) => Err(ApiError::invalid(
                            "messages",
                            format!("content parts of type `{other}` are not supported; this model takes text only"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join("\n"),
            };
            Ok(ChatMessage::new(m.role.clone(), content))
        })
        .collect()
}

/// Renders and tokenizes a conversation; a template that refuses it (`raise_exception`) is the
/// client's error.
pub fn chat_prompt(
    state: &AppState,
    messages: &[RequestMessage],
    add_generation_prompt: bool,
    add_special_tokens: bool,
) -> Result<Prompt, ApiError> {
    let messages = template_messages(messages)?;
    let text = state
        .tokenizer
        .apply_chat_template(&messages, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let ids =
        state.tokenizer.encode(&text, add_special_tokens).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    Ok(Prompt { ids, text: Some(text) })
}

struct Context {
    state: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    top_logprobs: Option<usize>,
    prompt_tokens: usize,
}

async fn run(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = body?;
    // Parsing, the chat template and tokenization of a long conversation take CPU time that
    // must not stall the other connections (and /health) on the async runtime.
    let (req, prompt) = off_runtime({
        let state = state.clone();
        move || {
            let req: ChatCompletionRequest = parse_json(&body)?;
            state.served.check_model(req.model.as_deref())?;
            if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
                return Err(ApiError::invalid("tools", "tool calling is not supported yet; omit `tools`"));
            }
            let prompt = chat_prompt(
                &state,
                &req.messages,
                req.add_generation_prompt.unwrap_or(true),
                req.add_special_tokens.unwrap_or(false),
            )?;
            Ok((req, prompt))
        }
    })
    .await?;
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        Some(v) => Some(params::check_max_tokens(
            if req.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" },
            v,
        )?),
        None => None,
    };
    let max_tokens = params::chat_max_tokens(
        max_tokens,
        state.served.config.sampling_defaults.max_tokens,
        prompt.ids.len(),
        state.served.max_model_len,
    );
    let top_logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, top) => Some(params::check_logprobs("top_logprobs", top.unwrap_or(0), state.client.max_logprobs())?),
        (false, Some(top)) if top > 0 => {
            return Err(ApiError::invalid("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."))
        }
        (false, _) => None,
    };
    let sampling = params::build(
        &req.sampling,
        Requested { max_tokens, logprobs: top_logprobs, prompt_logprobs: None },
        &state.served.config.sampling_defaults,
    )?;
    let requests = generate::process(&state, std::slice::from_ref(&prompt), &sampling)?;
    let permit = Admission::acquire(&state, sampling.n)?;
    let ctx = Context {
        id: format!("chatcmpl-{}", random_id()),
        created: unix_now(),
        model: state.served.model_name().to_string(),
        n: sampling.n,
        top_logprobs,
        prompt_tokens: prompt.ids.len(),
        state: state.clone(),
    };
    let streams = generate::submit(&state, &ctx.id, requests, arrival)?;
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        Ok(stream_response(ctx, streams, permit, include_usage))
    } else {
        Ok(Json(collect(ctx, streams).await?).into_response())
    }
}

#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Option<ChatLogprobs>,
    tokens: usize,
    finish_reason: Option<&'static str>,
    stop_reason: Option<StopReason>,
}

impl Context {
    fn apply(&self, choices: &mut [Choice], step: Step) -> Vec<ChatStreamChoice> {
        let mut out = Vec::new();
        for d in step.deltas {
            let Some(c) = choices.get_mut(d.index) else {
                continue;
            };
            c.tokens += d.token_ids.len();
            if d.text.is_empty() && d.token_ids.is_empty() && d.finish_reason.is_none() {
                continue;
            }
            let lp = self.top_logprobs.map(|top| ChatLogprobs {
                content: logprobs::chat_entries(&self.state.tokenizer, &d.logprobs.unwrap_or_default(), top),
            });
            c.text.push_str(&d.text);
            if let Some(new) = &lp {
                c.logprobs
                    .get_or_insert_with(|| ChatLogprobs { content: Vec::new() })
                    .content
                    .extend(new.content.iter().cloned());
            }
            if d.finish_reason.is_some() {
                c.finish_reason = d.finish_reason;
                c.stop_reason = d.stop_reason.clone();
            }
            out.push(ChatStreamChoice {
                index: d.index,
                delta: ChatDelta { role: None, content: Some(d.text) },
                logprobs: lp,
                finish_reason: d.finish_reason,
                stop_reason: d.stop_reason,
            });
        }
        out
    }

    fn chunk(&self, choices: Vec<ChatStreamChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            system_fingerprint: None,
        }
    }

    fn usage(&self, choices: &[Choice]) -> Usage {
        Usage::new(self.prompt_tokens, choices.iter().map(|c| c.tokens).sum())
    }
}

async fn collect(ctx: Context, mut streams: SelectAll<Tracked>) -> Result<ChatCompletionResponse, ApiError> {
    let mut choices: Vec<Choice> = (0..ctx.n).map(|_| Choice::default()).collect();
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
        .map(|(index, c)| ChatChoice {
            index,
            message: ChatMessageOut { role: "assistant", content: c.text, tool_calls: Vec::new() },
            logprobs: c.logprobs,
            finish_reason: c.finish_reason,
            stop_reason: c.stop_reason,
        })
        .collect();
    Ok(ChatCompletionResponse {
        id: ctx.id,
        object: "chat.completion",
        created: ctx.created,
        model: ctx.model,
        choices: out,
        usage,
        system_fingerprint: None,
    })
}

fn stream_response(ctx: Context, streams: SelectAll<Tracked>, permit: Permit, include_usage: bool) -> Response {
    let roles: Vec<Event> = (0..ctx.n)
        .map(|index| {
            json_event(&ctx.chunk(
                vec![ChatStreamChoice {
                    index,
                    delta: ChatDelta { role: Some("assistant"), content: Some(String::new()) },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            ))
        })
        .collect();
    let choices: Vec<Choice> = (0..ctx.n).map(|_| Choice::default()).collect();
    // The permit lives in the stream state: the request counts against the bound until its
    // last chunk is sent or the client goes away.
    let state = Some((ctx, streams, choices, permit));
    let deltas = stream::unfold(state, move |state| async move {
        let (ctx, mut streams, mut choices, permit) = state?;
        match streams.next().await {
            Some(Step { error: Some(message), .. }) => {
                Some((vec![json_event_raw(ApiError::internal(message).to_json()), done_event()], None))
            }
            Some(step) => {
                let events: Vec<Event> =
                    ctx.apply(&mut choices, step).into_iter().map(|c| json_event(&ctx.chunk(vec![c], None))).collect();
                Some((events, Some((ctx, streams, choices, permit))))
            }
            None => {
                let mut events = Vec::new();
                if include_usage {
                    events.push(json_event(&ctx.chunk(Vec::new(), Some(ctx.usage(&choices)))));
                }
                events.push(done_event());
                drop(permit);
                Some((events, None))
            }
        }
    })
    .flat_map(stream::iter);
    Sse::new(stream::iter(roles).chain(deltas).map(Ok::<_, Infallible>)).into_response()
}
