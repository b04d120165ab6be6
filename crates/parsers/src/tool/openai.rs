//! `openai`: gpt-oss's harmony format (see [`crate::harmony`]), as vLLM's `OpenAIToolParser`
//! reads it. A message addressed to `functions.NAME` is a call of `NAME` whose arguments are the
//! message text, re-serialized with `json.dumps` when the content type says JSON (or says
//! nothing) and the text parses. The content is the last `final` message, or failing that the
//! last `commentary` message addressed to no one (a preamble meant for the user). Analysis and
//! everything else are dropped: the reasoning parser reads the analysis channel.
//!
//! vLLM reads token ids, and the ids include the `<|call|>` or `<|return|>` that stopped the
//! generation; the text lacks that stop token, so a message the output ends in counts as ended.
//!
//! Streamed, as vLLM streams harmony: every final and preamble message's text as content (so a
//! stream's content differs from the whole output's where there are several), and a call's
//! arguments as they come, in the form the whole output returns them.

use super::json::{Json, JsonStream, Status};
use super::{content_event, non_empty, random_tool_call_id, Event, ExtractedToolCalls, Format, FunctionSpec, ToolCall};
use crate::harmony::{self, parse_header, Reader};

/// What a message is to this parser, from its header.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    /// `json`: the arguments are re-serialized when they parse.
    Call {
        name: String,
        json: bool,
    },
    Final,
    Preamble,
    Other,
}

/// A header refused by harmony makes vLLM fail the request; here its message is dropped.
fn kind(header: &str, after_start: bool) -> Kind {
    let Some(header) = parse_header(header, after_start) else { return Kind::Other };
    let recipient = header.recipient.as_deref();
    if let Some(rest) = recipient.and_then(|r| r.strip_prefix("functions.")) {
        // vLLM's `recipient.split("functions.")[1]` stops at a second `functions.`.
        let name = rest.split("functions.").next().unwrap_or(rest).to_owned();
        let json = header.content_type.as_deref().is_none_or(|t| t.contains("json"));
        return Kind::Call { name, json };
    }
    match (header.channel.as_deref(), recipient) {
        (Some("final"), _) => Kind::Final,
        (Some("commentary"), None | Some("")) => Kind::Preamble,
        _ => Kind::Other,
    }
}

/// A call's arguments from its whole text: `json.dumps(json.loads(text))`, or the text as it is
/// when it is not JSON (vLLM logs the error and keeps the text).
fn arguments(text: &str, json: bool) -> String {
    match json.then(|| Json::parse(text)).flatten() {
        Some(value) => value.dumps(),
        None => text.to_owned(),
    }
}

/// How a call's arguments are being streamed.
enum Args {
    /// As `json.dumps` writes them, while the text may still be JSON. `raw` is the text so far,
    /// `sent` how much of the stream's output has been sent.
    Json { stream: JsonStream, raw: String, sent: usize },
    /// The text as it comes.
    Raw,
    /// The text turned out not to be JSON after a normalized piece that it does not start with
    /// was sent: nothing more adds up.
    Stuck,
}

impl Args {
    fn new(json: bool) -> Args {
        if json {
            Args::Json { stream: JsonStream::default(), raw: String::new(), sent: 0 }
        } else {
            Args::Raw
        }
    }

    fn push(&mut self, text: &str, events: &mut Vec<Event>) {
        match self {
            Args::Raw => args_event(events, text),
            Args::Stuck => {}
            Args::Json { stream, raw, sent } => {
                raw.push_str(text);
                let consumed = stream.feed(text);
                let still_json = match stream.status() {
                    Status::Open => true,
                    // `json.loads` allows only whitespace after the value.
                    Status::Done => text[consumed..].chars().all(|c| matches!(c, ' ' | '\t' | '\n' | '\r')),
                    Status::Failed => false,
                };
                if still_json {
                    let out = stream.out();
                    args_event(events, &out[*sent..]);
                    *sent = out.len();
                } else {
                    // No longer text can be JSON either: the arguments are the raw text.
                    let next = Self::settle(&stream.out()[..*sent], raw, events);
                    *self = next;
                }
            }
        }
    }

    /// The message ended: JSON arguments are now what the whole text makes of them.
    fn end(&mut self, events: &mut Vec<Event>) {
        if let Args::Json { stream, raw, sent } = self {
            let whole = arguments(raw, true);
            Self::settle(&stream.out()[..*sent], &whole, events);
        }
    }

    /// Sends what `target` adds to what was `sent`, where it can; the state for text after it.
    fn settle(sent: &str, target: &str, events: &mut Vec<Event>) -> Args {
        match target.strip_prefix(sent) {
            Some(rest) => {
                args_event(events, rest);
                Args::Raw
            }
            None => Args::Stuck,
        }
    }
}

/// Reports `text` as more of the current call's arguments unless it is empty.
fn args_event(events: &mut Vec<Event>, text: &str) {
    if !text.is_empty() {
        events.push(Event::Args(text.to_owned()));
    }
}

/// What the current message's text goes to while streaming.
enum Body {
    Skip,
    Content,
    Call(Args),
}

pub(super) struct OpenAi {
    reader: Reader,
    /// How much of the output the reader has been given.
    read: usize,
    body: Body,
}

impl Default for OpenAi {
    fn default() -> Self {
        OpenAi { reader: Reader::default(), read: 0, body: Body::Skip }
    }
}

impl Format for OpenAi {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        let mut reader = Reader::default();
        let mut events = reader.feed(output);
        events.extend(reader.finish());
        let mut calls = Vec::new();
        let (mut final_content, mut preamble) = (None, None);
        let mut message = (Kind::Other, String::new());
        for event in events {
            match event {
                harmony::Event::Header { text, after_start } => message = (kind(&text, after_start), String::new()),
                harmony::Event::Text(text) => message.1.push_str(&text),
                harmony::Event::End => match std::mem::replace(&mut message, (Kind::Other, String::new())) {
                    (Kind::Call { name, json }, text) => {
                        calls.push(ToolCall { id: random_tool_call_id(), name, arguments: arguments(&text, json) })
                    }
                    (Kind::Final, text) => final_content = Some(text),
                    (Kind::Preamble, text) => preamble = Some(text),
                    (Kind::Other, _) => {}
                },
                // Harmony keeps no content for a header it never finished.
                harmony::Event::CutHeader(_) => {}
            }
        }
        // vLLM's `final_content or commentary_content`.
        let content = final_content.filter(|text| !text.is_empty()).or(preamble).unwrap_or_default();
        ExtractedToolCalls { tool_calls: calls, content: non_empty(&content) }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        let Some(new) = text.get(self.read..) else { return };
        self.read = text.len();
        for event in self.reader.feed(new) {
            match event {
                harmony::Event::Header { text, after_start } => {
                    self.body = match kind(&text, after_start) {
                        Kind::Call { name, json } => {
                            events.push(Event::Call { name, id: None });
                            Body::Call(Args::new(json))
                        }
                        Kind::Final | Kind::Preamble => Body::Content,
                        Kind::Other => Body::Skip,
                    }
                }
                harmony::Event::Text(text) => match &mut self.body {
                    Body::Content => content_event(events, &text),
                    Body::Call(args) => args.push(&text, events),
                    Body::Skip => {}
                },
                harmony::Event::End => {
                    if let Body::Call(args) = &mut self.body {
                        args.end(events);
                    }
                    self.body = Body::Skip;
                }
                // Only the end of the output cuts a header, and `Streamed` reads that from
                // `extract`.
                harmony::Event::CutHeader(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    fn extract(output: &str) -> ExtractedToolCalls {
        parser("openai").unwrap().extract(output, &[])
    }

    fn names_and_args(whole: &ExtractedToolCalls) -> Vec<(&str, &str)> {
        whole.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    // vLLM tests/tool_parsers/test_openai_tool_parser.py renders whole conversations with
    // openai_harmony's `render_conversation_for_completion` and parses all of it: the prompt's
    // messages are read and dropped like any other. These are the texts it renders.
    const SYSTEM: &str = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n\
        Knowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. \
        Channel must be included for every message.<|end|>";
    const ANALYSIS: &str = "<|start|>assistant<|channel|>analysis<|message|>User asks: \"What is the weather in \
        Tokyo?\" We need to use get_current_weather tool.<|end|>";

    fn completion(messages: &[&str]) -> String {
        format!("{}<|start|>assistant", messages.concat())
    }

    fn call(name: &str, content_type: &str, arguments: &str) -> String {
        format!(
            "<|start|>assistant to=functions.{name}<|channel|>commentary{content_type}<|message|>{arguments}<|call|>"
        )
    }

    #[test]
    fn vllm_no_tools() {
        let text = completion(&[
            SYSTEM,
            "<|start|>developer<|message|># Instructions\n\nTalk like a pirate!<|end|>",
            "<|start|>user<|message|>Arrr, how be you?<|end|>",
            "<|start|>assistant<|channel|>final<|message|>This is a test<|end|>",
        ]);
        let whole = assert_streams_match("openai", &text, &[], true);
        assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some("This is a test".into()) });
    }

    #[test]
    fn vllm_single_tool() {
        for arguments in [r#"{"location": "Tokyo"}"#, "{\n\"location\": \"Tokyo\"\n}"] {
            let text = completion(&[
                "<|start|>user<|message|>What is the weather in Tokyo?<|end|>",
                ANALYSIS,
                &call("get_current_weather", " json", arguments),
            ]);
            let whole = assert_streams_match("openai", &text, &[], true);
            assert_eq!(names_and_args(&whole), [("get_current_weather", r#"{"location": "Tokyo"}"#)]);
            assert_eq!(whole.content, None);
            assert!(whole.tool_calls[0].id.starts_with("chatcmpl-tool-"));
            assert!(whole.tool_calls[0].id.len() > 16);
        }
    }

    #[test]
    fn vllm_multiple_tools() {
        let tokyo = r#"{"location": "Tokyo"}"#;
        let text = completion(&[
            "<|start|>user<|message|>What is the weather in Tokyo based on where I'm at?<|end|>",
            ANALYSIS,
            &call("get_current_weather", " json", tokyo),
            &call("get_user_location", " json", tokyo),
            &call("no_content_type", "", tokyo),
            &call("not_json_no_content_type", "", "foo"),
            &call("empty_args", " json", "{}"),
            &call("no_args", " json", ""),
        ]);
        let whole = assert_streams_match("openai", &text, &[], true);
        assert_eq!(
            names_and_args(&whole),
            [
                ("get_current_weather", tokyo),
                ("get_user_location", tokyo),
                ("no_content_type", tokyo),
                ("not_json_no_content_type", "foo"),
                ("empty_args", "{}"),
                ("no_args", ""),
            ]
        );
        assert_eq!(whole.content, None);
        let ids: std::collections::HashSet<_> = whole.tool_calls.iter().map(|c| &c.id).collect();
        assert_eq!(ids.len(), 6);
    }

    #[test]
    fn vllm_tool_with_content() {
        let text = completion(&[
            "<|start|>user<|message|>What is the weather in Tokyo based on where I'm at?<|end|>",
            ANALYSIS,
            &call("get_current_weather", " json", r#"{"location": "Tokyo"}"#),
            "<|start|>assistant<|channel|>final<|message|>This tool call will get the weather.<|end|>",
        ]);
        let whole = assert_streams_match("openai", &text, &[], true);
        assert_eq!(names_and_args(&whole), [("get_current_weather", r#"{"location": "Tokyo"}"#)]);
        assert_eq!(whole.content.as_deref(), Some("This tool call will get the weather."));
    }

    /// What the model writes after a prompt ending in `<|start|>assistant`, its stop token gone.
    #[test]
    fn generated_call_without_its_stop_token() {
        let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
            to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"SF\", \"days\": [1, 2.50]}";
        let whole = assert_streams_match("openai", text, &[], true);
        assert_eq!(names_and_args(&whole), [("get_weather", r#"{"location": "SF", "days": [1, 2.5]}"#)]);
        assert_eq!(whole.content, None);
        // The same with `<|call|>` kept.
        let kept = assert_streams_match("openai", &format!("{text}<|call|>"), &[], true);
        assert_eq!(names_and_args(&kept), names_and_args(&whole));
    }

    #[test]
    fn recipient_before_the_channel() {
        let text = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Séoul\"}<|call|>";
        let whole = assert_streams_match("openai", text, &[], true);
        assert_eq!(names_and_args(&whole), [("get_weather", r#"{"city": "Séoul"}"#)]);
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "Séoul"}));
    }

    #[test]
    fn preamble_then_calls() {
        let text = "<|channel|>commentary<|message|>Let me check both.<|end|>\
            <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"SF\"}<|call|>\
            <|start|>assistant<|channel|>commentary to=functions.get_time<|constrain|>json<|message|>{}<|call|>";
        let whole = assert_streams_match("openai", text, &[], true);
        assert_eq!(whole.content.as_deref(), Some("Let me check both."));
        assert_eq!(names_and_args(&whole), [("get_weather", r#"{"city": "SF"}"#), ("get_time", "{}")]);
        let streamed = stream("openai", &token_chunks(text), &[]);
        assert_eq!(streamed.calls.len(), 2);
    }

    #[test]
    fn final_content_wins_over_a_preamble_and_the_last_one_counts() {
        let preamble = "<|channel|>commentary<|message|>Let me look that up.<|end|>";
        let answer = "<|start|>assistant<|channel|>final<|message|>The answer is 42.<|end|>";
        let text = format!("{preamble}{answer}");
        assert_eq!(extract(&text).content.as_deref(), Some("The answer is 42."));
        // A stream sends both messages' text, as vLLM streams it.
        let streamed = stream("openai", &char_chunks(&text, 3), &[]);
        assert_eq!(streamed.content, "Let me look that up.The answer is 42.");
        assert!(!streamed.finish_sent);

        let two =
            "<|channel|>final<|message|>first<|end|><|start|>assistant<|channel|>final<|message|>second<|return|>";
        assert_eq!(extract(two).content.as_deref(), Some("second"));
        // An empty final message gives way to the preamble (`final or commentary`).
        let empty = format!("{preamble}<|start|>assistant<|channel|>final<|message|><|return|>");
        assert_eq!(extract(&empty).content.as_deref(), Some("Let me look that up."));
    }

    #[test]
    fn only_functions_recipients_are_calls() {
        for text in [
            "<|channel|>commentary to=browser.search <|constrain|>json<|message|>{\"q\": \"x\"}<|call|>",
            "<|channel|>analysis to=python<|message|>print(1)<|call|>",
            "<|channel|>commentary to=get_weather<|message|>{}<|call|>",
            "<|channel|>analysis<|message|>only thinking<|end|>",
        ] {
            let whole = assert_streams_match("openai", text, &[], true);
            assert_eq!(whole, ExtractedToolCalls::default(), "{text}");
        }
        // vLLM takes a functions recipient on any channel.
        let whole = extract("<|channel|>analysis to=functions.f<|message|>{\"a\": 1}<|call|>");
        assert_eq!(names_and_args(&whole), [("f", r#"{"a": 1}"#)]);
        // vLLM's `recipient.split("functions.")[1]`.
        let whole = extract("<|channel|>commentary to=functions.a.functions.b<|message|>{}<|call|>");
        assert_eq!(whole.tool_calls[0].name, "a.");
    }

    #[test]
    fn arguments_that_are_not_json_are_kept_as_written() {
        // A content type without `json`: not re-serialized.
        let text = "<|channel|>commentary to=functions.run <|constrain|>python<|message|>{\"a\":1}<|call|>";
        let whole = assert_streams_match("openai", text, &[], true);
        assert_eq!(names_and_args(&whole), [("run", r#"{"a":1}"#)]);
        // JSON followed by more text, and JSON cut off: the text as it is, streamed too.
        for (body, expected) in [(r#"{"a": 1} and more"#, r#"{"a": 1} and more"#), (r#"{"a": 1"#, r#"{"a": 1"#)] {
            let text = format!("<|channel|>commentary to=functions.f json<|message|>{body}<|call|>");
            let whole = assert_streams_match("openai", &text, &[], true);
            assert_eq!(names_and_args(&whole), [("f", expected)]);
        }
        // Trailing whitespace is still JSON.
        let text = "<|channel|>commentary to=functions.f json<|message|>{\"a\":1}\n\n<|call|>";
        let whole = assert_streams_match("openai", text, &[], true);
        assert_eq!(names_and_args(&whole), [("f", r#"{"a": 1}"#)]);
        // Text that stops being JSON after a normalized piece was sent cannot be streamed as
        // written; the stream keeps what it sent.
        let text = "<|channel|>commentary to=functions.f<|message|>{\"a\":  [1, x]}<|call|>";
        assert_eq!(names_and_args(&extract(text)), [("f", "{\"a\":  [1, x]}")]);
        let streamed = stream("openai", &char_chunks(text, 2), &[]);
        assert_eq!(streamed.calls[0].arguments, r#"{"a": [1, "#);
    }

    #[test]
    fn text_outside_finished_messages() {
        // Never a header: vLLM's harmony parser has no message, so no content.
        let whole = assert_streams_match("openai", "plain text from a model that skipped harmony", &[], true);
        assert_eq!(whole, ExtractedToolCalls::default());
        // Cut off inside a call's header: nothing; inside the final message: its text so far.
        for text in ["<|channel|>commentary to=functions.get_wea", "<|channel|>final<|message|>The answer is <|"] {
            assert_streams_match("openai", text, &[], false);
        }
        assert_eq!(extract("<|channel|>final<|message|>The answer is <|").content.as_deref(), Some("The answer is <|"));
        assert_eq!(extract(""), ExtractedToolCalls::default());
        // A header harmony refuses drops its message.
        assert_eq!(
            extract("<|channel|>commentary a b to=functions.f<|message|>{}<|call|>"),
            ExtractedToolCalls::default()
        );
    }

    #[test]
    fn first_delta_of_each_call_names_it() {
        let text = "<|channel|>commentary to=functions.a json<|message|>{\"x\": \"long text\"}<|call|>\
            <|start|>assistant<|channel|>commentary to=functions.b json<|message|>{}<|call|>";
        let mut p = parser("openai").unwrap();
        let mut deltas = Vec::new();
        for piece in token_chunks(text) {
            deltas.extend(p.extract_streaming("", &piece, &[]));
        }
        let calls: Vec<_> = deltas.iter().flat_map(|d| &d.tool_calls).collect();
        assert_eq!(calls[0].index, 0);
        assert_eq!(calls[0].name.as_deref(), Some("a"));
        assert_eq!(calls[0].arguments.as_deref(), Some(""));
        assert!(calls.iter().filter(|c| c.index == 0).skip(1).all(|c| c.id.is_none() && c.name.is_none()));
        let second = calls.iter().find(|c| c.index == 1).unwrap();
        assert_eq!(second.name.as_deref(), Some("b"));
        assert!(second.id.as_deref().is_some_and(|id| id.starts_with("chatcmpl-tool-")));
        assert_eq!(p.finish(&[]), None);
    }
}
