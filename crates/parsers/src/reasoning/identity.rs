//! The whole output as content: vLLM's `IdentityReasoningParser`, which the DeepSeek-V3 and
//! Qwen3 parsers become when the request turned thinking off.

use super::{non_empty, Reasoned, ReasoningDelta, ReasoningParser};

#[derive(Debug)]
pub(super) struct Identity;

impl ReasoningParser for Identity {
    /// The output unchanged, empty or not, as vLLM returns it.
    fn extract(&self, output: &str) -> Reasoned {
        Reasoned { reasoning: None, content: Some(output.to_string()) }
    }

    fn extract_streaming(&mut self, _previous: &str, delta: &str) -> Option<ReasoningDelta> {
        non_empty(delta).map(|content| ReasoningDelta { reasoning: None, content: Some(content) })
    }

    fn finish(&mut self) -> Option<ReasoningDelta> {
        None
    }

    fn is_reasoning_end(&self, _output: &str) -> bool {
        true
    }

    fn end_marker(&self) -> Option<&'static str> {
        None
    }
}
