//! Token-exact greedy parity with transformers on CPU, one test per oracle fixture
//! (regenerate fixtures with `tools/oracle/generate_fixtures.py`, see tools/oracle/README.md).

use std::path::Path;

use ferrite_models::gate::{fixtures_dir, run_fixture, summarize};
use ferrite_tensor::DType;

/// Logprobs of the oracle's top-5 tokens agree to this many nats (f32 on both sides; the
/// difference is accumulation order only).
const LOGPROB_TOLERANCE: f32 = 2e-3;

fn gate(name: &str, dtype: DType) {
    let dir = fixtures_dir().join("models").join(name);
    assert!(Path::new(&dir).join("oracle.json").exists(), "fixture {name} is missing at {}", dir.display());
    let (oracle, reports) = run_fixture(&dir, dtype).unwrap_or_else(|e| panic!("{name}: {e}"));
    println!("{name} ({}) {dtype}: {}", oracle.architecture, summarize(&reports));
    for r in &reports {
        assert!(r.strict, "{name}/{}: diverged from the oracle at {:?}", r.name, r.divergence);
        if dtype == DType::F32 {
            assert!(r.max_logprob_error < LOGPROB_TOLERANCE, "{name}/{}: logprob error {}", r.name, r.max_logprob_error);
        }
    }
    assert!(reports.len() >= 8, "{name}: battery has only {} prompts", reports.len());
}

macro_rules! parity {
    ($($test:ident => $fixture:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            gate($fixture, DType::F32);
        }
    )*};
}

parity! {
    llama => "llama",
    llama_tied_llama3_rope => "llama-tied-llama3rope",
    llama_linear_rope => "llama-linear-rope",
    llama_dynamic_rope => "llama-dynamic-rope",
    llama_yarn_rope => "llama-yarn-rope",
    mistral_sliding_window => "mistral",
    qwen2 => "qwen2",
    qwen3 => "qwen3",
}
