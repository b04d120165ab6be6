//! `llama3_json` (and `llama4_json`): Llama 3.1/3.2/4 JSON tool calls,
//! `{"name": ..., "parameters": {...}}` (or `"arguments"`), optionally after `<|python_tag|>`,
//! several separated by `;`. As vLLM's `Llama3JsonToolParser`: a whole output's calls are the
//! JSON objects found anywhere in it and the text around them is dropped; a stream treats an
//! output as calls only when it starts with `<|python_tag|>` or `{`, and as content otherwise.

use super::*;

const PYTHON_TAG: &str = "<|python_tag|>";

const KEYS: CallKeys = CallKeys { arguments: &["arguments", "parameters"], unwrap_serialized: false, missing: None };

#[derive(Default)]
pub(super) struct Llama3Json {
    pos: usize,
    phase: Phase,
    /// Whether a call has been sent: until then a stream that turns out not to be calls can
    /// still become content.
    called: bool,
}

#[derive(Default)]
enum Phase {
    /// Nothing decided: the output may yet start with the tag.
    #[default]
    Start,
    Content,
    /// Before a call object: separators (`;`, whitespace) may come.
    Between,
    Call(CallStream),
    Stopped,
}

impl Format for Llama3Json {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        if !output.contains(PYTHON_TAG) && !output.contains('{') {
            return all_content(output);
        }
        let mut calls = Vec::new();
        let mut parsed_to = 0;
        for (at, _) in output.match_indices('{') {
            if at < parsed_to {
                continue;
            }
            let call = Json::parse_prefix(&output[at..]).and_then(|(object, len)| {
                parsed_to = at + len;
                KEYS.call(&object)
            });
            match call {
                Some((name, arguments)) => calls.push(ToolCall { id: random_tool_call_id(), name, arguments }),
                // Before the first call, a brace that is not one means the output is text; after
                // it, braces in trailing prose are only prose.
                None if calls.is_empty() => return all_content(output),
                None => {}
            }
        }
        if calls.is_empty() {
            return all_content(output);
        }
        ExtractedToolCalls { tool_calls: calls, content: None }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            match &mut self.phase {
                Phase::Start => {
                    if text.starts_with(PYTHON_TAG) {
                        self.pos = PYTHON_TAG.len();
                        self.phase = Phase::Between;
                    } else if text.starts_with('{') {
                        self.phase = Phase::Between;
                    } else if PYTHON_TAG.starts_with(text) {
                        return;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Content => {
                    content_event(events, text.get(self.pos..).unwrap_or(""));
                    self.pos = text.len();
                    return;
                }
                Phase::Between => {
                    let rest = text.get(self.pos..).unwrap_or("");
                    let skipped = rest.len() - rest.trim_start_matches([' ', '\t', '\n', '\r', ';']).len();
                    self.pos += skipped;
                    match text[self.pos..].chars().next() {
                        None => return,
                        Some('{') => self.phase = Phase::Call(CallStream::new(KEYS)),
                        Some(_) => self.phase = Phase::Stopped,
                    }
                }
                Phase::Call(call) => {
                    let Some(rest) = text.get(self.pos..) else { return };
                    match call.feed(rest, events) {
                        CallProgress::Open => {
                            self.pos = text.len();
                            return;
                        }
                        CallProgress::Done { consumed, called: true } => {
                            self.pos += consumed;
                            self.called = true;
                            self.phase = Phase::Between;
                        }
                        CallProgress::Done { called: false, .. } | CallProgress::Failed => self.not_a_call(),
                    }
                }
                Phase::Stopped => return,
            }
        }
    }
}

impl Llama3Json {
    /// An object that is not a call: before any call the whole output is text, so it is sent
    /// as content from the start; after one, the stream ends.
    fn not_a_call(&mut self) {
        if self.called {
            self.phase = Phase::Stopped;
        } else {
            self.pos = 0;
            self.phase = Phase::Content;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_llama3_json_tool_parser.py.

    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    fn extract(output: &str) -> ExtractedToolCalls {
        parser("llama3_json").unwrap().extract(output, &[])
    }

    fn names(extracted: &ExtractedToolCalls) -> Vec<&str> {
        extracted.tool_calls.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn call_inside_text() {
        let text =
            "Here is the result: {\"name\": \"getOpenIncidentsTool\", \"parameters\": {}} Would you like to know more?";
        let whole = extract(text);
        assert_eq!(names(&whole), ["getOpenIncidentsTool"]);
        assert_eq!(whole.tool_calls[0].arguments, "{}");
        assert_eq!(whole.content, None);
        // A stream only takes an output that starts with a call as calls, as vLLM's does.
        let streamed = stream("llama3_json", &token_chunks(text), &[]);
        assert_eq!(streamed.content, text);
        assert!(streamed.calls.is_empty());
    }

    #[test]
    fn arguments_and_parameters() {
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test query\", \"limit\": 10}}",
            &[],
            true,
        );
        assert_eq!(whole.tool_calls[0].name, "searchTool");
        assert!(whole.tool_calls[0].arguments.contains("\"query\": \"test query\""));
        assert!(whole.tool_calls[0].arguments.contains("\"limit\": 10"));
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"searchTool\", \"arguments\": {\"query\": \"test\"}}",
            &[],
            true,
        );
        assert_eq!(whole.tool_calls[0].arguments, r#"{"query": "test"}"#);
        let whole = assert_streams_match(
            "llama3_json",
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1.50}}",
            &[],
            true,
        );
        assert_eq!(whole.tool_calls[0].arguments, r#"{"a": 1.5}"#);
    }

    #[test]
    fn not_calls_are_content() {
        // The stream has sent the call by the time the JSON breaks; the whole output is text.
        let broken = "{\"name\": \"invalidTool\", \"parameters\": {invalid json}";
        assert_eq!(extract(broken), ExtractedToolCalls { tool_calls: vec![], content: Some(broken.to_owned()) });
        for text in [
            "This is just some text without any tool calls",
            "{\"parameters\": {}}",
            "{\"name\": \"toolWithoutParams\"}",
            "<|python_tag|>",
            "<b>bold</b>",
        ] {
            let whole = assert_streams_match("llama3_json", text, &[], false);
            assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) }, "{text}");
        }
        // Before any call the stream turns back to content at once.
        let streamed = stream("llama3_json", &char_chunks("{\"parameters\": {}} trailing", 2), &[]);
        assert_eq!(streamed.content, "{\"parameters\": {}} trailing");
    }

    #[test]
    fn several_calls() {
        for separator in ["; ", " ; ", ";", ";\n", "\n"] {
            let text = [
                "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test1\"}}",
                "{\"name\": \"getOpenIncidentsTool\", \"parameters\": {}}",
                "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test2\"}}",
            ]
            .join(separator);
            let whole = assert_streams_match("llama3_json", &text, &[], true);
            assert_eq!(names(&whole), ["searchTool", "getOpenIncidentsTool", "searchTool"]);
            assert_eq!(args(&whole.tool_calls[0]), json!({"query": "test1"}));
            assert_eq!(whole.tool_calls[1].arguments, "{}");
            assert_eq!(args(&whole.tool_calls[2]), json!({"query": "test2"}));
        }
        let text = "Here are the results: {\"name\": \"searchTool\", \"parameters\": {\"query\": \"test1\"}}; {\"name\": \"getOpenIncidentsTool\", \"parameters\": {}}; {\"name\": \"searchTool\", \"parameters\": {\"query\": \"test2\"}} Would you like to know more?";
        assert_eq!(names(&extract(text)), ["searchTool", "getOpenIncidentsTool", "searchTool"]);
    }

    #[test]
    fn nested_and_escaped_arguments() {
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"complexTool\", \"parameters\": {\"level1\": {\"level2\": {\"level3\": {\"level4\": {\"value\": \"deep\"}}}}}}",
            &[],
            true,
        );
        assert_eq!(args(&whole.tool_calls[0])["level1"]["level2"]["level3"]["level4"]["value"], "deep");
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"simpleTool\", \"parameters\": {\"value\": \"test\"}}; {\"name\": \"complexTool\", \"parameters\": {\"config\": {\"database\": {\"connection\": {\"pool\": {\"size\": 10}}}}}}",
            &[],
            true,
        );
        assert_eq!(args(&whole.tool_calls[1])["config"]["database"]["connection"]["pool"]["size"], 10);
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test {value} [complex]\",\"nested\": {\"inner\": \"more {brackets}\"}}}",
            &[],
            true,
        );
        assert_eq!(
            args(&whole.tool_calls[0]),
            json!({"query": "test {value} [complex]", "nested": {"inner": "more {brackets}"}})
        );
        let whole = assert_streams_match(
            "llama3_json",
            "{\"name\": \"parserTool\", \"parameters\": {\"text\": \"He said \\\"Hello {world}\\\"\"}}",
            &[],
            true,
        );
        assert_eq!(args(&whole.tool_calls[0])["text"], "He said \"Hello {world}\"");
    }

    #[test]
    fn braces_in_trailing_text_keep_the_call() {
        for text in [
            "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test\"}} I used {searchTool} for this.",
            "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test\"}} The arguments I passed were {\"query\": \"test\"}",
        ] {
            let whole = assert_streams_match("llama3_json", text, &[], true);
            assert_eq!(names(&whole), ["searchTool"]);
            assert_eq!(whole.content, None);
        }
    }
}
