//! `qwen3` (and `mimo`): Qwen3 and Qwen3.5, read as vLLM's parser-engine Qwen3 parser does.
//!
//! Thinking is on unless the request's `chat_template_kwargs` turn `enable_thinking` off. On, the
//! output starts inside the reasoning whether or not it opens with `<think>` (Qwen3.5 templates
//! put `<think>` in the prompt): reasoning runs to `</think>`, or to a `<tool_call>` (Qwen3.5 may
//! call a tool without closing its thoughts), and all of it is reasoning if neither comes (the
//! output was cut off). Off, the template closed an empty think block in the prompt and the whole
//! output is content, as vLLM's serving layer routes it.

use serde_json::{Map, Value};

use super::identity::Identity;
use super::{truthy, Reasoned, ReasoningDelta, ReasoningParser, ThinkRules, ThinkStream, THINK_END, THINK_START};

const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";
/// ChatML turn markers: a think marker before one belongs to an earlier turn.
const TURN_BOUNDARIES: [&str; 2] = ["<|im_start|>", "<|im_end|>"];

static RULES: ThinkRules = ThinkRules {
    markers: &[THINK_START, THINK_END, TOOL_CALL],
    implicit_end: Some(TOOL_CALL),
    start_in_content_is_text: true,
};

/// The parser for a request; a missing `enable_thinking` means on, a null means off (Python's
/// `get` with a default, then its truthiness).
pub(super) fn new(kwargs: &Map<String, Value>) -> Box<dyn ReasoningParser> {
    if kwargs.get("enable_thinking").is_none_or(truthy) {
        Box::new(Qwen3 { stream: ThinkStream::new(&RULES) })
    } else {
        Box::new(Identity)
    }
}

#[derive(Debug)]
struct Qwen3 {
    stream: ThinkStream,
}

impl ReasoningParser for Qwen3 {
    /// The same state machine as the stream, run over the whole output (as vLLM's engine does),
    /// so the two always agree. Content after the reasoning is kept verbatim but for `</think>`.
    fn extract(&self, output: &str) -> Reasoned {
        let mut stream = ThinkStream::new(&RULES);
        let mut split = stream.feed(output);
        split.append(stream.finish());
        split.into_reasoned()
    }

    fn extract_streaming(&mut self, _previous: &str, delta: &str) -> Option<ReasoningDelta> {
        self.stream.feed(delta).into_delta()
    }

    fn finish(&mut self) -> Option<ReasoningDelta> {
        self.stream.finish().into_delta()
    }

    /// vLLM's rule: the last think marker of this turn is `</think>`, or this turn has a
    /// `<tool_call>` that no `</tool_call>` follows yet.
    fn is_reasoning_end(&self, output: &str) -> bool {
        let last = |marker: &str| output.rfind(marker);
        let boundary = TURN_BOUNDARIES.iter().filter_map(|b| last(b)).max();
        let opened = last(THINK_START).max(boundary);
        let closed_by_think = last(THINK_END).is_some_and(|end| opened.is_none_or(|o| end > o));
        let open_tool_call = last(TOOL_CALL)
            .is_some_and(|call| opened.is_none_or(|o| call > o) && !output[call..].contains(TOOL_CALL_END));
        closed_by_think || open_tool_call
    }

    fn end_marker(&self) -> Option<&'static str> {
        Some(THINK_END)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Reasoned;
    use serde_json::{json, Map};

    fn r(reasoning: Option<&str>, content: Option<&str>) -> Reasoned {
        Reasoned { reasoning: reasoning.map(str::to_string), content: content.map(str::to_string) }
    }

    const TOOL_CALL_BODY: &str =
        "<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>";

    // vLLM tests/reasoning/test_qwen3_reasoning_parser.py, TEST_CASES (the same expectations
    // streaming and not): (output, reasoning, content).
    fn vllm_cases() -> Vec<(String, Option<&'static str>, Option<String>)> {
        let text = |s: &str| Some(s.to_string());
        vec![
            (
                "This is a reasoning section</think>This is the rest".into(),
                Some("This is a reasoning section"),
                text("This is the rest"),
            ),
            ("This is a reasoning section</think>".into(), Some("This is a reasoning section"), None),
            (
                "<think>This is a reasoning section</think>This is the rest".into(),
                Some("This is a reasoning section"),
                text("This is the rest"),
            ),
            ("This is the rest".into(), Some("This is the rest"), None),
            ("<think>This is a reasoning section</think>".into(), Some("This is a reasoning section"), None),
            (
                "<think>This is a reasoning\nsection</think>This is the rest\nThat".into(),
                Some("This is a reasoning\nsection"),
                text("This is the rest\nThat"),
            ),
            ("<think>This is a reasoning section".into(), Some("This is a reasoning section"), None),
            ("This is a reasoning section".into(), Some("This is a reasoning section"), None),
            (
                format!("I need to read the file.\n\n{TOOL_CALL_BODY}"),
                Some("I need to read the file.\n\n"),
                Some(TOOL_CALL_BODY.to_string()),
            ),
            (
                format!("<think>I need to read the file.\n\n{TOOL_CALL_BODY}"),
                Some("I need to read the file.\n\n"),
                Some(TOOL_CALL_BODY.to_string()),
            ),
        ]
    }

    #[test]
    fn vllm_vectors_whole_and_streamed() {
        for (output, reasoning, content) in vllm_cases() {
            let expected = Reasoned { reasoning: reasoning.map(str::to_string), content };
            assert_eq!(named("qwen3").extract(&output), expected, "{output:?}");
            assert_stream_matches_extract("qwen3", &Map::new(), &output);
            let mut p = named("mimo");
            assert_eq!(stream(p.as_mut(), &[output.as_str()]), expected, "mimo, one delta: {output:?}");
        }
    }

    // vLLM MULTI_TOKEN_DELTA_CASES: several tokens in one delta.
    #[test]
    fn vllm_multi_token_deltas() {
        let cases: &[(&[&str], Reasoned)] = &[
            (
                &["<think>This is a reasoning section", "</think>", "This is the rest"],
                r(Some("This is a reasoning section"), Some("This is the rest")),
            ),
            (
                &["reasoning section", "</think>This is the rest"],
                r(Some("reasoning section"), Some("This is the rest")),
            ),
            (&["<think>reasoning</think>"], r(Some("reasoning"), None)),
            (&["reasoning section", "</think>content"], r(Some("reasoning section"), Some("content"))),
            (
                &["I need to read the file.\n\n", "<tool_call>\n<function=bash>"],
                r(Some("I need to read the file.\n\n"), Some("<tool_call>\n<function=bash>")),
            ),
        ];
        for (deltas, expected) in cases {
            let mut p = named("qwen3");
            assert_eq!(&stream(p.as_mut(), deltas), expected, "{deltas:?}");
        }
    }

    // vLLM THINKING_DISABLED_CASES: enable_thinking=false makes the whole output content.
    #[test]
    fn vllm_thinking_disabled() {
        let off = kwargs(json!({"enable_thinking": false}));
        for output in [
            "This is plain content",
            "Some output without think tokens",
            &format!("I need to read the file.\n\n{TOOL_CALL_BODY}"),
        ] {
            assert_eq!(named_with("qwen3", off.clone()).extract(output), r(None, Some(output)));
            assert_stream_matches_extract("qwen3", &off, output);
        }
        assert!(named_with("qwen3", off.clone()).is_reasoning_end(""));
        assert_eq!(
            named_with("qwen3", kwargs(json!({"enable_thinking": null}))).extract("a</think>b"),
            r(None, Some("a</think>b"))
        );
        assert_eq!(
            named_with("qwen3", kwargs(json!({"enable_thinking": true}))).extract("a</think>b"),
            r(Some("a"), Some("b"))
        );
    }

    #[test]
    fn content_keeps_markers_but_a_second_end_tag() {
        let p = named("qwen3");
        assert_eq!(p.extract("a</think>b</think>c<think>d<tool_call>e"), r(Some("a"), Some("bc<think>d<tool_call>e")));
        assert_eq!(p.extract("<think>a<think>b</think>c"), r(Some("ab"), Some("c")));
        assert_eq!(p.extract(""), r(None, None));
        assert_eq!(p.extract("</think>"), r(None, None));
    }

    #[test]
    fn stream_always_adds_up_to_the_whole_output_split() {
        let alphabet = ["<think>", "</think>", "<tool_call>", "</tool_call>", "</th", "<", "a b", "\n", "é"];
        for text in random_texts(&alphabet, 200) {
            assert_stream_matches_extract("qwen3", &Map::new(), &text);
        }
    }

    #[test]
    fn is_reasoning_end_follows_vllm() {
        let p = named("qwen3");
        for (output, end) in [
            ("", false),
            ("thinking", false),
            ("thinking</think>answer", true),
            ("<think>thinking</think>", true),
            ("a</think>b<think>c", false),
            ("thinking\n<tool_call>\n<function=f>", true),
            ("thinking\n<tool_call>\n<function=f></function>\n</tool_call>", false),
            ("<tool_call>x</tool_call><think>y", false),
            ("a</think><|im_end|>", false),
            ("a</think>b<|im_start|>assistant\n<tool_call>", true),
        ] {
            assert_eq!(p.is_reasoning_end(output), end, "{output:?}");
        }
    }
}
