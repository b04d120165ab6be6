//! Constraints compiled over a real byte-level BPE vocabulary (the repo's 1000-token test
//! tokenizer): what the masks allow spells only strings of the constraint's language.

use std::path::Path;

use ferrite_structured::{
    Constraint, GrammarCompiler, JsonOptions, StructuredError, StructuredOutputs, TokenConstraint,
};
use ferrite_tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

const VOCAB: usize = 1024;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tokenizer")).unwrap()
}

fn compiler(tok: &Tokenizer) -> GrammarCompiler {
    GrammarCompiler::new(tok, VOCAB, tok.eos_token_ids(), JsonOptions::default()).unwrap()
}

fn allowed(c: &mut TokenConstraint) -> Vec<u32> {
    let mut words = vec![0u32; ferrite_structured::mask_words(VOCAB)];
    c.fill_mask(&mut words);
    (0..VOCAB as u32).filter(|&t| words[t as usize / 32] >> (t % 32) & 1 == 1).collect()
}

/// Draws tokens among those allowed until only EOS is (or `limit` tokens); returns the text.
fn random_walk(tok: &Tokenizer, c: &mut TokenConstraint, rng: &mut StdRng, limit: usize) -> Option<String> {
    let eos = tok.eos_token_ids();
    let mut ids = Vec::new();
    for _ in 0..limit {
        let ok = allowed(c);
        assert!(!ok.is_empty(), "a mask allowed nothing after {:?}", tok.decode(&ids, false));
        let text: Vec<u32> = ok.iter().copied().filter(|t| !eos.contains(t)).collect();
        if text.is_empty() || (ok.len() > text.len() && rng.random_bool(0.3)) {
            return Some(tok.decode(&ids, false).unwrap());
        }
        let t = text[rng.random_range(0..text.len())];
        c.accept(t);
        ids.push(t);
    }
    None
}

/// Feeds `text`'s tokens; returns how many the masks allowed before the first refused one.
fn feed(tok: &Tokenizer, c: &mut TokenConstraint, text: &str) -> (usize, usize) {
    let ids = tok.encode(text, false).unwrap();
    for (i, &t) in ids.iter().enumerate() {
        if !allowed(c).contains(&t) {
            return (i, ids.len());
        }
        c.accept(t);
    }
    (ids.len(), ids.len())
}

fn spec(c: Constraint) -> StructuredOutputs {
    StructuredOutputs::new(c)
}

#[test]
fn a_json_schema_allows_matching_documents_and_refuses_others() {
    let tok = tokenizer();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let grammar = compiler(&tok).compile(&spec(Constraint::Json(schema))).unwrap();
    let mut c = grammar.start();
    let (ok, all) = feed(&tok, &mut c, r#"{"name": "Ada", "age": 36}"#);
    assert_eq!(ok, all);
    assert!(c.is_finished() || allowed(&mut c).contains(&tok.eos_token_ids()[0]));
    let mut c = grammar.start();
    let (ok, all) = feed(&tok, &mut c, r#"{"name": "Ada", "age": "old"}"#);
    assert!(ok < all, "a string age must be refused");
}

#[test]
fn random_walks_stay_inside_regex_and_choice_languages() {
    let tok = tokenizer();
    let compiler = compiler(&tok);
    let mut rng = StdRng::seed_from_u64(7);
    let regex = compiler.compile(&spec(Constraint::Regex("[0-9]{3}-[a-z]{1,4}".into()))).unwrap();
    let choices = vec!["red".to_string(), "green".into(), "blue sky".into()];
    let choice = compiler.compile(&spec(Constraint::Choice(choices.clone()))).unwrap();
    for _ in 0..20 {
        let text = random_walk(&tok, &mut regex.start(), &mut rng, 20).unwrap();
        let (digits, letters) = text.split_once('-').unwrap_or_else(|| panic!("{text:?}"));
        assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!((1..=4).contains(&letters.len()) && letters.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");
        let text = random_walk(&tok, &mut choice.start(), &mut rng, 20).unwrap();
        assert!(choices.contains(&text), "{text:?}");
    }
}

#[test]
fn json_object_walks_parse_as_objects() {
    let tok = tokenizer();
    let grammar = compiler(&tok).compile(&spec(Constraint::JsonObject)).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let mut finished = 0;
    for _ in 0..20 {
        let mut c = grammar.start();
        if let Some(text) = random_walk(&tok, &mut c, &mut rng, 60) {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object(), "{text:?}");
            finished += 1;
        }
    }
    assert!(finished > 0);
}

#[test]
fn a_finished_grammar_allows_only_eos_and_padding_never() {
    let tok = tokenizer();
    let grammar = compiler(&tok).compile(&spec(Constraint::Choice(vec!["yes".into()]))).unwrap();
    let mut c = grammar.start();
    assert!(allowed(&mut c).iter().all(|&t| (t as usize) < 1000), "ids past the tokenizer are placeholders");
    feed(&tok, &mut c, "yes");
    assert!(c.is_finished());
    assert_eq!(allowed(&mut c), tok.eos_token_ids().to_vec());
}

#[test]
fn whitespace_can_be_disabled_by_the_server_or_the_request() {
    let tok = tokenizer();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let loose = compiler(&tok).compile(&spec(Constraint::Json(schema.clone()))).unwrap();
    assert_eq!(feed(&tok, &mut loose.start(), r#"{ "a" : 1 }"#).0, tok.encode(r#"{ "a" : 1 }"#, false).unwrap().len());
    let request = StructuredOutputs {
        constraint: Constraint::Json(schema),
        options: JsonOptions { disable_any_whitespace: true, ..Default::default() },
    };
    let tight = compiler(&tok).compile(&request).unwrap();
    let (ok, all) = feed(&tok, &mut tight.start(), r#"{ "a" : 1 }"#);
    assert!(ok < all);
    let (ok, all) = feed(&tok, &mut tight.start(), r#"{"a":1}"#);
    assert_eq!(ok, all);
}

#[test]
fn bad_constraints_are_the_request_s_error_with_the_compiler_s_message() {
    let tok = tokenizer();
    let compiler = compiler(&tok);
    for (constraint, needle) in [
        (Constraint::Regex("[0-9".into()), "regex"),
        (Constraint::Json(json!({"type": "no-such-type"})), "no-such-type"),
        (Constraint::Grammar("start: missing_rule".into()), "missing_rule"),
    ] {
        match compiler.compile(&spec(constraint.clone())) {
            Err(StructuredError::Invalid(m)) => assert!(m.to_lowercase().contains(needle), "{constraint:?}: {m}"),
            other => panic!("{constraint:?}: {:?}", other.map(|_| ())),
        }
    }
}

/// Hostile constraints: llguidance's limits (grammar size, lexer fuel and states) refuse them
/// as the request's error, quickly, instead of compiling for ever or taking the memory.
#[test]
fn oversized_constraints_are_refused_quickly() {
    let tok = tokenizer();
    let compiler = compiler(&tok);
    // As deep as a request body can nest: serde_json refuses JSON past 128 levels.
    let mut nested = json!({"type": "integer"});
    for _ in 0..60 {
        nested = json!({"type": "array", "items": nested});
    }
    let huge_enum = json!({"enum": (0..300_000).map(|i| format!("value-{i}")).collect::<Vec<_>>()});
    for (constraint, refused) in [
        (Constraint::Json(nested), false),
        (Constraint::Json(huge_enum), true),
        (Constraint::Regex("((a|b|c|d|e|f|g|h)[0-9]{1,20}){1000}".into()), false),
    ] {
        let start = std::time::Instant::now();
        let result = compiler.compile(&spec(constraint));
        let took = start.elapsed();
        assert!(took < std::time::Duration::from_secs(30), "{took:?}");
        match result {
            Err(StructuredError::Invalid(m)) => assert!(refused && m.contains("too big"), "{m}"),
            Err(e) => panic!("{e}"),
            Ok(_) => assert!(!refused, "a 300000-value enum compiled"),
        }
    }
}
