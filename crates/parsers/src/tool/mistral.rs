//! `mistral`: content, then `[TOOL_CALLS]` and the calls, in one of two forms as vLLM's
//! `MistralToolParser` reads them:
//!
//! - a JSON list, `[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, ...]` (tokenizers
//!   before v11): the arguments are re-serialized with `json.dumps`;
//! - `[TOOL_CALLS]add{"a": 1}[TOOL_CALLS]mul{...}`, the name possibly followed by `[ARGS]`
//!   (v11 and later): the arguments are the model's text from `{` to the next marker, as is.
//!
//! vLLM picks the form from the tokenizer's version; this parser sees only text, so a name
//! right after the marker means the second form and anything else the first.
//! Ids are 9 letters and digits, as mistral-common requires.

use super::*;

const BOT: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

const KEYS: CallKeys = CallKeys { arguments: &["arguments"], unwrap_serialized: false, missing: Some("{}") };

/// A Mistral tool-call id: 9 ASCII letters and digits.
pub(super) fn mistral_id() -> String {
    const ALPHANUMERIC: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut bits = uuid::Uuid::new_v4().as_u128();
    (0..9)
        .map(|_| {
            let c = ALPHANUMERIC[(bits % 62) as usize] as char;
            bits /= 62;
            c
        })
        .collect()
}

/// Whether the text after the first marker starts a `name{...}` call rather than JSON.
fn named_form(after_marker: char) -> bool {
    after_marker.is_alphanumeric() || matches!(after_marker, '_' | '-' | '.')
}

/// The JSON list form's calls in one marker's text, or `None` when it does not parse.
fn json_calls(text: &str) -> Option<Vec<ToolCall>> {
    let value = match Json::parse_prefix(text) {
        Some((value, _)) => value,
        // A model that wrote something before the list: vLLM's `\[{.*}\]` fallback.
        None => {
            let start = text.find("[{")?;
            let end = text.rfind("}]")?;
            Json::parse(text.get(start..end + 2)?)?
        }
    };
    let items = match value {
        Json::Array(items) => items,
        object @ Json::Object(_) => vec![object],
        _ => return None,
    };
    items
        .iter()
        .map(|item| KEYS.call(item).map(|(name, arguments)| ToolCall { id: mistral_id(), name, arguments }))
        .collect()
}

#[derive(Default)]
pub(super) struct Mistral {
    pos: usize,
    phase: Phase,
}

#[derive(Default)]
enum Phase {
    #[default]
    Content,
    /// Right after the first marker: the next character tells the form.
    Form,
    /// A name, up to `{`.
    Name {
        start: usize,
    },
    /// Arguments as written, up to the next marker.
    Arguments,
    /// Before the list's `[` (or a lone call object).
    ListStart,
    /// After `[`: a call or `]`.
    ListFirst,
    /// After a call: `,` or `]`.
    ListAfter,
    /// After `,`: a call.
    ListNext,
    Call {
        call: CallStream,
        in_list: bool,
    },
    /// After a list: another marker may start another.
    NextList,
    /// The calls stopped parsing: the whole output is content, which `finish` sends.
    Stopped,
}

impl Format for Mistral {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        let Some(first) = output.find(BOT) else { return all_content(output) };
        let content = &output[..first];
        let segments: Vec<&str> = output[first + BOT.len()..].split(BOT).collect();
        let named = segments.first().and_then(|s| s.chars().next()).is_some_and(named_form);
        let mut calls = Vec::new();
        for segment in segments {
            if named {
                // A segment without arguments is not a call.
                if let Some(brace) = segment.find('{') {
                    let name = segment[..brace].replace(ARGS, "");
                    calls.push(ToolCall { id: mistral_id(), name, arguments: segment[brace..].to_owned() });
                }
                continue;
            }
            let segment = segment.trim();
            match json_calls(segment) {
                Some(found) => calls.extend(found),
                // vLLM returns the text after the marker as the content.
                None => {
                    return ExtractedToolCalls {
                        tool_calls: Vec::new(),
                        content: non_empty(&format!("{content}{segment}")),
                    }
                }
            }
        }
        ExtractedToolCalls { tool_calls: calls, content: non_empty(content) }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            let rest = text.get(self.pos..).unwrap_or("");
            match &mut self.phase {
                Phase::Content => {
                    let (end, found) = content_end(text, self.pos, &[BOT]);
                    content_event(events, &text[self.pos..end]);
                    self.pos = end;
                    let Some(at) = found else { return };
                    self.pos = at + BOT.len();
                    self.phase = Phase::Form;
                }
                Phase::Form => match rest.chars().next() {
                    None => return,
                    Some(c) if named_form(c) => self.phase = Phase::Name { start: self.pos },
                    Some(_) => self.phase = Phase::ListStart,
                },
                Phase::Name { start } => {
                    let start = *start;
                    match find_first(text, self.pos, &["{", BOT]) {
                        Some((at, "{")) => {
                            let name = text[start..at].replace(ARGS, "");
                            events.push(Event::Call { name, id: None });
                            self.pos = at;
                            self.phase = Phase::Arguments;
                        }
                        Some((at, _)) => {
                            self.pos = at + BOT.len();
                            self.phase = Phase::Name { start: self.pos };
                        }
                        None => {
                            self.pos = (text.len() - partial_marker_len(text, BOT)).max(self.pos);
                            return;
                        }
                    }
                }
                Phase::Arguments => {
                    let (end, found) = content_end(text, self.pos, &[BOT]);
                    if end > self.pos {
                        events.push(Event::Args(text[self.pos..end].to_owned()));
                    }
                    self.pos = end;
                    let Some(at) = found else { return };
                    self.pos = at + BOT.len();
                    self.phase = Phase::Name { start: self.pos };
                }
                Phase::ListStart | Phase::ListFirst | Phase::ListAfter | Phase::ListNext => {
                    let trimmed = rest.trim_start();
                    self.pos += rest.len() - trimmed.len();
                    let Some(c) = trimmed.chars().next() else { return };
                    let phase = std::mem::take(&mut self.phase);
                    self.phase = match (phase, c) {
                        (Phase::ListStart, '[') => Phase::ListFirst,
                        (Phase::ListStart, '{') => Phase::Call { call: CallStream::new(KEYS), in_list: false },
                        (Phase::ListFirst | Phase::ListNext, '{') => {
                            Phase::Call { call: CallStream::new(KEYS), in_list: true }
                        }
                        (Phase::ListAfter, ',') => Phase::ListNext,
                        (Phase::ListFirst | Phase::ListAfter, ']') => Phase::NextList,
                        _ => {
                            self.phase = Phase::Stopped;
                            return;
                        }
                    };
                    if !matches!(self.phase, Phase::Call { .. }) {
                        self.pos += c.len_utf8();
                    }
                }
                Phase::Call { call, in_list } => match call.feed(rest, events) {
                    CallProgress::Open => {
                        self.pos = text.len();
                        return;
                    }
                    CallProgress::Done { consumed, called: true } => {
                        self.pos += consumed;
                        self.phase = if *in_list { Phase::ListAfter } else { Phase::NextList };
                    }
                    CallProgress::Done { called: false, .. } | CallProgress::Failed => self.phase = Phase::Stopped,
                },
                Phase::NextList => match find_first(text, self.pos, &[BOT]) {
                    Some((at, _)) => {
                        self.pos = at + BOT.len();
                        self.phase = Phase::ListStart;
                    }
                    None => {
                        self.pos = (text.len() - partial_marker_len(text, BOT)).max(self.pos);
                        return;
                    }
                },
                Phase::Stopped => return,
            }
        }
    }

    fn new_id(&self) -> String {
        mistral_id()
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_mistral_tool_parser.py.

    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    fn extract(output: &str) -> ExtractedToolCalls {
        parser("mistral").unwrap().extract(output, &[])
    }

    /// Streams every way; checks ids and returns the whole output's extraction.
    fn check(output: &str) -> ExtractedToolCalls {
        check_with(output, true)
    }

    fn check_with(output: &str, complete: bool) -> ExtractedToolCalls {
        let whole = assert_streams_match("mistral", output, &[], complete);
        for call in &whole.tool_calls {
            assert!(call.id.len() == 9 && call.id.chars().all(|c| c.is_ascii_alphanumeric()), "{}", call.id);
        }
        whole
    }

    /// An output, its calls' names and arguments, and its content.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);

    fn calls(extracted: &ExtractedToolCalls) -> Vec<(&str, &str)> {
        extracted.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    #[test]
    fn no_tools() {
        let whole = check("This is a test");
        assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some("This is a test".into()) });
    }

    #[test]
    fn json_list_form() {
        let weather = r#"{"city": "San Francisco", "state": "CA", "unit": "celsius"}"#;
        let cases: &[Case] = &[
            (r#"[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]"#, &[("add", r#"{"a": 3.5, "b": 4}"#)], None),
            (
                r#"[TOOL_CALLS] [{"name": "get_current_weather", "arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]"#,
                &[("get_current_weather", weather)],
                None,
            ),
            (
                r#"[TOOL_CALLS] [{"arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}, "name": "get_current_weather"}]"#,
                &[("get_current_weather", weather)],
                None,
            ),
            (r#"[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]"#, &[("get_age", r#"{"name": "John Doe"}"#)], None),
            (
                r#"[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "get_current_weather", "arguments":{"city": "San Francisco", "state": "CA", "unit": "celsius"}}]"#,
                &[("add", r#"{"a": 3.5, "b": 4}"#), ("get_current_weather", weather)],
                None,
            ),
            (r#"Hello[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]"#, &[("add", r#"{"a": 1, "b": 2}"#)], Some("Hello")),
            (
                "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\":{\"city\": \"Dallas\", \"state\": \"TX\", \"unit\": \"fahrenheit\"}}]\nextra trailing data",
                &[("get_current_weather", r#"{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}"#)],
                None,
            ),
            (r#"[TOOL_CALLS]  [ {"name":"add" , "arguments" : {"a": 3, "b": 4} } ]"#, &[("add", r#"{"a": 3, "b": 4}"#)], None),
            (r#"[TOOL_CALLS] [{"name": "add", "arguments":{"a": "3", "b": "4"}}]"#, &[("add", r#"{"a": "3", "b": "4"}"#)], None),
            (r#"[TOOL_CALLS] [{"name": "now"}]"#, &[("now", "{}")], None),
        ];
        for (output, expected, content) in cases {
            let whole = check(output);
            assert_eq!(calls(&whole), *expected, "{output}");
            assert_eq!(whole.content.as_deref(), *content, "{output}");
        }
    }

    #[test]
    fn json_list_fallbacks() {
        // Leading junk: vLLM's regex fallback still finds the list.
        // The stream cannot tell junk from a bad list until the end; finish sends the call.
        let whole = check_with(r#"[TOOL_CALLS]  junk [{"name": "add", "arguments":{"a": 1, "b": 2}}] trail"#, false);
        assert_eq!(calls(&whole), [("add", r#"{"a": 1, "b": 2}"#)]);
        let whole = check_with("[TOOL_CALLS] not json at all", false);
        assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some("not json at all".into()) });
        // vLLM raises on a second marker here; both lists are read instead.
        let whole = check(
            r#"[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1}}][TOOL_CALLS] [{"name": "sub", "arguments":{"b": 2}}]"#,
        );
        assert_eq!(calls(&whole), [("add", r#"{"a": 1}"#), ("sub", r#"{"b": 2}"#)]);
    }

    #[test]
    fn named_form() {
        let weather = r#"{"city": "San Francisco", "state": "CA", "unit": "celsius"}"#;
        let cases: &[Case] = &[
            (
                r#"[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}"#,
                &[("add_this_and_that", r#"{"a": 3.5, "b": 4}"#)],
                None,
            ),
            (&format!("[TOOL_CALLS]get_current_weather{weather}"), &[("get_current_weather", weather)], None),
            (
                r#"[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}"#,
                &[("add", r#"{"a": 3.5, "b": 4}"#), ("multiply", r#"{"a": 3, "b": 6}"#)],
                None,
            ),
            (
                r#"bla[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}"#,
                &[("add_this_and_that", r#"{"a": 3.5, "b": 4}"#)],
                Some("bla"),
            ),
            // Arguments are the model's text, even when it is cut short.
            (
                r#"hi{hi[TOOL_CALLS]bash{"command": "print(\"hello world!\")\nre.compile(r'{}')""#,
                &[("bash", r#"{"command": "print(\"hello world!\")\nre.compile(r'{}')""#)],
                Some("hi{hi"),
            ),
            (
                r#"hi{hi[TOOL_CALLS]bash{"command": "print(\"hello world!\")\nre.compile(r'{}')"}"#,
                &[("bash", r#"{"command": "print(\"hello world!\")\nre.compile(r'{}')"}"#)],
                Some("hi{hi"),
            ),
            // HF tokenizers keep [ARGS] in the text.
            (r#"[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}"#, &[("add", r#"{"a": 1, "b": 2}"#)], None),
            (r#"[TOOL_CALLS]get_time[ARGS]{}"#, &[("get_time", "{}")], None),
        ];
        for (output, expected, content) in cases {
            let whole = check(output);
            assert_eq!(calls(&whole), *expected, "{output}");
            assert_eq!(whole.content.as_deref(), *content, "{output}");
        }
    }

    #[test]
    fn named_form_without_arguments_is_skipped() {
        assert_eq!(extract("[TOOL_CALLS]toolname_no_args"), ExtractedToolCalls::default());
        let whole = check(r#"[TOOL_CALLS]nothing[TOOL_CALLS]add{"a": 1}"#);
        assert_eq!(calls(&whole), [("add", r#"{"a": 1}"#)]);
    }

    #[test]
    fn one_delta_holds_everything() {
        let streamed = stream(
            "mistral",
            &[r#"Some text[TOOL_CALLS] [{"name": "add", "arguments":{"a": 1, "b": 2}}]"#.to_owned()],
            &[],
        );
        assert_eq!(streamed.content, "Some text");
        assert_eq!(streamed.calls.len(), 1);
        assert_eq!(args(&streamed.calls[0]), json!({"a": 1, "b": 2}));
        // Content before the marker is sent while the name is still coming.
        let mut parser = parser("mistral").unwrap();
        let first = parser.extract_streaming("", "Hello", &[]).unwrap();
        assert_eq!(first.content.as_deref(), Some("Hello"));
        let second = parser.extract_streaming("Hello", "[TOOL_CALLS]add{\"a\": 1, \"b\": 2}", &[]).unwrap();
        assert_eq!(second.tool_calls[0].name.as_deref(), Some("add"));
        assert_eq!(second.tool_calls[0].arguments.as_deref(), Some("{\"a\": 1, \"b\": 2}"));
    }
}
