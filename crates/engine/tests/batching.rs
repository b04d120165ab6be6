//! Scheduling must never change what a request generates: concurrency, chunked prefill,
//! prefix-cache hits and preemption all give the tokens a lone request gets.

mod common;

use common::*;
use ferrite_engine::{EngineConfig, PromptInput};

#[test]
fn concurrent_mixed_lengths_match_solo_runs() {
    let llm = llm("llama", config());
    let prompts = battery("llama");
    let params = greedy(24);
    let alone = solo(&llm, &prompts, &params);
    let together = token_ids(&llm.generate(prompts, &params).unwrap());
    assert_eq!(together, alone);
}

#[test]
fn chunked_prefill_matches_whole_prefill() {
    for name in ["llama", "mistral"] {
        let prompts = battery(name);
        let params = greedy(16);
        let reference = token_ids(&llm(name, config()).generate(prompts.clone(), &params).unwrap());
        // 7 tokens a step: chunks straddle block boundaries and, for mistral, the sliding window.
        let chunked = llm(name, EngineConfig { max_num_batched_tokens: 7, ..config() });
        assert_eq!(token_ids(&chunked.generate(prompts, &params).unwrap()), reference, "{name}");
    }
}

#[test]
fn prefix_cache_hit_gives_the_cold_output_and_moves_the_counters() {
    let llm = llm("llama", config());
    let client = llm.client();
    let long = oracle("llama").cases.iter().find(|c| c.name == "code_300").unwrap().prompt_ids.clone();
    let params = greedy(16);
    let cold = llm.generate(vec![PromptInput::Tokens(long.clone())], &params).unwrap();
    assert_eq!(cold[0].num_cached_tokens, 0);
    let before = client.stats();
    let warm = llm.generate(vec![PromptInput::Tokens(long.clone())], &params).unwrap();
    let after = client.stats();
    assert_eq!(token_ids(&warm), token_ids(&cold));
    // Every full block but the one holding the last prompt token (always recomputed).
    let expected_hit = (long.len() - 1) / 16 * 16;
    assert_eq!(warm[0].num_cached_tokens, expected_hit);
    assert_eq!(after.prefix_cache_hits - before.prefix_cache_hits, expected_hit as u64);
    assert_eq!(after.prefix_cache_queries - before.prefix_cache_queries, long.len() as u64);

    // A prompt sharing only a prefix reuses it and still matches a cache-free engine.
    let mut branched = long[..100].to_vec();
    branched.extend_from_slice(&long[200..260]);
    let hit = llm.generate(vec![PromptInput::Tokens(branched.clone())], &params).unwrap();
    assert_eq!(hit[0].num_cached_tokens, 96);
    let uncached = common::llm("llama", ferrite_engine::EngineConfig { enable_prefix_caching: false, ..config() });
    assert_eq!(token_ids(&hit), token_ids(&uncached.generate(vec![PromptInput::Tokens(branched)], &params).unwrap()));
}

#[test]
fn full_prompt_hit_still_computes_the_last_token() {
    let llm = llm("llama", config());
    // 32 tokens: exactly two blocks, so a full hit would leave nothing to compute.
    let prompt: Vec<u32> = oracle("llama").cases[5].prompt_ids[..32].to_vec();
    let params = greedy(8);
    let first = llm.generate(vec![PromptInput::Tokens(prompt.clone())], &params).unwrap();
    let second = llm.generate(vec![PromptInput::Tokens(prompt)], &params).unwrap();
    assert_eq!(second[0].num_cached_tokens, 16);
    assert_eq!(token_ids(&second), token_ids(&first));
}

#[test]
fn preemption_under_a_tiny_cache_keeps_outputs() {
    let prompts: Vec<PromptInput> = battery("llama").into_iter().take(6).collect();
    let params = greedy(32);
    let reference = token_ids(&llm("llama", config()).generate(prompts.clone(), &params).unwrap());
    // 10 blocks = 160 slots: any one request fits (the longest needs 95 + 31), all together do not.
    let tiny = llm("llama", EngineConfig { kv_cache_memory: kv_memory("llama", 10), ..config() });
    let client = tiny.client();
    assert_eq!(client.cache_config().num_blocks, 10);
    let outputs = tiny.generate(prompts, &params).unwrap();
    assert_eq!(token_ids(&outputs), reference);
    let stats = client.stats();
    assert!(stats.num_preemptions > 0, "the tiny cache should have forced preemption: {stats:?}");
    wait_idle(&client);
}

#[test]
fn max_num_seqs_bounds_the_batch_without_changing_outputs() {
    let prompts = battery("qwen3");
    let params = greedy(12);
    let reference = token_ids(&llm("qwen3", config()).generate(prompts.clone(), &params).unwrap());
    let narrow = llm("qwen3", EngineConfig { max_num_seqs: 2, max_num_batched_tokens: 64, ..config() });
    assert_eq!(token_ids(&narrow.generate(prompts, &params).unwrap()), reference);
}
