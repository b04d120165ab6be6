//! `granite`: IBM Granite 3.x, which reasons in plain words: "Here is my thought process:" then
//! the reasoning, "Here is my response:" then the answer. vLLM also accepts "Here's" in both
//! phrases (seen from quantized models).

use super::{non_empty, MarkerLexer, Piece, Reasoned, ReasoningDelta, ReasoningParser, Split};

const THINK_STARTS: [&str; 2] = ["Here's my thought process:", "Here is my thought process:"];
const RESPONSE_STARTS: &[&str] = &["Here's my response:", "Here is my response:"];

/// Where the earliest of `phrases` starts in `text`, and its length.
fn leftmost(text: &str, phrases: &[&str]) -> Option<(usize, usize)> {
    phrases.iter().filter_map(|p| text.find(p).map(|at| (at, p.len()))).min()
}

#[derive(Debug)]
enum Phase {
    /// The output so far could still be the start of a thought-process phrase.
    Start(String),
    Reasoning,
    Content,
}

#[derive(Debug)]
pub(super) struct Granite {
    phase: Phase,
    lexer: MarkerLexer,
}

impl Granite {
    pub(super) fn new() -> Self {
        Self { phase: Phase::Start(String::new()), lexer: MarkerLexer::new(RESPONSE_STARTS) }
    }

    /// Routes reasoning text through the response-phrase lexer; from the phrase on, content.
    fn reason(&mut self, pieces: Vec<Piece>, split: &mut Split) {
        for piece in pieces {
            let in_reasoning = matches!(self.phase, Phase::Reasoning);
            match piece {
                Piece::Marker(_) if in_reasoning => self.phase = Phase::Content,
                Piece::Marker(text) => split.push(false, text),
                Piece::Text(text) => split.push(in_reasoning, &text),
            }
        }
        if matches!(self.phase, Phase::Content) {
            for piece in self.lexer.finish() {
                if let Piece::Text(text) = piece {
                    split.push(false, &text);
                }
            }
        }
    }
}

impl ReasoningParser for Granite {
    /// vLLM's regex: the first thought-process phrase anywhere, reasoning up to the first response
    /// phrase after it, content after that. Without both phrases the whole output is content.
    fn extract(&self, output: &str) -> Reasoned {
        let whole = || Reasoned { reasoning: None, content: Some(output.to_string()) };
        let Some((start, len)) = leftmost(output, &THINK_STARTS) else { return whole() };
        let rest = &output[start + len..];
        let Some((end, len)) = leftmost(rest, RESPONSE_STARTS) else { return whole() };
        Reasoned { reasoning: Some(rest[..end].to_string()), content: non_empty(&rest[end + len..]) }
    }

    /// As vLLM streams: reasoning only where the output opens with the thought-process phrase;
    /// reasoning from there (even if no response phrase ever comes, unlike `extract`), content
    /// after the response phrase. A tail that may begin a phrase is held back.
    fn extract_streaming(&mut self, _previous: &str, delta: &str) -> Option<ReasoningDelta> {
        let mut split = Split::default();
        match &mut self.phase {
            Phase::Start(seen) => {
                seen.push_str(delta);
                if let Some(phrase) = THINK_STARTS.iter().find(|p| seen.starts_with(**p)) {
                    let rest = seen[phrase.len()..].to_string();
                    self.phase = Phase::Reasoning;
                    let pieces = self.lexer.feed(&rest);
                    self.reason(pieces, &mut split);
                } else if !THINK_STARTS.iter().any(|p| p.starts_with(seen.as_str())) {
                    split.push(false, seen);
                    self.phase = Phase::Content;
                }
            }
            Phase::Reasoning => {
                let pieces = self.lexer.feed(delta);
                self.reason(pieces, &mut split);
            }
            Phase::Content => split.push(false, delta),
        }
        split.into_delta()
    }

    fn finish(&mut self) -> Option<ReasoningDelta> {
        let mut split = Split::default();
        match &mut self.phase {
            Phase::Start(seen) => split.push(false, &std::mem::take(seen)),
            Phase::Reasoning => {
                let pieces = self.lexer.finish();
                self.reason(pieces, &mut split);
            }
            Phase::Content => {}
        }
        split.into_delta()
    }

    /// The stream's view: reasoning ends at the response phrase, and there is none to end when
    /// the output does not open with the thought-process phrase. (vLLM's Granite parser has no
    /// such check, so its structured outputs never start.)
    fn is_reasoning_end(&self, output: &str) -> bool {
        match THINK_STARTS.iter().find(|p| output.starts_with(**p)) {
            Some(phrase) => leftmost(&output[phrase.len()..], RESPONSE_STARTS).is_some(),
            None => !THINK_STARTS.iter().any(|p| p.starts_with(output)),
        }
    }

    fn end_marker(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Reasoned, ReasoningDelta};
    use serde_json::Map;

    fn r(reasoning: Option<&str>, content: Option<&str>) -> Reasoned {
        Reasoned { reasoning: reasoning.map(str::to_string), content: content.map(str::to_string) }
    }

    const START_REASONING: &str = "Here is my thought process:";
    const START_RESPONSE: &str = "Here is my response:";

    /// The deltas vLLM's test tokenizer (OPT) would give: words with their leading space, and a
    /// ":" on its own.
    fn token_like(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let len = match rest.char_indices().skip(1).find(|&(_, c)| c == ' ' || c == ':' || c == '\n') {
                _ if rest.starts_with(':') => 1,
                Some((i, _)) => i,
                None => rest.len(),
            };
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        out
    }

    // vLLM tests/reasoning/test_granite_reasoning_parser.py, TEST_CASES (the same expectations
    // streaming and not).
    #[test]
    fn vllm_vectors_whole_and_streamed() {
        let cases = [
            (
                format!("{START_REASONING}This is a reasoning section{START_RESPONSE}This is the rest"),
                r(Some("This is a reasoning section"), Some("This is the rest")),
            ),
            (
                format!("{START_REASONING}This is a reasoning section{START_RESPONSE}"),
                r(Some("This is a reasoning section"), None),
            ),
            ("This is content".to_string(), r(None, Some("This is content"))),
            (
                format!("{START_REASONING}This\nThat{START_RESPONSE}This is the rest\nThat"),
                r(Some("This\nThat"), Some("This is the rest\nThat")),
            ),
        ];
        for (output, expected) in &cases {
            assert_eq!(&named("granite").extract(output), expected, "{output:?}");
            let mut p = named("granite");
            assert_eq!(&stream(p.as_mut(), &token_like(output)), expected, "streamed {output:?}");
            assert_stream_matches_extract("granite", &Map::new(), output);
        }
    }

    // vLLM STREAMING_SUBCASES: (previous, delta, reasoning, content) of one step. Feeding
    // `previous` first puts the parser where vLLM's stateless parser starts. STREAMING_3 is left
    // out: its current text is not its previous text plus its delta.
    #[test]
    fn vllm_streaming_subcases() {
        let cases: &[(&str, &str, Option<&str>, Option<&str>)] = &[
            ("", "Here", None, None),
            ("Here is my thought", " failure", None, Some("Here is my thought failure")),
            ("Here is my thought", " process:", None, None),
            ("Here is my thought process:", " foo", Some(" foo"), None),
            ("Here is my thought process: foo", " Here is", Some(" "), None),
            ("Here is my thought process: foo Here is", " Here", Some("Here is "), None),
            ("Here is my thought process: foo Here is my response:", " bar", None, Some(" bar")),
            ("", "Here is my thought process: foo Here is my response: bar", Some(" foo "), Some(" bar")),
            ("Here is my thought process: foo", " bar Here is my response: baz", Some(" bar "), Some(" baz")),
            ("Here is my thought process: This is a reasoning section ", "Here", None, None),
            ("Here is my thought process: foo Here is my response", ":", None, None),
            ("Here is my thought process: foo Here", " was", Some("Here was"), None),
        ];
        for (previous, delta, reasoning, content) in cases {
            let mut p = named("granite");
            if !previous.is_empty() {
                p.extract_streaming("", previous);
            }
            let expected = (reasoning.is_some() || content.is_some()).then(|| ReasoningDelta {
                reasoning: reasoning.map(str::to_string),
                content: content.map(str::to_string),
            });
            assert_eq!(p.extract_streaming(previous, delta), expected, "{previous:?} + {delta:?}");
        }
    }

    #[test]
    fn heres_variants_and_small_deltas() {
        for text in [
            "Here's my thought process: a Here there Here is my response: b",
            "Here is my thought process: héllo wörld Here's my response: ok",
            "Here is my thought process:Here is my response:x",
            "Here is my thought process:aHere is my response:x",
            "Here is my thought process:ab Here is my response:",
            "Her",
            "",
        ] {
            assert_stream_matches_extract("granite", &Map::new(), text);
        }
    }

    #[test]
    fn where_vllm_streams_differently_from_the_whole_output() {
        // No response phrase: the whole output is content, but a stream has already sent reasoning.
        let text = "Here is my thought process: unfinished";
        assert_eq!(named("granite").extract(text), r(None, Some(text)));
        let mut p = named("granite");
        assert_eq!(stream(p.as_mut(), &chunks(text, &[2])), r(Some(" unfinished"), None));
        // The regex finds the phrases anywhere; a stream only at the very start.
        let text = "Note: Here is my thought process: a Here is my response: b";
        assert_eq!(named("granite").extract(text), r(Some(" a "), Some(" b")));
        let mut p = named("granite");
        assert_eq!(stream(p.as_mut(), &chunks(text, &[3])), r(None, Some(text)));
    }

    #[test]
    fn is_reasoning_end_at_the_response_phrase() {
        let p = named("granite");
        for (output, end) in [
            ("", false),
            ("Here is my", false),
            ("Hello", true),
            ("Here is my thought process: a", false),
            ("Here is my thought process: a Here is my response:", true),
            ("Here's my thought process: a Here's my response: b", true),
        ] {
            assert_eq!(p.is_reasoning_end(output), end, "{output:?}");
        }
    }
}
