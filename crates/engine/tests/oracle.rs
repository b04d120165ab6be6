//! The oracle battery through the full engine: every prompt of a fixture submitted at once,
//! batched by the scheduler, greedy; token-exact against transformers, and the top-5 logprobs
//! within the parity gate's tolerance.

mod common;

use common::*;
use ferrite_engine::PromptInput;

const LOGPROB_TOLERANCE: f32 = 2e-3;

fn battery_matches_oracle(name: &str) {
    battery_matches_oracle_with(name, config());
}

fn battery_matches_oracle_with(name: &str, config: ferrite_engine::EngineConfig) -> ferrite_engine::LLM {
    let llm = llm(name, config);
    assert_battery_matches_oracle(&llm, name);
    llm
}

/// The battery batched, through 20-token chunks that cut into images, and twice more with prefix
/// caching, where the second run must hit blocks over its images.
fn battery_batched_chunked_and_cached(name: &str) {
    battery_matches_oracle(name);
    battery_matches_oracle_with(name, ferrite_engine::EngineConfig { max_num_batched_tokens: 20, ..config() });
    let cached = ferrite_engine::EngineConfig { enable_prefix_caching: true, max_num_batched_tokens: 20, ..config() };
    let engine = llm(name, cached);
    assert_battery_matches_oracle(&engine, name);
    let hits = engine.client().stats().prefix_cache_hits;
    assert_battery_matches_oracle(&engine, name);
    assert!(
        engine.client().stats().prefix_cache_hits > hits,
        "{name}: the second run should hit blocks over its images"
    );
}

fn assert_battery_matches_oracle(llm: &ferrite_engine::LLM, name: &str) {
    let oracle = oracle(name);
    let params = ferrite_engine::SamplingParams { logprobs: Some(5), ..greedy(oracle.cases[0].output_ids.len()) };
    let outputs = llm.generate(battery(name), &params).unwrap();
    assert_eq!(outputs.len(), oracle.cases.len());
    let mut max_err = 0.0f32;
    for (case, out) in oracle.cases.iter().zip(&outputs) {
        let seq = &out.outputs[0];
        assert_eq!(seq.token_ids, case.output_ids, "{name}/{}: tokens differ from the oracle", case.name);
        assert_eq!(&*out.prompt_token_ids, case.prompt_ids.as_slice());
        let logprobs = seq.logprobs.as_ref().expect("logprobs requested");
        assert_eq!(logprobs.len(), case.output_ids.len());
        for (step, (ours, want)) in logprobs.iter().zip(&case.top_logprobs).enumerate() {
            assert_eq!(ours.rank, 1, "{name}/{}: greedy token not ranked first at step {step}", case.name);
            assert_eq!(ours.top.len(), 5);
            for &(id, lp) in want {
                let got = ours.top.iter().find(|t| t.0 == id).unwrap_or_else(|| {
                    panic!("{name}/{} step {step}: oracle top-5 token {id} not in ours {:?}", case.name, ours.top)
                });
                max_err = max_err.max((got.1 - lp).abs());
            }
        }
    }
    println!("{name}: {} cases token-exact, max top-5 logprob error {max_err:.2e}", outputs.len());
    assert!(max_err < LOGPROB_TOLERANCE, "{name}: logprob error {max_err}");
}

/// Images through the engine: the battery batched, then with 20-token chunks that cut prompts
/// inside their images (each chunk reads its rows of the image's embeddings), then with prefix
/// caching run twice (the second run hits blocks over images: a hit equals a cold run).
#[test]
fn vision_language_batches_chunks_and_caches_images() {
    let name = "qwen2-vl";
    battery_matches_oracle(name);
    battery_matches_oracle_with(name, ferrite_engine::EngineConfig { max_num_batched_tokens: 20, ..config() });
    let cached = ferrite_engine::EngineConfig { enable_prefix_caching: true, max_num_batched_tokens: 20, ..config() };
    let llm = llm(name, cached);
    // The same prompts over other images first: their blocks must not serve the real ones.
    let others: Vec<PromptInput> = battery(name)
        .into_iter()
        .map(|p| match p {
            PromptInput::Multimodal { tokens, visuals } => {
                let visuals = visuals
                    .into_iter()
                    .map(|i| ferrite_engine::VisualInput {
                        pixel_values: i.pixel_values.iter().map(|v| -v).collect(),
                        hash: !i.hash,
                        ..i
                    })
                    .collect();
                PromptInput::Multimodal { tokens, visuals }
            }
            text => text,
        })
        .collect();
    llm.generate(others, &greedy(4)).unwrap();
    assert_battery_matches_oracle(&llm, name);
    let hits = llm.client().stats().prefix_cache_hits;
    assert_battery_matches_oracle(&llm, name);
    assert!(llm.client().stats().prefix_cache_hits > hits, "the second run should hit blocks over its images");
}

/// Qwen2.5-VL's windowed tower behind the same engine path, its images cut by 20-token chunks.
#[test]
fn qwen2_5_vl_batches_and_chunks_images() {
    battery_matches_oracle("qwen2.5-vl");
    battery_matches_oracle_with("qwen2.5-vl", ferrite_engine::EngineConfig { max_num_batched_tokens: 20, ..config() });
}

/// Qwen3-VL: DeepStack features follow their image's rows through batches, 20-token chunks and the
/// prefix cache; a video's temporal patches, each in a placeholder run of its own after its
/// timestamp text, are placed, encoded and cached one by one.
#[test]
fn qwen3_vl_carries_deepstack_through_chunks_and_the_prefix_cache() {
    battery_batched_chunked_and_cached("qwen3-vl");
}

/// Qwen3-VL-MoE: the same tower before sparse expert layers, batched and chunked.
#[test]
fn qwen3_vl_moe_batches_and_chunks_images() {
    battery_matches_oracle("qwen3-vl-moe");
    battery_matches_oracle_with(
        "qwen3-vl-moe",
        ferrite_engine::EngineConfig { max_num_batched_tokens: 20, ..config() },
    );
}

/// Qwen3.5 with images: a hybrid text model (recurrent Gated DeltaNet state beside the KV cache)
/// reading image embeddings and MRoPE positions, batched, through 20-token chunks (the state
/// carried across them) and from the prefix cache (a kept state resumed after a hit over images).
#[test]
fn qwen3_5_carries_images_through_recurrent_state() {
    battery_batched_chunked_and_cached("qwen3.5-vl");
}

/// LLaVA: 1-D positions, a CLIP tower, its images cut by chunks and served from the prefix cache.
#[test]
fn llava_batches_chunks_and_caches_images() {
    battery_batched_chunked_and_cached("llava");
}

/// LLaVA-NeXT: each image's embeddings (its whole-image tile, then its tiles' unpadded grid with a
/// newline per row) as many as its size makes them, cut by chunks and served from the prefix cache.
#[test]
fn llava_next_batches_chunks_and_caches_images() {
    battery_batched_chunked_and_cached("llava-next");
}

/// Mistral 3: each image's rows of `[IMG]` with `[IMG_BREAK]` between and `[IMG_END]` after are
/// one placeholder run whose `[IMG]` tokens take the image's embeddings and whose breaks keep their
/// own, cut by chunks (some covering only a break) and served from the prefix cache. A run that
/// does not follow its image's grid is refused.
#[test]
fn mistral3_batches_chunks_and_caches_images_between_row_breaks() {
    battery_batched_chunked_and_cached("mistral3");

    // The first image's first row closed by one more `[IMG]` instead of `[IMG_BREAK]`.
    let model_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("mistral3").join("config.json")).unwrap()).unwrap();
    let image = model_config["image_token_index"].as_u64().unwrap() as u32;
    let Some(PromptInput::Multimodal { mut tokens, visuals }) = battery("mistral3").into_iter().next() else {
        panic!("the first case has an image")
    };
    let start = tokens.iter().position(|&t| t == image).unwrap();
    let row_end = start + tokens[start..].iter().position(|&t| t != image).unwrap();
    tokens[row_end] = image;
    let engine = llm("mistral3", config());
    let err = engine.generate(vec![PromptInput::Multimodal { tokens, visuals }], &greedy(2)).unwrap_err().to_string();
    assert!(err.contains("each followed by one other token"), "{err}");
}

/// Gemma 3: each image's tokens attend to one another both ways, so the engine computes an image
/// within one chunk (20-token chunks stop before an image that does not fit) and a prefix hit that
/// ends inside an image computes the rest of it as one bidirectional piece; an image longer than a
/// step's token budget is refused.
#[test]
fn gemma3_keeps_each_image_in_one_chunk() {
    battery_batched_chunked_and_cached("gemma3-vl");

    let small = llm("gemma3-vl", ferrite_engine::EngineConfig { max_num_batched_tokens: 12, ..config() });
    let image_prompt = battery("gemma3-vl").into_iter().next().unwrap();
    let err = small.generate(vec![image_prompt], &greedy(2)).unwrap_err().to_string();
    assert!(err.contains("becomes 16 embeddings") && err.contains("--max-num-batched-tokens"), "{err}");
}

/// `--disable-chunked-mm-input` on a model that could split its images: chunks of 20 stop before
/// the images they cannot finish (still token-exact), and an image longer than a step is refused.
#[test]
fn disable_chunked_mm_input_keeps_images_whole() {
    let whole = |tokens| ferrite_engine::EngineConfig {
        disable_chunked_mm_input: true,
        max_num_batched_tokens: tokens,
        ..config()
    };
    battery_matches_oracle_with("qwen2-vl", whole(20));
    let small = llm("qwen2-vl", whole(8));
    let case = oracle("qwen2-vl").cases.into_iter().find(|c| c.name == "resized").unwrap();
    let err = small.generate(vec![prompt_input("qwen2-vl", &case)], &greedy(2)).unwrap_err().to_string();
    assert!(err.contains("becomes 12 embeddings") && err.contains("--disable-chunked-mm-input"), "{err}");
}

/// The encoder cache: the battery's images and videos are each encoded once however many prompts
/// bring them (the rest served from the cache, the tokens still the oracle's), and the sampled
/// sequences of an `n = 3` request share one encoding.
#[test]
fn images_are_encoded_once_per_content() {
    let name = "qwen2-vl";
    let uncached = ferrite_engine::EngineConfig { enable_prefix_caching: false, ..config() };
    let engine = battery_matches_oracle_with(name, uncached.clone());
    let items: Vec<(u64, [usize; 3])> = battery(name)
        .into_iter()
        .flat_map(|p| match p {
            PromptInput::Multimodal { visuals, .. } => visuals.into_iter().map(|v| (v.hash, v.grid_thw)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let distinct = items.iter().collect::<std::collections::HashSet<_>>().len() as u64;
    assert!(distinct < items.len() as u64, "the battery repeats an image");
    let stats = engine.client().stats().encoder_cache;
    assert_eq!((stats.encoded, stats.hits), (distinct, items.len() as u64 - distinct));

    let engine = llm(name, uncached);
    let case = oracle(name).cases.into_iter().find(|c| c.name == "two-images").unwrap();
    let params = ferrite_engine::SamplingParams { n: 3, ..random(Some(7), 8) };
    let out = engine.generate(vec![prompt_input(name, &case)], &params).unwrap();
    assert!(out[0].outputs.len() == 3 && out[0].outputs.iter().all(|o| o.token_ids.len() == 8));
    let stats = engine.client().stats().encoder_cache;
    assert_eq!((stats.encoded, stats.hits), (2, 4), "three sequences, two images, each encoded once");
}

/// Placeholder tokens the images do not fill, or images without placeholders, are the request's
/// error; a text-only model refuses images.
#[test]
fn image_placeholders_must_match_the_images() {
    let vl = llm("qwen2-vl", config());
    let client = vl.client();
    let PromptInput::Multimodal { tokens, visuals: images } = battery("qwen2-vl").swap_remove(0) else {
        panic!("an image case")
    };
    let params = greedy(4);
    let short = tokens.iter().copied().filter(|&t| t != 1002).chain([1002]).collect::<Vec<_>>();
    let err = client
        .process(PromptInput::Multimodal { tokens: short, visuals: images.clone() }, params.clone())
        .err()
        .expect("one placeholder for a 4-token image");
    assert!(err.to_string().contains("placeholder"), "{err}");
    let err = client
        .process(PromptInput::Multimodal { tokens: tokens.clone(), visuals: Vec::new() }, params.clone())
        .err()
        .expect("placeholders without an image");
    assert!(err.to_string().contains("placeholder"), "{err}");
    let text_only = llm("qwen2", config());
    let err = text_only
        .client()
        .process(PromptInput::Multimodal { tokens: vec![1, 2, 3], visuals: images.clone() }, params)
        .err()
        .expect("a text-only model");
    assert!(err.to_string().contains("does not accept image input"), "{err}");

    // A video fills video placeholders only, and a model without a video token refuses videos.
    let video: Vec<_> = images
        .iter()
        .map(|i| ferrite_engine::VisualInput {
            visual: ferrite_engine::Visual::Video { seconds_per_grid: 1.0 },
            ..i.clone()
        })
        .collect();
    let err = client
        .process(PromptInput::Multimodal { tokens: tokens.clone(), visuals: video.clone() }, greedy(4))
        .err()
        .expect("a video for image placeholders");
    assert!(err.to_string().contains("video 0 has no placeholder tokens"), "{err}");
    let err = llm("llava", config())
        .client()
        .process(PromptInput::Multimodal { tokens, visuals: video }, greedy(4))
        .err()
        .expect("LLaVA takes no video");
    assert!(err.to_string().contains("does not accept video input"), "{err}");
}

#[test]
fn llama() {
    battery_matches_oracle("llama");
}

#[test]
fn qwen3() {
    battery_matches_oracle("qwen3");
}

#[test]
fn mistral_sliding_window() {
    battery_matches_oracle("mistral");
}

#[test]
fn qwen2() {
    battery_matches_oracle("qwen2");
}

#[test]
fn llama_tied_llama3_rope() {
    battery_matches_oracle("llama-tied-llama3rope");
}

/// DeepSeek-V3.2 keeps its indexer's keys in the MLA cache rows: the battery batched, in 20-token
/// chunks (a chunk's queries score keys that earlier chunks cached), twice with prefix caching
/// (hits read cached indexer keys), and in a cache too small for the battery at once (preempted
/// requests write their keys again) meets the oracle.
#[test]
fn deepseek_v32_indexer_keys_live_in_the_paged_cache() {
    let name = "deepseek-v32";
    battery_batched_chunked_and_cached(name);
    // 48 blocks of 16 tokens, each token 2 layers x 4 heads x (32 key + 16 value) f32 columns (the
    // key rows: 24 MLA + 8 indexer): the longest request (648 + 16 tokens, 42 blocks) fits alone,
    // the battery does not.
    let tiny = ferrite_engine::EngineConfig {
        kv_cache_memory: 48 * 16 * 2 * 4 * (32 + 16) * 4,
        max_num_seqs: 16,
        max_num_batched_tokens: 64,
        ..config()
    };
    let llm = battery_matches_oracle_with(name, tiny);
    let client = llm.client();
    assert_eq!(client.cache_config().num_blocks, 48);
    let stats = client.stats();
    assert!(stats.num_preemptions > 0, "the tiny cache should have forced preemption: {stats:?}");
    wait_idle(&client);
}

/// Phi-3's generate drops its cache the first time a sequence outgrows LongRoPE's switch (256
/// here) during decode and runs the whole sequence again with the long factors; the engine
/// recomputes such a sequence too, in one step or (budget 96) in chunks that all use the long
/// factors.
#[test]
fn phi3_longrope_recomputes_a_sequence_that_decodes_past_the_switch() {
    battery_matches_oracle("phi3-longrope-switch");
    let chunked = ferrite_engine::EngineConfig { max_num_batched_tokens: 96, ..config() };
    battery_matches_oracle_with("phi3-longrope-switch", chunked);
}

/// PhiMoE's LongRoPE keeps its short factors but scales cos/sin by `long_mscale` past the switch,
/// and its generate recomputes there as Phi-3's does: the engine's recompute and chunked
/// prefill (budget 96) carry the scale of the whole sequence.
#[test]
fn phimoe_recomputes_past_the_switch_with_the_long_mscale() {
    battery_matches_oracle("phimoe-switch");
    let chunked = ferrite_engine::EngineConfig { max_num_batched_tokens: 96, ..config() };
    battery_matches_oracle_with("phimoe-switch", chunked.clone());
    battery_matches_oracle_with("phimoe", chunked);
}

/// LongRoPE picks its factors by sequence length (long past 256 positions in this fixture). With
/// prompts split into 96-token chunks, the first chunks of a 648-token prompt must still use the
/// factors of the whole prompt, as transformers (one forward per prompt) does; and a prompt that
/// shares a prefix with a shorter one must not reuse its keys, rotated with the short factors
/// (prefix caching is asked for here, and the engine turns it off for such models).
#[test]
fn phi3_longrope_with_chunked_prefill_and_shared_prefixes() {
    let chunked = ferrite_engine::EngineConfig { max_num_batched_tokens: 96, enable_prefix_caching: true, ..config() };
    battery_matches_oracle_with("phi3-longrope", chunked);
    let o = oracle("phi3-longrope");
    let llm = llm("phi3-longrope", ferrite_engine::EngineConfig { enable_prefix_caching: true, ..config() });
    for case in &o.cases {
        let out =
            llm.generate(vec![ferrite_engine::PromptInput::Tokens(case.prompt_ids.clone())], &greedy(16)).unwrap();
        assert_eq!(out[0].outputs[0].token_ids, case.output_ids, "{}: one request after another", case.name);
    }
}

/// Hybrid models (Gated DeltaNet and Mamba2 ones) batch the whole battery (prefills and decodes
/// of sequences with their own recurrent state in one step) token-exactly, also with prompts cut
/// into 24-token chunks, which split the 150-token prompt across the references' 64-token chunks
/// and carry the conv and recurrent states from one step to the next.
#[test]
fn recurrent_hybrids_batch_and_chunk_their_prompts() {
    for name in ["qwen3-next", "qwen3_5", "nemotron-h", "granite-moe-hybrid", "lfm2", "lfm2-moe"] {
        let llm = battery_matches_oracle_with(name, config());
        assert!(!llm.client().model_info().state_layers.is_empty(), "{name} has no recurrent layers");
        battery_matches_oracle_with(name, ferrite_engine::EngineConfig { max_num_batched_tokens: 24, ..config() });
    }
}

/// A cache too small for the battery at once: requests are preempted, lose their recurrent state
/// slot with their blocks, and recompute on return (from their first token, or from a state kept
/// for prefix hits).
#[test]
fn a_preempted_hybrid_request_recomputes_its_state() {
    let name = "qwen3-next";
    // 16 working slots of recurrent state (3 GDN layers) and 16 kept for prefix hits, then 48
    // blocks of the one attention layer: the longest request (648 + 16 tokens, 42 blocks) fits
    // alone, the battery (133 blocks) does not.
    let state = 2 * 16 * 3 * 4 * ((4 - 1) * 64 + 4 * 8 * 8);
    let blocks = 48 * 16 * 2 * 16 * 2 * 4;
    // 64-token chunks admit requests before their prompts are allocated whole, so running ones
    // run out of blocks mid-prompt and mid-decode.
    let tiny = ferrite_engine::EngineConfig {
        kv_cache_memory: state + blocks,
        max_num_seqs: 16,
        max_num_batched_tokens: 64,
        ..config()
    };
    let llm = battery_matches_oracle_with(name, tiny);
    let client = llm.client();
    assert_eq!((client.cache_config().num_blocks, client.cache_config().state_slots), (48, 16));
    let stats = client.stats();
    assert!(stats.num_preemptions > 0, "the tiny cache should have forced preemption: {stats:?}");
    wait_idle(&client);
}

/// Prefix caching on a hybrid model: a request's recurrent state is kept where its prompt's last
/// full block ends, so the battery run a second time restores kept states (every prompt longer
/// than a block hits) and still meets the oracle token for token.
#[test]
fn hybrid_prefix_hits_restore_kept_states() {
    let name = "qwen3-next";
    let llm = battery_matches_oracle_with(name, config());
    let client = llm.client();
    let cold = client.stats();
    assert_eq!(cold.prefix_cache_hits, 0, "a cold battery hit the cache: {cold:?}");
    let outputs = {
        let params = greedy(oracle(name).cases[0].output_ids.len());
        llm.generate(battery(name), &params).unwrap()
    };
    for (case, out) in oracle(name).cases.iter().zip(&outputs) {
        assert_eq!(out.outputs[0].token_ids, case.output_ids, "{name}/{}: a prefix hit changed tokens", case.name);
        let kept = (case.prompt_ids.len() - 1) / 16 * 16;
        assert_eq!(out.num_cached_tokens, kept, "{name}/{}: hit {} tokens", case.name, out.num_cached_tokens);
    }
    let warm = client.stats();
    println!("{name}: second battery hit {} of {} prompt tokens", warm.prefix_cache_hits, warm.prefix_cache_queries);
    wait_idle(&client);
}

/// A two-turn chat on a hybrid model: the second turn (first prompt, its answer, a new message)
/// resumes from the state kept after the first prompt and answers as a cold engine does.
#[test]
fn a_hybrid_second_turn_hits_the_first_turns_state() {
    let name = "qwen3_5";
    let oracle = oracle(name);
    let first = oracle.cases.iter().find(|c| c.prompt_ids.len() > 64).expect("a long case");
    let second: Vec<u32> =
        first.prompt_ids.iter().chain(&first.output_ids).chain(&oracle.cases[1].prompt_ids).copied().collect();
    let params = greedy(12);
    let cold = llm(name, ferrite_engine::EngineConfig { enable_prefix_caching: false, ..config() })
        .generate(vec![ferrite_engine::PromptInput::Tokens(second.clone())], &params)
        .unwrap();
    let warm = llm(name, config());
    warm.generate(vec![ferrite_engine::PromptInput::Tokens(first.prompt_ids.clone())], &greedy(first.output_ids.len()))
        .unwrap();
    let out = warm.generate(vec![ferrite_engine::PromptInput::Tokens(second)], &params).unwrap();
    assert_eq!(out[0].outputs[0].token_ids, cold[0].outputs[0].token_ids, "the hit changed the answer");
    let stats = warm.client().stats();
    let hit_rate = stats.prefix_cache_hits as f64 / stats.prefix_cache_queries as f64;
    println!("{name} two-turn chat: second turn hit {} tokens, hit rate {hit_rate:.2}", out[0].num_cached_tokens);
    assert_eq!(out[0].num_cached_tokens, (first.prompt_ids.len() - 1) / 16 * 16);
    assert!(hit_rate > 0.0);
}

/// A model of recurrent layers alone (Mamba2): no KV cache at all, the battery batched, chunked
/// (24-token steps) and run again on kept states, token-exact.
#[test]
fn mamba2_runs_without_a_kv_cache() {
    let name = "mamba2";
    let llm = battery_matches_oracle_with(name, config());
    let info = llm.client().model_info().clone();
    assert!(info.kv_layers.is_empty() && info.state_layers.len() == 3, "{info:?}");
    battery_matches_oracle_with(name, ferrite_engine::EngineConfig { max_num_batched_tokens: 24, ..config() });
    let params = greedy(oracle(name).cases[0].output_ids.len());
    let again = llm.generate(battery(name), &params).unwrap();
    for (case, out) in oracle(name).cases.iter().zip(&again) {
        assert_eq!(out.outputs[0].token_ids, case.output_ids, "{name}/{} from a kept state", case.name);
        assert_eq!(out.num_cached_tokens, (case.prompt_ids.len() - 1) / 16 * 16, "{name}/{}", case.name);
    }
}
