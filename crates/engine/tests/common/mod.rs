//! Shared helpers: fixture engines and oracle batteries.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ferrite_engine::{EngineClient, EngineConfig, PromptInput, RequestOutput, SamplingParams, LLM};
use ferrite_tensor::DType;
use ferrite_testing::gate::{fixtures_dir, Oracle};

pub fn fixture(name: &str) -> PathBuf {
    let dir = fixtures_dir().join("models").join(name);
    assert!(dir.join("oracle.json").exists(), "fixture {name} is missing at {}", dir.display());
    dir
}

pub fn oracle(name: &str) -> Oracle {
    Oracle::load(&fixture(name).join("oracle.json")).expect("oracle.json")
}

/// A small cache: the fixtures need only a few MiB.
pub fn config() -> EngineConfig {
    EngineConfig { kv_cache_memory: 16 << 20, ..Default::default() }
}

/// KV bytes of `blocks` blocks of 16 tokens for a fixture (f32 keys and values, all layers).
pub fn kv_memory(name: &str, blocks: usize) -> usize {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
    let get = |k: &str| cfg.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
    let heads = get("num_attention_heads").unwrap();
    let head_dim = get("head_dim").unwrap_or(get("hidden_size").unwrap() / heads);
    let kv_heads = get("num_key_value_heads").unwrap_or(heads);
    get("num_hidden_layers").unwrap() * kv_heads * head_dim * 2 * 4 * 16 * blocks
}

pub fn llm(name: &str, config: EngineConfig) -> LLM {
    LLM::new(fixture(name), DType::F32, config).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Each case's prompt (see [`prompt_input`]).
pub fn battery(name: &str) -> Vec<PromptInput> {
    oracle(name).cases.iter().map(|c| prompt_input(name, c)).collect()
}

/// A case's prompt ids, with its images and videos (processed pixels from the fixture) where it
/// has some.
pub fn prompt_input(name: &str, case: &ferrite_testing::gate::OracleCase) -> PromptInput {
    if case.images.is_empty() {
        return PromptInput::Tokens(case.prompt_ids.clone());
    }
    let dir = fixture(name);
    let visuals = case
        .images
        .iter()
        .map(|image| {
            let (pixels, grid) = image.load(&dir).unwrap();
            // The pixels' own hash: equal images share prefix-cache blocks.
            let hash = pixels
                .iter()
                .fold(0xcbf29ce484222325u64, |h, v| (h ^ u64::from(v.to_bits())).wrapping_mul(0x100000001b3));
            ferrite_engine::VisualInput {
                visual: grid.visual,
                pixel_values: pixels.into(),
                grid_thw: grid.grid_thw,
                hash,
            }
        })
        .collect();
    PromptInput::Multimodal { tokens: case.prompt_ids.clone(), visuals }
}

/// Greedy with EOS ignored: the oracle's decoding.
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }
}

/// Temperature, top-p, top-k and min-p all active.
pub fn random(seed: Option<u64>, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 200,
        min_p: 0.01,
        seed,
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// On an engine over the llama fixture: a seeded request draws the same tokens alone and
/// batched among others (unseeded ones included), another seed draws others, and sampling
/// departs from greedy.
pub fn assert_seeded_sampling_is_batch_independent(llm: &LLM) {
    let prompt = |i: usize| battery("llama")[i].clone();
    let alone = token_ids(&llm.generate(vec![prompt(2)], &random(Some(42), 24)).unwrap());
    let client = llm.client();
    let mut others: Vec<_> =
        (3..7).map(|i| client.add_request(format!("other-{i}"), prompt(i), random(None, 40)).unwrap()).collect();
    let batched = token_ids(&llm.generate(vec![prompt(2)], &random(Some(42), 24)).unwrap());
    for s in &mut others {
        while s.blocking_next().is_some() {}
    }
    assert_eq!(batched, alone);
    let other_seed = token_ids(&llm.generate(vec![prompt(2)], &random(Some(43), 24)).unwrap());
    assert_ne!(other_seed, alone, "different seeds should give different samples");
    let greedy_out = token_ids(&llm.generate(vec![prompt(2)], &greedy(24)).unwrap());
    assert_ne!(greedy_out, alone, "temperature 0.9 should depart from greedy");
}

pub fn token_ids(outputs: &[RequestOutput]) -> Vec<Vec<u32>> {
    outputs.iter().map(|o| o.outputs[0].token_ids.clone()).collect()
}

/// Each prompt run alone, one after another.
pub fn solo(llm: &LLM, prompts: &[PromptInput], params: &SamplingParams) -> Vec<Vec<u32>> {
    prompts.iter().map(|p| token_ids(&llm.generate(vec![p.clone()], params).unwrap())[0].clone()).collect()
}

/// Waits until the engine holds no request and no KV block (requests finish asynchronously).
pub fn wait_idle(client: &EngineClient) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = client.stats();
        if s.num_running == 0 && s.num_waiting == 0 && s.kv_blocks_used == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "engine did not go idle: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
