//! Tool-call parsers: `--tool-call-parser NAME` (see [`parser`]).
//!
//! Each model family's format is a module that says two things: what a whole output holds
//! (`extract`, as vLLM's `extract_tool_calls`) and what a growing output is already sure to hold
//! (`advance`). One wrapper, `Streamed`, turns the latter into OpenAI deltas for every format,
//! so the delta shapes are the same everywhere: the first delta of call `i` carries `index`,
//! `id`, `name` and the arguments known so far (possibly `""`), later ones append to the
//! arguments, and nothing is ever taken back. Arguments that vLLM re-serializes with
//! `json.dumps` are streamed in that same form, so the pieces of a call add up to the arguments
//! a non-streaming request gets.

mod deepseek_v3;
mod hermes;
mod json;
mod llama3_json;
mod mistral;
mod openai;
mod python;
mod pythonic;
mod qwen3_coder;

use std::borrow::Cow;

use serde::Serialize;

use json::{Json, JsonStream, Status};

/// One complete tool call, as the `tool_calls` of a chat completion message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    /// `chatcmpl-tool-<32 hex digits>` unless the model's format carries its own id
    /// (Mistral: 9 letters and digits).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text (an object, as the model wrote it or as Python's `json.dumps`
    /// writes it, whichever vLLM returns for the format).
    pub arguments: String,
}

/// A whole output split into its tool calls and the text around them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtractedToolCalls {
    pub tool_calls: Vec<ToolCall>,
    /// The text that is not a tool call (`None` when there is none).
    pub content: Option<String>,
}

/// A piece of one tool call in a stream, as vLLM's `DeltaToolCall`: the first delta of call
/// `index` carries its `id`, `name` and `arguments` (possibly empty); later ones carry only
/// `arguments`, a non-empty piece to append.
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

    /// Once the output is complete (after the last delta): what the stream still owes so that,
    /// added up, it says what [`ToolParser::extract`] says of the whole output, where the two
    /// can still agree. It closes a call the model left unterminated and releases text that
    /// was held back as a possible marker or tool call but turned out to be content. vLLM's
    /// server does the former from its parsers' state at the end of a stream.
    fn finish(&mut self, tools: &[FunctionSpec]) -> Option<ToolDelta>;
}

/// A new tool-call id in vLLM's shape.
pub fn random_tool_call_id() -> String {
    format!("chatcmpl-tool-{}", uuid::Uuid::new_v4().simple())
}

/// The names `--tool-call-parser` accepts. `llama4_json` is vLLM's other name for
/// `llama3_json`; `openai` is gpt-oss's harmony format.
pub const PARSERS: &[&str] =
    &["deepseek_v3", "hermes", "llama3_json", "llama4_json", "mistral", "openai", "pythonic", "qwen3_coder"];

/// A fresh parser for `name`, or `None` for a name not in [`PARSERS`].
pub fn parser(name: &str) -> Option<Box<dyn ToolParser>> {
    Some(match name {
        "deepseek_v3" => Box::new(Streamed::new(deepseek_v3::DeepSeekV3::default())),
        "hermes" => Box::new(Streamed::new(hermes::Hermes::default())),
        "llama3_json" | "llama4_json" => Box::new(Streamed::new(llama3_json::Llama3Json::default())),
        "mistral" => Box::new(Streamed::new(mistral::Mistral::default())),
        "openai" => Box::new(Streamed::new(openai::OpenAi::default())),
        "pythonic" => Box::new(Streamed::new(pythonic::Pythonic::default())),
        "qwen3_coder" => Box::new(Streamed::new(qwen3_coder::Qwen3Coder::default())),
        _ => return None,
    })
}

/// What a format's streaming side has become sure of, in output order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Content(String),
    /// The next call starts; `id` when the format carries its own.
    Call {
        name: String,
        id: Option<String>,
    },
    /// More of the latest call's arguments.
    Args(String),
}

/// A model family's format, as the modules implement it.
trait Format: Send {
    fn extract(&self, output: &str, tools: &[FunctionSpec]) -> ExtractedToolCalls;

    /// Reads `text`, the whole output so far (each call's text extends the last one's), past
    /// what it has read before, and reports what is now certain.
    fn advance(&mut self, text: &str, tools: &[FunctionSpec], events: &mut Vec<Event>);

    /// An id for a call whose text carries none.
    fn new_id(&self) -> String {
        random_tool_call_id()
    }
}

/// A [`Format`] served as a [`ToolParser`]: keeps the output so far and what has been sent.
struct Streamed<F> {
    format: F,
    text: String,
    content: String,
    calls: Vec<ToolCall>,
}

impl<F: Format> Streamed<F> {
    fn new(format: F) -> Self {
        Streamed { format, text: String::new(), content: String::new(), calls: Vec::new() }
    }

    fn push_content(&mut self, delta: &mut ToolDelta, text: &str) {
        if text.is_empty() {
            return;
        }
        self.content.push_str(text);
        delta.content.get_or_insert_with(String::new).push_str(text);
    }

    fn start_call(&mut self, delta: &mut ToolDelta, id: String, name: String) {
        delta.tool_calls.push(ToolCallDelta {
            index: self.calls.len(),
            id: Some(id.clone()),
            name: Some(name.clone()),
            arguments: Some(String::new()),
        });
        self.calls.push(ToolCall { id, name, arguments: String::new() });
    }

    fn push_args(&mut self, delta: &mut ToolDelta, index: usize, text: &str) {
        let Some(call) = self.calls.get_mut(index) else { return };
        if text.is_empty() {
            return;
        }
        call.arguments.push_str(text);
        match delta.tool_calls.last_mut() {
            Some(last) if last.index == index => last.arguments.get_or_insert_with(String::new).push_str(text),
            _ => delta.tool_calls.push(ToolCallDelta { index, arguments: Some(text.to_owned()), ..Default::default() }),
        }
    }

    fn nonempty(delta: ToolDelta) -> Option<ToolDelta> {
        (delta.content.is_some() || !delta.tool_calls.is_empty()).then_some(delta)
    }
}

impl<F: Format> ToolParser for Streamed<F> {
    fn extract(&self, output: &str, tools: &[FunctionSpec]) -> ExtractedToolCalls {
        self.format.extract(output, tools)
    }

    fn extract_streaming(&mut self, _previous: &str, delta: &str, tools: &[FunctionSpec]) -> Option<ToolDelta> {
        // The formats read the output by position, so it is kept here, only ever appended to;
        // `previous` is the same text as the caller saw it.
        self.text.push_str(delta);
        let mut events = Vec::new();
        self.format.advance(&self.text, tools, &mut events);
        let mut out = ToolDelta::default();
        for event in events {
            match event {
                Event::Content(text) => self.push_content(&mut out, &text),
                Event::Call { name, id } => {
                    let id = id.unwrap_or_else(|| self.format.new_id());
                    self.start_call(&mut out, id, name);
                }
                Event::Args(text) => {
                    if let Some(index) = self.calls.len().checked_sub(1) {
                        self.push_args(&mut out, index, &text);
                    }
                }
            }
        }
        Self::nonempty(out)
    }

    fn finish(&mut self, tools: &[FunctionSpec]) -> Option<ToolDelta> {
        let whole = self.format.extract(&self.text, tools);
        let content = whole.content.unwrap_or_default();
        // A stream can only be completed where it agrees with the whole output so far: what
        // was sent cannot be taken back.
        let agrees = content.starts_with(self.content.as_str())
            && whole.tool_calls.len() >= self.calls.len()
            && self.calls.iter().zip(&whole.tool_calls).all(|(sent, call)| sent.name == call.name);
        if !agrees {
            return None;
        }
        let mut out = ToolDelta::default();
        self.push_content(&mut out, &content[self.content.len()..]);
        for (index, call) in whole.tool_calls.into_iter().enumerate() {
            match self.calls.get(index) {
                Some(sent) => {
                    if let Some(rest) = call.arguments.strip_prefix(sent.arguments.as_str()) {
                        let rest = rest.to_owned();
                        self.push_args(&mut out, index, &rest);
                    }
                }
                None => {
                    self.start_call(&mut out, call.id, call.name);
                    self.push_args(&mut out, index, &call.arguments);
                }
            }
        }
        Self::nonempty(out)
    }
}

/// `Some(text)` unless it is empty, as vLLM's `content if content else None`.
fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Reports `text` as content unless it is empty.
fn content_event(events: &mut Vec<Event>, text: &str) {
    if !text.is_empty() {
        events.push(Event::Content(text.to_owned()));
    }
}

/// The whole output as content, no calls: what vLLM returns when a format does not parse.
fn all_content(output: &str) -> ExtractedToolCalls {
    ExtractedToolCalls { tool_calls: Vec::new(), content: non_empty(output) }
}

/// The length of the longest proper prefix of `marker` that ends `text`: text that may be the
/// start of a marker, to hold back until the next delta tells.
fn partial_marker_len(text: &str, marker: &str) -> usize {
    marker.char_indices().map(|(i, _)| i).skip(1).filter(|&len| text.ends_with(&marker[..len])).max().unwrap_or(0)
}

/// The earliest of `markers` in `text` at or after `from`: its position and which one.
fn find_first<'m>(text: &str, from: usize, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    let rest = text.get(from..)?;
    markers.iter().filter_map(|m| rest.find(m).map(|i| (from + i, *m))).min_by_key(|(i, _)| *i)
}

/// Where content that stops at the first of `markers` can be sent up to now: the marker's
/// position when one is in `text[from..]`, otherwise the end less a possible partial marker.
fn content_end(text: &str, from: usize, markers: &[&str]) -> (usize, Option<usize>) {
    match find_first(text, from, markers) {
        Some((at, _)) => (at, Some(at)),
        None => {
            let held = markers.iter().map(|m| partial_marker_len(text, m)).max().unwrap_or(0);
            (text.len().saturating_sub(held).max(from), None)
        }
    }
}

/// The function the request offers under `name`.
fn find_function<'a>(tools: &'a [FunctionSpec], name: &str) -> Option<&'a FunctionSpec> {
    tools.iter().find(|tool| tool.name == name)
}

/// How a JSON tool-call object (`{"name": ..., "arguments": {...}}`) names its parts.
#[derive(Debug, Clone, Copy)]
struct CallKeys {
    /// The member holding the arguments; the first one present is used.
    arguments: &'static [&'static str],
    /// A string value holding a serialized object or array is that object (Granite, under the
    /// hermes parser, writes its arguments this way).
    unwrap_serialized: bool,
    /// The arguments of a call that has none, or `None` when such an object is not a call.
    missing: Option<&'static str>,
}

impl CallKeys {
    /// A call object's arguments value as vLLM returns it: `json.dumps` of the value.
    fn arguments_of(&self, value: &Json) -> String {
        match value {
            Json::Str(text) if self.unwrap_serialized => match Json::parse(text) {
                Some(inner @ (Json::Object(_) | Json::Array(_))) => inner.dumps(),
                _ => value.dumps(),
            },
            _ => value.dumps(),
        }
    }

    /// A parsed call object's name and arguments.
    fn call(&self, object: &Json) -> Option<(String, String)> {
        let name = object.get("name")?.as_str()?.to_owned();
        let arguments = match self.arguments.iter().find_map(|key| object.get(key)) {
            Some(value) => self.arguments_of(value),
            None => self.missing?.to_owned(),
        };
        Some((name, arguments))
    }
}

/// How far a [`CallStream`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallProgress {
    /// All the text was read; the object goes on.
    Open,
    /// The object ended after `consumed` bytes of the last text; `called` when it was a call.
    Done { consumed: usize, called: bool },
    /// The text is not JSON.
    Failed,
}

/// One JSON tool-call object read as it streams: the call starts once its name is known and its
/// arguments have begun (so an object that is not a call sends nothing), and the arguments
/// stream in `json.dumps` form.
struct CallStream {
    json: JsonStream,
    keys: CallKeys,
    name: Option<String>,
    started: bool,
    sent: usize,
}

impl CallStream {
    fn new(keys: CallKeys) -> Self {
        CallStream { json: JsonStream::default(), keys, name: None, started: false, sent: 0 }
    }

    /// Reads `text` (new text only).
    fn feed(&mut self, text: &str, events: &mut Vec<Event>) -> CallProgress {
        let consumed = self.json.feed(text);
        let status = self.json.status();
        if status == Status::Failed {
            return CallProgress::Failed;
        }
        if self.name.is_none() {
            let name_member = self.json.members().iter().find(|m| m.key == "name");
            if let Some((Some(start), Some(end))) = name_member.map(|m| (m.start, m.end)) {
                match Json::parse(&self.json.out()[start..end]) {
                    Some(Json::Str(name)) => self.name = Some(name),
                    _ => return CallProgress::Failed,
                }
            }
        }
        let arguments = self.json.members().iter().find(|m| self.keys.arguments.contains(&m.key.as_str()));
        let known = match arguments.map(|m| (m.start, m.end)) {
            Some((Some(start), end)) => {
                let value = &self.json.out()[start..end.unwrap_or(self.json.out().len())];
                if self.keys.unwrap_serialized && value.starts_with('"') {
                    // Whether a string holds serialized arguments shows only once it ends.
                    end.and_then(|_| Json::parse(value)).map(|v| Cow::Owned(self.keys.arguments_of(&v)))
                } else {
                    Some(Cow::Borrowed(value))
                }
            }
            _ if status == Status::Done => self.keys.missing.map(Cow::Borrowed),
            _ => None,
        };
        if let (Some(name), Some(arguments)) = (&self.name, known) {
            if !self.started {
                events.push(Event::Call { name: name.clone(), id: None });
                self.started = true;
            }
            if let Some(new) = arguments.get(self.sent..).filter(|new| !new.is_empty()) {
                events.push(Event::Args(new.to_owned()));
                self.sent = arguments.len();
            }
        }
        match status {
            Status::Done => CallProgress::Done { consumed, called: self.started },
            _ => CallProgress::Open,
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Drives parsers the way the server does and checks what every stream must satisfy.

    use super::*;

    /// Markers kept whole when cutting text into token-like pieces, as tokenizers do.
    const MARKERS: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "[ARGS]",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
    ];

    pub(crate) fn tools(specs: &[(&str, serde_json::Value)]) -> Vec<FunctionSpec> {
        specs
            .iter()
            .map(|(name, parameters)| FunctionSpec { name: (*name).to_owned(), parameters: parameters.clone() })
            .collect()
    }

    /// `text` cut into pieces of `size` characters.
    pub(crate) fn char_chunks(text: &str, size: usize) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        chars.chunks(size).map(|c| c.iter().collect()).collect()
    }

    /// `text` cut roughly as a BPE tokenizer would: markers whole, words with their leading
    /// space, digits and punctuation one at a time, runs of newlines together.
    pub(crate) fn token_chunks(text: &str) -> Vec<String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            if let Some(marker) = MARKERS.iter().find(|m| rest.starts_with(*m)) {
                pieces.push((*marker).to_owned());
                rest = &rest[marker.len()..];
                continue;
            }
            let mut len = c.len_utf8();
            let word = |ch: char| ch.is_alphabetic() || ch == '_';
            if c == ' ' || word(c) {
                len += rest[len..].chars().take_while(|&ch| word(ch)).map(char::len_utf8).sum::<usize>();
            } else if c == '\n' {
                len += rest[len..].chars().take_while(|&ch| ch == '\n').count();
            }
            pieces.push(rest[..len].to_owned());
            rest = &rest[len..];
        }
        pieces
    }

    /// Every way the tests cut an output: 1, 2, 3 and 7 characters, token-like, and whole.
    pub(crate) fn chunkings(text: &str) -> Vec<Vec<String>> {
        let mut all: Vec<Vec<String>> = [1, 2, 3, 7].iter().map(|&n| char_chunks(text, n)).collect();
        all.push(token_chunks(text));
        all.push(vec![text.to_owned()]);
        all
    }

    /// What a client rebuilds from a stream.
    #[derive(Debug, Default)]
    pub(crate) struct Rebuilt {
        pub(crate) content: String,
        pub(crate) calls: Vec<ToolCall>,
        /// Whether [`ToolParser::finish`] had anything left to send.
        pub(crate) finish_sent: bool,
    }

    impl Rebuilt {
        fn apply(&mut self, delta: ToolDelta) {
            if let Some(content) = delta.content {
                assert!(!content.is_empty(), "content deltas are never empty");
                self.content.push_str(&content);
            }
            for piece in delta.tool_calls {
                if piece.index == self.calls.len() {
                    let (Some(id), Some(name), Some(arguments)) = (piece.id, piece.name, piece.arguments) else {
                        panic!("the first delta of call {} must carry id, name and arguments", piece.index);
                    };
                    self.calls.push(ToolCall { id, name, arguments });
                } else {
                    assert!(piece.index < self.calls.len(), "call indices go up one at a time");
                    assert!(piece.id.is_none() && piece.name.is_none(), "only a call's first delta names it");
                    let arguments = piece.arguments.expect("later deltas carry arguments");
                    assert!(!arguments.is_empty(), "argument pieces are never empty");
                    self.calls[piece.index].arguments.push_str(&arguments);
                }
            }
        }
    }

    /// Streams `chunks` through a fresh parser `name`, then finishes it.
    pub(crate) fn stream(name: &str, chunks: &[String], tools: &[FunctionSpec]) -> Rebuilt {
        let mut parser = parser(name).expect("a known parser");
        let mut result = Rebuilt::default();
        let mut previous = String::new();
        for chunk in chunks {
            if let Some(delta) = parser.extract_streaming(&previous, chunk, tools) {
                result.apply(delta);
            }
            previous.push_str(chunk);
        }
        if let Some(delta) = parser.finish(tools) {
            result.finish_sent = true;
            result.apply(delta);
        }
        result
    }

    /// Streams `output` cut every way, checking each stream adds up to the whole output's
    /// extraction (content and arguments to the character; ids of the same form). `complete`:
    /// the stream alone must already say everything, with nothing left for `finish`.
    pub(crate) fn assert_streams_match(
        name: &str,
        output: &str,
        tools: &[FunctionSpec],
        complete: bool,
    ) -> ExtractedToolCalls {
        let whole = parser(name).expect("a known parser").extract(output, tools);
        for chunks in chunkings(output) {
            let streamed = stream(name, &chunks, tools);
            let cut = format!("{name}, pieces {:?}", &chunks[..chunks.len().min(4)]);
            assert_eq!(streamed.content, whole.content.clone().unwrap_or_default(), "content; {cut}");
            assert_eq!(streamed.calls.len(), whole.tool_calls.len(), "calls; {cut}");
            for (got, want) in streamed.calls.iter().zip(&whole.tool_calls) {
                assert_eq!(got.name, want.name, "{cut}");
                assert_eq!(got.arguments, want.arguments, "{cut}");
                assert_eq!(got.id.len(), want.id.len(), "{cut}");
            }
            if complete {
                assert!(!streamed.finish_sent, "finish had more to send; {cut}");
            }
        }
        whole
    }

    /// The arguments parsed, for comparing with a literal.
    pub(crate) fn args(call: &ToolCall) -> serde_json::Value {
        serde_json::from_str(&call.arguments).expect("arguments are JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn registry_knows_every_name() {
        for name in PARSERS {
            assert!(parser(name).is_some(), "{name}");
        }
        assert!(parser("nope").is_none());
    }

    #[test]
    fn partial_markers_respect_char_boundaries() {
        assert_eq!(partial_marker_len("abc<tool_", "<tool_call>"), 6);
        assert_eq!(partial_marker_len("abc<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_marker_len("x<｜tool", "<｜tool▁calls▁begin｜>"), "<｜tool".len());
        assert_eq!(partial_marker_len("", "<a>"), 0);
    }

    #[test]
    fn finish_completes_an_unterminated_call_and_releases_content() {
        let tools = [];
        // Hermes without a closing tag and a stream that stops inside it.
        let mut hermes = parser("hermes").unwrap();
        let text = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 12";
        let delta = hermes.extract_streaming("", text, &tools).unwrap();
        assert_eq!(delta.content.as_deref(), Some("Hi "));
        assert_eq!(delta.tool_calls[0].arguments.as_deref(), Some("{\"a\": "));
        assert_eq!(hermes.finish(&tools), None, "the whole output is not a call either");

        // Text held back as a possible marker is content once the output ends.
        let mut hermes = parser("hermes").unwrap();
        let delta = hermes.extract_streaming("", "see <tool_", &tools).unwrap();
        assert_eq!(delta.content.as_deref(), Some("see "));
        let rest = hermes.finish(&tools).unwrap();
        assert_eq!(rest.content.as_deref(), Some("<tool_"));
        assert_eq!(hermes.finish(&tools), None);
    }

    /// xorshift64*: enough randomness to shuffle test text, the same on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }

        fn chunks(&mut self, text: &str) -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            let mut chunks = Vec::new();
            let mut at = 0;
            while at < chars.len() {
                let len = (1 + self.below(5)).min(chars.len() - at);
                chunks.push(chars[at..at + len].iter().collect());
                at += len;
            }
            chunks
        }
    }

    fn weather_tools() -> Vec<FunctionSpec> {
        tools(&[(
            "get_weather",
            serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                "opts": {"type": "object"}, "ok": {"type": "boolean"}, "x": {"type": "number"}}}),
        )])
    }

    #[test]
    fn no_input_breaks_a_parser() {
        const PIECES: &[&str] = &[
            "<tool_call>",
            "</tool_call>",
            "<|python_tag|>",
            "[TOOL_CALLS]",
            "[ARGS]",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
            "```json\n",
            "\n```",
            "<function=",
            "<parameter=",
            "</parameter>",
            "</function>",
            "{",
            "}",
            "[",
            "]",
            "(",
            ")",
            "\"",
            "'",
            "'''",
            "\\",
            "\\u12",
            "\\ud83d",
            ":",
            ",",
            ";",
            "=",
            "\"name\"",
            "\"arguments\"",
            "name",
            "get_weather",
            "city",
            "days",
            "x",
            " ",
            "\n",
            "1",
            "-2.5e3",
            "0x1f",
            "1e999",
            "true",
            "None",
            "b'z'",
            "é",
            "▁",
            "｜",
            "<",
            ">",
            "#",
            ".",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "commentary",
            "final",
            "analysis",
            " to=functions.get_weather",
            "to=",
            "<|constrain|>",
            "json",
            "<|message|>",
            "<|end|>",
            "<|call|>",
            "<|return|>",
            "<|",
        ];
        let tools = weather_tools();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..400 {
            let len = rng.below(40);
            let text: String = (0..len).map(|_| PIECES[rng.below(PIECES.len())]).collect();
            for name in PARSERS {
                parser(name).unwrap().extract(&text, &tools);
                stream(name, &rng.chunks(&text), &tools);
            }
        }
    }

    #[test]
    fn every_prefix_of_a_call_is_safe() {
        let outputs = [
            r#"Hi<tool_call>{"name": "get_weather", "arguments": {"city": "S\u00e9oul", "days": [1, 2.5, {"a": null}]}}</tool_call>"#,
            r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "SF"}}; {"name": "x", "parameters": {}}"#,
            r#"ok[TOOL_CALLS]get_weather[ARGS]{"city": "SF"}[TOOL_CALLS]x{}"#,
            r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "SF"}}, {"name": "x"}]"#,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"SF\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nSF\n</parameter>\n<parameter=opts>\n{'a': (1, 2)}\n</parameter>\n</function>\n</tool_call>",
            r"[get_weather(city='S\'F', days=3, opts={'a': [True, None, -1.5]}), x()]",
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary \
             <|constrain|>json<|message|>{\"city\": \"S\\u00e9\", \"d\": [1.50]} x<|call|><|start|>assistant\
             <|channel|>final<|message|>ok<|return|>",
        ];
        let tools = weather_tools();
        for output in outputs {
            for (end, _) in output.char_indices() {
                let prefix = &output[..end];
                for name in PARSERS {
                    parser(name).unwrap().extract(prefix, &tools);
                    stream(name, &char_chunks(prefix, 1), &tools);
                }
            }
        }
    }

    #[test]
    fn long_arguments_stream_in_linear_time() {
        let long = "x".repeat(200_000);
        let outputs = [
            ("hermes", format!(r#"<tool_call>{{"name": "w", "arguments": {{"text": "{long}"}}}}</tool_call>"#)),
            ("llama3_json", format!(r#"{{"name": "w", "parameters": {{"text": "{long}"}}}}"#)),
            ("mistral", format!(r#"[TOOL_CALLS]w{{"text": "{long}"}}"#)),
            ("mistral", format!(r#"[TOOL_CALLS][{{"name": "w", "arguments": {{"text": "{long}"}}}}]"#)),
            (
                "deepseek_v3",
                format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>w\n```json\n{{\"text\": \"{long}\"}}\n```<｜tool▁call▁end｜>"),
            ),
            ("openai", format!("<|channel|>commentary to=functions.w json<|message|>{{\"text\": \"{long}\"}}<|call|>")),
            ("openai", format!("<|channel|>commentary to=functions.w code<|message|>print({long})<|call|>")),
            ("qwen3_coder", format!("<tool_call>\n<function=w>\n<parameter=text>\n{long}\n</parameter>\n</function>\n</tool_call>")),
        ];
        for (name, output) in outputs {
            let started = std::time::Instant::now();
            let streamed = stream(name, &char_chunks(&output, 4), &[]);
            assert!(started.elapsed().as_secs() < 10, "{name} took {:?}", started.elapsed());
            assert!(streamed.calls[0].arguments.len() > long.len(), "{name}");
            assert!(!streamed.finish_sent, "{name}");
        }
    }

    #[test]
    fn token_chunks_keep_markers_whole() {
        let pieces = token_chunks("Hi there<tool_call>\n\n{\"a\": 12}");
        assert_eq!(pieces, ["Hi", " there", "<tool_call>", "\n\n", "{", "\"", "a", "\"", ":", " ", "1", "2", "}"]);
    }
}
