//! `hermes`: Hermes 2 Pro, Qwen2.5, Qwen3 (and Granite 4, which shares the format):
//! `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, the last one possibly left
//! open at the end of the output. The text before the first block is content; text between and
//! after blocks is dropped. As vLLM's `Hermes2ProToolParser`.

use super::*;

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

const KEYS: CallKeys = CallKeys { arguments: &["arguments"], unwrap_serialized: true, missing: None };

#[derive(Default)]
pub(super) struct Hermes {
    /// How far `advance` has read.
    pos: usize,
    phase: Phase,
}

#[derive(Default)]
enum Phase {
    /// Before the first block: content.
    #[default]
    Content,
    /// Between blocks: looking for the next `<tool_call>`.
    Seek,
    Call(CallStream),
    /// The output stopped being calls; nothing more is sent.
    Stopped,
}

impl Format for Hermes {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        let Some(first) = output.find(START) else { return all_content(output) };
        let mut calls = Vec::new();
        let mut pos = first;
        while let Some((at, _)) = find_first(output, pos, &[START]) {
            let body_start = at + START.len();
            // An unclosed block runs to the end of the output, other markers included.
            let (body, next) = match output[body_start..].find(END) {
                Some(len) => (&output[body_start..body_start + len], body_start + len + END.len()),
                None => (&output[body_start..], output.len()),
            };
            let Some((name, arguments)) = Json::parse(body).and_then(|call| KEYS.call(&call)) else {
                return all_content(output);
            };
            calls.push(ToolCall { id: random_tool_call_id(), name, arguments });
            pos = next;
        }
        ExtractedToolCalls { tool_calls: calls, content: non_empty(&output[..first]) }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            match &mut self.phase {
                Phase::Content => {
                    let (end, found) = content_end(text, self.pos, &[START]);
                    content_event(events, &text[self.pos..end]);
                    self.pos = end;
                    match found {
                        Some(at) => {
                            self.pos = at + START.len();
                            self.phase = Phase::Call(CallStream::new(KEYS));
                        }
                        None => return,
                    }
                }
                Phase::Seek => match find_first(text, self.pos, &[START]) {
                    Some((at, _)) => {
                        self.pos = at + START.len();
                        self.phase = Phase::Call(CallStream::new(KEYS));
                    }
                    None => {
                        self.pos = (text.len() - partial_marker_len(text, START)).max(self.pos);
                        return;
                    }
                },
                Phase::Call(call) => {
                    let Some(rest) = text.get(self.pos..) else { return };
                    match call.feed(rest, events) {
                        CallProgress::Open => {
                            self.pos = text.len();
                            return;
                        }
                        CallProgress::Done { consumed, called } => {
                            self.pos += consumed;
                            self.phase = if called { Phase::Seek } else { Phase::Stopped };
                        }
                        CallProgress::Failed => self.phase = Phase::Stopped,
                    }
                }
                Phase::Stopped => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_hermes_tool_parser.py.

    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    fn extract(output: &str) -> ExtractedToolCalls {
        parser("hermes").unwrap().extract(output, &[])
    }

    #[test]
    fn plain_text_is_content() {
        let text = "This is some prior text that has nothing to do with tool calling.";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) });
        assert_streams_match("hermes", "This is plain text with no tool calling involved.", &[], true);
        assert_eq!(extract("This is not a tool call.").tool_calls, vec![]);
    }

    #[test]
    fn call_between_tags() {
        // bug 19056: a boolean argument.
        let text = "<tool_call>\n{\"name\": \"final_answer\", \"arguments\": {\"trigger\": true}}\n</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.tool_calls.len(), 1);
        assert_eq!(whole.tool_calls[0].name, "final_answer");
        assert_eq!(whole.tool_calls[0].arguments, r#"{"trigger": true}"#);
        assert_eq!(whole.content, None);
        assert!(whole.tool_calls[0].id.starts_with("chatcmpl-tool-"));
    }

    #[test]
    fn call_until_end_of_output() {
        let text = "<tool_call>\n{\"name\": \"final_answer\", \"arguments\": {\"trigger\": true}}";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.tool_calls[0].arguments, r#"{"trigger": true}"#);
    }

    #[test]
    fn invalid_json_is_content() {
        let text = "<tool_call>\n{\"name\": \"final_answer\", \"arguments\": {\"trigger\": true}";
        assert_eq!(extract(text), ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) });
        // The stream sends the call's start before it can know; finish adds nothing after.
        let streamed = stream("hermes", &char_chunks(text, 3), &[]);
        assert_eq!(streamed.calls[0].name, "final_answer");
        assert!(!streamed.finish_sent);
    }

    #[test]
    fn temperature_call_streams_in_pieces() {
        let text = "<tool_call>{\"name\": \"get_current_temperature\",\"arguments\": {\"location\":\"San Francisco, California, United States\", \"unit\": \"celsius\"}}</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(
            args(&whole.tool_calls[0]),
            json!({"location": "San Francisco, California, United States", "unit": "celsius"})
        );
        // Re-serialized the way vLLM's json.dumps writes it.
        assert_eq!(
            whole.tool_calls[0].arguments,
            r#"{"location": "San Francisco, California, United States", "unit": "celsius"}"#
        );
        let pieces = stream("hermes", &token_chunks(text), &[]);
        assert_eq!(pieces.calls[0].arguments, whole.tool_calls[0].arguments);
    }

    #[test]
    fn content_then_call() {
        let text = "Sure, let me check the weather.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"NYC\"}}</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.content.as_deref(), Some("Sure, let me check the weather."));
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "NYC"}));
        // Content and a whole call in one delta.
        let text = "Hi!<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
        let one = stream("hermes", &[text.to_owned()], &[]);
        assert_eq!(one.content, "Hi!");
        assert_eq!(one.calls[0].arguments, r#"{"x": 1}"#);
    }

    #[test]
    fn several_calls() {
        let text = "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"cats\"}}</tool_call><tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"dogs\"}}</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.tool_calls.len(), 2);
        assert_eq!(args(&whole.tool_calls[0]), json!({"q": "cats"}));
        assert_eq!(args(&whole.tool_calls[1]), json!({"q": "dogs"}));
        assert_ne!(whole.tool_calls[0].id, whole.tool_calls[1].id);
        // Newline-separated Qwen style, with text in between that is dropped.
        let text = "Let me look.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nand\n<tool_call>\n{\"arguments\": {\"k\": [1, 2.50]}, \"name\": \"b\"}\n</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.content.as_deref(), Some("Let me look.\n"));
        assert_eq!(whole.tool_calls[0].arguments, "{}");
        assert_eq!(whole.tool_calls[1].name, "b");
        assert_eq!(whole.tool_calls[1].arguments, r#"{"k": [1, 2.5]}"#);
    }

    #[test]
    fn serialized_arguments_are_not_encoded_twice() {
        let text = "<tool_call>\n{\"name\": \"get_db_config\", \"arguments\": \"{\\\"param\\\": \\\"max_connections\\\"}\"}\n</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(whole.tool_calls[0].name, "get_db_config");
        assert_eq!(args(&whole.tool_calls[0]), json!({"param": "max_connections"}));
        let text = "<tool_call>\n{\"name\": \"do_thing\", \"arguments\": \"hello\"}\n</tool_call>";
        let whole = assert_streams_match("hermes", text, &[], true);
        assert_eq!(args(&whole.tool_calls[0]), json!("hello"));
    }

    #[test]
    fn string_arguments_match_between_modes() {
        for value in [r#"{"param": "max_connections"}"#, "hello", "{hello world}", "[oops", r#"{"a": 1} tail text"#] {
            let call = serde_json::to_string(&json!({"name": "f", "arguments": value})).unwrap();
            let text = format!("<tool_call>{call}</tool_call>");
            let whole = assert_streams_match("hermes", &text, &[], true);
            let parsed = args(&whole.tool_calls[0]);
            if value.starts_with("{\"param") {
                assert_eq!(parsed, json!({"param": "max_connections"}));
            } else {
                assert_eq!(parsed, json!(value));
            }
        }
    }

    #[test]
    fn not_a_call_is_content() {
        for text in [
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>[1, 2]</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "Hello <tool_call>not json</tool_call> bye",
            "ends with a partial marker <tool_",
        ] {
            let whole = assert_streams_match("hermes", text, &[], false);
            assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) }, "{text}");
        }
    }
}
