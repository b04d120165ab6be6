//! Multi-token-prediction heads against the references the fixture generator computed with
//! transformers' own modules, as vLLM runs each head (`tools/oracle/generate_fixtures.py`:
//! `_mtp_reference` for Qwen3.5's `mtp.*` in fixture `qwen3_5-mtp`, `_deepseek_mtp_reference` for
//! DeepSeek-V3's extra layer in `deepseek-v3-mtp`): over each reference sequence, the head's
//! argmax and its logit at every position, from the model's final hidden states and the next
//! tokens.

use std::path::PathBuf;

use ferrite_models::{load_model, CausalLM, ForwardInput, HiddenTap, LoadOptions};
use ferrite_tensor::{ops, AttnMetadata, AttnSeq, DType, Device, PagedKvLayer};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    ferrite_testing::gate::fixtures_dir().join("models").join(name)
}

/// The head's argmax and max logit at positions `0..len - 1` of `tokens`.
fn mtp_predictions(model: &dyn CausalLM, tokens: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let (n, block_size) = (tokens.len(), 16);
    let blocks = n.div_ceil(block_size);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut caches = model.info().allocate_caches(Device::Cpu, DType::F32, blocks, block_size, 1).unwrap();
    let seq = AttnSeq { q_start: 0, q_len: n, ctx_len: n, block_table: table.clone() };
    let mut meta = AttnMetadata::new(vec![seq], block_size).unwrap();
    if !model.info().state_layers.is_empty() {
        meta = meta.with_state_slots(vec![0]).unwrap();
    }
    let input = ForwardInput { tokens, meta: &meta, logit_rows: &[n - 1], embeds: None };
    let (_, hidden) = model.forward_with_hidden(&input, &mut caches, &HiddenTap::Final).unwrap();
    let head = model.mtp().expect("loaded with its MTP head");
    let spec = head.kv_layer();
    let mut kv =
        PagedKvLayer::new_on(Device::Cpu, DType::F32, blocks, block_size, spec.num_kv_heads, spec.k_dim, spec.v_dim)
            .unwrap();
    let rows: Vec<usize> = (0..n - 1).collect();
    let seq = AttnSeq { q_start: 0, q_len: n - 1, ctx_len: n - 1, block_table: table };
    let meta = AttnMetadata::new(vec![seq], block_size).unwrap();
    let hidden = ops::gather_rows(&hidden, &rows).unwrap();
    let (logits, _) = head.forward(&tokens[1..], &hidden, &meta, &rows, &mut kv).unwrap();
    let argmax = ops::argmax_rows(&logits).unwrap();
    let vocab = logits.last_dim();
    let data = logits.to_f32_vec();
    let max = argmax.iter().enumerate().map(|(i, &t)| data[i * vocab + t as usize]).collect();
    (argmax, max)
}

fn assert_predicts_as_the_reference(name: &str) {
    let dir = fixture(name);
    let oracle: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
    let opts = LoadOptions { progress: false, load_mtp: true, ..Default::default() };
    let model = load_model(&dir, &opts).unwrap().model;
    let cases = oracle["load_check"]["mtp_reference"].as_array().unwrap();
    for case in cases {
        let ids =
            |k: &str| -> Vec<u32> { case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect() };
        let tokens = ids("tokens");
        let (argmax, max) = mtp_predictions(model.as_ref(), &tokens);
        assert_eq!(argmax, ids("argmax"), "{name}: MTP predictions differ over {tokens:?}");
        for (ours, theirs) in max.iter().zip(case["max_logit"].as_array().unwrap()) {
            let theirs = theirs.as_f64().unwrap() as f32;
            assert!((ours - theirs).abs() < 1e-3, "{name}: max logit {ours} vs {theirs}");
        }
    }
    // Without asking for the head it is not loaded.
    assert!(load_model(&dir, &LoadOptions { progress: false, ..Default::default() }).unwrap().model.mtp().is_none());
}

#[test]
fn qwen3_5_mtp_head_predicts_as_the_reference() {
    assert_predicts_as_the_reference("qwen3_5-mtp");
}

#[test]
fn deepseek_v3_mtp_layer_predicts_as_the_reference() {
    assert_predicts_as_the_reference("deepseek-v3-mtp");
}

/// GLM-4.5's MTP layer: DeepSeek's layout around a GQA + MoE layer of its own kind.
#[test]
fn glm4_moe_mtp_layer_predicts_as_the_reference() {
    assert_predicts_as_the_reference("glm4-moe-mtp");
}

/// A checkpoint without a head refuses the request, naming what is missing.
#[test]
fn checkpoints_without_a_head_refuse_to_load_one() {
    let opts = LoadOptions { progress: false, load_mtp: true, ..Default::default() };
    for (name, needle) in [("qwen3_5", "MTP head"), ("deepseek-v2", "MTP layer")] {
        let err = load_model(&fixture(name), &opts).err().expect("no MTP head to load").to_string();
        assert!(err.contains(needle), "{name}: {err}");
    }
}
