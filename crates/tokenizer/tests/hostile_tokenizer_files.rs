//! `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` from strangers (issue
//! 34). Each case takes a fixture checkpoint's three files, sets one key (up to three levels
//! deep: special tokens, the template, normalizer and pre-tokenizer settings, vocabulary and
//! merges entries, eos/bos ids) to a hostile value, and builds the tokenizer. It is refused with
//! an error or built; a built one encodes, decodes (ids in and out of its vocabulary) and
//! renders its chat template without a panic.
//!
//! The seeds are byte-level BPE and WordPiece tokenizers with the fixture
//! models' special-token and generation settings. 256 cases by default; `PROPTEST_CASES=N` runs more (`scripts/fuzz.sh`).

use std::path::Path;
use std::sync::OnceLock;

use ferrite_tokenizer::{ChatMessage, Tokenizer};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The three files of each fixture checkpoint that has a `tokenizer.json`, parsed.
fn checkpoints() -> &'static [[Value; 3]] {
    static FILES: OnceLock<Vec<[Value; 3]>> = OnceLock::new();
    FILES.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
        let mut dirs: Vec<_> = std::fs::read_dir(root.join("models")).unwrap().map(|e| e.unwrap().path()).collect();
        dirs.sort();
        // Byte-level BPE (the fixtures' and the 1000-token test tokenizer) and WordPiece.
        dirs.extend(["tokenizer", "pooling/bert-rerank"].map(|d| root.join(d)));
        let read = |p: &Path| std::fs::read_to_string(p).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let mut seen = std::collections::HashSet::new();
        dirs.iter()
            .filter_map(|d| {
                let files = [
                    read(&d.join("tokenizer.json"))?,
                    read(&d.join("tokenizer_config.json")).unwrap_or(Value::Null),
                    read(&d.join("generation_config.json")).unwrap_or(Value::Null),
                ];
                // Many fixtures share one tokenizer; each distinct set once.
                seen.insert(files.iter().map(Value::to_string).collect::<String>()).then_some(files)
            })
            .collect()
    })
}

/// Key paths of `value` up to three levels, array elements included (the first few of each).
fn paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    if prefix.len() == 3 {
        return;
    }
    let children: Vec<(Step, &Value)> = match value {
        Value::Object(m) => m.iter().take(64).map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
        Value::Array(a) => a.iter().take(8).enumerate().map(|(i, v)| (Step::Index(i), v)).collect(),
        _ => return,
    };
    for (step, child) in children {
        prefix.push(step);
        out.push(prefix.clone());
        paths(child, prefix, out);
        prefix.pop();
    }
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn slot<'a>(mut value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    for step in path {
        value = match step {
            Step::Key(k) => &mut value[k.as_str()],
            Step::Index(i) => &mut value[*i],
        };
    }
    value
}

fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(null)),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e308)),
        Just(json!(0.5)),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("<s>")),
        Just(json!("{{ raise_exception('x') }}")),
        Just(json!("{% for m in messages %}{{ m.content[::-1] }}{% endfor %}")),
        Just(json!("\u{0}\u{FFFF}")),
        Just(json!([])),
        Just(json!([u64::MAX, -1, "x"])),
        Just(json!({})),
        Just(json!({"content": 5, "special": "yes"})),
        Just(json!([{"name": "default", "template": 7}])),
        "\\PC{0,12}".prop_map(Value::from),
        (0u64..70_000).prop_map(Value::from),
    ]
}

proptest! {
    #[test]
    fn poisoned_tokenizer_files_load_or_are_refused(
        which in any::<prop::sample::Index>(),
        file in 0usize..3,
        pick in any::<prop::sample::Index>(),
        value in hostile_value(),
        ids in prop::collection::vec(any::<u32>().prop_map(|i| i % 70_000), 0..8),
    ) {
        let mut files = checkpoints()[which.index(checkpoints().len())].clone();
        let mut found = Vec::new();
        paths(&files[file], &mut Vec::new(), &mut found);
        match found.is_empty() {
            true => files[file] = value,
            false => *slot(&mut files[file], &found[pick.index(found.len())]) = value,
        }
        let json = files[0].to_string();
        let generation = (!files[2].is_null()).then_some(&files[2]);
        let Ok(tok) = Tokenizer::from_parts(&json, &files[1], generation, None) else { return Ok(()) };
        let _ = tok.encode("Hello world <s> </s> <|im_start|>", true);
        let _ = tok.encode_pair("a b", "c", Some(4));
        let _ = tok.decode(&ids, true);
        let _ = tok.decode(&ids, false);
        for &id in &ids {
            let _ = tok.id_to_token(id);
        }
        let _ = tok.apply_chat_template(&[ChatMessage::new("user", "hi")], true);
    }
}

#[test]
fn the_seed_corpus_has_several_tokenizers() {
    assert!(checkpoints().len() >= 3, "{} distinct tokenizers", checkpoints().len());
}
