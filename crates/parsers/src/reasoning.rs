//! Reasoning parsers: `--reasoning-parser NAME` (see [`parser`]).

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

/// One model family's reasoning format. A parser value serves one request.
pub trait ReasoningParser: Send {
    fn extract(&self, output: &str) -> Reasoned;

    /// The delta for `delta` (the newest text; `previous` is everything before it); `None` while
    /// text is held back.
    fn extract_streaming(&mut self, previous: &str, delta: &str) -> Option<ReasoningDelta>;

    /// Whether the reasoning section has ended in `output` (so far): structured outputs apply
    /// from there on.
    fn is_reasoning_end(&self, output: &str) -> bool;

    /// The text that ends the reasoning section (`</think>`), where it is one marker.
    fn end_marker(&self) -> Option<&'static str>;
}

/// The names `--reasoning-parser` accepts.
pub const PARSERS: &[&str] = &[];

/// A fresh parser for `name`, or `None` for a name not in [`PARSERS`].
pub fn parser(name: &str) -> Option<Box<dyn ReasoningParser>> {
    let _ = name;
    None
}
