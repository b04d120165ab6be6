//! Structured-output constraints from untrusted requests (issue 34): random JSON schemas built
//! from the schema keywords (nested, contradictory, with absurd bounds and patterns), the
//! repo's GBNF samples mutated, regexes and structural tags from fragments. Each case compiles
//! or is refused with a message, without a panic and within llguidance's limits; a compiled one
//! is driven a few steps along its masks (masks, accepts, the verify-step masks), which must
//! not panic either.
//!
//! 256 cases by default; `PROPTEST_CASES=N` runs more (`scripts/fuzz.sh`).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrite_structured::{Constraint, GrammarCompiler, JsonOptions, StructuredOutputs};
use ferrite_tokenizer::Tokenizer;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const VOCAB: usize = 1024;
/// llguidance bounds a compile by its grammar size and lexer fuel; a compile past this on a
/// slow machine means a path those limits do not cover.
const COMPILE_LIMIT: Duration = Duration::from_secs(60);

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")).unwrap()
    })
}

fn compiler() -> &'static GrammarCompiler {
    static COMPILER: OnceLock<GrammarCompiler> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let tok = tokenizer();
        GrammarCompiler::new(tok, VOCAB, tok.eos_token_ids(), JsonOptions::default()).unwrap()
    })
}

fn gbnf_samples() -> &'static [String] {
    static SAMPLES: OnceLock<Vec<String>> = OnceLock::new();
    SAMPLES.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/testdata");
        let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect()
    })
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(i64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(u64::MAX)),
        Just(json!(1e308)),
        Just(json!(-1e-308)),
        Just(json!(0.5)),
        (-50i64..50).prop_map(Value::from),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("^[a-z]+$".to_string()),
        Just("(a|b)*c{2,5}".to_string()),
        Just("[".to_string()),
        Just("(?=lookahead)".to_string()),
        Just("\\p{L}{1,3}".to_string()),
        Just("a{99999}".to_string()),
        Just("(a*)*b".to_string()),
        Just("\\d{1000000000}".to_string()),
        Just(".*".to_string()),
        Just("".to_string()),
        "[a-z()\\[\\]{}|*+?.^$\\\\0-9]{0,12}",
    ]
}

fn schema(depth: u32) -> BoxedStrategy<Value> {
    let scalar_type =
        prop::sample::select(vec!["string", "integer", "number", "boolean", "null", "object", "array", "nope"]);
    let leaf = prop_oneof![
        scalar_type.clone().prop_map(|t| json!({"type": t})),
        Just(json!(true)),
        Just(json!(false)),
        Just(json!({})),
        (pattern(), prop::option::of(number()), prop::option::of(number())).prop_map(|(p, min, max)| {
            let mut s = json!({"type": "string", "pattern": p});
            if let Some(min) = min {
                s["minLength"] = min;
            }
            if let Some(max) = max {
                s["maxLength"] = max;
            }
            s
        }),
        prop::sample::select(vec!["date-time", "date", "time", "email", "uuid", "uri", "ipv4", "hostname", "bogus"])
            .prop_map(|f| json!({"type": "string", "format": f})),
        (number(), number(), prop::option::of(number())).prop_map(|(min, max, multiple)| {
            let mut s = json!({"type": "integer", "minimum": min, "maximum": max});
            if let Some(m) = multiple {
                s["multipleOf"] = m;
            }
            s
        }),
        (number(), number())
            .prop_map(|(min, max)| json!({"type": "number", "exclusiveMinimum": min, "exclusiveMaximum": max})),
        prop::collection::vec(prop_oneof![Just(json!(null)), number(), "[a-z]{0,5}".prop_map(Value::from)], 0..4)
            .prop_map(|e| json!({"enum": e})),
        number().prop_map(|c| json!({"const": c})),
        Just(json!({"$ref": "#/$defs/missing"})),
        Just(json!({"$ref": "#"})),
        Just(json!({"$ref": "http://example.com/schema.json"})),
        Just(json!({"type": ["string", "null"]})),
        Just(json!({"type": []})),
        Just(json!("not a schema")),
        Just(json!(42)),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    let inner = schema(depth - 1);
    prop_oneof![
        3 => leaf,
        2 => (
            prop::collection::vec(("[a-z]{1,6}", inner.clone()), 0..4),
            prop::collection::vec("[a-z]{1,6}", 0..3),
            prop::option::of(prop_oneof![Just(json!(false)), Just(json!(true)), inner.clone()]),
            prop::option::of((number(), number())),
        )
            .prop_map(|(props, required, additional, counts)| {
                let mut s = json!({"type": "object", "properties": props.into_iter().collect::<Map<_, _>>(), "required": required});
                if let Some(a) = additional {
                    s["additionalProperties"] = a;
                }
                if let Some((min, max)) = counts {
                    s["minProperties"] = min;
                    s["maxProperties"] = max;
                }
                s
            }),
        2 => (inner.clone(), prop::option::of(number()), prop::option::of(number()), any::<bool>()).prop_map(
            |(items, min, max, unique)| {
                let mut s = json!({"type": "array", "items": items, "uniqueItems": unique});
                if let Some(min) = min {
                    s["minItems"] = min;
                }
                if let Some(max) = max {
                    s["maxItems"] = max;
                }
                s
            }
        ),
        1 => prop::collection::vec(inner.clone(), 0..3).prop_map(|v| json!({"prefixItems": v, "type": "array"})),
        1 => (prop::sample::select(vec!["anyOf", "oneOf", "allOf"]), prop::collection::vec(inner.clone(), 0..4))
            .prop_map(|(k, v)| json!({ k: v })),
        1 => (inner.clone(), inner.clone()).prop_map(|(a, b)| json!({"$defs": {"a": a, "b": b}, "$ref": "#/$defs/a"})),
        1 => inner.clone().prop_map(|a| json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}, "v": a}}}, "$ref": "#/$defs/node"})),
        1 => (inner.clone(), inner.clone(), inner.clone()).prop_map(|(a, b, c)| json!({"if": a, "then": b, "else": c})),
        1 => inner.clone().prop_map(|a| json!({"not": a})),
        1 => (inner.clone(), pattern()).prop_map(|(a, p)| json!({"type": "object", "patternProperties": { p: a }})),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, text: String },
    Duplicate { at: usize, len: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    let fragment = prop_oneof![
        Just("::=".to_string()),
        Just("root ::= ".to_string()),
        Just("(".to_string()),
        Just(")*".to_string()),
        Just("[^\\x00-\\x{10FFFF}]".to_string()),
        Just("{0,99999}".to_string()),
        Just("\"\\u{D800}\"".to_string()),
        Just(" | ".to_string()),
        Just("x ::= x x\n".to_string()),
        Just("%import common.WS\n".to_string()),
        Just("start: /[/\n".to_string()),
        Just("\\".to_string()),
        Just("#".to_string()),
        "\\PC{0,8}",
    ];
    prop_oneof![
        (any::<usize>(), 0usize..60).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), fragment).prop_map(|(at, text)| Edit::Insert { at, text }),
        (any::<usize>(), 1usize..60).prop_map(|(at, len)| Edit::Duplicate { at, len }),
    ]
}

/// The char boundary at or before `at % (len + 1)`.
fn boundary(s: &str, at: usize) -> usize {
    let mut i = at % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(mut text: String, edits: &[Edit]) -> String {
    for e in edits {
        match e {
            Edit::Delete { at, len } => {
                let start = boundary(&text, *at);
                let end = boundary(&text, start + (*len).min(text.len() - start));
                text.replace_range(start..end, "");
            }
            Edit::Insert { at, text: fragment } => {
                let at = boundary(&text, *at);
                text.insert_str(at, fragment);
            }
            Edit::Duplicate { at, len } => {
                let start = boundary(&text, *at);
                let end = boundary(&text, start + (*len).min(text.len() - start));
                let piece = text[start..end].to_string();
                text.insert_str(end, &piece);
            }
        }
    }
    text
}

fn constraint() -> impl Strategy<Value = Constraint> {
    prop_oneof![
        4 => schema(3).prop_map(Constraint::Json),
        1 => Just(Constraint::JsonObject),
        2 => prop::collection::vec(pattern(), 1..4).prop_map(|parts| Constraint::Regex(parts.concat())),
        1 => prop::collection::vec("\\PC{0,6}", 0..4).prop_map(Constraint::Choice),
        3 => (any::<usize>(), prop::collection::vec(edit(), 0..5))
            .prop_map(|(i, edits)| Constraint::Grammar(apply(gbnf_samples()[i % gbnf_samples().len()].clone(), &edits))),
        1 => (
            prop::collection::vec(("[<a-z>]{0,6}", schema(2), "[<a-z/>]{0,6}"), 0..3),
            prop::collection::vec("[<a-z>]{0,4}", 0..3),
        )
            .prop_map(|(structures, triggers)| {
                let structures: Vec<Value> =
                    structures.into_iter().map(|(begin, schema, end)| json!({"begin": begin, "schema": schema, "end": end})).collect();
                Constraint::StructuralTag(json!({"structures": structures, "triggers": triggers}))
            }),
    ]
}

fn options() -> impl Strategy<Value = JsonOptions> {
    (any::<bool>(), any::<bool>(), prop::option::of(pattern())).prop_map(
        |(disable_any_whitespace, disable_additional_properties, whitespace_pattern)| JsonOptions {
            disable_any_whitespace,
            disable_additional_properties,
            whitespace_pattern,
        },
    )
}

proptest! {
    #[test]
    fn constraints_compile_or_are_refused_and_run_without_panics(
        constraint in constraint(),
        options in options(),
        walk in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let spec = StructuredOutputs { constraint, options };
        let start = Instant::now();
        let compiled = compiler().compile(&spec);
        prop_assert!(start.elapsed() < COMPILE_LIMIT, "a compile took {:?}", start.elapsed());
        let grammar = match compiled {
            Ok(g) => g,
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                return Ok(());
            }
        };
        let mut c = grammar.start();
        let mut words = vec![0u32; ferrite_structured::mask_words(VOCAB)];
        let mut drafts = Vec::new();
        for pick in walk {
            c.fill_mask(&mut words);
            let allowed: Vec<u32> = (0..VOCAB as u32).filter(|&t| words[t as usize / 32] >> (t % 32) & 1 == 1).collect();
            prop_assert!(!allowed.is_empty(), "a mask allowed nothing");
            let token = allowed[pick.index(allowed.len())];
            drafts.push(token);
            c.accept(token);
        }
        // Verify-step masks along tokens the grammar may or may not allow from here.
        let mut rows = vec![0u32; words.len() * (drafts.len() + 1)];
        c.fill_masks_along(&drafts, &mut rows, words.len());
    }
}

/// The generators reach both outcomes for each kind of constraint that can fail: a fuzz target
/// whose cases all compile, or all fail, would test little.
#[test]
fn the_generators_reach_compiled_and_refused_constraints() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = constraint();
    let mut outcomes = std::collections::BTreeMap::<(&str, bool), usize>::new();
    for _ in 0..400 {
        let constraint = strategy.new_tree(&mut runner).unwrap().current();
        let kind = match &constraint {
            Constraint::Json(_) => "json",
            Constraint::Grammar(_) => "grammar",
            Constraint::Regex(_) => "regex",
            _ => "other",
        };
        let ok = compiler().compile(&StructuredOutputs::new(constraint)).is_ok();
        *outcomes.entry((kind, ok)).or_default() += 1;
    }
    eprintln!("outcomes: {outcomes:?}");
    for kind in ["json", "grammar", "regex"] {
        for ok in [true, false] {
            assert!(outcomes.get(&(kind, ok)).copied().unwrap_or(0) >= 5, "{kind} ok={ok}: {outcomes:?}");
        }
    }
}

/// Found by the fuzz target: llguidance negates an integer bound while it builds the bound's
/// regex, and one at `i64::MIN` recursed until the stack overflowed, aborting the process. Each
/// way a request can put such a bound in front of it is refused with a message instead.
#[test]
fn integer_bounds_at_i64_min_are_refused_not_a_stack_overflow() {
    let lowest = json!(i64::MIN);
    let refused = [
        Constraint::Json(json!({"const": lowest})),
        Constraint::Json(json!({"type": "integer", "minimum": -1e19, "maximum": -1e19})),
        Constraint::Json(json!({"type": "integer", "exclusiveMinimum": -1e30, "exclusiveMaximum": -1e30})),
        Constraint::Json(json!({"enum": [1, -9223372036854775807i64]})),
        Constraint::Json(json!({"type": "object", "properties": {"a": {"anyOf": [{"const": lowest}]}}})),
        Constraint::Grammar("start: %json {\"const\": -9223372036854775808}".into()),
        Constraint::Grammar("start: %json {\"type\": \"integer\", \"maximum\": -1E+19, \"minimum\": -1.5e19}".into()),
        Constraint::StructuralTag(json!({
            "structures": [{"begin": "<f>", "schema": {"const": lowest}, "end": "</f>"}],
            "triggers": ["<f>"],
        })),
    ];
    for constraint in refused {
        let err = compiler().compile(&StructuredOutputs::new(constraint.clone())).err();
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("-2^63"), "{constraint:?}: {message:?}");
    }
    // The lowest integers llguidance can bound, and the same literals outside `%json`, still compile.
    let kept = [
        Constraint::Json(json!({"const": -9223372036854774784i64})),
        Constraint::Json(json!({"type": "integer", "minimum": -9223372036854774784i64, "maximum": 0})),
        Constraint::Grammar("start: \"-9223372036854775808\"".into()),
        Constraint::Regex("-9223372036854775808".into()),
    ];
    for constraint in kept {
        let compiled = compiler().compile(&StructuredOutputs::new(constraint.clone()));
        assert!(compiled.is_ok(), "{constraint:?}: {:?}", compiled.err());
    }
}
