//! `config.json` from strangers: every key of real fixtures' configs set to hostile values
//! (zero, negative, wrong type, null, out-of-range) must give a load error or a model, never a
//! panic or an allocation the checkpoint does not back. What a run finds becomes a regression
//! case in `proptest-regressions/`; `PROPTEST_CASES=100000 cargo test -p ferrite-models --test
//! hostile_configs` is the longer run.
//!
//! `every_key_set_huge` sets each key in turn to sizes near `u64::MAX` (overflowing products,
//! allocations no file backs); loaders refuse them through `check_dims`.

use std::path::{Path, PathBuf};

use ferrite_models::{load_model, LoadOptions};
use ferrite_testing::gate::fixtures_dir;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Fixtures whose configs span the loaders: dense, sliding, per-type rope, MoE, MLA, NoPE,
/// chunked attention, fused projections.
const FIXTURES: &[&str] = &[
    "llama",
    "gemma3",
    "phi3-longrope",
    "falcon-new-arch",
    "deepseek-v3",
    "deepseek-v32",
    "qwen3-moe",
    "cohere2",
    "olmo3",
    "smollm3",
    "glm4-moe",
    "hunyuan-moe",
    "llama4",
    "minicpm3",
    "granite-moe-shared",
    "apertus",
    "gpt-neox",
    "gpt_oss_mxfp4",
    "gemma4",
    "gemma3n",
    "internlm2",
    "minicpm",
    "chatglm",
    "qwen3-next",
    "qwen3_5-conditional",
    "mamba",
    "falcon-mamba",
    "jamba",
    "olmo-hybrid",
    "mamba2",
    "nemotron-h",
    "granite-moe-hybrid",
    "falcon-h1",
    "falcon-h1-tiny",
    "zamba2",
    "zamba2-tied",
    "kimi-linear",
];

fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1u64 << 25)),
        Just(json!(u64::MAX)),
        Just(json!(-1e308)),
        Just(json!(0.5)),
        Just(json!("x")),
        Just(json!(null)),
        Just(json!([])),
        Just(json!({})),
        Just(json!(true)),
        Just(json!([0, 1u64 << 25])),
        (0u64..70).prop_map(|v| json!(v)),
    ]
}

/// Every key of `config`, nested objects' keys included (two levels: rope sections and their
/// per-layer-type entries).
fn key_paths(config: &Value) -> Vec<Vec<String>> {
    let mut paths: Vec<Vec<String>> = Vec::new();
    if let Some(obj) = config.as_object() {
        for (k, v) in obj {
            paths.push(vec![k.clone()]);
            if let Some(inner) = v.as_object() {
                for (k2, v2) in inner {
                    paths.push(vec![k.clone(), k2.clone()]);
                    if let Some(inner2) = v2.as_object() {
                        paths.extend(inner2.keys().map(|k3| vec![k.clone(), k2.clone(), k3.clone()]));
                    }
                }
            }
        }
    }
    paths
}

/// Sets the `pick`-th key of [`key_paths`] to `value`.
fn poison(config: &mut Value, pick: usize, value: Value) {
    let paths = key_paths(config);
    let path = &paths[pick % paths.len()];
    let mut slot = config;
    for key in path {
        slot = &mut slot[key.as_str()];
    }
    *slot = value;
}

fn scratch_copy(fixture: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dst = std::env::temp_dir().join(format!("ferrite-hostile-config-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dst).unwrap();
    let src = fixtures_dir().join("models").join(fixture);
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        if src.join(f).exists() {
            // The weights are only read: a link keeps each case cheap.
            if f == "model.safetensors" {
                std::os::unix::fs::symlink(src.join(f), dst.join(f)).unwrap();
            } else {
                std::fs::copy(src.join(f), dst.join(f)).unwrap();
            }
        }
    }
    dst
}

fn load(dir: &Path) -> Result<(), String> {
    let opts = LoadOptions { progress: false, ..LoadOptions::default() };
    load_model(dir, &opts).map(|_| ()).map_err(|e| e.to_string())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(400), ..ProptestConfig::default() })]
    #[test]
    fn poisoned_configs_fail_cleanly(
        fixture in 0..FIXTURES.len(),
        poisons in proptest::collection::vec((any::<usize>(), hostile_value()), 1..3),
    ) {
        let dir = scratch_copy(FIXTURES[fixture]);
        let path = dir.join("config.json");
        let mut config = ferrite_models::loading::config::RawConfig::from_file(&path).unwrap().value;
        for (pick, value) in poisons {
            poison(&mut config, pick, value);
        }
        std::fs::write(&path, config.to_string()).unwrap();
        let outcome = load(&dir);
        std::fs::remove_dir_all(&dir).ok();
        if let Err(message) = outcome {
            prop_assert!(!message.is_empty());
        }
    }
}

#[test]
fn every_fixture_loads_unpoisoned() {
    for fixture in FIXTURES {
        let dir = scratch_copy(fixture);
        let outcome = load(&dir);
        std::fs::remove_dir_all(&dir).ok();
        outcome.unwrap_or_else(|e| panic!("{fixture}: {e}"));
    }
}

#[test]
fn every_key_set_huge() {
    let mut failures = Vec::new();
    for fixture in FIXTURES {
        let path = fixtures_dir().join("models").join(fixture).join("config.json");
        let base: Value = ferrite_models::loading::config::RawConfig::from_file(&path).unwrap().value;
        for pick in 0..key_paths(&base).len() {
            for v in [json!(1u64 << 40), json!(u64::MAX), json!(1e308), json!([0, 1u64 << 40])] {
                let dir = scratch_copy(fixture);
                let mut c = base.clone();
                poison(&mut c, pick, v.clone());
                std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
                let outcome = std::panic::catch_unwind(|| load(&dir));
                std::fs::remove_dir_all(&dir).ok();
                if outcome.is_err() {
                    failures.push(format!("{fixture} pick {pick} = {v}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} panics:\n{}", failures.len(), failures.join("\n"));
}
