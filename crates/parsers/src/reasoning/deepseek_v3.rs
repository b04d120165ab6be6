//! `deepseek_v3` and `holo2`: models whose template reasons only when asked
//! (`chat_template_kwargs` `thinking` or `enable_thinking`). Thinking on, the output is read as
//! DeepSeek-R1's; off, all of it is content. `holo2` (vLLM's
//! `DeepSeekV3ReasoningWithThinkingParser`) thinks unless a request sets either key.

use serde_json::{Map, Value};

use super::deepseek_r1::DeepSeekR1;
use super::identity::Identity;
use super::{truthy, ReasoningParser};

/// The parser for a request: DeepSeek-R1's when thinking, else the identity. `thinking_by_default`
/// applies where the request sets neither key (a null counts as unset, as Python's `get` reads it).
pub(super) fn new(kwargs: &Map<String, Value>, thinking_by_default: bool) -> Box<dyn ReasoningParser> {
    let set = |key| kwargs.get(key).filter(|v| !v.is_null());
    let thinking = match (set("thinking"), set("enable_thinking")) {
        (None, None) => thinking_by_default,
        (a, b) => a.is_some_and(truthy) || b.is_some_and(truthy),
    };
    if thinking {
        Box::new(DeepSeekR1::new())
    } else {
        Box::new(Identity)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::Reasoned;
    use serde_json::json;

    fn r(reasoning: Option<&str>, content: Option<&str>) -> Reasoned {
        Reasoned { reasoning: reasoning.map(str::to_string), content: content.map(str::to_string) }
    }

    fn is_r1(name: &str, kw: serde_json::Value) -> bool {
        named_with(name, kwargs(kw)).end_marker().is_some()
    }

    // vLLM tests/reasoning/test_deepseekv3_reasoning_parser.py: parser selection, identity parser.
    #[test]
    fn deepseek_v3_thinks_only_when_asked() {
        assert!(is_r1("deepseek_v3", json!({"thinking": true})));
        assert!(!is_r1("deepseek_v3", json!({"thinking": false})));
        assert!(is_r1("deepseek_v3", json!({"enable_thinking": true})));
        assert!(is_r1("deepseek_v3", json!({"thinking": false, "enable_thinking": 1})));
        assert!(!is_r1("deepseek_v3", json!({})));
        assert!(!is_r1("deepseek_v3", json!({"thinking": null})));
    }

    #[test]
    fn identity_keeps_everything_as_content() {
        let mut p = named_with("deepseek_v3", kwargs(json!({"thinking": false})));
        assert!(p.is_reasoning_end("This is some output"));
        assert_eq!(p.extract("This is some output"), r(None, Some("This is some output")));
        assert_eq!(p.extract_streaming("", "Hello world").and_then(|d| d.content).as_deref(), Some("Hello world"));
        assert_eq!(p.extract_streaming("Hello world", ""), None);
    }

    #[test]
    fn deepseek_v3_thinking_reads_like_r1() {
        let p = named_with("deepseek_v3", kwargs(json!({"thinking": true})));
        assert_eq!(p.extract("Reasoning</think>Answer"), r(Some("Reasoning"), Some("Answer")));
    }

    // vLLM tests/reasoning/test_holo2_reasoning_parser.py.
    #[test]
    fn holo2_thinks_unless_told_not_to() {
        assert!(is_r1("holo2", json!({})));
        assert!(is_r1("holo2", json!({"thinking": true})));
        assert!(!is_r1("holo2", json!({"thinking": false})));
        assert!(is_r1("holo2", json!({"thinking": null, "enable_thinking": null})));

        let p = named("holo2");
        assert!(p.is_reasoning_end("a b c</think>"));
        assert!(!p.is_reasoning_end("a b c"));
        assert!(p.is_reasoning_end("a b c</think>d"));

        let think = "This is a reasoning section</think>This is the rest";
        let cases: &[(&str, serde_json::Value, Reasoned)] = &[
            (think, json!({}), r(Some("This is a reasoning section"), Some("This is the rest"))),
            (think, json!({"thinking": true}), r(Some("This is a reasoning section"), Some("This is the rest"))),
            ("This is the rest", json!({"thinking": false}), r(None, Some("This is the rest"))),
            ("</think>This is the rest", json!({"thinking": false}), r(None, Some("</think>This is the rest"))),
            (
                "some text</think>This is the rest",
                json!({"thinking": false}),
                r(None, Some("some text</think>This is the rest")),
            ),
            ("This is a reasoning section</think>", json!({}), r(Some("This is a reasoning section"), None)),
        ];
        for (output, kw, expected) in cases {
            assert_eq!(&named_with("holo2", kwargs(kw.clone())).extract(output), expected, "{output:?} {kw}");
            let mut p = named_with("holo2", kwargs(kw.clone()));
            assert_eq!(&stream(p.as_mut(), &chunks(output, &[1, 2, 3])), expected, "streamed {output:?} {kw}");
        }
    }
}
