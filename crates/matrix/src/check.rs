//! Keeps every claim in the inventory backed by code or by a test.

use std::collections::BTreeSet;
use std::fmt;

use crate::inventory::{Category, Inventory, State};

/// One way the inventory disagrees with the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The row claims `implemented` or more, but the model registry has no constructor for it.
    NoConstructor { architecture: String, category: Category, state: State },
    /// The row claims a gate (`gated-*` or `benchmarked`) but names no test.
    NoTests { architecture: String, category: Category, state: State },
    /// The row names a test id that no `#[test]` in the workspace has.
    UnknownTest { architecture: String, category: Category, test: String },
    /// The model registry constructs an architecture that has no row at all.
    UnlistedConstructor { architecture: String },
    /// The same (architecture, category) appears more than once.
    DuplicateRow { architecture: String, category: Category },
    /// A quantized format is listed on a row that claims no gate, or without tests.
    UngatedQuantization { architecture: String, category: Category, format: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoConstructor { architecture, category, state } => write!(
                f,
                "{architecture} ({category}) is `{state}` but ferrite_models::registry has no constructor for it"
            ),
            Problem::NoTests { architecture, category, state } => {
                write!(f, "{architecture} ({category}) is `{state}` but its `tests` list is empty")
            }
            Problem::UnknownTest { architecture, category, test } => {
                write!(f, "{architecture} ({category}) names test `{test}`, which no #[test] in the workspace defines")
            }
            Problem::UnlistedConstructor { architecture } => {
                write!(f, "ferrite_models::registry constructs {architecture}, which has no row in the inventory")
            }
            Problem::DuplicateRow { architecture, category } => {
                write!(f, "{architecture} ({category}) has more than one row")
            }
            Problem::UngatedQuantization { architecture, category, format } => {
                write!(f, "{architecture} ({category}) lists quantized format `{format}` without tests on a gated row")
            }
        }
    }
}

/// Compares the inventory with `registry` (the architectures that have a constructor) and
/// `test_ids` (as produced by [`crate::discover_test_ids`]). An empty result means every claim
/// is backed. A named test must exist whatever the row's state: a dangling id is wrong even on
/// a row that does not need it yet.
pub fn check(inventory: &Inventory, registry: &[&str], test_ids: &BTreeSet<String>) -> Vec<Problem> {
    let constructible: BTreeSet<&str> = registry.iter().copied().collect();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for row in &inventory.rows {
        let architecture = || row.architecture.clone();
        if !seen.insert((row.architecture.as_str(), row.category)) {
            problems.push(Problem::DuplicateRow { architecture: architecture(), category: row.category });
        }
        if row.state >= State::Implemented && !constructible.contains(row.architecture.as_str()) {
            problems.push(Problem::NoConstructor {
                architecture: architecture(),
                category: row.category,
                state: row.state,
            });
        }
        if row.state >= State::GatedCpu && row.tests.is_empty() {
            problems.push(Problem::NoTests { architecture: architecture(), category: row.category, state: row.state });
        }
        for q in &row.quantized {
            if row.state < State::GatedCpu || q.tests.is_empty() {
                problems.push(Problem::UngatedQuantization {
                    architecture: architecture(),
                    category: row.category,
                    format: q.format.clone(),
                });
            }
        }
        let quantized_tests = row.quantized.iter().flat_map(|q| &q.tests);
        for test in row.tests.iter().chain(quantized_tests).filter(|t| !test_ids.contains(*t)) {
            problems.push(Problem::UnknownTest {
                architecture: architecture(),
                category: row.category,
                test: test.clone(),
            });
        }
    }
    let listed: BTreeSet<&str> = inventory.rows.iter().map(|r| r.architecture.as_str()).collect();
    for architecture in constructible.difference(&listed) {
        problems.push(Problem::UnlistedConstructor { architecture: architecture.to_string() });
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::testing::{inventory, row};
    use crate::inventory::Category::*;
    use crate::inventory::State::*;

    fn ids(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(ToString::to_string).collect()
    }

    const LLAMA_TEST: &str = "ferrite-models::parity::llama";

    #[test]
    fn consistent_inventory_has_no_problems() {
        let inv = inventory(vec![
            row("LlamaForCausalLM", TextGeneration, "llama", GatedCpu, &[LLAMA_TEST]),
            row("LlamaForCausalLM", Embedding, "llama", Inventoried, &[]),
            row("Qwen2ForCausalLM", TextGeneration, "qwen2", Implemented, &[]),
            row("GPT2LMHeadModel", TextGeneration, "gpt2", Inventoried, &[]),
        ]);
        let problems = check(&inv, &["LlamaForCausalLM", "Qwen2ForCausalLM"], &ids(&[LLAMA_TEST]));
        assert_eq!(problems, vec![]);
    }

    #[test]
    fn claim_without_constructor() {
        for state in [Implemented, GatedCpu, GatedCuda, Benchmarked] {
            let inv = inventory(vec![row("Qwen3ForCausalLM", TextGeneration, "qwen3", state, &[LLAMA_TEST])]);
            assert_eq!(
                check(&inv, &[], &ids(&[LLAMA_TEST])),
                vec![Problem::NoConstructor {
                    architecture: "Qwen3ForCausalLM".into(),
                    category: TextGeneration,
                    state,
                }]
            );
        }
    }

    #[test]
    fn quantized_formats_need_a_gated_row_and_real_tests() {
        use crate::inventory::QuantizedGate;
        let fp8 = |tests: &[&str]| QuantizedGate {
            format: "compressed-tensors FP8_DYNAMIC".into(),
            tests: tests.iter().map(ToString::to_string).collect(),
        };
        let with = |state, q: QuantizedGate| {
            let mut r = row("LlamaForCausalLM", TextGeneration, "llama", state, &[LLAMA_TEST]);
            r.quantized.push(q);
            inventory(vec![r])
        };
        let known = ids(&[LLAMA_TEST, "ferrite-models::parity::llama_fp8"]);
        let ok = with(GatedCpu, fp8(&["ferrite-models::parity::llama_fp8"]));
        assert_eq!(check(&ok, &["LlamaForCausalLM"], &known), vec![]);
        let ungated = Problem::UngatedQuantization {
            architecture: "LlamaForCausalLM".into(),
            category: TextGeneration,
            format: "compressed-tensors FP8_DYNAMIC".into(),
        };
        let no_tests = with(GatedCuda, fp8(&[]));
        assert_eq!(check(&no_tests, &["LlamaForCausalLM"], &known), vec![ungated.clone()]);
        let not_gated = with(Implemented, fp8(&["ferrite-models::parity::llama_fp8"]));
        assert_eq!(check(&not_gated, &["LlamaForCausalLM"], &known), vec![ungated]);
        let dangling = with(GatedCpu, fp8(&["ferrite-models::parity::nope"]));
        assert!(matches!(
            &check(&dangling, &["LlamaForCausalLM"], &known)[..],
            [Problem::UnknownTest { test, .. }] if test == "ferrite-models::parity::nope"
        ));
    }

    #[test]
    fn gate_without_tests() {
        for state in [GatedCpu, GatedCuda, Benchmarked] {
            let inv = inventory(vec![row("LlamaForCausalLM", TextGeneration, "llama", state, &[])]);
            assert_eq!(
                check(&inv, &["LlamaForCausalLM"], &ids(&[])),
                vec![Problem::NoTests { architecture: "LlamaForCausalLM".into(), category: TextGeneration, state }]
            );
        }
    }

    #[test]
    fn test_id_that_does_not_exist() {
        let inv = inventory(vec![
            row("LlamaForCausalLM", TextGeneration, "llama", GatedCuda, &[LLAMA_TEST, "ferrite-models::parity::gone"]),
            row("GPT2LMHeadModel", TextGeneration, "gpt2", Inventoried, &["ferrite-models::parity::gpt2"]),
        ]);
        assert_eq!(
            check(&inv, &["LlamaForCausalLM"], &ids(&[LLAMA_TEST])),
            vec![
                Problem::UnknownTest {
                    architecture: "LlamaForCausalLM".into(),
                    category: TextGeneration,
                    test: "ferrite-models::parity::gone".into(),
                },
                Problem::UnknownTest {
                    architecture: "GPT2LMHeadModel".into(),
                    category: TextGeneration,
                    test: "ferrite-models::parity::gpt2".into(),
                },
            ]
        );
    }

    #[test]
    fn constructor_without_row() {
        let inv = inventory(vec![row("LlamaForCausalLM", TextGeneration, "llama", Implemented, &[])]);
        assert_eq!(
            check(&inv, &["LlamaForCausalLM", "YiForCausalLM", "YiForCausalLM"], &ids(&[])),
            vec![Problem::UnlistedConstructor { architecture: "YiForCausalLM".into() }]
        );
    }

    #[test]
    fn duplicate_row() {
        let inv = inventory(vec![
            row("Qwen2ForCausalLM", TextGeneration, "qwen2", Inventoried, &[]),
            row("Qwen2ForCausalLM", Embedding, "qwen2", Inventoried, &[]),
            row("Qwen2ForCausalLM", TextGeneration, "qwen2", Inventoried, &[]),
        ]);
        assert_eq!(
            check(&inv, &[], &ids(&[])),
            vec![Problem::DuplicateRow { architecture: "Qwen2ForCausalLM".into(), category: TextGeneration }]
        );
    }

    #[test]
    fn messages_name_the_row() {
        let p = Problem::UnknownTest {
            architecture: "LlamaForCausalLM".into(),
            category: TextGeneration,
            test: "a::b::c".into(),
        };
        assert_eq!(
            p.to_string(),
            "LlamaForCausalLM (text-generation) names test `a::b::c`, which no #[test] in the workspace defines"
        );
    }
}
