//! A chat choice's output text -> the message the client gets, as vLLM's chat server shapes it:
//! the reasoning section split off (`--reasoning-parser`), then tool calls found by the tool-call
//! parser (`tool_choice: "auto"`), or the whole output taken as the arguments of the named tool,
//! or as the list of calls that `tool_choice: "required"` asked for (a grammar guarantees both).

use std::sync::Arc;

use ferrite_parsers::reasoning::{self, ReasoningDelta, ReasoningParser};
use ferrite_parsers::tool::{self, random_tool_call_id, FunctionSpec, ToolCall, ToolParser};
use serde_json::Value;

use crate::protocol::{FunctionCallOut, ToolCallOut};

/// How a request uses its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// No tool calls are looked for.
    Off,
    /// The named parser finds tool calls in the output.
    Auto(String),
    /// The output is the arguments of this function.
    Named(String),
    /// The output is a JSON list of `{"name", "parameters"}` objects.
    Required,
}

/// What a choice's shaper needs; shared by a request's choices.
#[derive(Debug, Clone)]
pub struct Shape {
    pub reasoning_parser: Option<String>,
    /// The request's `chat_template_kwargs`: reasoning parsers read `enable_thinking` from them.
    pub template_kwargs: Arc<serde_json::Map<String, Value>>,
    pub tools: ToolMode,
    pub functions: Arc<[FunctionSpec]>,
    /// `include_reasoning: false` drops the reasoning section from the message.
    pub include_reasoning: bool,
}

impl Shape {
    pub fn plain() -> Shape {
        Shape {
            reasoning_parser: None,
            template_kwargs: Arc::default(),
            tools: ToolMode::Off,
            functions: Arc::from([]),
            include_reasoning: true,
        }
    }

    /// Whether output text must keep its special tokens (tool-call and reasoning markers often
    /// are special tokens), as vLLM's parsers' `adjust_request` asks.
    pub fn needs_special_tokens(&self) -> bool {
        self.reasoning_parser.is_some() || matches!(self.tools, ToolMode::Auto(_))
    }
}

/// A message's parts: the whole message at the end, or what one step adds to it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parts {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
}

fn full_call(call: ToolCall, index: Option<usize>) -> ToolCallOut {
    ToolCallOut {
        index,
        id: Some(call.id),
        kind: Some("function"),
        function: FunctionCallOut { name: Some(call.name), arguments: Some(call.arguments) },
    }
}

/// The calls of a `required` output: `[{"name": ..., "parameters": {...}}, ...]`.
fn required_calls(content: &str) -> Vec<ToolCall> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(content) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let name = item.get("name")?.as_str()?.to_string();
            let arguments = item.get("parameters").map_or_else(|| "{}".to_string(), Value::to_string);
            Some(ToolCall { id: random_tool_call_id(), name, arguments })
        })
        .collect()
}

/// One choice's output as it streams in.
pub struct Shaper {
    shape: Shape,
    reasoning: Option<Box<dyn ReasoningParser>>,
    tool_parser: Option<Box<dyn ToolParser>>,
    /// The whole output so far, and the part of it past the reasoning section.
    text: String,
    content: String,
    named_id: Option<String>,
    tools_called: bool,
}

impl Shaper {
    /// `None` names a parser that does not exist (the server checked the names at start).
    pub fn new(shape: &Shape) -> Shaper {
        let reasoning =
            shape.reasoning_parser.as_deref().and_then(|name| reasoning::parser(name, &shape.template_kwargs));
        let tool_parser = match &shape.tools {
            ToolMode::Auto(name) => tool::parser(name),
            _ => None,
        };
        Shaper {
            shape: shape.clone(),
            reasoning,
            tool_parser,
            text: String::new(),
            content: String::new(),
            named_id: None,
            tools_called: false,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Whether the message holds tool calls (for `finish_reason: "tool_calls"`).
    pub fn tools_called(&self) -> bool {
        self.tools_called
    }

    /// What `text` (the newest output) adds to the streamed message.
    pub fn push(&mut self, text: &str) -> Parts {
        if self.tools_read_raw() {
            let reasoning = self.reasoning.as_mut().and_then(|r| r.extract_streaming(&self.text, text));
            self.text.push_str(text);
            let mut parts = self.take(reasoning.map(|d| ReasoningDelta { reasoning: d.reasoning, content: None }));
            let delta =
                self.tool_parser.as_mut().and_then(|p| p.extract_streaming(&self.content, text, &self.shape.functions));
            self.content.push_str(text);
            self.add_tool_delta(&mut parts, delta);
            return parts;
        }
        let split = match &mut self.reasoning {
            Some(r) => r.extract_streaming(&self.text, text),
            None => Some(ReasoningDelta { reasoning: None, content: Some(text.to_string()) }),
        };
        self.text.push_str(text);
        self.take(split)
    }

    /// The harmony format (gpt-oss) carries tool calls in messages of their own, which a
    /// reasoning parser drops: there the tool parser reads the whole output, as in vLLM, and the
    /// reasoning parser contributes only the reasoning.
    fn tools_read_raw(&self) -> bool {
        matches!(&self.shape.tools, ToolMode::Auto(name) if name == "openai")
    }

    /// Routes the reasoning part of a step to the message and its content part through the tool
    /// handling.
    fn take(&mut self, split: Option<ReasoningDelta>) -> Parts {
        let mut parts = Parts::default();
        let Some(split) = split else { return parts };
        parts.reasoning = split.reasoning.filter(|s| !s.is_empty() && self.shape.include_reasoning);
        let Some(content) = split.content.filter(|c| !c.is_empty()) else {
            return parts;
        };
        match &self.shape.tools {
            ToolMode::Off => parts.content = Some(content.clone()),
            ToolMode::Auto(_) => {
                let delta = self
                    .tool_parser
                    .as_mut()
                    .and_then(|p| p.extract_streaming(&self.content, &content, &self.shape.functions));
                self.add_tool_delta(&mut parts, delta);
            }
            ToolMode::Named(name) => {
                let first = self.named_id.is_none();
                let id = self.named_id.get_or_insert_with(random_tool_call_id).clone();
                self.tools_called = true;
                parts.tool_calls.push(ToolCallOut {
                    index: Some(0),
                    id: first.then_some(id),
                    kind: first.then_some("function"),
                    function: FunctionCallOut { name: first.then(|| name.clone()), arguments: Some(content.clone()) },
                });
            }
            // The list is parsed whole when the output ends ([`Shaper::finish`]).
            ToolMode::Required => {}
        }
        self.content.push_str(&content);
        parts
    }

    fn add_tool_delta(&mut self, parts: &mut Parts, delta: Option<tool::ToolDelta>) {
        let Some(d) = delta else { return };
        if let Some(text) = d.content.filter(|s| !s.is_empty()) {
            parts.content.get_or_insert_with(String::new).push_str(&text);
        }
        self.tools_called |= !d.tool_calls.is_empty();
        parts.tool_calls.extend(d.tool_calls.into_iter().map(|c| ToolCallOut {
            index: Some(c.index),
            kind: c.id.as_ref().map(|_| "function"),
            id: c.id,
            function: FunctionCallOut { name: c.name, arguments: c.arguments },
        }));
    }

    /// What is left to stream when the output ends: text a reasoning parser held back (a tag
    /// that never completed), what the tool parser still owes (an unclosed call, text it held
    /// back as a possible marker), and the calls of a `required` output.
    pub fn finish(&mut self) -> Parts {
        let mut held = self.reasoning.as_mut().and_then(|r| r.finish());
        if self.tools_read_raw() {
            held = held.map(|d| ReasoningDelta { reasoning: d.reasoning, content: None });
        }
        let mut parts = self.take(held);
        if let ToolMode::Auto(_) = self.shape.tools {
            let owed = self.tool_parser.as_mut().and_then(|p| p.finish(&self.shape.functions));
            self.add_tool_delta(&mut parts, owed);
        }
        if self.shape.tools == ToolMode::Required {
            let calls = required_calls(&self.content);
            self.tools_called = !calls.is_empty();
            parts.tool_calls.extend(calls.into_iter().enumerate().map(|(i, c)| full_call(c, Some(i))));
        }
        parts
    }

    /// The whole message of a finished, unstreamed output.
    pub fn message(&mut self, output: &str) -> Parts {
        let (reasoning, content) = match &self.reasoning {
            Some(r) => {
                let split = r.extract(output);
                (split.reasoning, split.content)
            }
            None => (None, Some(output.to_string())),
        };
        let mut parts = Parts { reasoning: reasoning.filter(|_| self.shape.include_reasoning), ..Default::default() };
        let content = if self.tools_read_raw() { output.to_string() } else { content.unwrap_or_default() };
        match &self.shape.tools {
            ToolMode::Off => parts.content = Some(content),
            ToolMode::Auto(_) => {
                let found = match &self.tool_parser {
                    Some(p) => p.extract(&content, &self.shape.functions),
                    None => tool::ExtractedToolCalls { tool_calls: Vec::new(), content: Some(content) },
                };
                self.tools_called = !found.tool_calls.is_empty();
                parts.content = found.content;
                parts.tool_calls = found.tool_calls.into_iter().map(|c| full_call(c, None)).collect();
            }
            ToolMode::Named(name) => {
                self.tools_called = true;
                parts.content = Some(String::new());
                let call = ToolCall { id: random_tool_call_id(), name: name.clone(), arguments: content };
                parts.tool_calls = vec![full_call(call, None)];
            }
            ToolMode::Required => {
                let calls = required_calls(&content);
                self.tools_called = !calls.is_empty();
                parts.content = Some(String::new());
                parts.tool_calls = calls.into_iter().map(|c| full_call(c, None)).collect();
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(tools: ToolMode) -> Shape {
        Shape { tools, ..Shape::plain() }
    }

    #[test]
    fn named_tool_streams_the_output_as_arguments_with_id_and_name_first() {
        let mut s = Shaper::new(&shape(ToolMode::Named("f".into())));
        let a = s.push("{\"x\":");
        let b = s.push(" 1}");
        assert_eq!(a.tool_calls[0].function.name.as_deref(), Some("f"));
        assert!(a.tool_calls[0].id.as_deref().is_some_and(|id| id.starts_with("chatcmpl-tool-")));
        assert_eq!((b.tool_calls[0].id.as_deref(), b.tool_calls[0].function.name.as_deref()), (None, None));
        let args: String = [a, b].iter().filter_map(|p| p.tool_calls[0].function.arguments.clone()).collect();
        assert_eq!(args, "{\"x\": 1}");
        assert!(s.tools_called());
    }

    #[test]
    fn required_output_becomes_its_calls_whole_or_streamed() {
        let out = r#"[{"name": "a", "parameters": {"q": "x"}}, {"name": "b", "parameters": {}}]"#;
        let mut s = Shaper::new(&shape(ToolMode::Required));
        let m = s.message(out);
        let names: Vec<_> = m.tool_calls.iter().map(|c| c.function.name.clone().unwrap()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(m.tool_calls[0].function.arguments.as_deref(), Some(r#"{"q":"x"}"#));
        let mut s = Shaper::new(&shape(ToolMode::Required));
        assert_eq!(s.push(&out[..10]), Parts::default());
        s.push(&out[10..]);
        let end = s.finish();
        assert_eq!(end.tool_calls.len(), 2);
        assert_eq!(end.tool_calls[1].index, Some(1));
        assert!(s.tools_called());
    }

    #[test]
    fn plain_output_is_content() {
        let mut s = Shaper::new(&Shape::plain());
        assert_eq!(s.push("hi").content.as_deref(), Some("hi"));
        assert_eq!(s.message("hi").content.as_deref(), Some("hi"));
        assert!(!s.tools_called());
    }

    /// gpt-oss: the harmony tool parser reads the whole output while the reasoning parser
    /// supplies the analysis channel, whole and streamed.
    #[test]
    fn harmony_calls_survive_the_reasoning_parser() {
        let out = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
                   to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        let shape = Shape {
            reasoning_parser: Some("openai_gptoss".into()),
            tools: ToolMode::Auto("openai".into()),
            ..Shape::plain()
        };
        let whole = Shaper::new(&shape).message(out);
        assert_eq!(whole.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(whole.tool_calls.len(), 1);
        assert_eq!(whole.tool_calls[0].function.name.as_deref(), Some("get_weather"));
        let args: Value = serde_json::from_str(whole.tool_calls[0].function.arguments.as_deref().unwrap()).unwrap();
        assert_eq!(args, serde_json::json!({"city": "Paris"}));
        let mut s = Shaper::new(&shape);
        let chars: Vec<char> = out.chars().collect();
        let mut streamed = Vec::new();
        for piece in chars.chunks(3) {
            streamed.push(s.push(&piece.iter().collect::<String>()));
        }
        streamed.push(s.finish());
        let reasoning: String = streamed.iter().filter_map(|p| p.reasoning.clone()).collect();
        let arguments: String =
            streamed.iter().flat_map(|p| &p.tool_calls).filter_map(|c| c.function.arguments.clone()).collect();
        assert_eq!(reasoning, "Need the weather.");
        assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), args);
        assert!(s.tools_called());
    }
}
