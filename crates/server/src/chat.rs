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
use ferrite_tokenizer::{ChatRender, ChatTemplate};
use futures::stream::{self, SelectAll, StreamExt};
use serde_json::Value;

use crate::admission::{Admission, Permit};
use crate::chat_output::{Parts, Shape, Shaper, ToolMode};
use crate::content_format::ContentFormat;
use crate::error::{parse_json, ApiError};
use crate::generate::{self, Prompt, Step, Tracked};
use crate::images::ImageProcessing;
use crate::logprobs;
use crate::media::{MediaKind, MediaRef, ModelMedia};
use crate::params::{self, Requested};
use crate::protocol::{
    ChatChoice, ChatCompletionChunk, ChatCompletionRequest, ChatCompletionResponse, ChatDelta, ChatLogprobs,
    ChatMessageOut, ChatStreamChoice, MessageContent, RequestMessage, StopReason, Usage, UsageReport,
};
use crate::sse::{done_event, json_event, json_event_raw};
use crate::{off_runtime, random_id, unix_now, AppState, ChatOptions};
use ferrite_engine::{Constraint, StructuredOutputs};
use ferrite_parsers::reasoning;
use ferrite_parsers::tool::FunctionSpec;
use serde_json::json;

pub async fn handle(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    match run(state, body, arrival).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// A conversation as the chat template sees it, and the media its messages bring.
pub struct TemplateInput {
    pub messages: Vec<Value>,
    /// The image parts, in message order, not fetched yet.
    pub media: Vec<MediaRef>,
}

/// Messages as the chat template sees them, as vLLM hands them over: content in the template's
/// format (see [`message_content`]), every other field kept, and assistant tool-call arguments
/// parsed from their JSON text into objects (templates print them with `tojson`).
pub fn template_messages(
    messages: &[RequestMessage],
    format: ContentFormat,
    model: &ModelMedia,
) -> Result<TemplateInput, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must contain at least one message"));
    }
    let mut media = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = message_content(i, m.content.as_ref(), format, model, &mut media)?;
        let mut message = m.rest.clone();
        message.insert("role".into(), m.role.clone().into());
        message.insert("content".into(), content);
        if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
            for call in calls.iter_mut() {
                let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else {
                    return Err(ApiError::invalid("messages", "a tool call needs a `function` object"));
                };
                let arguments = match function.get("arguments") {
                    Some(Value::String(text)) if !text.is_empty() => serde_json::from_str(text)
                        .map_err(|e| ApiError::invalid("messages", format!("tool call arguments are not JSON: {e}")))?,
                    Some(v @ Value::Object(_)) => v.clone(),
                    _ => Value::Object(Default::default()),
                };
                function.insert("arguments".into(), arguments);
            }
        }
        out.push(Value::Object(message));
    }
    Ok(TemplateInput { messages: out, media })
}

/// Message `i`'s content as vLLM hands it to a template of `format`: for `string`, the text parts
/// joined with newlines behind the model's placeholder for each image and video; for `openai`, a
/// list of `{"type": "text", "text": ...}`, `{"type": "image"}` and `{"type": "video"}` parts (a
/// string content, or none, becomes such a list too). Its image and video parts are added to
/// `media`.
fn message_content(
    i: usize,
    content: Option<&MessageContent>,
    format: ContentFormat,
    model: &ModelMedia,
    media: &mut Vec<MediaRef>,
) -> Result<Value, ApiError> {
    let parts = match content {
        None => &[][..],
        Some(MessageContent::Text(text)) => {
            return Ok(match format {
                ContentFormat::String => text.clone().into(),
                ContentFormat::Openai => json!([{"type": "text", "text": text}]),
            })
        }
        Some(MessageContent::Parts(parts)) => parts.as_slice(),
    };
    let mut texts = Vec::new();
    let mut wrapped = Vec::new();
    // The placeholder of each image and video part, in order.
    let mut placeholders = Vec::new();
    for (j, part) in parts.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        let fail = |problem: String| ApiError::invalid("messages", format!("{}: {problem}", at()));
        match part.kind.as_str() {
            "text" => {
                let text = part.text.as_deref().ok_or_else(|| fail("a text content part needs `text`".into()))?;
                match format {
                    ContentFormat::String => texts.push(text),
                    ContentFormat::Openai => wrapped.push(json!({"type": "text", "text": text})),
                }
            }
            "image_url" => {
                if !model.accepts_images {
                    return Err(fail(
                        "content parts of type `image_url` are not supported: this model does not accept image input"
                            .into(),
                    ));
                }
                let url = part.media_url().map_err(fail)?;
                if url.detail.is_some_and(|d| d != "auto") {
                    tracing::warn!("'image_url.detail' is currently not supported and will be ignored.");
                }
                media.push(MediaRef { kind: MediaKind::Image, url: url.url.to_string(), location: at() });
                placeholders.push(model.image_placeholder.as_deref());
                if format == ContentFormat::Openai {
                    wrapped.push(json!({"type": "image"}));
                }
            }
            "video_url" => {
                match model.images.as_deref().map(|p| &p.video) {
                    Some(Ok(_)) => {}
                    Some(Err(reason)) => return Err(fail(format!("content parts of type `video_url`: {reason}"))),
                    None => {
                        return Err(fail(
                            "content parts of type `video_url` are not supported: this model does not accept video \
                             input"
                                .into(),
                        ))
                    }
                }
                let url = part.media_url().map_err(fail)?;
                media.push(MediaRef { kind: MediaKind::Video, url: url.url.to_string(), location: at() });
                placeholders.push(model.video_placeholder.as_deref());
                if format == ContentFormat::Openai {
                    wrapped.push(json!({"type": "video"}));
                }
            }
            other => return Err(fail(format!("content parts of type `{other}` are not supported"))),
        }
    }
    match format {
        ContentFormat::Openai => Ok(Value::Array(wrapped)),
        ContentFormat::String => string_content(&texts, &placeholders)
            .map(Value::String)
            .map_err(|problem| ApiError::invalid("messages", format!("messages[{i}]: {problem}"))),
    }
}

/// vLLM's content for a `string` template: the text parts joined with newlines, behind the
/// placeholders (one per image or video part, grouped by placeholder in order of first use) that
/// the text does not already place itself.
fn string_content(texts: &[&str], placeholders: &[Option<&str>]) -> Result<String, String> {
    let text = texts.join("\n");
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for placeholder in placeholders.iter().flatten().filter(|p| !p.is_empty()) {
        match counts.iter_mut().find(|(p, _)| p == placeholder) {
            Some((_, n)) => *n += 1,
            None => counts.push((placeholder, 1)),
        }
    }
    let mut lines = Vec::new();
    for (placeholder, items) in counts {
        let placed = text.matches(placeholder).count();
        if placed > items {
            return Err(format!(
                "Found more '{placeholder}' placeholders in input prompt than actual multimodal data items."
            ));
        }
        lines.extend(std::iter::repeat_n(placeholder, items - placed));
    }
    lines.push(&text);
    Ok(lines.join("\n"))
}

/// How a conversation is rendered, beyond its messages.
#[derive(Default)]
pub struct PromptOptions<'a> {
    pub add_generation_prompt: bool,
    pub add_special_tokens: bool,
    pub continue_final_message: bool,
    pub tools: Option<&'a [Value]>,
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
    /// The request's own template (already allowed by the server's flags).
    pub chat_template: Option<&'a str>,
}

/// A rendered conversation: its prompt, and the media its messages bring (not fetched yet; they
/// are checked against `--limit-mm-per-prompt`).
pub struct RenderedChat {
    pub prompt: Prompt,
    pub media: Vec<MediaRef>,
}

/// Renders and tokenizes a conversation; a template that refuses it (`raise_exception`) is the
/// client's error.
pub fn chat_prompt(
    state: &AppState,
    messages: &[RequestMessage],
    o: &PromptOptions<'_>,
) -> Result<RenderedChat, ApiError> {
    if o.continue_final_message && o.add_generation_prompt {
        return Err(ApiError::invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let tok = &state.tokenizer;
    let options = &state.served.config.media;
    let request_template = o
        .chat_template
        .map(|source| {
            ChatTemplate::new(
                source.to_string(),
                tok.bos_token().unwrap_or_default().to_string(),
                tok.eos_token().unwrap_or_default().to_string(),
            )
        })
        .transpose()
        .map_err(|e| ApiError::invalid("chat_template", e.to_string()))?;
    let (template, format) = match &request_template {
        Some(t) => (t, options.content_format.resolve(t.source())),
        None => match tok.chat_template() {
            Some(t) => (t, state.content_format),
            None => return Err(ApiError::invalid("messages", "this model has no chat template")),
        },
    };
    let input = template_messages(messages, format, &options.model)?;
    options.limits.check(&input.media)?;
    let render = ChatRender {
        messages: &input.messages,
        tools: o.tools,
        add_generation_prompt: o.add_generation_prompt,
        continue_final_message: o.continue_final_message,
        kwargs: o.kwargs,
    };
    let text = template.render_chat(&render).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let images = input.media.iter().filter(|m| m.kind == MediaKind::Image).count();
    let text = ImageProcessing::expand_text(options.model.images.as_deref(), text, images)?;
    let ids = tok.encode(&text, o.add_special_tokens).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    let prompt = Prompt { tokenized_with_special_tokens: Some(o.add_special_tokens), ..Prompt::new(ids, Some(text)) };
    Ok(RenderedChat { prompt, media: input.media })
}

pub(crate) struct Context {
    state: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    top_logprobs: Option<usize>,
    prompt_tokens: usize,
    shape: Shape,
    /// The prompt's ids, when the request asked for `return_token_ids`.
    prompt_token_ids: Option<Vec<u32>>,
    /// The `prompt_logprobs` the request asked for.
    prompt_logprobs: Option<usize>,
    /// Logprob entries name tokens `token_id:<id>`.
    tokens_as_ids: bool,
}

type PromptEntries = Vec<Option<serde_json::Map<String, Value>>>;

impl Context {
    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    /// vLLM's `prompt_logprobs` from the step that carries them, when the request asked.
    fn prompt_entries(&self, step: &Step) -> Option<PromptEntries> {
        let positions = step.prompt_logprobs.as_ref()?;
        Some(logprobs::prompt_entries(&self.state.tokenizer, positions, self.prompt_logprobs?))
    }
}

/// The tokens that end a reasoning section the output will open, after which structured outputs
/// apply (as vLLM starts the grammar once its reasoning parser sees the section end); `None`
/// when no reasoning section is coming.
fn reasoning_end_tokens(state: &AppState, shape: &Shape) -> Result<Option<Vec<u32>>, ApiError> {
    let Some(parser) = shape.reasoning_parser.as_deref().and_then(|n| reasoning::parser(n, &shape.template_kwargs))
    else {
        return Ok(None);
    };
    if parser.is_reasoning_end("") {
        return Ok(None);
    }
    let Some(marker) = parser.end_marker() else { return Ok(None) };
    let ids = state.tokenizer.encode(marker, false).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Some(ids))
}

/// What a request's `tools` and `tool_choice` mean for its prompt, its output constraint and the
/// shape of its message, with vLLM's checks.
struct ToolPlan {
    template_tools: Option<Vec<Value>>,
    constraint: Option<Constraint>,
    shape: Shape,
}

fn tool_plan(options: &ChatOptions, req: &ChatCompletionRequest) -> Result<ToolPlan, ApiError> {
    let tools = req.tools.clone().unwrap_or_default();
    let mut functions = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let function = t.get("function").filter(|_| t.get("type").and_then(Value::as_str) == Some("function"));
        let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
        let (Some(function), Some(name)) = (function, name) else {
            return Err(ApiError::invalid(
                "tools",
                format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ));
        };
        let parameters =
            function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        functions.push(FunctionSpec { name: name.to_string(), parameters });
    }
    let choice = match &req.tool_choice {
        None if tools.is_empty() => "none".to_string(),
        None => "auto".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => format!("function:{name}"),
            _ => return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )),
        },
    };
    let mut plan = ToolPlan {
        template_tools: (!tools.is_empty()).then(|| tools.clone()),
        constraint: None,
        shape: Shape::plain(),
    };
    plan.shape.reasoning_parser = options.reasoning_parser.clone();
    plan.shape.template_kwargs = Arc::new(req.chat_template_kwargs.clone().unwrap_or_default());
    plan.shape.include_reasoning = req.include_reasoning.unwrap_or(true);
    let one_call = req.parallel_tool_calls == Some(false);
    match choice.as_str() {
        "none" => {
            if options.exclude_tools_when_tool_choice_none {
                plan.template_tools = None;
            }
        }
        "auto" => {
            if !tools.is_empty() {
                match (&options.tool_call_parser, options.enable_auto_tool_choice) {
                    (Some(parser), true) => plan.shape.tools = ToolMode::Auto(parser.clone()),
                    _ => {
                        return Err(ApiError::invalid(
                            "tool_choice",
                            "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                        ))
                    }
                }
            }
        }
        "required" => {
            if tools.is_empty() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice \"required\" needs at least one tool in `tools`",
                ));
            }
            let options: Vec<Value> = functions
                .iter()
                .map(|f| {
                    json!({
                        "properties": {"name": {"type": "string", "enum": [f.name]}, "parameters": f.parameters},
                        "required": ["name", "parameters"]
                    })
                })
                .collect();
            let mut schema = json!({"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": options}});
            if one_call {
                schema["maxItems"] = json!(1);
            }
            plan.constraint = Some(Constraint::Json(schema));
            plan.shape.tools = ToolMode::Required;
        }
        named => {
            let Some(name) = named.strip_prefix("function:") else {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice {named:?} is not one of none, auto, required or a named function"),
                ));
            };
            let Some(f) = functions.iter().find(|f| f.name == name) else {
                return Err(ApiError::invalid("tool_choice", format!("Tool '{name}' has not been passed in `tools`.")));
            };
            plan.constraint = Some(Constraint::Json(f.parameters.clone()));
            plan.shape.tools = ToolMode::Named(name.to_string());
        }
    }
    plan.shape.functions = functions.into();
    Ok(plan)
}

async fn run(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Response, ApiError> {
    let body = body?;
    let req: ChatCompletionRequest = off_runtime(move || parse_json(&body)).await?;
    let stream = req.stream.unwrap_or(false);
    let usage = UsageReport::of(req.stream_options.as_ref());
    let started = start(state, req, arrival).await?;
    if stream {
        Ok(stream_response(started.ctx, started.streams, started.permit, usage))
    } else {
        let response = collect(started.ctx, started.streams).await?;
        drop(started.permit);
        Ok(Json(response).into_response())
    }
}

/// A chat request rendered, admitted and submitted to the engine.
pub(crate) struct Started {
    pub(crate) ctx: Context,
    pub(crate) streams: SelectAll<Tracked>,
    pub(crate) permit: Permit,
}

/// Renders, checks, admits and submits a chat request (the Responses API goes through it too).
pub(crate) async fn start(
    state: Arc<AppState>,
    req: ChatCompletionRequest,
    arrival: Instant,
) -> Result<Started, ApiError> {
    // The chat template and tokenization of a long conversation take CPU time that must not
    // stall the other connections (and /health) on the async runtime.
    let (req, rendered, plan) = off_runtime({
        let state = state.clone();
        move || {
            state.served.check_model(req.model.as_deref())?;
            let plan = tool_plan(&state.served.config.chat, &req)?;
            if req.chat_template.is_some() && !state.served.config.chat.trust_request_chat_template {
                return Err(ApiError::invalid(
                    "chat_template",
                    "Chat template is passed with request, but --trust-request-chat-template is not set. Refused \
                     request with untrusted chat template.",
                ));
            }
            // vLLM hands gpt-oss's reasoning_effort to the template with the request's kwargs.
            let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
            if let Some(effort) = &req.reasoning_effort {
                kwargs.insert("reasoning_effort".into(), effort.clone().into());
            }
            let options = PromptOptions {
                add_generation_prompt: req
                    .add_generation_prompt
                    .unwrap_or(!req.continue_final_message.unwrap_or(false)),
                add_special_tokens: req.add_special_tokens.unwrap_or(false),
                continue_final_message: req.continue_final_message.unwrap_or(false),
                tools: plan.template_tools.as_deref(),
                kwargs: Some(&kwargs),
                chat_template: req.chat_template.as_deref(),
            };
            let mut rendered = chat_prompt(&state, &req.messages, &options)?;
            params::truncate_prompt(&mut rendered.prompt, &req.sampling, state.served.max_model_len, &state.tokenizer)?;
            rendered.prompt.mm_processor_kwargs = req.mm_processor_kwargs.clone();
            Ok((req, rendered, plan))
        }
    })
    .await?;
    let RenderedChat { mut prompt, media } = rendered;
    prompt.media = state.media.fetch_all(media).await?;
    // Decoding and resizing images is CPU work: off the async runtime, as the template was.
    let prompt = off_runtime({
        let state = state.clone();
        move || {
            let mut prompt = prompt;
            ImageProcessing::apply(state.served.config.media.model.images.as_deref(), &mut prompt, &state.tokenizer)?;
            Ok(prompt)
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
    let prompt_logprobs = params::prompt_logprobs(&req.sampling, state.client.max_logprobs())?;
    let mut sampling = params::build(
        &req.sampling,
        Requested { max_tokens, logprobs: top_logprobs, prompt_logprobs },
        &state.served.config.sampling_defaults,
    )?;
    if let Some(constraint) = plan.constraint {
        if sampling.structured_outputs.is_some() {
            return Err(ApiError::invalid(
                "tool_choice",
                "a `required` or named tool_choice sets the output's structure; it cannot be combined with \
                 response_format or structured_outputs",
            ));
        }
        sampling.structured_outputs = Some(StructuredOutputs::new(constraint));
    }
    if plan.shape.needs_special_tokens() {
        sampling.skip_special_tokens = false;
    }
    if sampling.structured_outputs.is_some() {
        sampling.structured_outputs_after = reasoning_end_tokens(&state, &plan.shape)?;
    }
    let requests = generate::process_off_runtime(&state, std::slice::from_ref(&prompt), &sampling).await?;
    let permit = Admission::acquire(&state, sampling.n)?;
    let ctx = Context {
        id: format!("chatcmpl-{}", random_id()),
        created: unix_now(),
        model: state.served.model_name().to_string(),
        n: sampling.n,
        top_logprobs,
        prompt_tokens: prompt.ids.len(),
        prompt_token_ids: req.sampling.return_token_ids.unwrap_or(false).then(|| prompt.ids.clone()),
        prompt_logprobs,
        tokens_as_ids: req.sampling.return_tokens_as_token_ids.unwrap_or(false),
        state: state.clone(),
        shape: plan.shape,
    };
    let streams = generate::submit(&state, &ctx.id, requests, arrival)?;
    Ok(Started { ctx, streams, permit })
}

pub(crate) struct Choice {
    text: String,
    logprobs: Option<ChatLogprobs>,
    tokens: usize,
    finish_reason: Option<&'static str>,
    stop_reason: Option<StopReason>,
    shaper: Shaper,
    token_ids: Vec<u32>,
}

impl Choice {
    pub(crate) fn new(shape: &Shape) -> Choice {
        Choice {
            text: String::new(),
            logprobs: None,
            tokens: 0,
            finish_reason: None,
            stop_reason: None,
            shaper: Shaper::new(shape),
            token_ids: Vec::new(),
        }
    }

    /// vLLM reports a choice that ended in tool calls as `tool_calls` rather than `stop`.
    fn finish_reason(&self, reason: Option<&'static str>) -> Option<&'static str> {
        match reason {
            Some("stop") if self.shaper.tools_called() && !matches!(self.shaper_mode(), ToolMode::Named(_)) => {
                Some("tool_calls")
            }
            other => other,
        }
    }

    fn shaper_mode(&self) -> &ToolMode {
        &self.shaper.shape().tools
    }
}

impl Context {
    /// Applies one engine step to the choices. `streaming`: also shape each delta (reasoning
    /// split, tool-call pieces) into the stream choices returned; a collected response is shaped
    /// once, whole, by [`Shaper::message`], so its deltas are not parsed on the way.
    pub(crate) fn apply(&self, choices: &mut [Choice], step: Step, streaming: bool) -> Vec<ChatStreamChoice> {
        let mut out = Vec::new();
        for d in step.deltas {
            let Some(c) = choices.get_mut(d.index) else {
                continue;
            };
            c.tokens += d.token_ids.len();
            if self.prompt_token_ids.is_some() {
                c.token_ids.extend_from_slice(&d.token_ids);
            }
            if d.text.is_empty() && d.token_ids.is_empty() && d.finish_reason.is_none() {
                continue;
            }
            let lp = self.top_logprobs.map(|top| ChatLogprobs {
                content: logprobs::chat_entries(
                    logprobs::Names { tokenizer: &self.state.tokenizer, as_ids: self.tokens_as_ids },
                    &d.logprobs.unwrap_or_default(),
                    top,
                ),
            });
            c.text.push_str(&d.text);
            if let Some(new) = &lp {
                c.logprobs
                    .get_or_insert_with(|| ChatLogprobs { content: Vec::new() })
                    .content
                    .extend(new.content.iter().cloned());
            }
            let mut parts = if streaming { c.shaper.push(&d.text) } else { Parts::default() };
            if d.finish_reason.is_some() && streaming {
                let rest = c.shaper.finish();
                parts.content = [parts.content.take(), rest.content].into_iter().flatten().reduce(|a, b| a + &b);
                parts.reasoning = [parts.reasoning.take(), rest.reasoning].into_iter().flatten().reduce(|a, b| a + &b);
                parts.tool_calls.extend(rest.tool_calls);
            }
            if d.finish_reason.is_some() {
                c.finish_reason = d.finish_reason;
                c.stop_reason = d.stop_reason.clone();
            }
            let finish_reason = c.finish_reason(d.finish_reason);
            if parts == Parts::default() && lp.is_none() && finish_reason.is_none() {
                // A parser is holding text back (a marker may be starting).
                continue;
            }
            out.push(ChatStreamChoice {
                index: d.index,
                delta: ChatDelta {
                    role: None,
                    content: parts.content,
                    reasoning_content: parts.reasoning.clone(),
                    reasoning: parts.reasoning,
                    tool_calls: parts.tool_calls,
                },
                logprobs: lp,
                finish_reason,
                stop_reason: d.stop_reason,
                token_ids: self.prompt_token_ids.is_some().then_some(d.token_ids),
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
            prompt_token_ids: None,
            prompt_logprobs: None,
        }
    }

    pub(crate) fn usage(&self, choices: &[Choice]) -> Usage {
        Usage::new(self.prompt_tokens, choices.iter().map(|c| c.tokens).sum())
    }
}

pub(crate) async fn collect(ctx: Context, mut streams: SelectAll<Tracked>) -> Result<ChatCompletionResponse, ApiError> {
    let mut choices: Vec<Choice> = (0..ctx.n).map(|_| Choice::new(&ctx.shape)).collect();
    let mut prompt_logprobs = None;
    while let Some(step) = streams.next().await {
        if let Some(message) = &step.error {
            return Err(ApiError::internal(message.clone()));
        }
        prompt_logprobs = prompt_logprobs.or_else(|| ctx.prompt_entries(&step));
        ctx.apply(&mut choices, step, false);
    }
    let usage = ctx.usage(&choices);
    let out = choices
        .into_iter()
        .enumerate()
        .map(|(index, mut c)| {
            let text = std::mem::take(&mut c.text);
            let parts = c.shaper.message(&text);
            ChatChoice {
                index,
                finish_reason: c.finish_reason(c.finish_reason),
                message: ChatMessageOut {
                    role: "assistant",
                    content: parts.content,
                    reasoning_content: parts.reasoning.clone(),
                    reasoning: parts.reasoning,
                    tool_calls: parts.tool_calls,
                },
                logprobs: c.logprobs,
                stop_reason: c.stop_reason,
                token_ids: ctx.prompt_token_ids.is_some().then_some(std::mem::take(&mut c.token_ids)),
            }
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
        prompt_token_ids: ctx.prompt_token_ids,
        prompt_logprobs,
    })
}

fn stream_response(ctx: Context, streams: SelectAll<Tracked>, permit: Permit, usage: UsageReport) -> Response {
    let roles: Vec<Event> = (0..ctx.n)
        .map(|index| {
            let mut chunk = ctx.chunk(
                vec![ChatStreamChoice {
                    index,
                    delta: ChatDelta { role: Some("assistant"), content: Some(String::new()), ..Default::default() },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                    token_ids: None,
                }],
                None,
            );
            chunk.prompt_token_ids = ctx.prompt_token_ids.clone();
            json_event(&chunk)
        })
        .collect();
    let choices: Vec<Choice> = (0..ctx.n).map(|_| Choice::new(&ctx.shape)).collect();
    // The permit lives in the stream state: the request counts against the bound until its
    // last chunk is sent or the client goes away.
    // The prompt logprobs ride on the first chunk with content; a step whose text is still held
    // back (a partial character, a possible stop string) carries them over to the next one.
    let state = Some((ctx, streams, choices, permit, None));
    let deltas = stream::unfold(state, move |state| async move {
        let (ctx, mut streams, mut choices, permit, pending_prompt_logprobs) = state?;
        match streams.next().await {
            Some(Step { error: Some(message), .. }) => {
                Some((vec![json_event_raw(ApiError::internal(message).to_json()), done_event()], None))
            }
            Some(step) => {
                let mut prompt_logprobs = pending_prompt_logprobs.or_else(|| ctx.prompt_entries(&step));
                let events: Vec<Event> = ctx
                    .apply(&mut choices, step, true)
                    .into_iter()
                    .map(|c| {
                        let so_far = usage
                            .continuous
                            .then(|| Usage::new(ctx.prompt_tokens, choices.get(c.index).map_or(0, |ch| ch.tokens)));
                        let mut chunk = ctx.chunk(vec![c], so_far);
                        chunk.prompt_logprobs = prompt_logprobs.take();
                        json_event(&chunk)
                    })
                    .collect();
                Some((events, Some((ctx, streams, choices, permit, prompt_logprobs))))
            }
            None => {
                let mut events = Vec::new();
                if let Some(entries) = pending_prompt_logprobs {
                    let mut chunk = ctx.chunk(Vec::new(), None);
                    chunk.prompt_logprobs = Some(entries);
                    events.push(json_event(&chunk));
                }
                if usage.at_end {
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

#[cfg(test)]
mod tests {
    use super::*;

    const PAD: &str = "<|vision_start|><|image_pad|><|vision_end|>";

    fn messages(json: Value) -> Vec<RequestMessage> {
        serde_json::from_value(json).unwrap()
    }

    fn vision() -> ModelMedia {
        ModelMedia { accepts_images: true, image_placeholder: Some(PAD.into()), video_placeholder: None, images: None }
    }

    fn image(url: &str) -> Value {
        json!({"type": "image_url", "image_url": {"url": url}})
    }

    #[test]
    fn a_text_model_joins_text_and_refuses_media_parts_by_location() {
        let input = template_messages(
            &messages(
                json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]),
            ),
            ContentFormat::String,
            &ModelMedia::default(),
        )
        .unwrap();
        assert_eq!(input.messages[0]["content"], "a\nb");
        assert!(input.media.is_empty());
        for (part, want) in [
            (
                image("https://x/a.png"),
                "messages[1].content[1]: content parts of type `image_url` are not supported: this model does not \
                 accept image input",
            ),
            (
                json!({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}),
                "messages[1].content[1]: content parts of type `video_url` are not supported: this model does not \
                 accept video input",
            ),
            (
                json!({"type": "input_audio"}),
                "messages[1].content[1]: content parts of type `input_audio` are not supported",
            ),
            (json!({"type": "text"}), "messages[1].content[1]: a text content part needs `text`"),
        ] {
            let conversation = messages(json!([
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "look"}, part]},
            ]));
            for format in [ContentFormat::String, ContentFormat::Openai] {
                let e = template_messages(&conversation, format, &ModelMedia::default()).err().unwrap();
                assert_eq!((e.message.as_str(), e.param.as_deref()), (want, Some("messages")));
            }
        }
    }

    #[test]
    fn string_content_puts_the_missing_placeholders_first() {
        let conversation = messages(json!([
            {"role": "user", "content": [image("https://x/a.png"), {"type": "text", "text": "Describe."}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": [
                {"type": "text", "text": "Compare"},
                image("data:image/png;base64,AAAA"),
                {"type": "text", "text": format!("with {PAD} this")},
                {"type": "image_url", "image_url": "https://x/c.png"},
            ]},
        ]));
        let input = template_messages(&conversation, ContentFormat::String, &vision()).unwrap();
        assert_eq!(input.messages[0]["content"], format!("{PAD}\nDescribe."));
        assert_eq!(input.messages[1]["content"], "A cat.");
        assert_eq!(input.messages[2]["content"], format!("{PAD}\nCompare\nwith {PAD} this"));
        let refs: Vec<(&str, &str)> = input.media.iter().map(|m| (m.location.as_str(), m.url.as_str())).collect();
        assert_eq!(
            refs,
            [
                ("messages[0].content[0]", "https://x/a.png"),
                ("messages[2].content[1]", "data:image/png;base64,AAAA"),
                ("messages[2].content[3]", "https://x/c.png"),
            ]
        );

        let too_many = messages(json!([{"role": "user", "content": [
            image("https://x/a.png"), {"type": "text", "text": format!("{PAD}{PAD}")},
        ]}]));
        let e = template_messages(&too_many, ContentFormat::String, &vision()).err().unwrap();
        assert_eq!(
            e.message,
            format!("messages[0]: Found more '{PAD}' placeholders in input prompt than actual multimodal data items.")
        );
        // A model with no placeholder gets the text alone.
        let bare = ModelMedia { image_placeholder: None, ..vision() };
        let input = template_messages(&conversation, ContentFormat::String, &bare).unwrap();
        assert_eq!(input.messages[0]["content"], "Describe.");

        let bad_url =
            messages(json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "low"}}]}]));
        let e = template_messages(&bad_url, ContentFormat::String, &vision()).err().unwrap();
        assert_eq!(e.message, "messages[0].content[0]: `image_url` needs a `url` string");
    }

    #[test]
    fn videos_get_their_own_placeholders_and_parts() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2-vl");
        let processing = crate::images::ImageProcessing::from_model_dir(&dir, 1002, 14, Some(1003)).unwrap();
        const VIDEO: &str = "<|video|>";
        let model = ModelMedia {
            video_placeholder: Some(VIDEO.into()),
            images: Some(std::sync::Arc::new(processing)),
            ..vision()
        };
        let video = json!({"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,AAAA,AAAA"}});
        let conversation = messages(json!([{"role": "user", "content": [
            video, image("https://x/a.png"), {"type": "text", "text": "Compare."}, video,
        ]}]));
        // vLLM groups the missing placeholders by placeholder, in the order each first appears.
        let input = template_messages(&conversation, ContentFormat::String, &model).unwrap();
        assert_eq!(input.messages[0]["content"], format!("{VIDEO}\n{VIDEO}\n{PAD}\nCompare."));
        let kinds: Vec<MediaKind> = input.media.iter().map(|m| m.kind).collect();
        assert_eq!(kinds, [MediaKind::Video, MediaKind::Image, MediaKind::Video]);
        let input = template_messages(&conversation, ContentFormat::Openai, &model).unwrap();
        assert_eq!(
            input.messages[0]["content"],
            json!([{"type": "video"}, {"type": "image"}, {"type": "text", "text": "Compare."}, {"type": "video"}])
        );
    }

    #[test]
    fn openai_content_is_a_list_of_parts_that_qwen2_vls_template_renders() {
        let conversation = messages(json!([
            {"role": "user", "content": [image("https://x/a.png"), {"type": "text", "text": "Describe the image."}]},
            {"role": "assistant", "content": "Red."},
            {"role": "assistant", "content": null, "tool_calls": []},
        ]));
        let input = template_messages(&conversation, ContentFormat::Openai, &vision()).unwrap();
        assert_eq!(
            input.messages[0]["content"],
            json!([{"type": "image"}, {"type": "text", "text": "Describe the image."}])
        );
        assert_eq!(input.messages[1]["content"], json!([{"type": "text", "text": "Red."}]));
        assert_eq!(input.messages[2]["content"], json!([]));
        assert_eq!(input.media.len(), 1);

        // Qwen2-VL's processor template (the fixture's), and the prompt transformers rendered.
        let source = "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n\
You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string \
%}{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' \
or 'image' in content or 'image_url' in content %}<|vision_start|><|image_pad|><|vision_end|>{% elif 'text' in content \
%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt \
%}<|im_start|>assistant\n{% endif %}";
        assert_eq!(crate::content_format::detect(source), ContentFormat::Openai);
        let template = ChatTemplate::new(source.into(), String::new(), String::new()).unwrap();
        let render = ChatRender {
            messages: &input.messages[..1],
            tools: None,
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: None,
        };
        assert_eq!(
            template.render_chat(&render).unwrap(),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
             <|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}
