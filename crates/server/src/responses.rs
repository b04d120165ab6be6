//! `POST /v1/responses`: OpenAI's Responses API as vLLM serves it, on the chat pipeline. The
//! request's `instructions`, the conversation of `previous_response_id` and its `input` (text or
//! items: messages, function calls and their outputs) become chat messages; function `tools`,
//! `tool_choice` and `text.format` become the chat request's tools and response format. The
//! chat message that comes back becomes output items (reasoning, message, function calls), whole
//! or as the API's stream of typed events. Responses are kept in memory (the most recent
//! [`STORED`]) so that a later request can continue from them.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, StreamExt};
use serde_json::{json, Map, Value};

use crate::chat::{self, Choice};
use crate::error::{parse_json, ApiError};
use crate::protocol::{ChatCompletionRequest, ChatCompletionResponse, ChatStreamChoice, Usage};
use crate::{off_runtime, random_id, unix_now, AppState};

/// Responses kept for `previous_response_id`, oldest dropped first.
pub const STORED: usize = 1024;

/// A stored response's conversation: chat messages, the response's own turn included.
type Conversation = Vec<Value>;

/// Stored conversations by response id, and the ids oldest first.
#[derive(Default)]
pub struct Store {
    inner: Mutex<(VecDeque<String>, HashMap<String, Conversation>)>,
}

impl Store {
    fn get(&self, id: &str) -> Option<Vec<Value>> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.get(id).cloned()
    }

    fn put(&self, id: String, conversation: Vec<Value>) {
        let mut guard = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (order, map) = &mut *guard;
        order.push_back(id.clone());
        map.insert(id, conversation);
        while order.len() > STORED {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }
}

/// Request fields this endpoint reads; other Responses fields are refused by name.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "stream",
    "previous_response_id",
    "store",
    "metadata",
    "user",
];

pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    match run(state, body, Instant::now()).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

fn text_of(param: &str, content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("input_text" | "output_text" | "text"), Some(t)) => Ok(t),
                (kind, _) => Err(ApiError::invalid(
                    param,
                    format!("content parts of type {kind:?} are not supported; this model takes text only"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.join("\n")),
        other => Err(ApiError::invalid(param, format!("content must be text or a list of parts, got {other}"))),
    }
}

/// A message item's content as chat content: text (parts joined with newlines, as before), or,
/// when it holds an `input_image`, chat parts with the image as an `image_url` part.
fn message_content(content: &Value) -> Result<Value, ApiError> {
    let parts = match content {
        Value::Array(parts) if parts.iter().any(|p| p.get("type").and_then(Value::as_str) == Some("input_image")) => {
            parts
        }
        other => return text_of("input", other).map(Value::String),
    };
    parts
        .iter()
        .map(|p| match p.get("type").and_then(Value::as_str) {
            Some("input_image") => match p.get("image_url").and_then(Value::as_str) {
                Some(url) => Ok(json!({"type": "image_url", "image_url": {"url": url, "detail": p.get("detail")}})),
                None => Err(ApiError::invalid(
                    "input",
                    "an input_image part needs `image_url` (a URL or a data URI); `file_id` is not supported",
                )),
            },
            _ => text_of("input", &Value::Array(vec![p.clone()])).map(|text| json!({"type": "text", "text": text})),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// `input` items as chat messages (consecutive function calls join one assistant turn).
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("input", "input must be a string or a list of items")),
    };
    let mut messages: Vec<Value> = Vec::new();
    for item in items {
        match item.get("type").and_then(Value::as_str).unwrap_or("message") {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let role = if role == "developer" { "system" } else { role };
                let content = message_content(item.get("content").unwrap_or(&Value::Null))?;
                messages.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let call = json!({
                    "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": item.get("name").cloned().unwrap_or(Value::Null),
                                 "arguments": item.get("arguments").cloned().unwrap_or(json!("{}"))},
                });
                let joins = messages.last().is_some_and(|m| m["role"] == "assistant" && m.get("tool_calls").is_some());
                match messages.last_mut() {
                    Some(last) if joins => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let output = text_of("input", item.get("output").unwrap_or(&Value::Null))?;
                messages.push(json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}));
            }
            // A reasoning item of an earlier turn: chat templates drop past reasoning anyway.
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid("input", format!("input items of type {other:?} are not supported")))
            }
        }
    }
    Ok(messages)
}

/// The Responses request as a chat request, and the conversation it continues.
fn chat_request(state: &AppState, req: &Map<String, Value>) -> Result<(ChatCompletionRequest, Vec<Value>), ApiError> {
    if let Some(field) = req.keys().find(|k| !FIELDS.contains(&k.as_str()) && !req[*k].is_null()) {
        return Err(ApiError::invalid(field, format!("`{field}` is not supported by this server's /v1/responses")));
    }
    let mut conversation = match req.get("previous_response_id").and_then(Value::as_str) {
        Some(id) => {
            state.responses.get(id).ok_or_else(|| ApiError::not_found(format!("Response with id '{id}' not found.")))?
        }
        None => Vec::new(),
    };
    conversation.extend(input_messages(req.get("input").unwrap_or(&Value::Null))?);
    let mut messages = Vec::new();
    match req.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(instructions)) => messages.push(json!({"role": "system", "content": instructions})),
        // vLLM's `instructions: Optional[str]`; anything else would also be echoed back whole.
        Some(other) => {
            let kind = match other {
                Value::Array(_) => "an array",
                Value::Object(_) => "an object",
                Value::Number(_) => "a number",
                _ => "a boolean",
            };
            return Err(ApiError::invalid("instructions", format!("`instructions` must be a string, got {kind}")));
        }
    }
    messages.extend(conversation.iter().cloned());
    let tools = match req.get("tools") {
        Some(Value::Array(tools)) => tools
            .iter()
            .map(|t| match t.get("type").and_then(Value::as_str) {
                Some("function") => Ok(json!({"type": "function", "function": {
                    "name": t.get("name"), "description": t.get("description"), "parameters": t.get("parameters"),
                }})),
                other => Err(ApiError::invalid("tools", format!("tools of type {other:?} are not supported"))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    let response_format = match req.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => Value::Null,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => Value::Null,
            Some("json_object") => json!({"type": "json_object"}),
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": f.get("name"), "schema": f.get("schema"), "strict": f.get("strict"),
            }}),
            other => return Err(ApiError::invalid("text", format!("text.format type {other:?} is not supported"))),
        },
    };
    let tool_choice = match req.get("tool_choice") {
        // Responses names a function flat: {"type": "function", "name": ...}.
        Some(c @ Value::Object(_)) if c.get("name").is_some() => {
            json!({"type": "function", "function": {"name": c["name"]}})
        }
        Some(c) => c.clone(),
        None => Value::Null,
    };
    let mut chat = json!({
        "model": req.get("model"),
        "messages": messages,
        "max_tokens": req.get("max_output_tokens"),
        "temperature": req.get("temperature"),
        "top_p": req.get("top_p"),
        "top_k": req.get("top_k"),
        "seed": req.get("seed"),
        "parallel_tool_calls": req.get("parallel_tool_calls"),
        "tool_choice": tool_choice,
        "response_format": response_format,
    });
    if !tools.is_empty() {
        chat["tools"] = Value::Array(tools);
    }
    let chat: ChatCompletionRequest =
        serde_json::from_value(chat).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    Ok((chat, conversation))
}

/// What the response is made of, as it accumulates (or once, from a finished chat message).
#[derive(Default)]
struct Output {
    reasoning: String,
    text: String,
    /// (call id, name, arguments)
    calls: Vec<(String, String, String)>,
    finish_reason: Option<&'static str>,
}

impl Output {
    fn from_chat(r: &ChatCompletionResponse) -> Output {
        let Some(c) = r.choices.first() else { return Output::default() };
        Output {
            reasoning: c.message.reasoning_content.clone().unwrap_or_default(),
            text: c.message.content.clone().unwrap_or_default(),
            calls: c
                .message
                .tool_calls
                .iter()
                .map(|t| {
                    (
                        t.id.clone().unwrap_or_default(),
                        t.function.name.clone().unwrap_or_default(),
                        t.function.arguments.clone().unwrap_or_default(),
                    )
                })
                .collect(),
            finish_reason: c.finish_reason,
        }
    }

    /// The output items, with the ids the stream announced them under.
    fn items(&self, ids: &ItemIds) -> Vec<Value> {
        let mut items = Vec::new();
        if !self.reasoning.is_empty() {
            items.push(reasoning_item(&ids.reasoning, &self.reasoning, "completed"));
        }
        if !self.text.is_empty() || self.calls.is_empty() {
            items.push(message_item(&ids.message, &self.text, "completed"));
        }
        for (i, (call_id, name, arguments)) in self.calls.iter().enumerate() {
            items.push(call_item(&ids.call(i), call_id, name, arguments, "completed"));
        }
        items
    }

    /// The chat turn this response adds to its conversation.
    fn turn(&self) -> Value {
        let calls: Vec<Value> = self
            .calls
            .iter()
            .map(
                |(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}),
            )
            .collect();
        let mut turn = json!({"role": "assistant", "content": self.text});
        if !calls.is_empty() {
            turn["tool_calls"] = Value::Array(calls);
        }
        turn
    }
}

struct ItemIds {
    reasoning: String,
    message: String,
    calls: Vec<String>,
}

impl ItemIds {
    fn new() -> ItemIds {
        ItemIds { reasoning: format!("rs_{}", random_id()), message: format!("msg_{}", random_id()), calls: Vec::new() }
    }

    fn call(&self, i: usize) -> String {
        self.calls.get(i).cloned().unwrap_or_else(|| format!("fc_{i}"))
    }
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "status": status,
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    } else {
        json!([])
    };
    json!({"type": "message", "id": id, "role": "assistant", "status": status, "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    request: Map<String, Value>,
}

impl Meta {
    fn response(&self, status: &str, output: Vec<Value>, usage: Option<Usage>, finish: Option<&str>) -> Value {
        let incomplete = (finish == Some("length")).then(|| json!({"reason": "max_output_tokens"}));
        let get = |k: &str| self.request.get(k).cloned().unwrap_or(Value::Null);
        json!({
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": if status == "completed" && incomplete.is_some() { "incomplete" } else { status },
            "incomplete_details": incomplete, "error": null,
            "instructions": get("instructions"), "max_output_tokens": get("max_output_tokens"),
            "temperature": get("temperature"), "top_p": get("top_p"), "metadata": get("metadata"),
            "previous_response_id": get("previous_response_id"),
            "tools": self.request.get("tools").cloned().unwrap_or(json!([])),
            "tool_choice": self.request.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "parallel_tool_calls": self.request.get("parallel_tool_calls").cloned().unwrap_or(json!(true)),
            "text": self.request.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
            "output": output,
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens,
            })),
        })
    }
}

async fn run(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = body?;
    let req: Map<String, Value> = off_runtime(move || parse_json(&body)).await?;
    let (chat_req, conversation) = chat_request(&state, &req)?;
    let meta = Meta {
        id: format!("resp_{}", random_id()),
        created: unix_now(),
        model: state.served.model_name().to_string(),
        request: req.clone(),
    };
    let store = req.get("store").and_then(Value::as_bool).unwrap_or(true);
    let started = chat::start(state.clone(), chat_req, arrival).await?;
    if !req.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        let chat = chat::collect(started.ctx, started.streams).await?;
        drop(started.permit);
        let output = Output::from_chat(&chat);
        if store {
            state.responses.put(meta.id.clone(), [conversation, vec![output.turn()]].concat());
        }
        let body = meta.response("completed", output.items(&ItemIds::new()), Some(chat.usage), output.finish_reason);
        return Ok(Json(body).into_response());
    }
    Ok(stream_events(state, meta, started, conversation, store))
}

/// The stream's state: items open so far, in output order.
struct Streamer {
    meta: Meta,
    seq: u64,
    ids: ItemIds,
    output: Output,
    /// Output indices of the open reasoning item, message, and each call.
    reasoning_at: Option<usize>,
    message_at: Option<usize>,
    calls_at: Vec<usize>,
    next_index: usize,
    done: Vec<bool>,
}

impl Streamer {
    fn event(&mut self, kind: &str, mut body: Value) -> Event {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Event::default().event(kind).data(body.to_string())
    }

    fn open(&mut self, item: Value, events: &mut Vec<Event>) -> usize {
        let at = self.next_index;
        self.next_index += 1;
        self.done.push(false);
        events.push(self.event("response.output_item.added", json!({"output_index": at, "item": item})));
        at
    }

    fn close_reasoning(&mut self, events: &mut Vec<Event>) {
        if let Some(at) = self.reasoning_at.take() {
            let item = reasoning_item(&self.ids.reasoning, &self.output.reasoning, "completed");
            let text = self.output.reasoning.clone();
            events.push(self.event(
                "response.reasoning_text.done",
                json!({
                "item_id": self.ids.reasoning, "output_index": at, "content_index": 0, "text": text}),
            ));
            events.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
            self.done[at] = true;
        }
    }

    fn close_message(&mut self, events: &mut Vec<Event>) {
        if let Some(at) = self.message_at.take() {
            let text = self.output.text.clone();
            let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
            let id = self.ids.message.clone();
            events.push(self.event(
                "response.output_text.done",
                json!({
                "item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": []}),
            ));
            events.push(self.event(
                "response.content_part.done",
                json!({
                "item_id": id, "output_index": at, "content_index": 0, "part": part}),
            ));
            let item = message_item(&id, &text, "completed");
            events.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
            self.done[at] = true;
        }
    }

    fn close_calls(&mut self, events: &mut Vec<Event>) {
        for i in 0..self.calls_at.len() {
            let at = self.calls_at[i];
            if self.done[at] {
                continue;
            }
            let (call_id, name, arguments) = self.output.calls[i].clone();
            let id = self.ids.call(i);
            events.push(self.event(
                "response.function_call_arguments.done",
                json!({
                "item_id": id, "output_index": at, "arguments": arguments}),
            ));
            let item = call_item(&id, &call_id, &name, &arguments, "completed");
            events.push(self.event("response.output_item.done", json!({"output_index": at, "item": item})));
            self.done[at] = true;
        }
    }

    /// The events for one streamed chat choice delta.
    fn delta(&mut self, c: ChatStreamChoice) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(r) = c.delta.reasoning_content.filter(|r| !r.is_empty()) {
            let at = match self.reasoning_at {
                Some(at) => at,
                None => {
                    let item = reasoning_item(&self.ids.reasoning, "", "in_progress");
                    let at = self.open(item, &mut events);
                    self.reasoning_at = Some(at);
                    at
                }
            };
            self.output.reasoning.push_str(&r);
            let id = self.ids.reasoning.clone();
            events.push(self.event(
                "response.reasoning_text.delta",
                json!({
                "item_id": id, "output_index": at, "content_index": 0, "delta": r}),
            ));
        }
        if let Some(text) = c.delta.content.filter(|t| !t.is_empty()) {
            self.close_reasoning(&mut events);
            let at = match self.message_at {
                Some(at) => at,
                None => {
                    let at = self.open(message_item(&self.ids.message, "", "in_progress"), &mut events);
                    let id = self.ids.message.clone();
                    events.push(self.event(
                        "response.content_part.added",
                        json!({
                        "item_id": id, "output_index": at, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
                    ));
                    self.message_at = Some(at);
                    at
                }
            };
            self.output.text.push_str(&text);
            let id = self.ids.message.clone();
            events.push(self.event(
                "response.output_text.delta",
                json!({
                "item_id": id, "output_index": at, "content_index": 0, "delta": text, "logprobs": []}),
            ));
        }
        for call in c.delta.tool_calls {
            self.close_reasoning(&mut events);
            self.close_message(&mut events);
            let i = call.index.unwrap_or(0);
            while self.calls_at.len() <= i {
                let n = self.calls_at.len();
                let (call_id, name) = if n == i {
                    (call.id.clone().unwrap_or_default(), call.function.name.clone().unwrap_or_default())
                } else {
                    (String::new(), String::new())
                };
                self.ids.calls.push(format!("fc_{}", random_id()));
                let item = call_item(&self.ids.call(n), &call_id, &name, "", "in_progress");
                let at = self.open(item, &mut events);
                self.calls_at.push(at);
                self.output.calls.push((call_id, name, String::new()));
            }
            if let Some(args) = call.function.arguments.filter(|a| !a.is_empty()) {
                self.output.calls[i].2.push_str(&args);
                let (id, at) = (self.ids.call(i), self.calls_at[i]);
                events.push(self.event(
                    "response.function_call_arguments.delta",
                    json!({
                    "item_id": id, "output_index": at, "delta": args}),
                ));
            }
        }
        if c.finish_reason.is_some() {
            self.output.finish_reason = c.finish_reason;
        }
        events
    }

    fn finish(&mut self, usage: Usage) -> Vec<Event> {
        let mut events = Vec::new();
        self.close_reasoning(&mut events);
        self.close_message(&mut events);
        self.close_calls(&mut events);
        let response =
            self.meta.response("completed", self.output.items(&self.ids), Some(usage), self.output.finish_reason);
        events.push(self.event("response.completed", json!({"response": response})));
        events
    }
}

fn stream_events(
    state: Arc<AppState>,
    meta: Meta,
    started: chat::Started,
    conversation: Vec<Value>,
    store: bool,
) -> Response {
    let mut s = Streamer {
        meta,
        seq: 0,
        ids: ItemIds::new(),
        output: Output::default(),
        reasoning_at: None,
        message_at: None,
        calls_at: Vec::new(),
        next_index: 0,
        done: Vec::new(),
    };
    let created = s.meta.response("in_progress", Vec::new(), None, None);
    let opening = vec![
        s.event("response.created", json!({"response": created.clone()})),
        s.event("response.in_progress", json!({"response": created})),
    ];
    let chat::Started { ctx, streams, permit } = started;
    let choices: Vec<Choice> = vec![Choice::new(ctx.shape())];
    let init = Some((s, ctx, streams, choices, permit, state, conversation));
    let rest = stream::unfold(init, move |st| async move {
        let (mut s, ctx, mut streams, mut choices, permit, state, conversation) = st?;
        match streams.next().await {
            Some(step) if step.error.is_some() => {
                let message = step.error.unwrap_or_default();
                let failed = s.meta.response("failed", Vec::new(), None, None);
                let mut failed = failed;
                failed["error"] = json!({"code": "server_error", "message": message});
                Some((vec![s.event("response.failed", json!({"response": failed}))], None))
            }
            Some(step) => {
                let events: Vec<Event> =
                    ctx.apply(&mut choices, step, true).into_iter().flat_map(|c| s.delta(c)).collect();
                Some((events, Some((s, ctx, streams, choices, permit, state, conversation))))
            }
            None => {
                let events = s.finish(ctx.usage(&choices));
                if store {
                    state.responses.put(s.meta.id.clone(), [conversation, vec![s.output.turn()]].concat());
                }
                drop(permit);
                Some((events, None))
            }
        }
    })
    .flat_map(stream::iter);
    Sse::new(stream::iter(opening).chain(rest).map(Ok::<_, Infallible>)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_images_become_image_url_parts() {
        let messages = input_messages(&json!([
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://x/a.png", "detail": "auto"},
            ]},
        ]))
        .unwrap();
        assert_eq!(messages[0]["content"], "a\nb");
        assert_eq!(
            messages[1]["content"],
            json!([
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "auto"}},
            ])
        );
        let chat: crate::protocol::RequestMessage = serde_json::from_value(messages[1].clone()).unwrap();
        let Some(crate::protocol::MessageContent::Parts(parts)) = &chat.content else { panic!("parts") };
        assert_eq!(parts[1].media_url().unwrap().url, "https://x/a.png");

        let e = input_messages(&json!([{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]));
        assert!(e.unwrap_err().message.contains("`file_id` is not supported"));
    }
}
