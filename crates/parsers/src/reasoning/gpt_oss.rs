//! `openai_gptoss`: gpt-oss's harmony format, read from text the way vLLM's harmony parser reads
//! tokens. The output is a run of messages:
//! `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`
//! (the prompt ends in `<|start|>assistant`, so the first header has no role). The `analysis`
//! channel is reasoning; `final`, and `commentary` addressed to no one (a preamble), are content;
//! tool calls (a `to=functions.…` recipient) and everything else are left to others.

use super::{Reasoned, ReasoningDelta, ReasoningParser, Split};
use crate::harmony::{channel, Event, Reader, CHANNEL, CONSTRAIN, ENDS, MESSAGE, START};

/// vLLM's built-in tools: a recipient naming one is not a function call.
const BUILTIN_TOOLS: [&str; 3] = ["python", "browser", "container"];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Reasoning,
    Content,
    Other,
}

/// vLLM's `is_function_recipient` as the chat endpoint calls it: `functions.NAME`, or any bare
/// name that is not the assistant or a built-in tool.
fn is_function_recipient(recipient: &str) -> bool {
    if recipient.is_empty() || recipient.starts_with("<|") || recipient == "assistant" {
        return false;
    }
    if let Some(name) = recipient.strip_prefix("functions.") {
        return !name.is_empty();
    }
    let first = recipient.split('.').next().unwrap_or(recipient);
    !BUILTIN_TOOLS.contains(&first)
}

/// What a message's text is, from its header. `role_in_header`: the header follows a
/// `<|start|>` and so begins with the role; only the assistant's messages count.
fn classify(header: &str, role_in_header: bool) -> Kind {
    let channel = channel(header);
    let without_channel = match (header.find(CHANNEL), channel) {
        (Some(at), Some(name)) => format!("{}{}", &header[..at], &header[at + CHANNEL.len() + name.len()..]),
        _ => header.to_string(),
    };
    let spaced = without_channel.replace(CONSTRAIN, &format!(" {CONSTRAIN}"));
    let mut parts = spaced.split_whitespace().peekable();
    if role_in_header && parts.next() != Some("assistant") {
        return Kind::Other;
    }
    parts.next_if_eq(&"assistant");
    let recipient = parts.find_map(|p| p.strip_prefix("to="));
    match (channel, recipient) {
        (_, Some(r)) if is_function_recipient(r) => Kind::Other,
        (Some("analysis"), _) => Kind::Reasoning,
        (Some("final"), _) | (Some("commentary"), None) => Kind::Content,
        _ => Kind::Other,
    }
}

/// The harmony reader's events as reasoning and content: `kind` is the current message's, kept
/// across steps. A header the output stopped in is content, as vLLM returns it (a non-harmony
/// output too).
fn split(kind: &mut Kind, events: Vec<Event>) -> Split {
    let mut split = Split::default();
    for event in events {
        match event {
            Event::Header { text, after_start } => *kind = classify(&text, after_start),
            Event::Text(text) if *kind != Kind::Other => split.push(*kind == Kind::Reasoning, &text),
            Event::Text(_) | Event::End => {}
            Event::CutHeader(raw) => split.push(false, &raw),
        }
    }
    split
}

#[derive(Debug)]
pub(super) struct GptOss {
    reader: Reader,
    kind: Kind,
}

impl GptOss {
    pub(super) fn new() -> Self {
        Self { reader: Reader::default(), kind: Kind::Other }
    }
}

impl ReasoningParser for GptOss {
    /// The non-empty analysis messages joined by newlines, and likewise the content messages, as
    /// vLLM joins them; a stream runs them together without the newline.
    fn extract(&self, output: &str) -> Reasoned {
        let mut reader = Reader::default();
        let mut events = reader.feed(output);
        events.extend(reader.finish());
        let (mut reasoning, mut content) = (Vec::new(), Vec::new());
        let mut message = (Kind::Other, String::new());
        for event in events {
            match event {
                Event::Header { text, after_start } => message = (classify(&text, after_start), String::new()),
                Event::Text(text) => message.1.push_str(&text),
                Event::End => match std::mem::replace(&mut message, (Kind::Other, String::new())) {
                    (_, text) if text.is_empty() => {}
                    (Kind::Reasoning, text) => reasoning.push(text),
                    (Kind::Content, text) => content.push(text),
                    (Kind::Other, _) => {}
                },
                Event::CutHeader(raw) => content.push(raw),
            }
        }
        let join = |parts: Vec<String>| (!parts.is_empty()).then(|| parts.join("\n"));
        Reasoned { reasoning: join(reasoning), content: join(content) }
    }

    fn extract_streaming(&mut self, _previous: &str, delta: &str) -> Option<ReasoningDelta> {
        split(&mut self.kind, self.reader.feed(delta)).into_delta()
    }

    fn finish(&mut self) -> Option<ReasoningDelta> {
        split(&mut self.kind, self.reader.finish()).into_delta()
    }

    /// Whether the message being written is on the final channel with its header complete. (The
    /// newest vLLM answers true from the start, for it constrains gpt-oss through a harmony
    /// structural tag instead; this is its earlier token rule, which a plain grammar needs.)
    fn is_reasoning_end(&self, output: &str) -> bool {
        let message_start = ENDS.iter().filter_map(|end| output.rfind(end).map(|at| at + end.len())).max();
        let current = &output[message_start.unwrap_or(0)..];
        let Some(body) = current.find(MESSAGE) else { return false };
        let header = &current[..body];
        let header = header.rfind(START).map_or(header, |at| &header[at..]);
        channel(header) == Some("final")
    }

    fn end_marker(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Reasoned;
    use serde_json::Map;

    fn r(reasoning: Option<&str>, content: Option<&str>) -> Reasoned {
        Reasoned { reasoning: reasoning.map(str::to_string), content: content.map(str::to_string) }
    }

    const ANALYSIS: &str = "<|channel|>analysis<|message|>";
    const FINAL: &str = "<|channel|>final<|message|>";
    const COMMENTARY: &str = "<|channel|>commentary<|message|>";
    /// Ends a message and opens the next assistant header.
    const NEXT: &str = "<|end|><|start|>assistant";

    // vLLM tests/entrypoints/openai/parser/test_harmony_utils.py, TestParseChatOutput (the
    // non-streaming split that the harmony parser keeps).
    #[test]
    fn vllm_parse_chat_output_vectors() {
        let cases = [
            (format!("{FINAL}I'm in the middle of answering"), r(None, Some("I'm in the middle of answering"))),
            (format!("{ANALYSIS}I'm in the middle of thinking"), r(Some("I'm in the middle of thinking"), None)),
            (
                format!("{ANALYSIS}I'm thinking.{NEXT}{FINAL}I'm in the middle of answering"),
                r(Some("I'm thinking."), Some("I'm in the middle of answering")),
            ),
            (format!("{FINAL}The answer is 4.<|end|>"), r(None, Some("The answer is 4."))),
            (format!("{COMMENTARY}I need to call some tools.<|end|>"), r(None, Some("I need to call some tools."))),
            (format!("{ANALYSIS}I've thought hard about this.<|end|>"), r(Some("I've thought hard about this."), None)),
            (
                format!("{ANALYSIS}I've thought hard about this.{NEXT}{FINAL}The answer is 4.<|end|>"),
                r(Some("I've thought hard about this."), Some("The answer is 4.")),
            ),
            (
                format!(
                    "{COMMENTARY}Let me check the weather.{NEXT} to=functions.get_weather\
                     {COMMENTARY}{{\"location\": \"SF\"}}<|end|>"
                ),
                r(None, Some("Let me check the weather.")),
            ),
            (format!("{COMMENTARY}I'll search for that"), r(None, Some("I'll search for that"))),
            (
                format!("{COMMENTARY}Let me look that up.{NEXT}{FINAL}The answer is 42.<|end|>"),
                r(None, Some("Let me look that up.\nThe answer is 42.")),
            ),
        ];
        for (output, expected) in &cases {
            assert_eq!(&named("openai_gptoss").extract(output), expected, "{output:?}");
        }
    }

    #[test]
    fn streams_add_up_to_the_whole_output_for_one_message_of_each_kind() {
        for text in [
            format!("{ANALYSIS}I'm thinking.{NEXT}{FINAL}The answer is 4.<|return|>"),
            format!("{ANALYSIS}a < b, <|x|> is text{NEXT}<|channel|>final <|constrain|>json<|message|>{{\"a\": 1}}"),
            format!(
                "{ANALYSIS}Need weather.{NEXT}<|channel|>commentary to=functions.get_weather <|constrain|>json\
                 <|message|>{{\"city\":\"SF\"}}<|call|>"
            ),
            format!("{FINAL}日本語"),
            "plain text from a model that skipped harmony".to_string(),
            format!("{ANALYSIS}thinking{NEXT}<|channel|>fin"),
        ] {
            assert_stream_matches_extract("openai_gptoss", &Map::new(), &text);
        }
    }

    #[test]
    fn tool_calls_and_builtin_tools() {
        let p = named("openai_gptoss");
        // A built-in tool call on the analysis channel is reasoning; one on commentary is neither.
        assert_eq!(p.extract("<|channel|>analysis to=python<|message|>print(1)<|call|>"), r(Some("print(1)"), None));
        assert_eq!(p.extract("<|channel|>commentary to=browser.search<|message|>{}<|call|>"), r(None, None));
        // A bare recipient is a function call on the chat endpoint.
        assert_eq!(p.extract("<|channel|>commentary to=get_weather<|message|>{}<|call|>"), r(None, None));
        // Messages of other roles, and with no channel, are dropped.
        let text = format!("{FINAL}a<|end|><|start|>user{FINAL}b{NEXT}<|message|>c<|end|>");
        assert_eq!(p.extract(&text), r(None, Some("a")));
    }

    #[test]
    fn stream_runs_messages_together_where_extract_joins_them_with_newlines() {
        let text = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>";
        assert_eq!(named("openai_gptoss").extract(text), r(Some("a\nb"), None));
        let mut p = named("openai_gptoss");
        assert_eq!(stream(p.as_mut(), &chunks(text, &[2])), r(Some("ab"), None));
    }

    #[test]
    fn output_stopped_inside_a_header_is_content() {
        let p = named("openai_gptoss");
        assert_eq!(
            p.extract("<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>fin"),
            r(Some("thinking"), Some("<|start|>assistant<|channel|>fin"))
        );
        assert_eq!(p.extract(""), r(None, None));
        assert_eq!(p.extract("<|channel|>analysis<|message|>"), r(None, None));
    }

    // vLLM tests/reasoning/test_gptoss_reasoning_parser.py, test_gptoss_is_reasoning_end.
    #[test]
    fn vllm_is_reasoning_end_vectors() {
        const USER: &str = "<|start|>user<|message|>";
        const REASONING: &str = "<|end|><|start|>assistant<|channel|>analysis<|message|>";
        const END: &str = "<|end|>";
        const ASSISTANT: &str = "<|start|>assistant";
        let prefix = format!("{END}{ASSISTANT}<|channel|>final");
        let content_start = format!("{prefix}<|message|>");
        let cases = [
            (format!("{REASONING}This is reasoning{content_start}This is the rest"), true),
            (format!("{REASONING}This is reasoning<|end|>"), false),
            (format!("{USER}This is a user message"), false),
            (format!("{REASONING}This is reasoning{prefix}"), false),
            (format!("{REASONING}This is reasoning<|message|>"), false),
            (format!("{REASONING}This is reasoning{prefix}<|constrain|> JSON "), false),
            (format!("{REASONING}This is reasoning{prefix}<|constrain|> JSON <|message|>"), true),
            (format!("{REASONING}This is reasoning{prefix}<|constrain|> JSON <|message|>This is the rest"), true),
            (format!("{REASONING}This is reasoning{prefix}<|constrain|>ReplyAction <|message|>This is the rest"), true),
            (
                format!(
                    "{USER}1st turn user message{REASONING}1st turn reasoning{content_start}1st turn response{END}\
                     {USER}2nd turn user message{END}{ASSISTANT}"
                ),
                false,
            ),
        ];
        let p = named("openai_gptoss");
        for (output, end) in &cases {
            assert_eq!(p.is_reasoning_end(output), *end, "{output:?}");
        }
    }
}
