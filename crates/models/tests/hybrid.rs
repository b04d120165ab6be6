//! Recurrent models (the Gated DeltaNet hybrids Qwen3-Next and Qwen3.5, Mamba2) beyond the
//! parity battery: the gate catches breaks of their recurrent layers, and the state carried
//! between steps gives what one pass over the whole sequence gives.

use ferrite_models::{load_model, CausalLM, ForwardInput, LoadOptions};
use ferrite_tensor::{AttnMetadata, AttnSeq, DType, Device};
use ferrite_testing::gate::{edit_config, edit_f32_tensors, fixture_copy, fixtures_dir, run_fixture, Oracle};

fn strict_count(dir: &std::path::Path) -> (usize, usize) {
    let (_, reports) = run_fixture(dir, DType::F32).unwrap();
    (reports.iter().filter(|r| r.strict).count(), reports.len())
}

/// Each break changes outputs of the battery; the unbroken copy passes all of it.
#[test]
fn gate_catches_gated_deltanet_breaks() {
    let breaks: [Break; 4] = [
        ("unbroken", None, None),
        (
            "key heads regrouped (2 x 8 -> 4 x 4: same widths, other L2 norms and head sharing)",
            Some(|c| {
                c["linear_num_key_heads"] = 4.into();
                c["linear_key_head_dim"] = 4.into();
            }),
            None,
        ),
        ("causal conv taps reversed", None, Some(reversed_conv_taps)),
        (
            "A_log negated (slower state decay)",
            None,
            Some(|name| {
                name.ends_with("A_log").then(|| Box::new(|w: &mut [f32]| w.iter_mut().for_each(|v| *v = -*v)) as Edit)
            }),
        ),
    ];
    assert_gate_catches("qwen3-next", &breaks);
}

/// A change to a tensor's values.
type Edit = Box<dyn Fn(&mut [f32])>;
type WeightEdit = fn(&str) -> Option<Edit>;

/// Every causal conv's taps (kernel 4) in reverse order.
fn reversed_conv_taps(name: &str) -> Option<Edit> {
    name.ends_with("conv1d.weight")
        .then(|| Box::new(|w: &mut [f32]| w.chunks_exact_mut(4).for_each(<[f32]>::reverse)) as Edit)
}

/// The tensors whose names end with `suffix`, zeroed.
fn zeroed(name: &str, suffix: &str) -> Option<Edit> {
    name.ends_with(suffix).then(|| Box::new(|w: &mut [f32]| w.fill(0.0)) as Edit)
}
type ConfigEdit = fn(&mut serde_json::Value);
type Break = (&'static str, Option<ConfigEdit>, Option<WeightEdit>);

/// Mamba2: the D skip, the conv and the B/C grouping each matter.
#[test]
fn gate_catches_mamba2_breaks() {
    let breaks: [Break; 4] = [
        ("unbroken", None, None),
        (
            "B/C regrouped (2 groups of state 8 -> 1 of 16: same widths, other heads' B and C)",
            Some(|c| {
                c["n_groups"] = 1.into();
                c["state_size"] = 16.into();
            }),
            None,
        ),
        ("causal conv taps reversed", None, Some(reversed_conv_taps)),
        ("D skip zeroed", None, Some(|name| zeroed(name, "mixer.D"))),
    ];
    assert_gate_catches("mamba2", &breaks);
}

/// Mamba (1): A per channel and state entry, the dt_proj bias inside the softplus, the conv and
/// the D skip each matter; so do Falcon-Mamba's dt/B/C norms.
#[test]
fn gate_catches_mamba_breaks() {
    let breaks: [Break; 5] = [
        ("unbroken", None, None),
        (
            "A one value per channel (every state entry given the channel's first A)",
            None,
            Some(|name| {
                name.ends_with("A_log")
                    .then(|| Box::new(|w: &mut [f32]| w.chunks_exact_mut(8).for_each(|row| row.fill(row[0]))) as Edit)
            }),
        ),
        ("dt_proj bias zeroed", None, Some(|name| zeroed(name, "dt_proj.bias"))),
        ("causal conv taps reversed", None, Some(reversed_conv_taps)),
        ("D skip zeroed", None, Some(|name| zeroed(name, "mixer.D"))),
    ];
    assert_gate_catches("mamba", &breaks);
    let falcon: [Break; 2] = [
        ("unbroken", None, None),
        (
            "dt/B/C norms read as Mamba's (none)",
            Some(|c| c["architectures"] = serde_json::json!(["MambaForCausalLM"])),
            None,
        ),
    ];
    assert_gate_catches("falcon-mamba", &falcon);
}

/// Jamba: its dt/B/C norms' weights and A per state entry matter.
#[test]
fn gate_catches_jamba_breaks() {
    let breaks: [Break; 3] = [
        ("unbroken", None, None),
        (
            "dt/B/C RMSNorm weights read as ones",
            None,
            Some(|name| {
                name.ends_with("layernorm.weight")
                    .then(|| name.contains(".mamba."))
                    .filter(|&mamba| mamba)
                    .map(|_| Box::new(|w: &mut [f32]| w.fill(1.0)) as Edit)
            }),
        ),
        (
            "A one value per channel",
            None,
            Some(|name| {
                name.ends_with("A_log")
                    .then(|| Box::new(|w: &mut [f32]| w.chunks_exact_mut(8).for_each(|row| row.fill(row[0]))) as Edit)
            }),
        ),
    ];
    assert_gate_catches("jamba", &breaks);
}

/// OLMo Hybrid: beta's [0, 2] range and the attention layer's rotary embedding matter.
#[test]
fn gate_catches_olmo_hybrid_breaks() {
    let breaks: [Break; 3] = [
        ("unbroken", None, None),
        ("linear_allow_neg_eigval off (beta in [0, 1])", Some(|c| c["linear_allow_neg_eigval"] = false.into()), None),
        ("rope_parameters dropped (NoPE attention)", Some(|c| c["rope_parameters"] = serde_json::Value::Null), None),
    ];
    assert_gate_catches("olmo-hybrid", &breaks);
}

/// Nemotron-H: the dt clamp on prompts (time_step_min) and its relu² MLP layers matter.
#[test]
fn gate_catches_nemotron_h_breaks() {
    let breaks: [Break; 3] = [
        ("unbroken", None, None),
        (
            "time_step_min 0.05 -> 1e-4 (the prompt dt clamp all but off)",
            Some(|c| c["time_step_min"] = 1e-4.into()),
            None,
        ),
        ("MLP activation relu2 -> relu", Some(|c| c["mlp_hidden_act"] = "relu".into()), None),
    ];
    assert_gate_catches("nemotron-h", &breaks);
}

/// Granite 4.0-H: its Mamba2 layers' D skip and B/C grouping matter. (Rotary embeddings on its
/// one attention layer would go unnoticed: Granite's attention multiplier, 1/128 here as in the
/// real models, leaves that layer's softmax nearly flat.)
#[test]
fn gate_catches_granite_moe_hybrid_breaks() {
    let breaks: [Break; 3] = [
        ("unbroken", None, None),
        ("D skip zeroed", None, Some(|name| zeroed(name, "mamba.D"))),
        (
            "B/C regrouped (2 groups of state 8 -> 1 of 16)",
            Some(|c| {
                c["mamba_n_groups"] = 1.into();
                c["mamba_d_state"] = 16.into();
            }),
            None,
        ),
    ];
    assert_gate_catches("granite-moe-hybrid", &breaks);
}

/// LFM2: its short convs' taps and bias, and the rotary embedding of its attention layer, matter.
#[test]
fn gate_catches_lfm2_breaks() {
    let breaks: [Break; 4] = [
        ("unbroken", None, None),
        ("short conv bias zeroed", None, Some(|name| zeroed(name, "conv.conv.bias"))),
        (
            "short conv taps reversed",
            None,
            Some(|name| {
                name.ends_with("conv.conv.weight")
                    .then(|| Box::new(|w: &mut [f32]| w.chunks_exact_mut(3).for_each(<[f32]>::reverse)) as Edit)
            }),
        ),
        ("rope_theta 1e6 -> 100", Some(|c| c["rope_parameters"]["rope_theta"] = 100.0.into()), None),
    ];
    assert_gate_catches("lfm2", &breaks);
}

/// LFM2-MoE: the expert bias steers the choice of experts, and the routed weights are scaled.
#[test]
fn gate_catches_lfm2_moe_breaks() {
    let breaks: [Break; 3] = [
        ("unbroken", None, None),
        ("expert_bias zeroed", None, Some(|name| zeroed(name, "feed_forward.expert_bias"))),
        ("routed_scaling_factor 2 -> 1", Some(|c| c["routed_scaling_factor"] = 1.0.into()), None),
    ];
    assert_gate_catches("lfm2-moe", &breaks);
}

/// Falcon-H1: the muP multipliers inside its parallel attention + Mamba2 layers (the in_proj
/// vector, the keys', the MLP's), where its gated norm sits, and the embedding multiplier matter.
#[test]
fn gate_catches_falcon_h1_breaks() {
    let breaks: [Break; 6] = [
        ("unbroken", None, None),
        (
            "ssm_multipliers dropped (no muP vector on in_proj's output)",
            Some(|c| {
                c.as_object_mut().unwrap().remove("ssm_multipliers");
            }),
            None,
        ),
        ("key_multiplier 0.39 -> 1", Some(|c| c["key_multiplier"] = 1.0.into()), None),
        ("attention_in_multiplier 1.3 -> 1", Some(|c| c["attention_in_multiplier"] = 1.0.into()), None),
        ("mamba_norm_before_gate on -> off", Some(|c| c["mamba_norm_before_gate"] = false.into()), None),
        (
            "mlp_multipliers [0.88, 0.59] -> [1, 1]",
            Some(|c| c["mlp_multipliers"] = serde_json::json!([1.0, 1.0])),
            None,
        ),
    ];
    assert_gate_catches("falcon-h1", &breaks);
    let tiny: [Break; 3] = [
        ("unbroken", None, None),
        ("embedding_multiplier 0.5 -> 1", Some(|c| c["embedding_multiplier"] = 1.0.into()), None),
        ("Mamba2 D skip zeroed", None, Some(|name| zeroed(name, "mamba.D"))),
    ];
    assert_gate_catches("falcon-h1-tiny", &tiny);
}

/// Zamba2: the shared blocks' RoPE, their per-invocation q/k/v and gate_up adapters, the
/// original embeddings in their input, and the hybrid layers' linear each matter.
#[test]
fn gate_catches_zamba2_breaks() {
    let breaks: [Break; 4] = [
        ("unbroken", None, None),
        ("use_mem_rope on -> off", Some(|c| c["use_mem_rope"] = false.into()), None),
        (
            "use_shared_attention_adapter on -> off (no q/k/v adapters)",
            Some(|c| c["use_shared_attention_adapter"] = false.into()),
            None,
        ),
        (
            "original embeddings dropped from the shared blocks' input (their half of input_layernorm zeroed)",
            None,
            Some(|name| {
                name.ends_with("shared_transformer.input_layernorm.weight").then(|| {
                    Box::new(|w: &mut [f32]| {
                        let half = w.len() / 2;
                        w[half..].fill(0.0)
                    }) as Edit
                })
            }),
        ),
    ];
    assert_gate_catches("zamba2", &breaks);
    let tied: [Break; 3] = [
        ("unbroken", None, None),
        (
            "gate_up LoRA adapters zeroed",
            None,
            Some(|name| {
                name.contains("gate_up_proj_adapter_list").then(|| Box::new(|w: &mut [f32]| w.fill(0.0)) as Edit)
            }),
        ),
        (
            "hybrid layers' linear zeroed (shared block output dropped)",
            None,
            Some(|name| zeroed(name, ".linear.weight")),
        ),
    ];
    assert_gate_catches("zamba2-tied", &tied);
}

/// Kimi Linear: KDA's per-channel decay (collapsed to one decay per head: the forget gate's
/// `f_b_proj` rows and `dt_bias` averaged over each head's 16 channels), its sigmoid output gate,
/// and the MoE router's renormalisation and scaling each matter.
#[test]
fn gate_catches_kimi_linear_breaks() {
    let breaks: [Break; 5] = [
        ("unbroken", None, None),
        ("per-channel decay collapsed to one decay per head", None, Some(per_head_decay)),
        (
            "output gate dropped (g_b_proj zeroed: sigmoid 1/2 everywhere)",
            None,
            Some(|name| zeroed(name, "g_b_proj.weight")),
        ),
        ("moe_renormalize true -> false", Some(|c| c["moe_renormalize"] = false.into()), None),
        ("routed_scaling_factor 2.446 -> 1", Some(|c| c["routed_scaling_factor"] = 1.0.into()), None),
    ];
    assert_gate_catches("kimi-linear", &breaks);
}

/// The kimi-linear fixture's forget gates with one decay per head: each head's 16 rows of
/// `f_b_proj` (16 wide) and 16 `dt_bias` values replaced by their mean.
fn per_head_decay(name: &str) -> Option<Edit> {
    const HEAD_DIM: usize = 16;
    let mean_rows = |w: &mut [f32], rows: usize, cols: usize| {
        for head in w.chunks_exact_mut(rows * cols) {
            for c in 0..cols {
                let mean = (0..rows).map(|r| head[r * cols + c]).sum::<f32>() / rows as f32;
                (0..rows).for_each(|r| head[r * cols + c] = mean);
            }
        }
    };
    if name.ends_with("f_b_proj.weight") {
        Some(Box::new(move |w: &mut [f32]| mean_rows(w, HEAD_DIM, HEAD_DIM)))
    } else if name.ends_with("dt_bias") {
        Some(Box::new(move |w: &mut [f32]| mean_rows(w, HEAD_DIM, 1)))
    } else {
        None
    }
}

fn assert_gate_catches(fixture: &str, breaks: &[Break]) {
    for &(what, config, weights) in breaks {
        let dir = fixture_copy(fixture, what);
        if let Some(edit) = config {
            edit_config(&dir, edit);
        }
        if let Some(edit) = weights {
            edit_f32_tensors(&dir, edit);
        }
        let (strict, total) = strict_count(&dir);
        std::fs::remove_dir_all(&dir).ok();
        match what {
            "unbroken" => assert_eq!(strict, total, "{fixture}: the unbroken copy fails the gate"),
            _ => assert!(strict < total, "{fixture}: {what} went unnoticed ({strict}/{total} strict)"),
        }
    }
}

/// A config naming a layer type this family does not have fails to load, naming it.
#[test]
fn an_unknown_layer_type_is_a_load_error() {
    for (fixture, types) in [
        ("qwen3_5", ["linear_attention", "linear_attention", "mamba", "full_attention"]),
        ("lfm2", ["conv", "conv", "mamba", "conv"]),
    ] {
        let dir = fixture_copy(fixture, "unknown-layer-type");
        edit_config(&dir, |c| c["layer_types"] = serde_json::json!(types));
        let err = load_model(&dir, &LoadOptions { progress: false, ..Default::default() }).err().expect("loaded");
        std::fs::remove_dir_all(&dir).ok();
        let msg = err.to_string();
        assert!(msg.contains("mamba") && msg.contains("layer_types"), "{fixture}: {msg}");
    }
}

/// Logits of the last token after the sequence went through the model in `chunks` (the state
/// carried from one forward to the next through slot 1 of 2), its first `prompt` tokens counting
/// as the prompt.
fn last_logits(model: &dyn CausalLM, tokens: &[u32], chunks: &[usize], prompt: usize) -> Vec<f32> {
    let block_size = 16;
    let blocks = tokens.len().div_ceil(block_size);
    let mut caches = model.info().allocate_caches(Device::Cpu, DType::F32, blocks, block_size, 2).unwrap();
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut done = 0;
    let mut logits = Vec::new();
    for &n in chunks {
        let seq = AttnSeq { q_start: 0, q_len: n, ctx_len: done + n, block_table: table.clone() };
        let meta = AttnMetadata::new(vec![seq], block_size)
            .unwrap()
            .with_prompt_lens(vec![prompt])
            .unwrap()
            .with_state_slots(vec![1])
            .unwrap();
        let input = ForwardInput { tokens: &tokens[done..done + n], meta: &meta, logit_rows: &[n - 1], embeds: None };
        logits = model.forward(&input, &mut caches).unwrap().to_f32_vec();
        done += n;
    }
    assert_eq!(done, tokens.len());
    logits
}

/// Chunked prefill (chunks that cut across the references' 64-token chunks) followed by decode
/// gives what the whole prompt in one step followed by decode gives; and decode with the carried
/// state gives what one pass over the whole sequence gives, except for Nemotron-H and Zamba2,
/// whose references clamp dt (at `time_step_min`) on prompts only (so a token decoded and the
/// same token in a prompt differ).
#[test]
fn carried_state_equals_one_pass() {
    for name in [
        "qwen3-next",
        "qwen3_5",
        "mamba",
        "jamba",
        "mamba2",
        "nemotron-h",
        "granite-moe-hybrid",
        "lfm2",
        "lfm2-moe",
        "falcon-h1",
        "falcon-h1-tiny",
        "zamba2",
        "zamba2-tied",
        "kimi-linear",
    ] {
        let dir = fixtures_dir().join("models").join(name);
        let oracle = Oracle::load(&dir.join("oracle.json")).unwrap();
        let model = load_model(&dir, &LoadOptions { progress: false, ..Default::default() }).unwrap().model;
        let case = oracle.cases.iter().max_by_key(|c| c.prompt_ids.len()).unwrap();
        let tokens: Vec<u32> = case.prompt_ids.iter().chain(&case.output_ids[..4]).copied().collect();
        let n = case.prompt_ids.len();
        let decoded = last_logits(model.as_ref(), &tokens, &[n, 1, 1, 1, 1], n);
        let err = |other: &[f32]| decoded.iter().zip(other).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let chunked = last_logits(model.as_ref(), &tokens, &[50, 50, 100, n - 200, 1, 1, 1, 1], n);
        assert!(err(&chunked) < 1e-4, "{name}: chunked prefill differs from one prefill by {}", err(&chunked));
        let one_pass = last_logits(model.as_ref(), &tokens, &[n + 4], n + 4);
        match name {
            "nemotron-h" | "zamba2" | "zamba2-tied" => {
                assert!(err(&one_pass) > 1e-5, "{name}: decode clamps dt like a prompt")
            }
            _ => assert!(err(&one_pass) < 1e-4, "{name}: decode differs from one pass by {}", err(&one_pass)),
        }
    }
}
