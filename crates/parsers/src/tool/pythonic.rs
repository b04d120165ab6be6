//! `pythonic`: a Python list of calls, `[get_weather(city='SF', days=3), other()]`, the whole
//! output (Llama 3.2, Llama 4, ToolACE). Keyword arguments only, whose values are literals:
//! strings, numbers, `True`/`False`/`None` (or `true`/`false`/`null`), lists and dicts. The
//! arguments are `json.dumps` of the keyword dict. An output that is not such a list is
//! content. As vLLM's `PythonicToolParser`, which also drops a call whose values JSON cannot
//! carry (bytes, non-finite floats, ...) and keeps its siblings.

use super::python::{Literal, Stop};
use super::*;

/// One call read from the text: as much of it as is certain.
struct CallRead {
    /// Known once `name(` has been read.
    name: Option<String>,
    /// The arguments as JSON, as far as they are certain.
    args: String,
    /// Where the call ends, once it has; or why reading stopped.
    end: Result<usize, Stop>,
    unsupported: bool,
}

/// Reads the call at `pos`: `name(kw=value, ...)`, the name possibly dotted.
fn read_call(text: &str, pos: usize, complete: bool) -> CallRead {
    let mut literal = Literal::at(text, pos, complete);
    let mut name = None;
    let end = call_syntax(&mut literal, &mut name).map(|()| literal.pos);
    // A whole text that stops early is not a call.
    let end = if complete { end.map_err(|_| Stop::Invalid) } else { end };
    CallRead { name, args: literal.out, end, unsupported: literal.unsupported }
}

fn call_syntax(literal: &mut Literal, name: &mut Option<String>) -> Result<(), Stop> {
    let mut dotted = String::new();
    loop {
        let part = literal.identifier()?.ok_or(Stop::Invalid)?;
        dotted.push_str(part);
        if !literal.eat('.') {
            break;
        }
        dotted.push('.');
    }
    match literal.peek() {
        Some('(') => literal.eat('('),
        Some(_) => return Err(Stop::Invalid),
        None => return Err(Stop::End),
    };
    *name = Some(dotted);
    literal.out.push('{');
    let mut keywords: Vec<String> = Vec::new();
    loop {
        literal.skip_space();
        if literal.eat(')') {
            literal.out.push('}');
            return Ok(());
        }
        if literal.peek().is_none() {
            return Err(Stop::End);
        }
        // Positional arguments do not match vLLM's pattern: the output is not calls.
        let keyword = literal.identifier()?.ok_or(Stop::Invalid)?;
        literal.skip_space();
        match literal.peek() {
            Some('=') => literal.eat('='),
            Some(_) => return Err(Stop::Invalid),
            None => return Err(Stop::End),
        };
        // Python: "keyword argument repeated".
        if keywords.iter().any(|k| k == keyword) {
            return Err(Stop::Invalid);
        }
        if !keywords.is_empty() {
            literal.out.push_str(", ");
        }
        json::push_string(&mut literal.out, keyword);
        literal.out.push_str(": ");
        keywords.push(keyword.to_owned());
        literal.value()?;
        literal.skip_space();
        if !literal.eat(',') {
            literal.skip_space();
            match literal.peek() {
                Some(')') => {}
                Some(_) => return Err(Stop::Invalid),
                None => return Err(Stop::End),
            }
        }
    }
}

/// Where the text after `pos` goes on, past what Python skips inside brackets.
fn skip_space(text: &str, pos: usize) -> usize {
    let mut literal = Literal::at(text, pos, true);
    literal.skip_space();
    literal.pos
}

#[derive(Default)]
pub(super) struct Pythonic {
    pos: usize,
    phase: Phase,
    /// Whether the call being read has been started in the stream, and how much of its
    /// arguments was sent.
    started: bool,
    sent: usize,
    /// Whether any call has been sent.
    called: bool,
}

#[derive(Default)]
enum Phase {
    /// Nothing read: the first character decides.
    #[default]
    Start,
    Content,
    /// A call from `pos`.
    Call,
    /// After a call: `,` or `]`.
    After,
    /// After `,`: another call or `]`.
    Next,
    /// The list ended, or stopped being one after calls were sent.
    Done,
}

impl Format for Pythonic {
    fn extract(&self, output: &str, _tools: &[FunctionSpec]) -> ExtractedToolCalls {
        if !output.starts_with('[') {
            return all_content(output);
        }
        let mut calls = Vec::new();
        let mut pos = 1;
        loop {
            let call = read_call(output, pos, true);
            let Ok(end) = call.end else { return all_content(output) };
            if let (Some(name), false) = (call.name, call.unsupported) {
                calls.push(ToolCall { id: random_tool_call_id(), name, arguments: call.args });
            }
            pos = skip_space(output, end);
            match output[pos..].chars().next() {
                Some(',') => {
                    pos = skip_space(output, pos + 1);
                    if output[pos..].starts_with(']') {
                        pos += 1;
                        break;
                    }
                }
                Some(']') => {
                    pos += 1;
                    break;
                }
                _ => return all_content(output),
            }
        }
        // The list must be the whole output, and hold a call JSON can carry.
        if !output[pos..].trim().is_empty() || calls.is_empty() {
            return all_content(output);
        }
        ExtractedToolCalls { tool_calls: calls, content: None }
    }

    fn advance(&mut self, text: &str, _tools: &[FunctionSpec], events: &mut Vec<Event>) {
        loop {
            match self.phase {
                Phase::Start => {
                    if text.is_empty() {
                        return;
                    }
                    if text.starts_with('[') {
                        self.pos = 1;
                        self.phase = Phase::Call;
                    } else {
                        self.phase = Phase::Content;
                    }
                }
                Phase::Content => {
                    content_event(events, text.get(self.pos..).unwrap_or(""));
                    self.pos = text.len();
                    return;
                }
                Phase::Call => {
                    let call = read_call(text, self.pos, false);
                    if call.unsupported {
                        // JSON cannot carry this call: what was sent of it cannot be completed.
                        self.not_calls();
                        continue;
                    }
                    // A call starts once a keyword or its end is read: `f(1)` is not one.
                    let shaped = call.args.len() > 1 || call.end.is_ok();
                    if let (Some(name), true) = (&call.name, shaped) {
                        if !self.started {
                            events.push(Event::Call { name: name.clone(), id: None });
                            self.started = true;
                            self.called = true;
                        }
                        if let Some(new) = call.args.get(self.sent..).filter(|new| !new.is_empty()) {
                            events.push(Event::Args(new.to_owned()));
                            self.sent = call.args.len();
                        }
                    }
                    match call.end {
                        Ok(end) => {
                            self.pos = end;
                            self.started = false;
                            self.sent = 0;
                            self.phase = Phase::After;
                        }
                        Err(Stop::End) => return,
                        Err(Stop::Invalid) => self.not_calls(),
                    }
                }
                Phase::After | Phase::Next => {
                    self.pos = skip_space(text, self.pos);
                    let after = matches!(self.phase, Phase::After);
                    match text[self.pos..].chars().next() {
                        None => return,
                        Some(',') if after => {
                            self.pos += 1;
                            self.phase = Phase::Next;
                        }
                        Some(']') => {
                            self.pos += 1;
                            self.phase = Phase::Done;
                        }
                        Some(_) if !after => self.phase = Phase::Call,
                        Some(_) => self.not_calls(),
                    }
                }
                Phase::Done => return,
            }
        }
    }
}

impl Pythonic {
    /// The list turned out not to be calls: before any call was sent the whole output is
    /// content, sent from the start; after one, the stream ends.
    fn not_calls(&mut self) {
        if self.called {
            self.phase = Phase::Done;
        } else {
            self.pos = 0;
            self.phase = Phase::Content;
        }
    }
}

#[cfg(test)]
mod tests {
    //! Cases from vLLM's tests/tool_parsers/test_pythonic_tool_parser.py.

    use super::super::test_support::*;
    use super::super::*;

    const SIMPLE: &str = "get_weather(city='San Francisco', metric='celsius')";
    const SIMPLE_ARGS: &str = r#"{"city": "San Francisco", "metric": "celsius"}"#;
    const MORE_TYPES: &str = "register_user(name='John Doe', age=37, address={'city': 'San Francisco', 'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'])";
    const MORE_TYPES_ARGS: &str = r#"{"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, "role": null, "passed_test": true, "aliases": ["John", "Johnny"]}"#;

    fn check(output: &str) -> ExtractedToolCalls {
        assert_streams_match("pythonic", output, &[], true)
    }

    fn calls(extracted: &ExtractedToolCalls) -> Vec<(&str, &str)> {
        extracted.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect()
    }

    #[test]
    fn no_tool_call() {
        let text = "How can I help you today?";
        assert_eq!(check(text), ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) });
    }

    #[test]
    fn tool_calls() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            (SIMPLE, &[("get_weather", SIMPLE_ARGS)]),
            (MORE_TYPES, &[("register_user", MORE_TYPES_ARGS)]),
            ("get_weather()", &[("get_weather", "{}")]),
            ("do_something_cool(additional_data={})", &[("do_something_cool", r#"{"additional_data": {}}"#)]),
            ("do_something_cool(steps=[])", &[("do_something_cool", r#"{"steps": []}"#)]),
            (
                r#"get_weather(city='Martha\'s Vineyard', metric='\"cool units\"')"#,
                &[("get_weather", r#"{"city": "Martha's Vineyard", "metric": "\"cool units\""}"#)],
            ),
            (&format!("{SIMPLE}, {MORE_TYPES}"), &[("get_weather", SIMPLE_ARGS), ("register_user", MORE_TYPES_ARGS)]),
        ];
        for (body, expected) in cases {
            let whole = check(&format!("[{body}]"));
            assert_eq!(calls(&whole), *expected, "{body}");
            assert_eq!(whole.content, None);
        }
    }

    #[test]
    fn large_steps() {
        let chunks = [
            "[get_weather(city='San".to_owned(),
            " Francisco', metric='celsius'), get_weather(), do_something_cool(steps=[])]".to_owned(),
        ];
        let streamed = stream("pythonic", &chunks, &[]);
        assert_eq!(streamed.content, "");
        let got: Vec<(&str, &str)> = streamed.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(
            got,
            [("get_weather", SIMPLE_ARGS), ("get_weather", "{}"), ("do_something_cool", r#"{"steps": []}"#)]
        );
        assert!(!streamed.finish_sent);
    }

    #[test]
    fn strings_stream_as_they_come() {
        let mut parser = parser("pythonic").unwrap();
        let first = parser.extract_streaming("", "[get_weather(city='San", &[]).unwrap();
        assert_eq!(first.tool_calls[0].arguments.as_deref(), Some(r#"{"city": "San"#));
        let second = parser.extract_streaming("[get_weather(city='San", " Fran", &[]).unwrap();
        assert_eq!(second.tool_calls[0].arguments.as_deref(), Some(" Fran"));
    }

    #[test]
    fn calls_json_cannot_carry_are_dropped() {
        let whole = parser("pythonic").unwrap().extract(&format!("[bad(x=b'z'), {SIMPLE}]"), &[]);
        assert_eq!(calls(&whole), [("get_weather", SIMPLE_ARGS)]);
        let whole = parser("pythonic").unwrap().extract(&format!("[calc(x=1e999), {SIMPLE}]"), &[]);
        assert_eq!(calls(&whole), [("get_weather", SIMPLE_ARGS)]);
    }

    #[test]
    fn other_python_is_content() {
        for text in [
            "[f(a='x 'y' 'z), g(b='p 'q' 'r)]",
            "[1, 2, 3]",
            "[foo(x=1])]",
            "[f(1)]",
            "[]",
            "[f(a=1, a=2)]",
            "[f(a=1)] and more",
            " [f()]",
            "[f(a=1)",
        ] {
            let whole = parser("pythonic").unwrap().extract(text, &[]);
            assert_eq!(whole, ExtractedToolCalls { tool_calls: vec![], content: Some(text.to_owned()) }, "{text}");
        }
        // Before any call the stream gives the text back as content.
        for text in ["[1, 2, 3]", "[f(1)]", "[]", "[see below]"] {
            let whole = assert_streams_match("pythonic", text, &[], false);
            assert_eq!(whole.content.as_deref(), Some(text));
        }
    }

    #[test]
    fn python_literal_details() {
        let whole =
            check("[f(a=-1, b=+2.5, c=0x10, d=1_000, e=\"x\" 'y', g=[1, 2], h={1: True}, i=null, j=\"\"\"q\"\"\")]");
        assert_eq!(
            whole.tool_calls[0].arguments,
            r#"{"a": -1, "b": 2.5, "c": 16, "d": 1000, "e": "xy", "g": [1, 2], "h": {"1": true}, "i": null, "j": "q"}"#
        );
        let whole = check("[module.tool(query='a\\nb'), other.thing()]");
        assert_eq!(calls(&whole), [("module.tool", r#"{"query": "a\nb"}"#), ("other.thing", "{}")]);
        let whole = check("[f(a='x', b=2),\n g()]");
        assert_eq!(calls(&whole), [("f", r#"{"a": "x", "b": 2}"#), ("g", "{}")]);
    }
}
