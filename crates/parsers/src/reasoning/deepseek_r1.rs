//! `deepseek_r1`: DeepSeek-R1 and its distills. The chat template usually opens `<think>` in the
//! prompt, so the output often starts inside the reasoning: everything up to `</think>` is
//! reasoning, with or without a `<think>` of its own.

use super::{split_think, think_ended, Reasoned, ReasoningDelta, ReasoningParser, ThinkRules, ThinkStream};
use super::{THINK_END, THINK_START};

static RULES: ThinkRules =
    ThinkRules { markers: &[THINK_START, THINK_END], implicit_end: None, start_in_content_is_text: false };

#[derive(Debug)]
pub(super) struct DeepSeekR1 {
    stream: ThinkStream,
}

impl DeepSeekR1 {
    pub(super) fn new() -> Self {
        Self { stream: ThinkStream::new(&RULES) }
    }
}

impl ReasoningParser for DeepSeekR1 {
    /// vLLM's whole-output split: no `</think>` means the output was cut off while reasoning.
    fn extract(&self, output: &str) -> Reasoned {
        split_think(output)
    }

    /// As vLLM streams it, which differs from [`extract`](Self::extract) at the edges: text
    /// before a `<think>` is reasoning (a stream cannot wait to see whether `<think>` follows),
    /// think markers after `</think>` are dropped, and an empty reasoning is absent.
    fn extract_streaming(&mut self, _previous: &str, delta: &str) -> Option<ReasoningDelta> {
        self.stream.feed(delta).into_delta()
    }

    fn finish(&mut self) -> Option<ReasoningDelta> {
        self.stream.finish().into_delta()
    }

    fn is_reasoning_end(&self, output: &str) -> bool {
        think_ended(output)
    }

    fn end_marker(&self) -> Option<&'static str> {
        Some(THINK_END)
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

    /// The deltas a tokenizer would give: each marker alone, words with their leading space.
    fn token_like(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let len = if let Some(m) = ["<think>", "</think>"].iter().find(|m| rest.starts_with(**m)) {
                m.len()
            } else {
                let body = rest.char_indices().skip(1).find(|&(_, c)| c == ' ' || c == '\n' || c == '<');
                body.map_or(rest.len(), |(i, _)| i)
            };
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        out
    }

    // Vectors from vLLM tests/reasoning/test_deepseekr1_reasoning_parser.py:
    // (output, non-streaming (reasoning, content), streaming (reasoning, content), is_reasoning_end).
    #[allow(clippy::type_complexity)]
    const CASES: &[(&str, (Option<&str>, Option<&str>), (Option<&str>, Option<&str>), bool)] = &[
        (
            "This is a reasoning section</think>This is the rest",
            (Some("This is a reasoning section"), Some("This is the rest")),
            (Some("This is a reasoning section"), Some("This is the rest")),
            true,
        ),
        (
            "This is a reasoning section</think>",
            (Some("This is a reasoning section"), None),
            (Some("This is a reasoning section"), None),
            true,
        ),
        ("This is content", (Some("This is content"), None), (Some("This is content"), None), false),
        (
            "This\nThat</think>This is the rest\nThat",
            (Some("This\nThat"), Some("This is the rest\nThat")),
            (Some("This\nThat"), Some("This is the rest\nThat")),
            true,
        ),
        ("</think>This is the rest", (Some(""), Some("This is the rest")), (None, Some("This is the rest")), true),
        (
            "<think>This is a reasoning section</think>This is the rest",
            (Some("This is a reasoning section"), Some("This is the rest")),
            (Some("This is a reasoning section"), Some("This is the rest")),
            true,
        ),
        (
            "<think>This is a reasoning section</think>",
            (Some("This is a reasoning section"), None),
            (Some("This is a reasoning section"), None),
            true,
        ),
        (
            "<think>This\nThat</think>This is the rest\nThat",
            (Some("This\nThat"), Some("This is the rest\nThat")),
            (Some("This\nThat"), Some("This is the rest\nThat")),
            true,
        ),
        (
            "<think>This is a reasoning section",
            (Some("This is a reasoning section"), None),
            (Some("This is a reasoning section"), None),
            false,
        ),
        ("", (Some(""), None), (None, None), false),
        (
            "\n<think>This is a reasoning section</think>\nThis is the rest",
            (Some("This is a reasoning section"), Some("\nThis is the rest")),
            // vLLM: a stream cannot know text before <think> is not reasoning.
            (Some("\nThis is a reasoning section"), Some("\nThis is the rest")),
            true,
        ),
    ];

    #[test]
    fn vllm_vectors_whole_output() {
        for (output, (reasoning, content), _, _) in CASES {
            assert_eq!(named("deepseek_r1").extract(output), r(*reasoning, *content), "{output:?}");
        }
    }

    #[test]
    fn vllm_vectors_streamed_token_by_token() {
        for (output, _, (reasoning, content), _) in CASES {
            let mut p = named("deepseek_r1");
            assert_eq!(stream(p.as_mut(), &token_like(output)), r(*reasoning, *content), "{output:?}");
        }
    }

    #[test]
    fn vllm_vectors_is_reasoning_end() {
        for (output, _, _, end) in CASES {
            assert_eq!(named("deepseek_r1").is_reasoning_end(output), *end, "{output:?}");
        }
    }

    // vLLM tests/reasoning/test_base_thinking_reasoning_parser.py (the base class R1 uses).
    #[test]
    fn vllm_base_thinking_vectors() {
        let p = named("deepseek_r1");
        assert_eq!(p.extract("<think></think>"), r(Some(""), None));
        assert_eq!(p.extract("First</think>Middle</think>Last"), r(Some("First"), Some("Middle</think>Last")));
        assert_eq!(p.extract("<think>Outer<think>Inner</think>Content"), r(Some("Outer<think>Inner"), Some("Content")));
        assert_eq!(
            p.extract("<thinking>Not a real token</thinking>Content"),
            r(Some("<thinking>Not a real token</thinking>Content"), None)
        );
        let streams: &[(&[&str], Reasoned)] = &[
            (
                &["<think>", "Some ", "reasoning ", "content", "</think>", "Final ", "answer"],
                r(Some("Some reasoning content"), Some("Final answer")),
            ),
            (&["<think>", "Some ", "reasoning ", "without ", "end"], r(Some("Some reasoning without end"), None)),
            // Regression vLLM#55195: a start marker grouped with text is still dropped.
            (&["<think>Some reasoning", "</think>", "Answer"], r(Some("Some reasoning"), Some("Answer"))),
            (&["<think>Some reasoning"], r(Some("Some reasoning"), None)),
            (&["Reasoning1</think>Content1"], r(Some("Reasoning1"), Some("Content1"))),
        ];
        for (deltas, expected) in streams {
            let mut p = named("deepseek_r1");
            assert_eq!(&stream(p.as_mut(), deltas), expected, "{deltas:?}");
        }
        for (output, end) in [
            ("a b</think>c", true),
            ("a b c", false),
            ("", false),
            ("a<think>b</think>", true),
            ("a<think>b c", false),
            ("a<think>b</think>c d<think>", false),
        ] {
            assert_eq!(p.is_reasoning_end(output), end, "{output:?}");
        }
    }

    #[test]
    fn markers_split_across_small_deltas_stream_like_the_whole_output() {
        for text in [
            "This is a reasoning section</think>This is the rest",
            "<think>This\nThat</think>This is the rest\nThat",
            "<think>Unfinished reasoning",
            "Reasoning with < and </thin and <th in it</think>Answer with < too",
            "日本語の推論</think>答え",
            "</think>",
        ] {
            assert_stream_matches_extract("deepseek_r1", &Map::new(), text);
        }
    }

    #[test]
    fn stream_drops_think_markers_after_the_reasoning() {
        let mut p = named("deepseek_r1");
        assert_eq!(stream(p.as_mut(), &["a", "</think>", "b", "<think>", "c", "</think>"]), r(Some("a"), Some("bc")));
    }

    #[test]
    fn a_held_tail_comes_out_at_finish() {
        let mut p = named("deepseek_r1");
        assert_eq!(
            p.extract_streaming("", "x</think>y <"),
            Some(super::ReasoningDelta { reasoning: Some("x".into()), content: Some("y ".into()) })
        );
        assert_eq!(p.finish(), Some(super::ReasoningDelta { reasoning: None, content: Some("<".into()) }));
    }
}
