//! Tool-call parsers: `--tool-call-parser NAME` (see [`parser`]).

use serde::Serialize;

/// One complete tool call, as the `tool_calls` of a chat completion message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// `chatcmpl-tool-<32 hex digits>` unless the model's format carries its own id.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// A whole output split into its tool calls and the text around them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtractedToolCalls {
    pub tool_calls: Vec<ToolCall>,
    /// The text that is not a tool call (`None` when there is none).
    pub content: Option<String>,
}

/// A piece of one tool call in a stream: the first delta of call `index` carries its `id` and
/// `name`, later ones append to its `arguments`, exactly as vLLM's `DeltaToolCall`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// What one streamed step adds to the message: content text and/or tool-call pieces.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolDelta {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallDelta>,
}

/// A function the request offers (`tools[i].function`), for parsers that need the schemas
/// (parameter types in XML formats).
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionSpec {
    pub name: String,
    pub parameters: serde_json::Value,
}

/// One model family's tool-call format. A parser value serves one request: the streaming side
/// keeps state between deltas.
pub trait ToolParser: Send {
    /// The tool calls in a whole output.
    fn extract(&self, output: &str, tools: &[FunctionSpec]) -> ExtractedToolCalls;

    /// The message delta for `delta` (the newest text; `previous` is everything before it).
    /// `None` while the parser holds text back (a marker may be starting).
    fn extract_streaming(&mut self, previous: &str, delta: &str, tools: &[FunctionSpec]) -> Option<ToolDelta>;
}

/// A new tool-call id in vLLM's shape.
pub fn random_tool_call_id() -> String {
    format!("chatcmpl-tool-{}", uuid::Uuid::new_v4().simple())
}

/// The names `--tool-call-parser` accepts.
pub const PARSERS: &[&str] = &[];

/// A fresh parser for `name`, or `None` for a name not in [`PARSERS`].
pub fn parser(name: &str) -> Option<Box<dyn ToolParser>> {
    let _ = name;
    None
}
