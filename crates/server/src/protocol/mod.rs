//! The OpenAI wire format as vLLM speaks it: request bodies (with vLLM's sampling extras) and
//! response and stream-chunk bodies.
//!
//! Numbers a client may get wrong (negative `max_tokens`, `n` of a billion) are read as wide
//! signed types and checked later, so the client gets vLLM's message instead of a serde type
//! error.

mod pooling;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use pooling::*;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// With `include_usage`, every chunk carries its choice's usage so far (vLLM's extension).
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// What a stream reports of token usage.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageReport {
    /// One final chunk with the request's usage.
    pub at_end: bool,
    /// Every chunk with its choice's usage so far.
    pub continuous: bool,
}

impl UsageReport {
    pub fn of(options: Option<&StreamOptions>) -> UsageReport {
        let at_end = options.and_then(|o| o.include_usage).unwrap_or(false);
        UsageReport { at_end, continuous: at_end && options.and_then(|o| o.continuous_usage_stats).unwrap_or(false) }
    }
}

/// Sampling fields `/v1/completions` and `/v1/chat/completions` share, including vLLM's
/// extras (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `min_tokens`, `stop_token_ids`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingFields {
    pub n: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopSpec>,
    pub stop_token_ids: Option<Vec<i64>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<i64>,
    pub skip_special_tokens: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub allowed_token_ids: Option<Vec<i64>>,
    /// Keep only the last (or, with `truncation_side: "right"`, the first) k prompt tokens; -1
    /// keeps as many as the context holds.
    pub truncate_prompt_tokens: Option<i64>,
    /// Responses carry the prompt's and each choice's token ids (vLLM's `return_token_ids`).
    pub return_token_ids: Option<bool>,
    /// Per prompt token, its logprob and this many most likely alternatives.
    pub prompt_logprobs: Option<i64>,
    /// Logprob entries name tokens `token_id:<id>` instead of their text.
    pub return_tokens_as_token_ids: Option<bool>,
    pub truncation_side: Option<String>,
    pub bad_words: Option<Vec<String>>,
    pub best_of: Option<i64>,
    /// OpenAI's `response_format` (`text`, `json_object`, `json_schema`) and vLLM's
    /// `structural_tag` format.
    pub response_format: Option<Value>,
    /// vLLM's `structured_outputs` object (one of `json`, `regex`, `choice`, `grammar`,
    /// `json_object`, `structural_tag`, plus the JSON options).
    pub structured_outputs: Option<Value>,
    /// vLLM's older spellings of the same constraints.
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
    pub guided_whitespace_pattern: Option<Value>,
    /// Every other field: vLLM's that ferrite has not built are refused by name
    /// ([`crate::params::check_unsupported`]); fields vLLM does not know are ignored, as there.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// A string, a list of strings, a list of token ids or a list of token-id lists; read by
    /// [`crate::completions`] so that each shape gets its own error message.
    pub prompt: Value,
    pub max_tokens: Option<i64>,
    pub echo: Option<bool>,
    pub logprobs: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub suffix: Option<String>,
    pub add_special_tokens: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A chat message's `content`: a string, or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: `{"type": "text", "text": ...}`, `{"type": "image_url", "image_url": {"url":
/// ..., "detail": ...}}` (or, as vLLM also takes it, the URL alone as `image_url`) or vLLM's
/// `{"type": "video_url", "video_url": {"url": ...}}`. The media fields stay JSON here so that a
/// malformed one is reported with the part it is in (see [`ContentPart::media_url`]) rather than
/// as a content that matches no shape.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    pub image_url: Option<Value>,
    pub video_url: Option<Value>,
}

/// A media part's URL and, for an image, the `detail` it asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaUrl<'a> {
    pub url: &'a str,
    pub detail: Option<&'a str>,
}

impl ContentPart {
    /// The URL of an `image_url` or `video_url` part; the error says what is wrong with it.
    pub fn media_url(&self) -> Result<MediaUrl<'_>, String> {
        let (field, value) = match self.kind.as_str() {
            "image_url" => ("image_url", &self.image_url),
            "video_url" => ("video_url", &self.video_url),
            other => return Err(format!("a part of type `{other}` has no media URL")),
        };
        match value {
            Some(Value::String(url)) => Ok(MediaUrl { url, detail: None }),
            Some(Value::Object(object)) => match (object.get("url"), object.get("detail")) {
                (Some(Value::String(url)), None | Some(Value::Null)) => Ok(MediaUrl { url, detail: None }),
                (Some(Value::String(url)), Some(Value::String(detail))) => Ok(MediaUrl { url, detail: Some(detail) }),
                (Some(Value::String(_)), Some(other)) => Err(format!("`{field}.detail` must be a string, got {other}")),
                _ => Err(format!("`{field}` needs a `url` string")),
            },
            _ => Err(format!("a `{field}` part needs `{field}`: {{\"url\": ...}}, or the URL as a string")),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct RequestMessage {
    pub role: String,
    /// Null is allowed (an assistant turn that only called tools).
    pub content: Option<MessageContent>,
    /// Everything else the message carries (`tool_calls`, `tool_call_id`, `name`, ...), handed
    /// to the chat template as is.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<RequestMessage>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// A Jinja template for this request (needs `--trust-request-chat-template`).
    pub chat_template: Option<String>,
    /// Extra variables for the chat template (e.g. `enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Leave the last (assistant) message open for the model to continue.
    pub continue_final_message: Option<bool>,
    /// `false` drops the reasoning section from the message (`--reasoning-parser`).
    pub include_reasoning: Option<bool>,
    /// gpt-oss's `reasoning_effort`, handed to the chat template as vLLM does.
    pub reasoning_effort: Option<String>,
    pub add_generation_prompt: Option<bool>,
    pub add_special_tokens: Option<bool>,
    /// vLLM's per-request settings for the model's multimodal processor (`{"max_pixels": ...}`),
    /// handed to it with the request's images.
    pub mm_processor_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `/tokenize` takes either a completion-style `prompt` or chat `messages` (vLLM's two shapes).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<RequestMessage>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub return_token_strs: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
    pub token_strs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub total_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice, null for EOS or
/// length.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum StopReason {
    Token(u32),
    Text(String),
}

/// OpenAI completions logprobs: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<usize>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<StopReason>,
    /// With `return_token_ids`: the prompt's ids (once per choice in a stream) and the
    /// generated ids (a stream chunk's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// With `prompt_logprobs` (once per choice in a stream).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, Value>>>>,
}

/// A `/v1/completions` response body or (with `object` "text_completion" too, as OpenAI sends
/// it) one stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

/// A tool call in a response message, or (with `index`, fields optional) a piece of one in a
/// stream chunk.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCallOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatMessageOut {
    pub role: &'static str,
    /// Null when the message is only tool calls.
    pub content: Option<String>,
    /// The reasoning section (`--reasoning-parser`), under vLLM's two names.
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ChatMessageOut,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    pub stop_reason: Option<StopReason>,
    /// With `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: Option<String>,
    /// With `return_token_ids`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `prompt_logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, Value>>>>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatStreamChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatStreamChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub system_fingerprint: Option<String>,
    /// With `return_token_ids`, on each choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// With `prompt_logprobs`, on the first chunk that carries generated text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<serde_json::Map<String, Value>>>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelPermission {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub allow_create_engine: bool,
    pub allow_sampling: bool,
    pub allow_logprobs: bool,
    pub allow_search_indices: bool,
    pub allow_view: bool,
    pub allow_fine_tuning: bool,
    pub organization: &'static str,
    pub group: Option<String>,
    pub is_blocking: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub root: String,
    pub parent: Option<String>,
    pub max_model_len: usize,
    pub permission: Vec<ModelPermission>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_request_reads_vllm_extras_and_both_stop_shapes() {
        let r: CompletionRequest = serde_json::from_str(
            r#"{"prompt":"hi","stop":"x","top_k":5,"ignore_eos":true,"stop_token_ids":[3],"max_tokens":-1}"#,
        )
        .unwrap();
        assert_eq!(r.sampling.stop.unwrap().into_vec(), vec!["x".to_string()]);
        assert_eq!(r.sampling.top_k, Some(5));
        assert_eq!(r.sampling.ignore_eos, Some(true));
        assert_eq!(r.max_tokens, Some(-1));
        let r: CompletionRequest = serde_json::from_str(r#"{"prompt":[1,2],"stop":["a","b"]}"#).unwrap();
        assert_eq!(r.sampling.stop.unwrap().into_vec().len(), 2);
    }

    #[test]
    fn chat_content_is_a_string_or_text_parts() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}]}"#,
        )
        .unwrap();
        assert!(matches!(r.messages[0].content, Some(MessageContent::Text(_))));
        assert!(matches!(r.messages[1].content, Some(MessageContent::Parts(_))));
        assert!(r.messages[2].content.is_none());
    }

    #[test]
    fn media_parts_carry_their_url_as_an_object_or_a_string() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":[
                {"type":"image_url","image_url":{"url":"https://x/a.png","detail":"high"}},
                {"type":"image_url","image_url":"data:image/png;base64,AAAA"},
                {"type":"video_url","video_url":{"url":"https://x/v.mp4"}},
                {"type":"image_url","image_url":{"detail":"low"}},
                {"type":"image_url"},
                {"type":"text","text":"hi"}]}],
                "mm_processor_kwargs":{"max_pixels":12544}}"#,
        )
        .unwrap();
        let Some(MessageContent::Parts(parts)) = &r.messages[0].content else { panic!("parts") };
        assert_eq!(parts[0].media_url(), Ok(MediaUrl { url: "https://x/a.png", detail: Some("high") }));
        assert_eq!(parts[1].media_url(), Ok(MediaUrl { url: "data:image/png;base64,AAAA", detail: None }));
        assert_eq!(parts[2].media_url(), Ok(MediaUrl { url: "https://x/v.mp4", detail: None }));
        assert_eq!(parts[3].media_url().unwrap_err(), "`image_url` needs a `url` string");
        assert!(parts[4].media_url().unwrap_err().contains("needs `image_url`"));
        assert!(parts[5].media_url().is_err());
        assert_eq!(r.mm_processor_kwargs.unwrap()["max_pixels"], 12544);
    }

    #[test]
    fn chunks_skip_absent_usage_but_keep_null_fingerprint() {
        let chunk = ChatCompletionChunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk",
            created: 1,
            model: "m".into(),
            choices: vec![ChatStreamChoice {
                index: 0,
                delta: ChatDelta { role: Some("assistant"), content: Some(String::new()), ..Default::default() },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
                token_ids: None,
            }],
            usage: None,
            system_fingerprint: None,
            prompt_token_ids: None,
            prompt_logprobs: None,
        };
        let v = serde_json::to_value(&chunk).unwrap();
        assert!(v.get("usage").is_none());
        assert_eq!(v["system_fingerprint"], Value::Null);
        assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(v["choices"][0]["finish_reason"], Value::Null);
    }
}
