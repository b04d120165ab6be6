//! Reasoning parsers: `--reasoning-parser NAME` (see [`parser`]).
//!
//! Each parser follows the vLLM parser of the same name: what is reasoning and what is content
//! when a marker is missing, which empty parts become `None`, and what the streamed deltas add up
//! to. vLLM's streaming parsers read token ids; these read text, so a marker may arrive split
//! across deltas: a parser holds back a tail that may still become a marker and releases it once
//! it cannot, or at [`ReasoningParser::finish`].

mod deepseek_r1;
mod deepseek_v3;
mod gpt_oss;
mod granite;
mod identity;
mod qwen3;

use serde_json::{Map, Value};

/// A whole output split into its reasoning and its answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reasoned {
    pub reasoning: Option<String>,
    pub content: Option<String>,
}

/// What one streamed step adds: reasoning text and/or content text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReasoningDelta {
    pub reasoning: Option<String>,
    pub content: Option<String>,
}

/// One model family's reasoning format. A parser value serves one request: the streaming side
/// keeps state between deltas, so one value sees one stream from its first delta to `finish`.
pub trait ReasoningParser: Send {
    /// The split of a whole output (the non-streaming response). It may differ from what the
    /// stream of the same output adds up to wherever vLLM's two paths differ; each parser says.
    fn extract(&self, output: &str) -> Reasoned;

    /// The delta for `delta` (the newest text; `previous` is everything before it); `None` while
    /// text is held back.
    fn extract_streaming(&mut self, previous: &str, delta: &str) -> Option<ReasoningDelta>;

    /// The stream has ended: what was held back as the possible start of a marker, sent as the
    /// text it turned out to be (and, for gpt-oss, an output cut off inside a message header,
    /// which vLLM returns as content). Call once, after the last delta.
    fn finish(&mut self) -> Option<ReasoningDelta>;

    /// Whether the reasoning section has ended in `output` (so far): structured outputs apply
    /// from there on.
    fn is_reasoning_end(&self, output: &str) -> bool;

    /// The text that ends the reasoning section (`</think>`), where it is one marker.
    fn end_marker(&self) -> Option<&'static str>;
}

/// The names `--reasoning-parser` accepts.
pub const PARSERS: &[&str] =
    &["deepseek_r1", "deepseek_v3", "granite", "holo2", "mimo", "openai_gptoss", "gpt_oss", "qwen3"];

/// A fresh parser for `name`, or `None` for a name not in [`PARSERS`]. `chat_template_kwargs` is
/// what the request's template was rendered with: vLLM hands it to the parser, and the Qwen3 and
/// DeepSeek-V3 parsers read from `enable_thinking` / `thinking` whether the prompt asked for a
/// reasoning section.
pub fn parser(name: &str, chat_template_kwargs: &Map<String, Value>) -> Option<Box<dyn ReasoningParser>> {
    Some(match name {
        "deepseek_r1" => Box::new(deepseek_r1::DeepSeekR1::new()),
        "deepseek_v3" => deepseek_v3::new(chat_template_kwargs, false),
        "holo2" => deepseek_v3::new(chat_template_kwargs, true),
        "granite" => Box::new(granite::Granite::new()),
        "openai_gptoss" | "gpt_oss" => Box::new(gpt_oss::GptOss::new()),
        // vLLM registers one Qwen3 parser under both names.
        "qwen3" | "mimo" => qwen3::new(chat_template_kwargs),
        _ => return None,
    })
}

/// Python's `bool(value)`, which vLLM applies to chat-template kwargs.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_string())
}

/// Reasoning and content text gathered from one step; empty parts become `None`.
#[derive(Debug, Default)]
struct Split {
    reasoning: String,
    content: String,
}

impl Split {
    fn push(&mut self, to_reasoning: bool, text: &str) {
        if to_reasoning {
            self.reasoning.push_str(text);
        } else {
            self.content.push_str(text);
        }
    }

    fn append(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }

    fn into_delta(self) -> Option<ReasoningDelta> {
        let delta = ReasoningDelta { reasoning: non_empty(&self.reasoning), content: non_empty(&self.content) };
        (delta.reasoning.is_some() || delta.content.is_some()).then_some(delta)
    }

    fn into_reasoned(self) -> Reasoned {
        Reasoned { reasoning: non_empty(&self.reasoning), content: non_empty(&self.content) }
    }
}

/// A piece of text as [`MarkerLexer`] cuts it.
#[derive(Debug, PartialEq)]
pub(crate) enum Piece {
    Text(String),
    Marker(&'static str),
}

/// Cuts streamed text at markers. A tail that is the start of a marker is held back until the
/// next delta completes it or shows it was text, so a marker split across deltas is still found.
#[derive(Debug)]
pub(crate) struct MarkerLexer {
    markers: &'static [&'static str],
    held: String,
}

impl MarkerLexer {
    pub(crate) fn new(markers: &'static [&'static str]) -> Self {
        Self { markers, held: String::new() }
    }

    pub(crate) fn feed(&mut self, delta: &str) -> Vec<Piece> {
        let mut buffer = std::mem::take(&mut self.held);
        buffer.push_str(delta);
        let mut pieces = Vec::new();
        let mut rest = buffer.as_str();
        while let Some((at, marker)) = self.first_marker(rest) {
            if at > 0 {
                pieces.push(Piece::Text(rest[..at].to_string()));
            }
            pieces.push(Piece::Marker(marker));
            rest = &rest[at + marker.len()..];
        }
        let keep = self.partial_marker_len(rest);
        let text = &rest[..rest.len() - keep];
        if !text.is_empty() {
            pieces.push(Piece::Text(text.to_string()));
        }
        self.held = rest[rest.len() - keep..].to_string();
        pieces
    }

    /// What is held back, as text: the stream ended before it became a marker.
    pub(crate) fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Text(held)]
        }
    }

    /// The leftmost marker in `text`, the longest where two start at the same place.
    fn first_marker(&self, text: &str) -> Option<(usize, &'static str)> {
        self.markers
            .iter()
            .filter_map(|&m| text.find(m).map(|at| (at, m)))
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.len().cmp(&a.1.len())))
    }

    /// The length of the longest tail of `text` that a marker starts with (but is not).
    fn partial_marker_len(&self, text: &str) -> usize {
        let longest = self.markers.iter().map(|m| m.len()).max().unwrap_or(0);
        let from = text.len().saturating_sub(longest.saturating_sub(1));
        (from..text.len())
            .filter(|&at| text.is_char_boundary(at))
            .map(|at| &text[at..])
            .find(|tail| self.markers.iter().any(|m| m.starts_with(tail)))
            .map_or(0, str::len)
    }
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// How a `<think>`...`</think>` format treats its markers once streamed.
#[derive(Debug)]
struct ThinkRules {
    markers: &'static [&'static str],
    /// A marker that also ends the reasoning (Qwen3's `<tool_call>`) and stays in the content.
    implicit_end: Option<&'static str>,
    /// Whether a `<think>` after the reasoning is content text (Qwen3) or dropped (DeepSeek-R1,
    /// whose vLLM parser skips every think token that arrives on its own).
    start_in_content_is_text: bool,
}

/// A streamed think-tag output: reasoning until the end marker, content after it. `<think>`
/// itself is dropped, as is `</think>` in the content (vLLM skips a lone think token).
#[derive(Debug)]
struct ThinkStream {
    rules: &'static ThinkRules,
    lexer: MarkerLexer,
    in_reasoning: bool,
}

impl ThinkStream {
    fn new(rules: &'static ThinkRules) -> Self {
        Self { rules, lexer: MarkerLexer::new(rules.markers), in_reasoning: true }
    }

    fn feed(&mut self, delta: &str) -> Split {
        let pieces = self.lexer.feed(delta);
        self.route(pieces)
    }

    fn finish(&mut self) -> Split {
        let pieces = self.lexer.finish();
        self.route(pieces)
    }

    fn route(&mut self, pieces: Vec<Piece>) -> Split {
        let mut split = Split::default();
        for piece in pieces {
            match piece {
                Piece::Text(text) => split.push(self.in_reasoning, &text),
                Piece::Marker(THINK_END) => self.in_reasoning = false,
                Piece::Marker(THINK_START) if self.in_reasoning || !self.rules.start_in_content_is_text => {}
                Piece::Marker(marker) if self.in_reasoning && Some(marker) == self.rules.implicit_end => {
                    self.in_reasoning = false;
                    split.push(false, marker);
                }
                Piece::Marker(marker) => split.push(self.in_reasoning, marker),
            }
        }
        split
    }
}

/// vLLM's base think-tag split of a whole output: drop everything up to the first `<think>`,
/// then reasoning until the first `</think>` (all of it when there is none), content after.
/// The reasoning is kept even when empty, as vLLM returns it.
fn split_think(output: &str) -> Reasoned {
    let body = output.find(THINK_START).map_or(output, |at| &output[at + THINK_START.len()..]);
    match body.find(THINK_END) {
        None => Reasoned { reasoning: Some(body.to_string()), content: None },
        Some(at) => {
            Reasoned { reasoning: Some(body[..at].to_string()), content: non_empty(&body[at + THINK_END.len()..]) }
        }
    }
}

/// Whether the last think marker in `output` is `</think>`.
fn think_ended(output: &str) -> bool {
    match (output.rfind(THINK_END), output.rfind(THINK_START)) {
        (Some(end), Some(start)) => end > start,
        (end, _) => end.is_some(),
    }
}

#[cfg(test)]
mod test_support {
    use super::*;

    pub fn kwargs(json: Value) -> Map<String, Value> {
        match json {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    pub fn named(name: &str) -> Box<dyn ReasoningParser> {
        named_with(name, Map::new())
    }

    pub fn named_with(name: &str, kwargs: Map<String, Value>) -> Box<dyn ReasoningParser> {
        match parser(name, &kwargs) {
            Some(p) => p,
            None => panic!("no parser {name}"),
        }
    }

    /// Streams `deltas` through `parser` and `finish`, concatenating what comes out the way a
    /// client does (vLLM's `StreamingReasoningReconstructor`): `None` where nothing came.
    pub fn stream(parser: &mut dyn ReasoningParser, deltas: &[&str]) -> Reasoned {
        let mut out = Reasoned::default();
        let mut previous = String::new();
        let mut add = |delta: Option<ReasoningDelta>| {
            if let Some(d) = delta {
                assert!(d.reasoning.as_deref() != Some("") && d.content.as_deref() != Some(""), "empty delta part");
                if let Some(r) = d.reasoning {
                    out.reasoning.get_or_insert_with(String::new).push_str(&r);
                }
                if let Some(c) = d.content {
                    out.content.get_or_insert_with(String::new).push_str(&c);
                }
            }
        };
        for delta in deltas {
            add(parser.extract_streaming(&previous, delta));
            previous.push_str(delta);
        }
        add(parser.finish());
        out
    }

    /// `text` cut into deltas of the given sizes in characters, cycling through `sizes`.
    pub fn chunks<'a>(text: &'a str, sizes: &[usize]) -> Vec<&'a str> {
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let mut out = Vec::new();
        let (mut at, mut k) = (0, 0);
        while at + 1 < bounds.len() {
            let next = (at + sizes[k % sizes.len()].max(1)).min(bounds.len() - 1);
            out.push(&text[bounds[at]..bounds[next]]);
            at = next;
            k += 1;
        }
        out
    }

    /// Streams `text` in deltas of 1 to 3 characters (several patterns) and checks that the
    /// concatenated deltas equal `extract`, with an empty non-streaming part read as absent
    /// (vLLM's whole-output split keeps an empty reasoning; a stream never sends an empty delta).
    pub fn assert_stream_matches_extract(name: &str, kwargs: &Map<String, Value>, text: &str) {
        let whole = named_with(name, kwargs.clone()).extract(text);
        let expected = Reasoned {
            reasoning: whole.reasoning.filter(|r| !r.is_empty()),
            content: whole.content.filter(|c| !c.is_empty()),
        };
        for sizes in [&[1][..], &[2], &[3], &[1, 2, 3], &[3, 1, 2], &[2, 3, 1, 1]] {
            let mut p = named_with(name, kwargs.clone());
            let streamed = stream(p.as_mut(), &chunks(text, sizes));
            assert_eq!(streamed, expected, "{name}, deltas of {sizes:?} chars: {text:?}");
        }
    }

    /// Deterministic pseudo-random text over `alphabet` pieces (markers and fragments of them).
    pub fn random_texts(alphabet: &[&str], count: usize) -> Vec<String> {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) as usize
        };
        (0..count)
            .map(|_| {
                let len = next() % 12;
                (0..len).map(|_| alphabet[next() % alphabet.len()]).collect()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn registry_builds_every_listed_name_and_nothing_else() {
        for name in PARSERS {
            assert!(parser(name, &Map::new()).is_some(), "{name}");
        }
        assert!(parser("nope", &Map::new()).is_none());
        assert!(parser("", &Map::new()).is_none());
    }

    #[test]
    fn truthiness_follows_python() {
        for (value, expected) in [
            (Value::Null, false),
            (Value::Bool(false), false),
            (Value::Bool(true), true),
            (serde_json::json!(0), false),
            (serde_json::json!(0.0), false),
            (serde_json::json!(2), true),
            (serde_json::json!(""), false),
            (serde_json::json!("false"), true),
            (serde_json::json!([]), false),
            (serde_json::json!({"a": 1}), true),
        ] {
            assert_eq!(truthy(&value), expected, "{value}");
        }
    }

    #[test]
    fn lexer_finds_markers_split_across_deltas() {
        let mut lexer = MarkerLexer::new(&[THINK_START, THINK_END]);
        assert_eq!(lexer.feed("ab</th"), vec![Piece::Text("ab".into())]);
        assert_eq!(lexer.feed("ink>c<"), vec![Piece::Marker(THINK_END), Piece::Text("c".into())]);
        assert_eq!(lexer.feed("x"), vec![Piece::Text("<x".into())]);
        assert_eq!(lexer.feed("<thi"), vec![]);
        assert_eq!(lexer.finish(), vec![Piece::Text("<thi".into())]);
        assert_eq!(lexer.finish(), vec![]);
    }

    #[test]
    fn lexer_prefers_the_longest_marker_at_one_place() {
        let mut lexer = MarkerLexer::new(&["<|end|>", "<|endoftext|>"]);
        assert_eq!(lexer.feed("a<|endoftext|>"), vec![Piece::Text("a".into()), Piece::Marker("<|endoftext|>")]);
    }

    #[test]
    fn lexer_holds_back_only_on_char_boundaries() {
        let mut lexer = MarkerLexer::new(&[THINK_END]);
        assert_eq!(lexer.feed("é<"), vec![Piece::Text("é".into())]);
        assert_eq!(lexer.feed("é"), vec![Piece::Text("<é".into())]);
        assert_eq!(lexer.feed("日本</"), vec![Piece::Text("日本".into())]);
    }

    #[test]
    fn chunks_cover_the_text_in_order() {
        let text = "añb</think>日本";
        for sizes in [&[1][..], &[2], &[3], &[1, 2, 3]] {
            let parts = chunks(text, sizes);
            assert_eq!(parts.concat(), text);
            assert!(parts.iter().all(|p| !p.is_empty() && p.chars().count() <= 3));
        }
    }

    #[test]
    fn no_parser_panics_on_marker_soup() {
        let alphabet = [
            "<think>",
            "</think>",
            "</th",
            "<",
            ">",
            "<tool_call>",
            "x",
            " ",
            "é",
            "Here is my thought process:",
            "Here's my response:",
            "Here",
            ":",
            "<|channel|>",
            "analysis",
            "final",
            "commentary to=functions.f",
            "<|message|>",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|return|>",
            "<|",
        ];
        let texts = random_texts(&alphabet, 300);
        for name in PARSERS {
            for text in &texts {
                let p = named(name);
                let _ = p.extract(text);
                let _ = p.is_reasoning_end(text);
                for sizes in [&[1][..], &[2, 3]] {
                    let mut p = named(name);
                    let _ = stream(p.as_mut(), &chunks(text, sizes));
                }
            }
        }
    }
}
