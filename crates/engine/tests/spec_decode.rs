//! Speculative decoding is lossless: with n-gram drafts, every request draws the same tokens as
//! without speculation (greedy and seeded sampling, logprobs, penalties, stop rules), alone and
//! batched, and drafts are really proposed and accepted along the way.

mod common;

use common::*;
use ferrite_engine::{EngineConfig, PromptInput, SamplingParams, SpeculativeConfig, LLM};

fn ngram(k: usize) -> SpeculativeConfig {
    let json = format!(
        r#"{{"method": "ngram", "num_speculative_tokens": {k}, "prompt_lookup_min": 1, "prompt_lookup_max": 3}}"#
    );
    SpeculativeConfig::parse(&json).unwrap()
}

fn with_spec(name: &str, k: usize) -> LLM {
    llm(name, EngineConfig { speculative: Some(ngram(k)), ..config() })
}

/// The battery, plus prompts that quote themselves, where prompt lookup finds long matches.
fn prompts(name: &str) -> Vec<PromptInput> {
    let mut p = battery(name);
    let cycle: Vec<u32> = (0..60).map(|i| [17, 250, 3, 99, 41][i % 5]).collect();
    p.push(PromptInput::Tokens(cycle));
    let quoted: Vec<u32> = (5..45).chain(5..30).collect();
    p.push(PromptInput::Tokens(quoted));
    p
}

fn outputs(llm: &LLM, prompts: &[PromptInput], params: &SamplingParams) -> Vec<(Vec<u32>, Vec<Option<f32>>)> {
    llm.generate(prompts.to_vec(), params)
        .unwrap()
        .into_iter()
        .map(|o| {
            let c = &o.outputs[0];
            let lps = c.logprobs.as_ref().map_or(Vec::new(), |l| l.iter().map(|t| Some(t.logprob)).collect());
            (c.token_ids.clone(), lps)
        })
        .collect()
}

#[test]
fn ngram_speculation_draws_the_same_tokens_greedy_and_seeded() {
    for name in ["llama", "qwen3", "mixtral"] {
        let plain = llm(name, config());
        let spec = with_spec(name, 4);
        let prompts = prompts(name);
        let seeded = SamplingParams { seed: Some(7), logprobs: Some(2), ..random(None, 48) };
        let penalised = SamplingParams { repetition_penalty: 1.3, frequency_penalty: 0.4, ..greedy(48) };
        for params in [greedy(48), seeded, penalised] {
            let want = outputs(&plain, &prompts, &params);
            let batched = outputs(&spec, &prompts, &params);
            let tokens = |o: &[(Vec<u32>, Vec<Option<f32>>)]| o.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
            assert_eq!(tokens(&batched), tokens(&want), "{name}: batched, {params:?}");
            let alone: Vec<_> =
                prompts.iter().map(|p| outputs(&spec, std::slice::from_ref(p), &params).remove(0)).collect();
            assert_eq!(tokens(&alone), tokens(&want), "{name}: alone, {params:?}");
            // Logprobs of a verified position are those of the same token drawn alone.
            for ((_, a), (_, b)) in batched.iter().zip(&want) {
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(b) {
                    assert!((x.unwrap() - y.unwrap()).abs() < 1e-3, "{name}: logprob {x:?} vs {y:?}");
                }
            }
        }
        let stats = spec.client().stats().spec_decode;
        assert!(stats.num_drafts > 0 && stats.num_accepted_tokens > 0, "{name}: no draft was accepted: {stats:?}");
        assert!(stats.num_accepted_tokens < stats.num_draft_tokens, "{name}: no draft was rejected: {stats:?}");
        println!("{name}: {stats:?}");
    }
}

/// Stop rules apply to each accepted token in turn: a stop token inside an accepted run ends the
/// request there, and max_tokens is never overshot by a run.
#[test]
fn stops_inside_an_accepted_run_end_the_request_where_they_fall() {
    let plain = llm("llama", config());
    let spec = with_spec("llama", 6);
    let prompts = prompts("llama");
    for max_tokens in [1, 2, 5, 13] {
        let want = outputs(&plain, &prompts, &greedy(max_tokens));
        let got = outputs(&spec, &prompts, &greedy(max_tokens));
        assert_eq!(got, want, "max_tokens {max_tokens}");
        assert!(got.iter().all(|(t, _)| t.len() == max_tokens));
    }
    // Stop on a token the plain run draws in its middle: both end at its first occurrence.
    let long = outputs(&plain, &prompts, &greedy(40));
    for (prompt, (tokens, _)) in prompts.iter().zip(&long) {
        let stop = tokens[tokens.len() / 2];
        let params = SamplingParams { stop_token_ids: vec![stop], ..greedy(40) };
        let want = outputs(&plain, std::slice::from_ref(prompt), &params);
        let got = outputs(&spec, std::slice::from_ref(prompt), &params);
        assert_eq!(got[0].0, want[0].0);
        assert_eq!(got[0].0.last(), Some(&stop));
    }
    wait_idle(&spec.client());
}

/// With structured outputs each verified position is drawn under the grammar's mask after the
/// drafts before it, and a draft the grammar refuses ends the run: outputs stay the same, and
/// the constrained requests do accept drafts.
#[test]
fn structured_outputs_constrain_every_verified_position() {
    use ferrite_engine::{Constraint, StructuredOutputs};
    let plain = llm("llama", config());
    let prompts = prompts("llama");
    for spec in
        [with_spec("llama", 4), llm("llama", EngineConfig { speculative: Some(draft_model("llama", 4)), ..config() })]
    {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
            "required": ["items"]
        });
        for constraint in [Constraint::Regex("[a-z ]{1,80}\\.".into()), Constraint::Json(schema)] {
            let before = spec.client().stats().spec_decode;
            let params =
                SamplingParams { structured_outputs: Some(StructuredOutputs::new(constraint.clone())), ..greedy(40) };
            let want = outputs(&plain, &prompts, &params);
            let got = outputs(&spec, &prompts, &params);
            assert_eq!(got, want, "{constraint:?}");
            let after = spec.client().stats().spec_decode;
            let accepted = after.num_accepted_tokens - before.num_accepted_tokens;
            assert!(accepted > 0, "{constraint:?}: no draft was accepted under the grammar");
            println!("{constraint:?}: {} drafts, {accepted} accepted", after.num_drafts - before.num_drafts);
        }
    }
}

/// Drafts survive the scheduler's hard cases: a pool so small that requests are preempted and
/// recomputed mid-run, and requests that end at the context limit, where drafts must not run
/// past `max_model_len`.
#[test]
fn preemption_and_the_context_limit_keep_outputs_identical() {
    let small = EngineConfig { kv_cache_memory: kv_memory("llama", 12), ..config() };
    let plain = llm("llama", small.clone());
    let spec = llm("llama", EngineConfig { speculative: Some(ngram(4)), ..small });
    let short = |p: &PromptInput| matches!(p, PromptInput::Tokens(t) if t.len() <= 120);
    let prompts: Vec<PromptInput> = prompts("llama").into_iter().filter(short).collect();
    let params = greedy(60);
    let want = outputs(&plain, &prompts, &params);
    assert_eq!(outputs(&spec, &prompts, &params), want);
    assert!(spec.client().stats().num_preemptions > 0, "the pool was large enough to never preempt");
    assert!(spec.client().stats().spec_decode.num_accepted_tokens > 0);
    wait_idle(&spec.client());

    let short = EngineConfig { max_model_len: Some(64), ..config() };
    let plain = llm("llama", short.clone());
    let spec = llm("llama", EngineConfig { speculative: Some(ngram(6)), ..short });
    let cycle: Vec<u32> = (0..40).map(|i| [17, 250, 3, 99][i % 4]).collect();
    let params = SamplingParams { max_tokens: None, ..greedy(1) };
    let want = outputs(&plain, &[PromptInput::Tokens(cycle.clone())], &params);
    let got = outputs(&spec, &[PromptInput::Tokens(cycle)], &params);
    assert_eq!(got, want);
    assert_eq!(got[0].0.len(), 64 - 40, "generation runs to the context limit");
}

/// Suffix decoding is as lossless, and learns: once a batch's responses are in its global tree,
/// the same requests again accept most of their drafts.
#[test]
fn suffix_speculation_learns_from_finished_responses() {
    let spec = SpeculativeConfig::parse(r#"{"method": "suffix", "num_speculative_tokens": 6}"#).unwrap();
    let plain = llm("llama", config());
    let suffix = llm("llama", EngineConfig { speculative: Some(spec), ..config() });
    let prompts = prompts("llama");
    let params = greedy(40);
    let want = outputs(&plain, &prompts, &params);
    let rate = |a: ferrite_engine::SpecDecodeStats, b: ferrite_engine::SpecDecodeStats| {
        (b.num_accepted_tokens - a.num_accepted_tokens) as f64 / (b.num_draft_tokens - a.num_draft_tokens).max(1) as f64
    };
    let s0 = suffix.client().stats().spec_decode;
    assert_eq!(outputs(&suffix, &prompts, &params), want);
    let s1 = suffix.client().stats().spec_decode;
    let alone: Vec<_> = prompts.iter().map(|p| outputs(&suffix, std::slice::from_ref(p), &params).remove(0)).collect();
    assert_eq!(alone, want);
    let s2 = suffix.client().stats().spec_decode;
    println!("suffix: first pass {:.2} of drafts accepted, repeat {:.2}", rate(s0, s1), rate(s1, s2));
    assert!(s2.num_accepted_tokens - s1.num_accepted_tokens > s1.num_accepted_tokens - s0.num_accepted_tokens);
    assert!(rate(s1, s2) > 0.8, "repeated requests should mostly accept: {}", rate(s1, s2));
}

/// A hybrid model's recurrent state takes in every draft of a verify step: after a rejection it
/// is restored from the copy saved before the step, and the accepted tokens are computed again
/// with the next drafts. Outputs stay identical with n-gram drafts and with a draft model, greedy
/// and seeded, on every recurrent family (Gated DeltaNet, Mamba2, their MoE and hybrid forms),
/// and again when the prompts hit the prefix cache's kept states.
#[test]
fn hybrid_models_speculate_with_state_rollback() {
    for name in ["qwen3-next", "qwen3_5", "qwen3_5-moe", "mamba2", "nemotron-h", "granite-moe-hybrid"] {
        let plain = llm(name, config());
        let prompts = prompts(name);
        let seeded = SamplingParams { seed: Some(11), ..random(None, 32) };
        // Suffix decoding accepts most drafts once the first pass's responses are in its tree.
        let suffix = SpeculativeConfig::parse(r#"{"method": "suffix", "num_speculative_tokens": 4}"#).unwrap();
        for spec_config in [ngram(4), draft_model("llama", 3), suffix] {
            let spec = llm(name, EngineConfig { speculative: Some(spec_config.clone()), ..config() });
            for params in [greedy(32), seeded.clone()] {
                let want = token_ids(&plain.generate(prompts.clone(), &params).unwrap());
                for pass in ["batched", "again, from the prefix cache"] {
                    let got = token_ids(&spec.generate(prompts.clone(), &params).unwrap());
                    assert_eq!(got, want, "{name} with {:?}, {pass}, {params:?}", spec_config.method);
                }
            }
            let stats = spec.client().stats().spec_decode;
            println!("{name} with {:?}: {stats:?}", spec_config.method);
            assert!(stats.num_accepted_tokens < stats.num_draft_tokens, "{name}: no draft was rejected");
            if matches!(spec_config.method, ferrite_engine::spec_decode::SpeculativeMethod::Suffix(_)) {
                assert!(2 * stats.num_accepted_tokens > stats.num_draft_tokens, "{name}: {stats:?}");
            }
            wait_idle(&spec.client());
        }
    }
}

fn draft_model(name: &str, k: usize) -> SpeculativeConfig {
    let json = serde_json::json!({"model": fixture(name), "num_speculative_tokens": k});
    SpeculativeConfig::parse(&json.to_string()).unwrap()
}

/// A draft model's drafts are verified like any others: greedy, seeded and penalised requests
/// draw the same tokens with and without it, batched and alone. A draft that is the target itself
/// has nearly every draft accepted, sampled ones too (it draws with the target's uniforms); an
/// unrelated draft of the same vocabulary has most refused, and the outputs stay the same.
#[test]
fn draft_model_speculation_draws_the_same_tokens() {
    for (target, draft, well_matched) in
        [("llama", "llama", true), ("llama", "qwen3", false), ("mixtral", "mixtral", true)]
    {
        let plain = llm(target, config());
        let spec = llm(target, EngineConfig { speculative: Some(draft_model(draft, 4)), ..config() });
        let prompts = prompts(target);
        let seeded = SamplingParams { seed: Some(7), logprobs: Some(2), ..random(None, 40) };
        let penalised = SamplingParams { repetition_penalty: 1.3, frequency_penalty: 0.4, ..greedy(40) };
        for params in [greedy(40), seeded, penalised] {
            let before = spec.client().stats().spec_decode;
            let want = outputs(&plain, &prompts, &params);
            let tokens = |o: &[(Vec<u32>, Vec<Option<f32>>)]| o.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
            let batched = outputs(&spec, &prompts, &params);
            assert_eq!(tokens(&batched), tokens(&want), "{target} drafted by {draft}: batched, {params:?}");
            let alone: Vec<_> =
                prompts.iter().map(|p| outputs(&spec, std::slice::from_ref(p), &params).remove(0)).collect();
            assert_eq!(tokens(&alone), tokens(&want), "{target} drafted by {draft}: alone, {params:?}");
            for ((_, a), (_, b)) in batched.iter().zip(&want) {
                for (x, y) in a.iter().zip(b) {
                    assert!((x.unwrap() - y.unwrap()).abs() < 1e-3, "logprob {x:?} vs {y:?}");
                }
            }
            let after = spec.client().stats().spec_decode;
            let (drafted, accepted) = (
                after.num_draft_tokens - before.num_draft_tokens,
                after.num_accepted_tokens - before.num_accepted_tokens,
            );
            println!("{target} drafted by {draft}, {params:?}: {accepted}/{drafted} accepted");
            assert!(drafted > 0, "no drafts were proposed");
            // The draft draws as the target does (processors, temperature, the same uniforms):
            // a draft that is the target agrees with nearly every draw.
            if well_matched {
                assert!(accepted as f64 > 0.9 * drafted as f64, "a draft that is the target: {accepted}/{drafted}");
            }
            if !well_matched {
                assert!(accepted < drafted / 2, "an unrelated draft: {accepted}/{drafted}");
            }
        }
        wait_idle(&spec.client());
    }
}

/// The draft's keys live in the target's blocks: preemption (blocks taken back and the sequence
/// computed again), the context limit (drafts stop at `max_model_len`) and a draft whose own
/// context is shorter than the requests (no drafts past it) keep outputs identical.
#[test]
fn draft_model_survives_preemption_and_context_limits() {
    let small = EngineConfig { kv_cache_memory: 2 * kv_memory("llama", 12), ..config() };
    let plain = llm("llama", small.clone());
    let spec = llm("llama", EngineConfig { speculative: Some(draft_model("llama", 4)), ..small });
    let short = |p: &PromptInput| matches!(p, PromptInput::Tokens(t) if t.len() <= 120);
    let prompts: Vec<PromptInput> = prompts("llama").into_iter().filter(short).collect();
    let want = outputs(&plain, &prompts, &greedy(60));
    assert_eq!(outputs(&spec, &prompts, &greedy(60)), want);
    let stats = spec.client().stats();
    assert!(stats.num_preemptions > 0, "the pool was large enough to never preempt");
    assert!(stats.spec_decode.num_accepted_tokens > 0);
    wait_idle(&spec.client());

    let short = EngineConfig { max_model_len: Some(64), ..config() };
    let plain = llm("llama", short.clone());
    let spec = llm("llama", EngineConfig { speculative: Some(draft_model("llama", 6)), ..short });
    let cycle: Vec<u32> = (0..40).map(|i| [17, 250, 3, 99][i % 4]).collect();
    let params = SamplingParams { max_tokens: None, ..greedy(1) };
    let want = outputs(&plain, &[PromptInput::Tokens(cycle.clone())], &params);
    let got = outputs(&spec, &[PromptInput::Tokens(cycle.clone())], &params);
    assert_eq!(got, want);
    assert_eq!(got[0].0.len(), 64 - 40, "generation runs to the context limit");

    let json = serde_json::json!({"model": fixture("llama"), "num_speculative_tokens": 4, "max_model_len": 48});
    let bounded = SpeculativeConfig::parse(&json.to_string()).unwrap();
    let plain = llm("llama", config());
    let spec = llm("llama", EngineConfig { speculative: Some(bounded), ..config() });
    let params = greedy(30);
    let want = outputs(&plain, &[PromptInput::Tokens(cycle.clone())], &params);
    assert_eq!(outputs(&spec, &[PromptInput::Tokens(cycle)], &params), want);
    let stats = spec.client().stats().spec_decode;
    // Drafts run while the sequence stays within the draft's 48 tokens: at most 9 verify steps.
    assert!(stats.num_drafts > 0 && stats.num_drafts <= 9, "{stats:?}");
}

/// A draft model that cannot serve is refused at start with a message naming the problem: a
/// missing checkpoint, a hybrid draft (its state cannot be rolled back), a vocabulary larger
/// than the target's.
#[test]
fn unfit_draft_models_are_refused_at_start() {
    let missing = SpeculativeConfig::parse(r#"{"model": "/nonexistent/draft", "num_speculative_tokens": 2}"#).unwrap();
    for (spec, needle) in [
        (missing, "/nonexistent/draft"),
        (draft_model("qwen3-next", 2), "recurrent"),
        (draft_model("llava", 2), "vocabulary"),
    ] {
        let config = EngineConfig { speculative: Some(spec), ..config() };
        let err = match LLM::new(fixture("llama"), ferrite_tensor::DType::F32, config) {
            Ok(_) => panic!("an unfit draft model started"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(needle) && err.contains("--speculative-config"), "{err}");
    }
}

/// A greedy request's sampling, as a drafter reads it.
fn greedy_sampling() -> ferrite_engine::params::RequestSampling {
    ferrite_engine::params::RequestSampling {
        params: SamplingParams::greedy(16),
        max_tokens: 16,
        eos_token_id: None,
        stop_token_ids: Vec::new(),
        min_tokens_mask: Vec::new(),
        seed: 0,
        bad_words_token_ids: Vec::new(),
        grammar: None,
        multimodal: None,
    }
}

fn mtp(k: usize) -> SpeculativeConfig {
    SpeculativeConfig::parse(&format!(r#"{{"method": "mtp", "num_speculative_tokens": {k}}}"#)).unwrap()
}

/// A target and a draft head stepped by hand over one sequence (one request, its blocks `0..`):
/// each step the target computes positions `start..end`, its caches kept across steps, and the
/// head catches up on them and drafts `room` tokens after the `known` ones.
struct HeadSteps<'m> {
    model: &'m dyn ferrite_models::CausalLM,
    caches: Vec<ferrite_tensor::PagedKvLayer>,
    drafter: ferrite_engine::eagle::EagleDrafter,
    table: Vec<u32>,
    block_size: usize,
    sampling: ferrite_engine::params::RequestSampling,
}

impl<'m> HeadSteps<'m> {
    /// `own_head` drafts (`None`: the target's MTP head), up to `k` tokens a step.
    fn new(
        model: &'m dyn ferrite_models::CausalLM,
        own_head: Option<Box<dyn ferrite_models::DraftHead>>,
        k: usize,
        blocks: usize,
    ) -> HeadSteps<'m> {
        use ferrite_tensor::{DType, Device};
        let block_size = 16;
        let spec = match &own_head {
            Some(head) => head.kv_layer(),
            None => model.mtp().expect("loaded with its MTP head").kv_layer(),
        };
        let drafter =
            ferrite_engine::eagle::EagleDrafter::new(own_head, spec, Device::Cpu, DType::F32, blocks, block_size, k)
                .unwrap();
        HeadSteps {
            model,
            caches: model.info().allocate_caches(Device::Cpu, DType::F32, blocks, block_size, 1).unwrap(),
            drafter,
            table: (0..blocks as u32).collect(),
            block_size,
            sampling: greedy_sampling(),
        }
    }

    fn step(
        &mut self,
        seq: &[u32],
        (start, end, known, room): (usize, usize, usize, usize),
    ) -> std::collections::HashMap<u64, Vec<u32>> {
        use ferrite_engine::eagle::EagleRequest;
        use ferrite_engine::spec_decode::DraftTarget;
        use ferrite_models::ForwardInput;
        use ferrite_tensor::{AttnMetadata, AttnSeq};
        let seqs = vec![AttnSeq { q_start: 0, q_len: end - start, ctx_len: end, block_table: self.table.clone() }];
        let meta = AttnMetadata::new(seqs, self.block_size).unwrap().with_state_slots(vec![0]).unwrap();
        let input =
            ForwardInput { tokens: &seq[start..end], meta: &meta, logit_rows: &[end - start - 1], embeds: None };
        let (_, hidden) = self.model.forward_with_hidden(&input, &mut self.caches, &self.drafter.hidden_tap()).unwrap();
        let target = DraftTarget {
            id: 0,
            tokens: &seq[..known],
            num_prompt_tokens: known.min(29),
            sampling: &self.sampling,
            block_table: &self.table,
            room,
        };
        let req = EagleRequest { target, start, computed: end - start, row: 0 };
        self.drafter.propose(self.model, &hidden, &[req]).unwrap()
    }
}

/// (positions start..end the target computes, tokens known after the step, drafts wanted, the
/// position whose reference prediction is the first draft): a prompt chunk, a chunk that ends in
/// a draw, a verify step.
const HEAD_STEPS: [(usize, usize, usize, usize, Option<usize>); 3] =
    [(0, 20, 37, 0, None), (20, 29, 30, 1, Some(28)), (29, 31, 32, 1, Some(30))];

/// The MTP drafter feeds the head what vLLM feeds it: over a prompt chunk, a chunk that ends in a
/// draw, and a verify step, each first draft is the head's prediction the fixture's reference
/// computed with transformers' modules at that position.
#[test]
fn mtp_drafter_feeds_the_head_the_reference_inputs() {
    use ferrite_models::{load_model, LoadOptions};

    let dir = fixture("qwen3_5-mtp");
    let model = load_model(&dir, &LoadOptions { progress: false, load_mtp: true, ..Default::default() }).unwrap().model;
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let reference = &oracle["load_check"]["mtp_reference"][0];
    let ids =
        |k: &str| -> Vec<u32> { reference[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
    let (seq, argmax) = (ids("tokens"), ids("argmax"));
    let mut steps = HeadSteps::new(model.as_ref(), None, 1, 4);
    for (start, end, known, room, predicted_at) in HEAD_STEPS {
        let drafts = steps.step(&seq, (start, end, known, room));
        match predicted_at {
            None => assert!(drafts.is_empty()),
            Some(pos) => assert_eq!(drafts[&0], vec![argmax[pos]], "the draft after position {pos}"),
        }
    }
}

/// MTP speculation on a hybrid model (its state rolled back after rejections), on DeepSeek-V3
/// (its extra MLA + MoE layer) and on GLM-4.5 (the same layout around GQA + MoE): the tokens are those drawn without speculation, greedy and
/// seeded, batched and alone; a model without an MTP head is refused at start.
#[test]
fn mtp_speculation_draws_the_same_tokens() {
    // The second is real Qwen3.5 checkpoints' layout (ForConditionalGeneration, with a tower).
    for (name, ks) in [
        ("qwen3_5-mtp", &[1, 3][..]),
        ("qwen3_5-conditional", &[2][..]),
        ("deepseek-v3-mtp", &[2][..]),
        ("glm4-moe-mtp", &[2][..]),
    ] {
        let plain = llm(name, config());
        let prompts = prompts(name);
        let seeded = SamplingParams { seed: Some(5), ..random(None, 32) };
        for &k in ks {
            let spec = llm(name, EngineConfig { speculative: Some(mtp(k)), ..config() });
            for params in [greedy(32), seeded.clone()] {
                let want = token_ids(&plain.generate(prompts.clone(), &params).unwrap());
                let got = token_ids(&spec.generate(prompts.clone(), &params).unwrap());
                assert_eq!(got, want, "{name}, k {k}, {params:?}");
                assert_eq!(solo(&spec, &prompts, &params), want, "{name}, k {k}, alone, {params:?}");
            }
            let stats = spec.client().stats().spec_decode;
            println!("{name}, mtp k={k}: {stats:?}");
            assert!(stats.num_drafts > 0 && stats.num_draft_tokens <= stats.num_drafts * k as u64);
            wait_idle(&spec.client());
        }
    }
    for name in ["qwen3_5", "llama"] {
        let config = EngineConfig { speculative: Some(mtp(1)), ..config() };
        let err = match LLM::new(fixture(name), ferrite_tensor::DType::F32, config) {
            Ok(_) => panic!("{name} started with MTP speculation"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("MTP") || err.contains("multi-token-prediction"), "{name}: {err}");
    }
}

/// The llama-eagle3 fixture's `head` (by vLLM's `method` for it: `eagle` or `eagle3`).
fn eagle(method: &str, head: &str, k: Option<usize>) -> SpeculativeConfig {
    let model = fixture("llama-eagle3").join(head);
    let k = k.map_or(String::new(), |k| format!(r#", "num_speculative_tokens": {k}"#));
    SpeculativeConfig::parse(&format!(r#"{{"method": "{method}", "model": "{}"{k}}}"#, model.display())).unwrap()
}

fn eagle3(head: &str, k: Option<usize>) -> SpeculativeConfig {
    eagle("eagle3", head, k)
}

/// The fixture's EAGLE heads: (reference entry, head, version).
const EAGLE_HEADS: [(&str, &str, ferrite_models::EagleVersion); 4] = [
    ("eagle3_reference", "eagle3", ferrite_models::EagleVersion::Three),
    ("eagle3_reference", "eagle3-speculators", ferrite_models::EagleVersion::Three),
    ("eagle_reference", "eagle", ferrite_models::EagleVersion::One),
    ("eagle_reference", "eagle-hass", ferrite_models::EagleVersion::One),
];

/// The EAGLE drafter feeds each head what vLLM feeds it: over a prompt chunk, a chunk that ends
/// in a draw and a verify step, each first draft is the head's prediction the fixture's reference
/// computed with torch at that position (from the target's residual stream at an EAGLE-3 head's
/// aux layers, from its final-norm output for an EAGLE-1 head); a pass over a whole sequence
/// drafts the reference's chain of three.
#[test]
fn eagle_drafter_feeds_the_head_the_reference_inputs() {
    use ferrite_models::{load_eagle_head, load_model, LoadOptions};

    let dir = fixture("llama-eagle3");
    let opts = LoadOptions { progress: false, ..Default::default() };
    let model = load_model(&dir, &opts).unwrap().model;
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
    };
    for (entry, head_name, version) in EAGLE_HEADS {
        let reference = &oracle["load_check"][entry][head_name];
        let steps = |k: usize| {
            let head = load_eagle_head(&dir.join(head_name), model.as_ref(), &opts, version).unwrap();
            HeadSteps::new(model.as_ref(), Some(head), k, 8)
        };
        let first = &reference["sequences"][0];
        let (seq, argmax) = (ids(&first["tokens"]), ids(&first["argmax"]));
        let mut one = steps(1);
        for (start, end, known, room, predicted_at) in HEAD_STEPS {
            let drafts = one.step(&seq, (start, end, known, room));
            match predicted_at {
                None => assert!(drafts.is_empty(), "{head_name}"),
                Some(pos) => assert_eq!(drafts[&0], vec![argmax[pos]], "{head_name}: the draft after position {pos}"),
            }
        }
        for sequence in reference["sequences"].as_array().unwrap() {
            let seq = ids(&sequence["tokens"]);
            let drafts = steps(3).step(&seq, (0, seq.len(), seq.len(), 3));
            assert_eq!(drafts[&0], ids(&sequence["chain"]), "{head_name}: the drafts after {} tokens", seq.len());
        }
    }
}

/// EAGLE speculation, with EAGLE-3 heads in the Hugging Face layout and in the speculators
/// format, and EAGLE-1 heads with and without HASS's norms: the tokens are those drawn without
/// speculation, greedy and seeded, batched and alone. Without a `method`, the head's checkpoint
/// says it is EAGLE-3 (and a speculators one how many drafts).
#[test]
fn eagle_speculation_draws_the_same_tokens() {
    let name = "llama-eagle3";
    let plain = llm(name, config());
    let prompts = prompts(name);
    let seeded = SamplingParams { seed: Some(5), ..random(None, 32) };
    let heads = [("eagle3", "eagle3", 1), ("eagle3", "eagle3", 3), ("eagle3", "eagle3-speculators", 2)];
    for (method, head, k) in heads.into_iter().chain([("eagle", "eagle", 2), ("eagle", "eagle-hass", 3)]) {
        let spec = llm(name, EngineConfig { speculative: Some(eagle(method, head, Some(k))), ..config() });
        for params in [greedy(32), seeded.clone()] {
            let want = token_ids(&plain.generate(prompts.clone(), &params).unwrap());
            let got = token_ids(&spec.generate(prompts.clone(), &params).unwrap());
            assert_eq!(got, want, "{head}, k {k}, {params:?}");
            assert_eq!(solo(&spec, &prompts, &params), want, "{head}, k {k}, alone, {params:?}");
        }
        let stats = spec.client().stats().spec_decode;
        println!("{head}, {method} k={k}: {stats:?}");
        assert!(stats.num_drafts > 0 && stats.num_draft_tokens <= stats.num_drafts * k as u64, "{stats:?}");
        wait_idle(&spec.client());
    }
    let speculators = fixture(name).join("eagle3-speculators");
    let inferred = SpeculativeConfig::parse(&format!(r#"{{"model": "{}"}}"#, speculators.display())).unwrap();
    assert_eq!(inferred, eagle3("eagle3-speculators", Some(3)));
    let hf = fixture(name).join("eagle3");
    let inferred =
        SpeculativeConfig::parse(&format!(r#"{{"model": "{}", "num_speculative_tokens": 2}}"#, hf.display()));
    assert_eq!(inferred.unwrap(), eagle3("eagle3", Some(2)));
}

/// A head that cannot draft for the target is refused at start with a message naming why: vLLM's
/// default aux layers do not fit a 2-layer target; a missing checkpoint.
#[test]
fn unfit_eagle3_heads_are_refused_at_start() {
    let missing =
        SpeculativeConfig::parse(r#"{"method": "eagle3", "model": "/nonexistent/head", "num_speculative_tokens": 2}"#);
    for (target, spec, needle) in [
        ("llama", eagle3("eagle3", Some(2)), "eagle_aux_hidden_state_layer_ids"),
        ("llama-eagle3", missing.unwrap(), "/nonexistent/head"),
    ] {
        let config = EngineConfig { speculative: Some(spec), ..config() };
        let err = match LLM::new(fixture(target), ferrite_tensor::DType::F32, config) {
            Ok(_) => panic!("an unfit EAGLE-3 head started on {target}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(needle) && err.contains("--speculative-config"), "{target}: {err}");
    }
}

/// A draft model catches long prompts up in forwards of at most the step's token budget (as the
/// target computes them in chunks) and its keys are right: the target drafting for itself has
/// every draft accepted, and the tokens are those drawn without speculation.
#[test]
fn draft_model_catches_long_prompts_up_within_the_token_budget() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use ferrite_engine::{Engine, LoadedDrafter};
    use ferrite_models::{load_model, CausalLM, ForwardInput, LoadOptions, ModelInfo};
    use ferrite_tensor::{PagedKvLayer, Tensor};

    /// The draft, noting the largest forward it is asked for.
    struct Recording {
        inner: Box<dyn CausalLM>,
        largest: Arc<AtomicUsize>,
    }
    impl CausalLM for Recording {
        fn info(&self) -> &ModelInfo {
            self.inner.info()
        }
        fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> ferrite_models::Result<Tensor> {
            self.largest.fetch_max(input.tokens.len(), Ordering::SeqCst);
            self.inner.forward(input, kv)
        }
    }

    let budget = 48;
    let dir = fixture("llama");
    let load = || load_model(&dir, &LoadOptions { progress: false, ..Default::default() }).unwrap().model;
    let largest = Arc::new(AtomicUsize::new(0));
    let draft = Recording { inner: load(), largest: largest.clone() };
    let spec_config =
        EngineConfig { speculative: Some(draft_model("llama", 3)), max_num_batched_tokens: budget, ..config() };
    let tokenizer = Arc::new(ferrite_tokenizer::Tokenizer::from_dir(&dir).unwrap());
    let drafter = Some(LoadedDrafter::Model(Box::new(draft)));
    let engine = Engine::with_drafter(load(), drafter, tokenizer, spec_config).unwrap();
    let spec = LLM::from_engine(engine);
    let plain = llm("llama", EngineConfig { max_num_batched_tokens: budget, ..config() });
    let prompts = battery("llama");
    assert!(prompts.iter().any(|p| matches!(p, PromptInput::Tokens(t) if t.len() > 4 * budget)));
    let params = greedy(16);
    assert_eq!(
        token_ids(&spec.generate(prompts.clone(), &params).unwrap()),
        token_ids(&plain.generate(prompts, &params).unwrap())
    );
    let stats = spec.client().stats().spec_decode;
    assert!(stats.num_draft_tokens > 0 && stats.num_accepted_tokens == stats.num_draft_tokens, "{stats:?}");
    let largest = largest.load(Ordering::SeqCst);
    assert!(largest <= budget, "a draft forward of {largest} tokens, over the budget of {budget}");
}
