//! FP8 checkpoints against transformers on CPU: compressed-tensors schemes written by
//! llm-compressor and the `fp8` block format, each fixture's greedy tokens token-exact, and each
//! way of getting the format wrong (a scale ignored or broadcast over the wrong rows, the input
//! quantization skipped) caught.
//!
//! Tolerance. Where the inputs of the linear layers are quantized (W8A8), a last-bit difference
//! in an activation, from summing in another order than torch, can move it across an e4m3
//! rounding boundary: one element then changes by a whole e4m3 step, and the logprobs of later
//! positions by up to a few tenths of a nat (f64 and f32 runs of the same oracle differ by up to
//! 0.6). Tokens stay STRICT; logprobs are held to `W8A8_LOGPROB_TOLERANCE` there, and to the
//! f32 gate's 2e-3 where only the weights are quantized (W8A16).

use std::path::{Path, PathBuf};

use ferrite_models::{load_model, LoadOptions};
use ferrite_tensor::kv::Fp8KvScales;
use ferrite_tensor::{DType, Device};
use ferrite_testing::gate::{
    edit_config, edit_f32_tensors, fixture_copy, fixtures_dir, greedy, judge, run_fixture, stable_prefixes, summarize,
    CaseReport, Oracle,
};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

const LOGPROB_TOLERANCE: f32 = 2e-3;
const W8A8_LOGPROB_TOLERANCE: f32 = 0.6;

fn reports(dir: &Path) -> Vec<CaseReport> {
    let (oracle, reports) = run_fixture(dir, DType::F32).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    println!("{} ({}): {}", dir.display(), oracle.architecture, summarize(&reports));
    reports
}

/// Tokens exact and logprobs within `tolerance` through each case's stable prefix (every token
/// where the oracle is stable throughout): past it the oracle does not reproduce itself.
fn gate(name: &str, tolerance: f32) {
    let dir = fixtures_dir().join("models").join(name);
    let stable = stable_prefixes(&dir.join("oracle.json")).unwrap();
    let reports = reports(&dir);
    for r in &reports {
        let prefix = stable.get(&r.name).copied().unwrap_or(usize::MAX);
        assert!(
            r.holds_through(prefix, tolerance),
            "{name}/{}: diverged at {:?} or logprob error {:?} within the {prefix} tokens the oracle keeps",
            r.name,
            r.divergence,
            r.step_logprob_errors.iter().take(prefix).copied().fold(0.0f32, f32::max)
        );
    }
    assert!(reports.len() >= 8);
}

#[test]
fn compressed_tensors_fp8_dynamic() {
    gate("llama-fp8-dynamic", W8A8_LOGPROB_TOLERANCE);
}

#[test]
fn compressed_tensors_fp8_static() {
    gate("llama-fp8-static", W8A8_LOGPROB_TOLERANCE);
}

#[test]
fn compressed_tensors_fp8_block() {
    gate("llama-fp8-block", W8A8_LOGPROB_TOLERANCE);
}

/// Experts W8A16 (transformers loads them into its fused expert tensors, which carry no
/// quantization scheme), attention W8A8.
#[test]
fn compressed_tensors_fp8_dynamic_moe() {
    gate("qwen3-moe-fp8-dynamic", W8A8_LOGPROB_TOLERANCE);
}

/// MLA, a dense first layer and routed + shared experts, every projection in 128x128 blocks, as
/// DeepSeek-V3 ships; transformers dequantizes them at load (W8A16) and fuses the experts.
#[test]
fn fp8_block_format_deepseek_v3() {
    gate("deepseek-v3-fp8", LOGPROB_TOLERANCE);
}

/// Qwen3-30B-A3B-FP8's layout: attention and every expert's projections in blocks.
#[test]
fn fp8_block_format_qwen3_moe() {
    gate("qwen3-moe-fp8", LOGPROB_TOLERANCE);
}

#[test]
fn fp8_block_format() {
    gate("qwen3-fp8", LOGPROB_TOLERANCE);
}

/// `--quantization fp8` on the unquantized llama fixture, against transformers running llama's
/// own weights as llm-compressor's FP8_DYNAMIC writes them (`oracle-online-fp8.json`; the
/// generator checks that its weights are bit for bit what ferrite's rounding gives).
#[test]
fn online_fp8_matches_llm_compressor_fp8_dynamic() {
    let dir = fixtures_dir().join("models/llama");
    let oracle_path = dir.join("oracle-online-fp8.json");
    let oracle = Oracle::load(&oracle_path).unwrap();
    let opts = LoadOptions { progress: false, quantization: Some("fp8".into()), ..Default::default() };
    let model = load_model(&dir, &opts).unwrap().model;
    let stable = stable_prefixes(&oracle_path).unwrap();
    let reports: Vec<CaseReport> = oracle
        .cases
        .iter()
        .map(|case| judge(case, &greedy(model.as_ref(), &case.prompt_ids, case.output_ids.len(), 16).unwrap()))
        .collect();
    println!("llama --quantization fp8: {}", summarize(&reports));
    for r in &reports {
        let prefix = stable.get(&r.name).copied().unwrap_or(usize::MAX);
        assert!(
            r.holds_through(prefix, W8A8_LOGPROB_TOLERANCE),
            "{}: diverged at {:?} within the {prefix} tokens the oracle keeps",
            r.name,
            r.divergence
        );
    }
    // The plain llama oracle is not met: the quantization changes every case.
    let plain = Oracle::load(&dir.join("oracle.json")).unwrap();
    let unquantized = load_model(&dir, &LoadOptions { progress: false, ..Default::default() }).unwrap().model;
    let case = &plain.cases[1];
    let ours = greedy(unquantized.as_ref(), &case.prompt_ids, case.output_ids.len(), 16).unwrap();
    assert!(!judge(&oracle.cases[1], &ours).strict, "the unquantized model meets the FP8 oracle");
}

/// A copy of fixture `name` in a fresh directory, its config and tensors passed through `edit`.
fn broken_copy(name: &str, what: &str, edit: &Break) -> PathBuf {
    let dst = fixture_copy(name, &format!("fp8-{what}"));
    match edit {
        Break::Config(edit) => edit_config(&dst, edit),
        &Break::Scales(suffix, edit) => {
            edit_f32_tensors(&dst, |name| name.ends_with(suffix).then(|| Box::new(edit) as Box<dyn Fn(&mut [f32])>))
        }
    }
    dst
}

enum Break {
    Config(fn(&mut serde_json::Value)),
    /// The f32 tensors whose names end with the suffix, rewritten.
    Scales(&'static str, fn(&mut [f32])),
}

#[test]
fn gate_catches_fp8_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Break)] = &[
        ("llama-fp8-dynamic", "weight scales ignored", Break::Scales(".weight_scale", |s| s.fill(1.0))),
        ("llama-fp8-dynamic", "channel scales on the wrong rows", Break::Scales(".weight_scale", |s| s.reverse())),
        (
            "llama-fp8-dynamic",
            "input quantization skipped",
            Break::Config(|c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = json!(null)),
        ),
        ("llama-fp8-static", "input scales ignored", Break::Scales(".input_scale", |s| s.fill(1.0))),
        (
            "llama-fp8-static",
            "input quantization skipped",
            Break::Config(|c| c["quantization_config"]["config_groups"]["group_0"]["input_activations"] = json!(null)),
        ),
        ("llama-fp8-block", "block scales ignored", Break::Scales(".weight_scale", |s| s.fill(1.0))),
        (
            "llama-fp8-block",
            "input quantized per token instead of per 128",
            Break::Config(|c| {
                c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["strategy"] = json!("token")
            }),
        ),
        ("qwen3-moe-fp8-dynamic", "expert scales ignored", Break::Scales("_proj.weight_scale", |s| s.fill(1.0))),
        ("deepseek-v3-fp8", "block scales ignored", Break::Scales(".weight_scale_inv", |s| s.fill(1.0))),
        ("qwen3-moe-fp8", "expert block scales reversed", Break::Scales("_proj.weight_scale_inv", |s| s.reverse())),
        ("qwen3-fp8", "block scales ignored", Break::Scales(".weight_scale_inv", |s| s.fill(1.0))),
        ("qwen3-fp8", "block scales on the wrong blocks", Break::Scales(".weight_scale_inv", |s| s.reverse())),
    ];
    for (fixture, what, edit) in breaks {
        let dir = broken_copy(fixture, what, edit);
        let reports = reports(&dir);
        std::fs::remove_dir_all(&dir).ok();
        let strict = reports.iter().filter(|r| r.strict).count();
        let worst = reports.iter().map(|r| r.max_logprob_error).fold(0.0f32, f32::max);
        println!("{fixture} with {what}: {strict}/{} strict, max logprob error {worst:.3}", reports.len());
        assert!(strict < reports.len(), "{fixture}: {what} went unnoticed ({strict}/{} strict)", reports.len());
    }
}

/// A checkpoint whose scales are missing or mis-shaped fails to load naming the tensor, and a
/// method other than the checkpoint's is refused.
#[test]
fn bad_fp8_checkpoints_are_load_errors_naming_the_tensor() {
    let load = |dir: &Path, quantization: Option<&str>| {
        let opts = ferrite_models::LoadOptions {
            progress: false,
            quantization: quantization.map(str::to_owned),
            ..Default::default()
        };
        ferrite_models::load_model(dir, &opts).err().map(|e| e.to_string())
    };
    let good = fixtures_dir().join("models/llama-fp8-dynamic");
    let err = load(&good, Some("fp8")).expect("a mismatched --quantization must fail");
    assert!(err.contains("does not match") && err.contains("compressed-tensors"), "{err}");

    let dir = broken_copy("llama-fp8-dynamic", "scale dropped", &Break::Config(|_| {}));
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dropped = "model.layers.1.mlp.down_proj.weight_scale";
    let kept: Vec<(String, TensorView)> = st.tensors().into_iter().filter(|(n, _)| n != dropped).collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let err = load(&dir, None).expect("a missing scale must fail");
    assert!(err.contains(dropped), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    let dir = broken_copy("qwen3-fp8", "scale grid transposed", &Break::Config(|_| {}));
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, TensorView)> = st.tensors();
    let (name, view) = tensors
        .iter_mut()
        .find(|(n, v)| n.ends_with(".weight_scale_inv") && v.shape()[0] != v.shape()[1])
        .expect("a non-square block scale grid");
    let transposed = vec![view.shape()[1], view.shape()[0]];
    *view = TensorView::new(view.dtype(), transposed, view.data()).unwrap();
    let name = name.clone();
    safetensors::serialize_to_file(tensors, None, &path).unwrap();
    let err = load(&dir, None).expect("a mis-shaped scale must fail");
    assert!(err.contains(&name), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A checkpoint's FP8 KV-cache scales (compressed-tensors' `kv_cache_scheme`: a scalar
/// `self_attn.k_scale` and `v_scale` per layer) reach the layers' caches when the cache is FP8,
/// and only then; a scale that is not one value is refused, naming it.
#[test]
fn checkpoint_kv_cache_scales_reach_an_fp8_cache() {
    let write_scales = |dir: &Path, shape: Vec<usize>| -> Vec<Fp8KvScales> {
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let layers = st.names().iter().filter(|n| n.ends_with(".self_attn.q_proj.weight")).count();
        let scales: Vec<Fp8KvScales> =
            (0..layers).map(|i| Fp8KvScales { k: 0.5 + 0.25 * i as f32, v: 2.0 - 0.5 * i as f32 }).collect();
        let values: Vec<(String, Vec<u8>)> = (0..layers)
            .flat_map(|i| {
                let n = shape.iter().product::<usize>();
                [("k_scale", scales[i].k), ("v_scale", scales[i].v)].map(|(leaf, value)| {
                    let data = std::iter::repeat_n(value.to_le_bytes(), n).flatten().collect();
                    (format!("model.layers.{i}.self_attn.{leaf}"), data)
                })
            })
            .collect();
        let mut tensors: Vec<(String, TensorView)> = st.tensors();
        for (name, data) in &values {
            tensors.push((name.clone(), TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap()));
        }
        safetensors::serialize_to_file(tensors, None, &path).unwrap();
        scales
    };
    let options = LoadOptions { dtype: DType::F32, progress: false, ..Default::default() };

    let dir = fixture_copy("llama", "kv-scales");
    let scales = write_scales(&dir, vec![]);
    let model = load_model(&dir, &options).unwrap().model;
    let info = model.info();
    assert_eq!(info.kv_scales, scales.iter().copied().map(Some).collect::<Vec<_>>());
    let fp8 = info.allocate_caches(Device::Cpu, DType::Fp8, 2, 16, 0).unwrap();
    assert_eq!(fp8.iter().map(|c| c.fp8).collect::<Vec<_>>(), info.kv_scales);
    let plain = info.allocate_caches(Device::Cpu, DType::F32, 2, 16, 0).unwrap();
    assert!(plain.iter().all(|c| c.fp8.is_none()));
    std::fs::remove_dir_all(&dir).ok();

    // Without scales in the checkpoint, an FP8 cache takes vLLM's 1.0.
    let model = load_model(&fixtures_dir().join("models/llama"), &options).unwrap().model;
    assert!(model.info().kv_scales.is_empty());
    let fp8 = model.info().allocate_caches(Device::Cpu, DType::Fp8, 2, 16, 0).unwrap();
    assert!(fp8.iter().all(|c| c.fp8 == Some(Fp8KvScales::default())));

    let dir = fixture_copy("llama", "kv-scales-two-values");
    write_scales(&dir, vec![2]);
    let err = load_model(&dir, &options).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.self_attn.k_scale"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
