//! `deepseek_v3`: DeepSeek-V3 and R1 (0528). Content, then
//! `<｜tool▁calls▁begin｜>` and calls of the form
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>`,
//! then `<｜tool▁calls▁end｜>`. The arguments are the model's text between the fences, as is.
//! As vLLM's `DeepSeekV3ToolParser`, except that arguments may span lines and that an output
//! whose calls all fail to parse is content rather than nothing.

use super::*;

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```json\n";
const ARGS_END: &str = "\n```<｜tool▁call▁end｜>";

enum Header {
    /// The call's name and where its arguments start.
    Ready {
        name: String,
        args_at: usize,
    },
    /// The header may still come.
    Partial,
    Invalid,
}

/// The header after a `<｜tool▁call▁begin｜>` that ends at `from`: `TYPE<｜tool▁sep｜>NAME`,
/// a newline and the opening fence.
fn header(text: &str, from: usize) -> Header {
    let rest = text.get(from..).unwrap_or("");
    let Some(newline) = rest.find('\n') else { return Header::Partial };
    let line = &rest[..newline];
    let Some(sep) = line.rfind(SEP) else { return Header::Invalid };
    let name = &line[sep + SEP.len()..];
    let after = &rest[newline + 1..];
    if name.is_empty() {
        Header::Invalid
    } else if after.starts_with(FENCE) {
        Header::Ready { name: name.to_owned(), args_at: from + newline + 1 + FENCE.len() }
    } else if FENCE.starts_with(after) {
        Header::Partial
    } else {
        Header::Invalid
    }
}

#[derive(Default)]
pub(super) struct DeepSeekV3 {
    pos: usize,
    phase: Phase,
}

#[derive(Default)]
enum Phase {
    #[default]
    Content,
    /// Looking for the next `<｜tool▁call▁begin｜>`.
    Seek,
    /// Reading the header of the call whose begin marker ends at `from`.
    Header {
        from: usize,
    },
    Arguments,
}

impl Format for DeepSeekV3 {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        let Some(first) = output.find(CALLS_BEGIN) else { return all_content(output) };
        let mut calls = Vec::new();
        let mut pos = 0;
        while let Some((at, _)) = find_first(output, pos, &[CALL_BEGIN]) {
            pos = at + CALL_BEGIN.len();
            if let Header::Ready { name, args_at } = header(output, pos) {
                if let Some(len) = output[args_at..].find(ARGS_END) {
                    let arguments = output[args_at..args_at + len].to_owned();
                    calls.push(ToolCall { id: random_tool_call_id(), name, arguments });
                    pos = args_at + len + ARGS_END.len();
                }
            }
        }
        if calls.is_empty() {
            return all_content(output);
        }
        ExtractedToolCalls { tool_calls: calls, content: non_empty(&output[..first]) }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            match self.phase {
                Phase::Content => {
                    let (end, found) = content_end(text, self.pos, &[CALLS_BEGIN]);
                    content_event(events, &text[self.pos..end]);
                    self.pos = end;
                    let Some(at) = found else { return };
                    self.pos = at + CALLS_BEGIN.len();
                    self.phase = Phase::Seek;
                }
                Phase::Seek => match find_first(text, self.pos, &[CALL_BEGIN]) {
                    Some((at, _)) => {
                        self.pos = at + CALL_BEGIN.len();
                        self.phase = Phase::Header { from: self.pos };
                    }
                    None => {
                        self.pos = (text.len() - partial_marker_len(text, CALL_BEGIN)).max(self.pos);
                        return;
                    }
                },
                Phase::Header { from } => match header(text, from) {
                    Header::Ready { name, args_at } => {
                        events.push(Event::Call { name, id: None });
                        self.pos = args_at;
                        self.phase = Phase::Arguments;
                    }
                    Header::Partial => return,
                    Header::Invalid => self.phase = Phase::Seek,
                },
                Phase::Arguments => {
                    let (end, found) = content_end(text, self.pos, &[ARGS_END]);
                    if end > self.pos {
                        events.push(Event::Args(text[self.pos..end].to_owned()));
                    }
                    self.pos = end;
                    let Some(at) = found else { return };
                    self.pos = at + ARGS_END.len();
                    self.phase = Phase::Seek;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_deepseekv3_tool_parser.py (the common suite
    //! in common_tests.py).

    use super::super::test_support::*;
    use super::super::*;
    use serde_json::json;

    const SINGLE: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

    fn check(output: &str) -> ExtractedToolCalls {
        assert_streams_match("deepseek_v3", output, &[], true)
    }

    #[test]
    fn no_tool_calls() {
        let text = "How can I help you today? I can check weather for you.";
        assert_eq!(check(text).content.as_deref(), Some(text));
    }

    #[test]
    fn single_call() {
        let whole = check(SINGLE);
        assert_eq!(whole.content, None);
        assert_eq!(whole.tool_calls.len(), 1);
        assert_eq!(whole.tool_calls[0].name, "get_weather");
        assert_eq!(whole.tool_calls[0].arguments, r#"{"city": "Tokyo", "unit": "celsius"}"#);
    }

    #[test]
    fn parallel_calls() {
        let whole = check(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search_hotels\n```json\n{\"location\": \"Tokyo\", \"check_in\": \"2025-01-15\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
        let names: Vec<_> = whole.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "search_hotels"]);
        assert_ne!(whole.tool_calls[0].id, whole.tool_calls[1].id);
    }

    #[test]
    fn data_types_empty_and_escapes() {
        let whole = check(concat!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>test_function\n```json\n",
            "{\"string_field\": \"hello\", \"int_field\": 42, \"float_field\": 3.14, \"bool_field\": true, \"null_field\": null, ",
            "\"array_field\": [\"a\", \"b\", \"c\"], \"object_field\": {\"nested\": \"value\"}, \"empty_array\": [], \"empty_object\": {}}",
            "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ));
        let parsed = args(&whole.tool_calls[0]);
        assert_eq!(parsed["int_field"], 42);
        assert_eq!(parsed["object_field"], json!({"nested": "value"}));
        let whole = check("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_current_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(whole.tool_calls[0].arguments, "{}");
        let whole = check(concat!(
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>send_message\n```json\n",
            r#"{"text": "He said \"hello\"", "path": "C:\\Users\\file", "newline": "line1\nline2"}"#,
            "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ));
        assert_eq!(args(&whole.tool_calls[0])["path"], "C:\\Users\\file");
    }

    #[test]
    fn surrounding_text() {
        let whole = check("Let me check the weather for you.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(whole.content.as_deref(), Some("Let me check the weather for you."));
        assert_eq!(args(&whole.tool_calls[0]), json!({"city": "Paris"}));
    }

    #[test]
    fn arguments_over_several_lines() {
        let whole = check("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\n  \"a\": 1\n}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(args(&whole.tool_calls[0]), json!({"a": 1}));
    }

    #[test]
    fn malformed_is_content() {
        for text in [
            "<｜tool▁calls▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁calls▁end｜>",
            "Hi <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function get_weather\n```json\n{}\n```<｜tool▁call▁end｜>",
        ] {
            let whole = assert_streams_match("deepseek_v3", text, &[], false);
            assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) });
        }
        // Arguments that are not JSON pass through as written, as vLLM passes them.
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(check(text).tool_calls[0].arguments, "{\"city\": \"Tokyo\"");
    }
}
