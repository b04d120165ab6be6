//! The parity battery of every fixture on a CUDA GPU: in f32 token-exact against transformers
//! with the CPU gate's logprob tolerance, and in bf16 judged by the near-tie rule (a case passes
//! STRICT, or diverges only where the oracle's top two were within `NEAR_TIE_NATS`; only a model
//! that routes tokens among experts or carries a recurrent state may miss, in at most
//! `MOE_BF16_MISSES` / `RECURRENT_BF16_MISSES` of its cases). Without a GPU (CI) the test prints
//! SKIP and passes.

use ferrite_tensor::{DType, Device};
use ferrite_testing::gate::{
    fixtures_dir, run_fixture_on, run_fixture_with, stable_prefixes, summarize, NEAR_TIE_NATS,
};

const LOGPROB_TOLERANCE: f32 = 2e-3;

/// bf16 rounding of the hidden state can reorder a mixture-of-experts router's top-k (the
/// router itself runs in f32), which changes a token's whole MLP output: such a case diverges
/// beyond the near-tie rule through no bug of ours, while the same fixture is STRICT in f32.
/// A dense model has no such step, so any miss there is a bug.
const MOE_BF16_MISSES: usize = 2;

/// A Gated DeltaNet layer multiplies its state by `exp(-A * softplus(a + dt_bias))` at every
/// token, `a` a projection of the bf16 hidden state and `A` up to 16 in the fixtures (transformers'
/// init range): bf16's relative error in `a` becomes an absolute error of the decay exponent that
/// compounds over the sequence, so a recurrent model's bf16 run drifts further from the f32
/// oracle than attention alone does (the same fixtures are STRICT in f32 on CUDA).
const RECURRENT_BF16_MISSES: usize = 2;

/// Where the inputs of the linear layers are quantized to FP8 (W8A8), a last-bit difference in
/// an activation can cross an e4m3 rounding boundary and move later logprobs by tenths of a nat
/// (see `fp8_parity.rs`): tokens stay STRICT, logprobs are held to this bound.
const W8A8_LOGPROB_TOLERANCE: f32 = 0.6;

/// W8A8: compressed-tensors groups with input activations, or the `fp8` block format
/// (DeepSeek-V3, Qwen3-FP8), whose activations are quantized per 128-group at run time.
fn quantizes_inputs(config: &serde_json::Value) -> bool {
    let q = &config["quantization_config"];
    let groups = q["config_groups"].as_object();
    groups.is_some_and(|g| g.values().any(|g| !g["input_activations"].is_null())) || q["quant_method"] == "fp8"
}

/// Whether the fixture's config has recurrent (linear-attention or state-space) layers.
fn has_recurrent_layers(config: &serde_json::Value) -> bool {
    ["linear_num_value_heads", "linear_attn_config", "mamba_d_state", "ssm_state_size"]
        .iter()
        .any(|k| !config[*k].is_null() || !config["text_config"][*k].is_null())
}

/// Whether the fixture's config routes tokens among experts (any spelling of the expert count,
/// at the top level or in `text_config`).
fn routes_among_experts(config: &serde_json::Value) -> bool {
    let keys = ["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"];
    [Some(config), config.get("text_config")].into_iter().flatten().any(|c| {
        keys.iter().any(|k| match &c[*k] {
            serde_json::Value::Number(n) => n.as_u64().is_some_and(|n| n > 1),
            serde_json::Value::Array(a) => a.iter().any(|n| n.as_u64().is_some_and(|n| n > 1)),
            _ => false,
        })
    })
}

#[test]
fn every_fixture_on_cuda() {
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return;
    }
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir().join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut failures = Vec::new();
    let mut bf16_misses = Vec::new();
    let (mut bf16_strict, mut bf16_near, mut bf16_total) = (0, 0, 0);
    for name in &names {
        let dir = fixtures_dir().join("models").join(name);
        let config = ferrite_models::loading::config::RawConfig::from_file(&dir.join("config.json")).unwrap().value;
        let moe = routes_among_experts(&config);
        let recurrent = has_recurrent_layers(&config);
        let w8a8 = quantizes_inputs(&config);
        let tolerance = if w8a8 { W8A8_LOGPROB_TOLERANCE } else { LOGPROB_TOLERANCE };
        let stable = stable_prefixes(&dir.join("oracle.json")).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let (oracle, reports) = match run_fixture_on(&dir, dtype, Device::Cuda(0)) {
                Ok(r) => r,
                Err(e) => {
                    println!("{name} {dtype}: ERROR {e}");
                    failures.push(format!("{name} {dtype}: {e}"));
                    continue;
                }
            };
            let worst = reports.iter().map(|r| r.max_logprob_error).fold(0.0f32, f32::max);
            println!(
                "{name} ({}) cuda {dtype}: {}, max logprob error {worst:.1e}",
                oracle.architecture,
                summarize(&reports)
            );
            for r in &reports {
                let line = format!(
                    "{name} {dtype}/{}: divergence {:?}, logprob error {}",
                    r.name, r.divergence, r.max_logprob_error
                );
                match dtype {
                    // The stable prefix is the oracle's own estimate (a float64 and three
                    // perturbed runs); cuBLAS sums in yet another order, so a W8A8 case may also
                    // part from it inside the prefix at a near tie.
                    DType::F32
                        if !(r.holds_through(stable.get(&r.name).copied().unwrap_or(usize::MAX), tolerance)
                            || (w8a8 && r.near_tie() && r.max_logprob_error < tolerance)) =>
                    {
                        failures.push(line)
                    }
                    DType::BF16 if !(r.strict || r.near_tie()) => bf16_misses.push(line),
                    _ => {}
                }
            }
            if dtype == DType::BF16 {
                let misses = reports.iter().filter(|r| !(r.strict || r.near_tie())).count();
                // bf16 moves each activation by up to 2^-9 of itself before it is rounded to
                // e4m3 (steps of 2^-4), so a few percent of the quantized inputs land on the
                // other e4m3 neighbour than in the f32 oracle: a W8A8 model in bf16 is compared
                // and reported, its f32 run above is the gate.
                let allowed = if moe { MOE_BF16_MISSES } else { 0 } + if recurrent { RECURRENT_BF16_MISSES } else { 0 };
                if misses > allowed && !w8a8 {
                    failures.push(format!(
                        "{name} bf16: {misses} cases beyond the near-tie rule (moe: {moe}, recurrent: {recurrent})"
                    ));
                }
                bf16_total += reports.len();
                bf16_strict += reports.iter().filter(|r| r.strict).count();
                bf16_near += reports.iter().filter(|r| r.near_tie()).count();
            }
        }
    }
    println!(
        "bf16 on cuda: {} of {bf16_total} cases pass (STRICT {bf16_strict} + near-tie {bf16_near}, rule {NEAR_TIE_NATS} nats)",
        bf16_strict + bf16_near
    );
    println!("bf16 cases beyond the near-tie rule:\n{}", bf16_misses.join("\n"));
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// DeepSeek's MLA (and GLM-4-MoE-Lite's) with the latent KV cache (compressed latent + rope key, `kv_b_proj` absorbed
/// into the query and output) on CUDA, f32, token-exact.
#[test]
fn deepseek_latent_mla_on_cuda() {
    use ferrite_models::families::deepseek_v2::{self, DeepseekVariant};
    use ferrite_models::layers::mla::MlaCacheMode;
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return;
    }
    let fixtures = [
        ("deepseek-v2", DeepseekVariant::V2),
        ("deepseek-v3", DeepseekVariant::V3),
        ("glm4-moe-lite", DeepseekVariant::Glm4MoeLite),
    ];
    for (name, variant) in fixtures {
        let dir = fixtures_dir().join("models").join(name);
        let (_, reports) = run_fixture_with(&dir, DType::F32, Device::Cuda(0), |r, w| {
            Ok(Box::new(deepseek_v2::load_with(r, w, variant, MlaCacheMode::Latent)?))
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!("{name} latent MLA cache cuda f32: {}", summarize(&reports));
        for r in &reports {
            assert!(r.strict && r.max_logprob_error < LOGPROB_TOLERANCE, "{name}/{}: {:?}", r.name, r.divergence);
        }
    }
}

/// On CUDA in bf16 the W4A16 fixture's linear layers stay packed (the battery above runs them
/// so), half a byte per weight, as do the symmetric GPTQ fixture's (repacked at load), and
/// `dequantize_weights` still gives the dequantized model; both pass the near-tie rule.
#[test]
fn int4_weights_stay_packed_on_cuda() {
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return;
    }
    for name in ["llama-w4a16", "llama-gptq"] {
        let dir = fixtures_dir().join("models").join(name);
        let opts = |dequantize_weights: bool| ferrite_models::LoadOptions {
            dtype: DType::BF16,
            device: Device::Cuda(0),
            progress: false,
            dequantize_weights,
            ..Default::default()
        };
        let load = |dequantize_weights: bool| {
            ferrite_models::load_model(&dir, &opts(dequantize_weights)).unwrap().model.info().weight_bytes
        };
        let (kept, dequantized) = (load(false), load(true));
        let config = ferrite_models::loading::config::RawConfig::from_file(&dir.join("config.json")).unwrap().value;
        let (h, i) = (config["hidden_size"].as_u64().unwrap(), config["intermediate_size"].as_u64().unwrap());
        let kv = config["num_key_value_heads"].as_u64().unwrap() * config["head_dim"].as_u64().unwrap();
        let per_layer = (2 * h * h + 2 * kv * h + 3 * h * i) as usize;
        let linear = per_layer * config["num_hidden_layers"].as_u64().unwrap() as usize;
        println!("{name} bf16 weight bytes: kept {kept}, dequantized {dequantized} ({linear} linear weights)");
        // bf16 is 2 bytes a weight; packed is half a byte plus a bf16 scale per 32 (both fixtures'
        // group size).
        assert_eq!(
            dequantized - kept,
            linear * 2 - (linear / 2 + linear / 32 * 2),
            "{name}: kept {kept} vs {dequantized}"
        );
        for dequantize_weights in [false, true] {
            let (_, reports) = ferrite_testing::gate::run_fixture_opts(&dir, &opts(dequantize_weights)).unwrap();
            println!("{name} bf16 dequantize_weights={dequantize_weights}: {}", summarize(&reports));
            assert!(reports.iter().all(|r| r.strict || r.near_tie()), "{name} dequantize_weights={dequantize_weights}");
        }
    }
}

/// On CUDA in bf16 the FP8 fixtures' linear layers stay e4m3 bytes (the FP8 GEMV and GEMM read
/// them), a byte per weight, and `dequantize_weights` still gives the dequantized bf16 model. A
/// bf16 W8A8 model is noisy against its f32 oracle (see `every_fixture_on_cuda`), so the kept
/// model is held to the dequantized one's own count of cases within the near-tie rule, less one.
#[test]
fn fp8_weights_stay_bytes_on_cuda() {
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return;
    }
    let opts = |dequantize_weights: bool| ferrite_models::LoadOptions {
        dtype: DType::BF16,
        device: Device::Cuda(0),
        progress: false,
        dequantize_weights,
        fp8_kernels: true,
        ..Default::default()
    };
    let passing =
        |reports: &[ferrite_testing::gate::CaseReport]| reports.iter().filter(|r| r.strict || r.near_tie()).count();
    for name in ["llama-fp8-dynamic", "llama-fp8-static", "llama-fp8-block", "qwen3-fp8", "deepseek-v3-fp8"] {
        let dir = fixtures_dir().join("models").join(name);
        let bytes = |dequantize_weights: bool| {
            ferrite_models::load_model(&dir, &opts(dequantize_weights)).unwrap().model.info().weight_bytes
        };
        let (kept, dequantized) = (bytes(false), bytes(true));
        let (_, kept_reports) = ferrite_testing::gate::run_fixture_opts(&dir, &opts(false)).unwrap();
        let (_, dequantized_reports) = ferrite_testing::gate::run_fixture_opts(&dir, &opts(true)).unwrap();
        println!(
            "{name} bf16 weight bytes kept {kept} / dequantized {dequantized}: kept {}, dequantized {}",
            summarize(&kept_reports),
            summarize(&dequantized_reports)
        );
        assert!(kept < dequantized, "{name}: FP8 weights were not kept as bytes ({kept} vs {dequantized})");
        assert!(
            passing(&kept_reports) + 1 >= passing(&dequantized_reports),
            "{name}: kept FP8 weights pass {} cases, the dequantized model {}",
            passing(&kept_reports),
            passing(&dequantized_reports)
        );
    }
}
