//! Token-exact greedy parity with transformers on CPU, one test per oracle fixture
//! (regenerate fixtures with `tools/oracle/generate_fixtures.py`, see tools/oracle/README.md).

use std::path::Path;

use ferrite_tensor::DType;
use ferrite_testing::gate::{edit_config, fixture_copy, fixtures_dir, rename_tensors, run_fixture, summarize};

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
            assert!(
                r.max_logprob_error < LOGPROB_TOLERANCE,
                "{name}/{}: logprob error {}",
                r.name,
                r.max_logprob_error
            );
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
    llama_eagle3_target => "llama-eagle3",
    mistral_sliding_window => "mistral",
    qwen2 => "qwen2",
    qwen3 => "qwen3",
    qwen2_vl => "qwen2-vl",
    qwen2_5_vl => "qwen2.5-vl",
    qwen3_vl => "qwen3-vl",
    qwen3_vl_moe => "qwen3-vl-moe",
    qwen3_5_vl => "qwen3.5-vl",
    llava => "llava",
    llava_siglip => "llava-siglip",
    llava_next => "llava-next",
    mistral3 => "mistral3",
    gemma3_vl => "gemma3-vl",
    gemma => "gemma",
    gemma2 => "gemma2",
    gemma3 => "gemma3",
    phi3 => "phi3",
    phi3_longrope => "phi3-longrope",
    phi3_longrope_switch_during_decode => "phi3-longrope-switch",
    phi => "phi",
    opt => "opt",
    opt_postnorm => "opt-postnorm",
    gpt2 => "gpt2",
    gpt_neox => "gpt-neox",
    gptj => "gptj",
    afmoe => "afmoe",
    cohere2_moe => "cohere2-moe",
    cohere2_moe_rms_sigmoid => "cohere2-moe-rms-sigmoid",
    phimoe => "phimoe",
    phimoe_switch_during_decode => "phimoe-switch",
    granite_swa => "granite-swa",
    granite_moe_swa => "granite-moe-swa",
    hyperclovax => "hyperclovax",
    lfm3 => "lfm3",
    stablelm => "stablelm",
    stablelm_qknorm_parallel => "stablelm-qknorm-parallel",
    granite => "granite",
    olmo2 => "olmo2",
    cohere => "cohere",
    starcoder2 => "starcoder2",
    falcon => "falcon",
    falcon_new_arch => "falcon-new-arch",
    mixtral => "mixtral",
    mixtral_default_rope_theta => "mixtral-default-theta",
    qwen2_moe => "qwen2-moe",
    qwen3_moe => "qwen3-moe",
    olmoe => "olmoe",
    deepseek_v2 => "deepseek-v2",
    deepseek_v3 => "deepseek-v3",
    deepseek_v32 => "deepseek-v32",
    smollm3 => "smollm3",
    internlm3 => "internlm3",
    seed_oss => "seed-oss",
    ernie4_5 => "ernie4_5",
    ministral3 => "ministral3",
    arcee => "arcee",
    apertus => "apertus",
    cohere2 => "cohere2",
    olmo3 => "olmo3",
    exaone4 => "exaone4",
    glm => "glm",
    glm4 => "glm4",
    glm4_moe => "glm4-moe",
    glm4_moe_mtp_target => "glm4-moe-mtp",
    glm4_moe_lite => "glm4-moe-lite",
    hunyuan_dense => "hunyuan-dense",
    hunyuan_moe => "hunyuan-moe",
    granite_moe => "granite-moe",
    granite_moe_shared => "granite-moe-shared",
    minimax_m2 => "minimax-m2",
    ernie45_moe => "ernie45-moe",
    minicpm3 => "minicpm3",
    llama4 => "llama4",
    gpt_oss => "gpt_oss",
    gpt_oss_mxfp4 => "gpt_oss_mxfp4",
    gemma4 => "gemma4",
    gemma3n => "gemma3n",
    internlm2 => "internlm2",
    minicpm => "minicpm",
    chatglm => "chatglm",
    qwen3_next => "qwen3-next",
    qwen3_5 => "qwen3_5",
    qwen3_5_moe => "qwen3_5-moe",
    qwen3_5_conditional_generation_layout => "qwen3_5-conditional",
    mamba => "mamba",
    falcon_mamba => "falcon-mamba",
    jamba => "jamba",
    olmo_hybrid => "olmo-hybrid",
    exaone => "exaone",
    mamba2 => "mamba2",
    nemotron => "nemotron",
    nemotron_h => "nemotron-h",
    lfm2 => "lfm2",
    lfm2_moe => "lfm2-moe",
    granite_moe_hybrid => "granite-moe-hybrid",
    falcon_h1 => "falcon-h1",
    falcon_h1_tiny => "falcon-h1-tiny",
    zamba2 => "zamba2",
    zamba2_tied => "zamba2-tied",
    kimi_linear => "kimi-linear",
}

/// A copy of a fixture with its config edited, to show the gate catches the edit.
fn broken_copy(name: &str, edit: impl Fn(&mut serde_json::Value)) -> std::path::PathBuf {
    let dir = fixture_copy(name, "broken");
    edit_config(&dir, edit);
    dir
}

fn strict_count(dir: &Path) -> (usize, usize) {
    let (_, reports) = run_fixture(dir, DType::F32).unwrap();
    (reports.iter().filter(|r| r.strict).count(), reports.len())
}

#[test]
fn gate_catches_a_dropped_rope_scaling() {
    let dir = broken_copy("llama-tied-llama3rope", |c| {
        c["rope_parameters"] =
            serde_json::json!({"rope_type": "default", "rope_theta": c["rope_parameters"]["rope_theta"]});
    });
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(strict < total, "dropping llama3 rope scaling went unnoticed ({strict}/{total} strict)");
}

#[test]
fn gate_catches_a_wrong_norm_epsilon() {
    let dir = broken_copy("qwen3", |c| c["rms_norm_eps"] = serde_json::json!(0.5));
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert!(strict < total, "a wrong rms_norm_eps went unnoticed ({strict}/{total} strict)");
}

/// Architectures vLLM's registry serves as Llama load the Llama fixture under their own names
/// and meet its oracle.
#[test]
fn llama_aliases_run_the_llama_fixture() {
    for alias in ["LLaMAForCausalLM", "IQuestCoderForCausalLM", "TeleChat3ForCausalLM"] {
        let dir = broken_copy("llama", |c| c["architectures"] = serde_json::json!([alias]));
        let (strict, total) = strict_count(&dir);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(strict, total, "{alias}: {strict}/{total} strict");
    }
}

/// EXAONE's own config keys are read: a wrong `layer_norm_epsilon` or a dropped `rope_theta`
/// (transformers' default 500000) changes tokens.
#[test]
fn gate_catches_exaone_config_breaks() {
    type ConfigEdit = fn(&mut serde_json::Value);
    let breaks: [(&str, ConfigEdit); 2] = [
        ("layer_norm_epsilon 1e-6 -> 0.5", |c| c["layer_norm_epsilon"] = serde_json::json!(0.5)),
        ("rope_theta dropped (500000)", |c| {
            c.as_object_mut().unwrap().remove("rope_theta");
        }),
    ];
    for (what, edit) in breaks {
        let dir = broken_copy("exaone", edit);
        let (strict, total) = strict_count(&dir);
        std::fs::remove_dir_all(&dir).ok();
        assert!(strict < total, "{what} went unnoticed ({strict}/{total} strict)");
    }
}

/// Vision-language: the MRoPE split of the text model's frequencies, the vision tower's 2-D
/// rotary embedding, Qwen2.5-VL's attention windows and the seconds its video positions count,
/// Qwen3-VL's DeepStack blocks and interleaved MRoPE, Mistral 3's Pixtral rotary base and feature
/// layer each change image or video prompts' tokens.
#[test]
fn gate_catches_vision_language_breaks() {
    assert_breaks_caught(&[
        ("qwen2-vl", "an MRoPE split moved by one frequency", |c| {
            c["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([3, 3, 2])
        }),
        ("qwen2-vl", "the vision tower's rotary base", |c| {
            c["vision_config"]["rope_parameters"]["rope_theta"] = serde_json::json!(100.0)
        }),
        ("qwen2-vl", "every frequency on the temporal axis (1-D positions)", |c| {
            c["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([8, 0, 0])
        }),
        ("qwen2.5-vl", "windows as wide as the image (no window attention)", |c| {
            c["vision_config"]["window_size"] = serde_json::json!(560)
        }),
        ("qwen2.5-vl", "every block windowed", |c| c["vision_config"]["fullatt_block_indexes"] = serde_json::json!([])),
        ("qwen2.5-vl", "a video's time steps 0.33 positions apart instead of 2.08", |c| {
            c["vision_config"]["tokens_per_second"] = serde_json::json!(4)
        }),
        ("qwen3-vl", "DeepStack features from other blocks", |c| {
            c["vision_config"]["deepstack_visual_indexes"] = serde_json::json!([1, 2])
        }),
        ("qwen3-vl", "every frequency on the temporal axis (1-D positions)", |c| {
            c["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([8, 0, 0])
        }),
        ("llava-siglip", "the SigLIP tower read a layer early", |c| c["vision_feature_layer"] = serde_json::json!(-2)),
        ("mistral3", "the Pixtral tower's 2-D rotary base", |c| {
            c["vision_config"]["rope_parameters"]["rope_theta"] = serde_json::json!(100.0)
        }),
        ("mistral3", "the Pixtral tower read a layer early", |c| c["vision_feature_layer"] = serde_json::json!(-2)),
    ]);
}

/// `--dtype bf16` on the CPU: bf16 weights, f32 activations, the pixels rounded to bf16 as
/// transformers casts them. Against the f32 oracle every case holds by the near-tie rule (bf16
/// rounding may tip a close pick, nothing more).
#[test]
fn vision_language_runs_in_bf16_on_cpu() {
    for fixture in ["qwen2-vl", "qwen2.5-vl", "llava", "llava-next", "mistral3"] {
        let (_, reports) = run_fixture(&fixtures_dir().join("models").join(fixture), DType::BF16)
            .unwrap_or_else(|e| panic!("{fixture} in bf16: {e}"));
        println!("{fixture} bf16 on the CPU: {}", summarize(&reports));
        let agreeing = reports.iter().filter(|r| r.strict || r.near_tie()).count();
        assert_eq!(agreeing, reports.len(), "{fixture} in bf16: {}", summarize(&reports));
    }
}

/// The Hub's Qwen2-VL and Qwen2.5-VL checkpoints were saved by transformers 4: text keys at the
/// config's top level with MRoPE spelled as `rope_scaling: {type: mrope}`, `in_chans` in the
/// vision config, and tensors under `model.*` and `visual.*`. The fixtures rewritten that way
/// give the same tokens.
#[test]
fn qwen_vl_checkpoints_in_the_hub_layout_load() {
    for fixture in ["qwen2-vl", "qwen2.5-vl"] {
        let dir = fixture_copy(fixture, "hub-layout");
        edit_config(&dir, |c| {
            let text = c["text_config"].take();
            for (key, value) in text.as_object().unwrap() {
                if key == "rope_parameters" {
                    c["rope_theta"] = value["rope_theta"].clone();
                    c["rope_scaling"] = serde_json::json!({"type": "mrope", "mrope_section": value["mrope_section"]});
                } else if c.get(key).is_none() {
                    c[key] = value.clone();
                }
            }
            c.as_object_mut().unwrap().remove("text_config");
            let vision = c["vision_config"].as_object_mut().unwrap();
            vision.remove("rope_parameters");
            vision.remove("in_channels");
            vision.insert("in_chans".into(), 3.into());
        });
        rename_tensors(&dir, |name| {
            if let Some(rest) = name.strip_prefix("model.language_model.") {
                format!("model.{rest}")
            } else if let Some(rest) = name.strip_prefix("model.visual.") {
                format!("visual.{rest}")
            } else {
                name.to_string()
            }
        });
        let (strict, total) = strict_count(&dir);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(strict, total, "{fixture} in the Hub's layout: {strict}/{total} strict");
    }
}

/// Qwen3-VL-MoE's Hub checkpoints store each layer's experts fused as `[experts, in, out]`;
/// transformers 5 saves them `[experts, out, in]`. Both give the same tokens.
#[test]
fn qwen3_vl_moe_experts_in_the_hub_layout_load() {
    let dir = fixture_copy("qwen3-vl-moe", "hub-layout");
    ferrite_testing::gate::transpose_f32_tensors(&dir, |name| {
        name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj")
    });
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "qwen3-vl-moe with [experts, in, out] experts: {strict}/{total} strict");
}

/// llava-hf's checkpoints keep the CLIP tower under `vision_tower.vision_model.*` (transformers 5
/// saves it under `vision_tower.*`); the same weights give the same tokens either way.
#[test]
fn llava_checkpoints_in_the_hub_layout_load() {
    let dir = fixture_copy("llava", "hub-layout");
    rename_tensors(&dir, |name| match name.strip_prefix("vision_tower.") {
        Some(rest) => format!("vision_tower.vision_model.{rest}"),
        None => name.to_string(),
    });
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "llava in the Hub's layout: {strict}/{total} strict");
}

/// LLaVA-NeXT in the `model.*`-rooted layout of transformers' module tree (`model.image_newline`,
/// `model.language_model.*`, `model.vision_tower.*`, `lm_head`) gives the same tokens as the
/// `language_model.*` one transformers saves, with `image_newline` at the root.
#[test]
fn llava_next_checkpoints_in_the_model_rooted_layout_load() {
    let dir = fixture_copy("llava-next", "model-rooted");
    rename_tensors(&dir, |name| {
        if let Some(rest) = name.strip_prefix("language_model.model.") {
            format!("model.language_model.{rest}")
        } else if let Some(rest) = name.strip_prefix("language_model.") {
            rest.to_string()
        } else {
            format!("model.{name}")
        }
    });
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "llava-next in the model-rooted layout: {strict}/{total} strict");
}

/// Model families wave 1: each family's distinctive config key, edited in a copy of its fixture,
/// must break the gate — tokens where the key changes greedy outputs, log-probs where it only
/// rescales the logits (final softcap, logit scale), which the gate compares within
/// `LOGPROB_TOLERANCE`.
type Edit = fn(&mut serde_json::Value);

/// Each `(fixture, what, edit)` must fail the gate: tokens diverge, or log-probs move past the
/// tolerance (for edits that only rescale the logits).
fn assert_breaks_caught(breaks: &[(&str, &str, Edit)]) {
    for (fixture, what, edit) in breaks {
        let dir = broken_copy(fixture, edit);
        let (_, reports) = run_fixture(&dir, DType::F32).unwrap_or_else(|e| panic!("{fixture} ({what}): {e}"));
        std::fs::remove_dir_all(&dir).ok();
        let strict = reports.iter().filter(|r| r.strict).count();
        let worst = reports.iter().map(|r| r.max_logprob_error).fold(0.0f32, f32::max);
        println!("{fixture} with {what}: {strict}/{} strict, max logprob error {worst:.3}", reports.len());
        assert!(
            strict < reports.len() || worst >= LOGPROB_TOLERANCE,
            "{fixture}: {what} went unnoticed ({strict}/{} strict, max logprob error {worst})",
            reports.len()
        );
    }
}

#[test]
fn gate_catches_wave1_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("gemma2", "attention softcap dropped", |c| c["attn_logit_softcapping"] = json!(null)),
        ("gemma2", "final softcap dropped", |c| c["final_logit_softcapping"] = json!(null)),
        ("gemma2", "query_pre_attn_scalar ignored", |c| c["query_pre_attn_scalar"] = json!(16)),
        ("gemma3", "local rope base = global", |c| {
            c["rope_parameters"]["sliding_attention"] = c["rope_parameters"]["full_attention"].clone()
        }),
        ("phi3-longrope", "long factors = short", |c| {
            c["rope_parameters"]["long_factor"] = c["rope_parameters"]["short_factor"].clone()
        }),
        ("phi", "full rotary", |c| c["rope_parameters"]["partial_rotary_factor"] = json!(1.0)),
        ("gpt-neox", "sequential residual", |c| c["use_parallel_residual"] = json!(false)),
        ("granite", "residual_multiplier 1", |c| c["residual_multiplier"] = json!(1.0)),
        ("granite", "logits_scaling 1", |c| c["logits_scaling"] = json!(1.0)),
        ("cohere", "logit_scale 1", |c| c["logit_scale"] = json!(1.0)),
        ("starcoder2", "sliding window dropped", |c| c["sliding_window"] = json!(null)),
    ];
    assert_breaks_caught(breaks);
}

/// The DeepSeek fixtures again with MLA's latent KV cache (compressed latent + rope key, one KV
/// head, `kv_b_proj` absorbed into the query and output) instead of the default expanded cache.
fn gate_latent_mla(name: &str, variant: ferrite_models::families::deepseek_v2::DeepseekVariant) {
    use ferrite_models::families::deepseek_v2;
    use ferrite_models::layers::mla::MlaCacheMode;
    let dir = fixtures_dir().join("models").join(name);
    let (oracle, reports) =
        ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, |r, w| {
            let model = deepseek_v2::load_with(r, w, variant, MlaCacheMode::Latent)?;
            let spec = ferrite_models::CausalLM::info(&model).kv_layers[0];
            assert_eq!(spec.num_kv_heads, 1, "latent cache has one KV head");
            Ok(Box::new(model))
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    println!("{name} ({}) latent MLA cache f32: {}", oracle.architecture, summarize(&reports));
    for r in &reports {
        assert!(r.strict, "{name}/{}: diverged from the oracle at {:?}", r.name, r.divergence);
        assert!(r.max_logprob_error < LOGPROB_TOLERANCE, "{name}/{}: logprob error {}", r.name, r.max_logprob_error);
    }
    assert!(reports.len() >= 8, "{name}: battery has only {} prompts", reports.len());
}

#[test]
fn deepseek_v2_latent_mla_cache() {
    gate_latent_mla("deepseek-v2", ferrite_models::families::deepseek_v2::DeepseekVariant::V2);
}

#[test]
fn deepseek_v3_latent_mla_cache() {
    gate_latent_mla("deepseek-v3", ferrite_models::families::deepseek_v2::DeepseekVariant::V3);
}

#[test]
fn glm4_moe_lite_latent_mla_cache() {
    gate_latent_mla("glm4-moe-lite", ferrite_models::families::deepseek_v2::DeepseekVariant::Glm4MoeLite);
}

#[test]
fn deepseek_v32_latent_mla_cache() {
    gate_latent_mla("deepseek-v32", ferrite_models::families::deepseek_v2::DeepseekVariant::V32);
}

/// DeepSeek-V3.2's sparse attention: the indexer's choice of 8 keys per query matters, so MLA
/// attending to every causal key (`index_topk` past every prompt: the indexer's mask dropped), or
/// to 16, breaks the gate. transformers' V3.2 always rotates MLA's rope in interleaved pairs, so a
/// stray `rope_interleave: false` must change nothing.
#[test]
fn gate_catches_deepseek_v32_breaks() {
    use serde_json::json;
    assert_breaks_caught(&[
        ("deepseek-v32", "index_topk 8 -> 4096 (dense attention)", |c| c["index_topk"] = json!(4096)),
        ("deepseek-v32", "index_topk 8 -> 16", |c| c["index_topk"] = json!(16)),
    ]);
    let dir = broken_copy("deepseek-v32", |c| c["rope_interleave"] = json!(false));
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "rope_interleave false changed deepseek-v32 ({strict}/{total} strict)");
}

#[test]
fn gate_catches_moe_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("mixtral", "top-1 routing", |c| c["num_experts_per_tok"] = json!(1)),
        ("qwen2-moe", "norm_topk_prob true", |c| c["norm_topk_prob"] = json!(true)),
        ("qwen3-moe", "norm_topk_prob false", |c| c["norm_topk_prob"] = json!(false)),
        ("olmoe", "norm_topk_prob true", |c| c["norm_topk_prob"] = json!(true)),
        ("deepseek-v2", "mscale_all_dim dropped", |c| c["rope_parameters"]["mscale_all_dim"] = json!(null)),
        ("deepseek-v2", "greedy instead of group-limited routing", |c| c["topk_method"] = json!("greedy")),
        ("deepseek-v2", "routed_scaling_factor 1", |c| c["routed_scaling_factor"] = json!(1.0)),
        ("deepseek-v3", "no group limit", |c| {
            c["n_group"] = json!(1);
            c["topk_group"] = json!(1);
        }),
        ("deepseek-v3", "norm_topk_prob false", |c| c["norm_topk_prob"] = json!(false)),
        ("deepseek-v3", "routed_scaling_factor 1", |c| c["routed_scaling_factor"] = json!(1.0)),
        ("deepseek-v3", "rope not interleaved", |c| c["rope_interleave"] = json!(false)),
        ("afmoe", "muP embedding scale dropped", |c| c["mup_enabled"] = json!(false)),
        ("afmoe", "route_scale 1", |c| c["route_scale"] = json!(1.0)),
        ("afmoe", "every layer slides and rotates", |c| c["layer_types"] = json!(vec!["sliding_attention"; 4])),
        ("afmoe", "no layer slides or rotates", |c| c["layer_types"] = json!(vec!["full_attention"; 4])),
        ("cohere2-moe", "shared expert summed, not averaged", |c| {
            c["shared_expert_combination_strategy"] = json!("sum")
        }),
        ("cohere2-moe", "sigmoid instead of softmax", |c| c["expert_selection_fn"] = json!("sigmoid")),
        ("cohere2-moe", "dense prefix without rotary", |c| c["prefix_dense_sliding_window_pattern"] = json!(2)),
        ("cohere2-moe-rms-sigmoid", "top-k not renormalised", |c| c["norm_topk_prob"] = json!(false)),
        ("cohere2-moe-rms-sigmoid", "LayerNorm instead of RMSNorm", |c| c["rms_norm_eps"] = json!(null)),
        ("phimoe", "router_jitter_noise 0.01", |c| c["router_jitter_noise"] = json!(0.01)),
        ("phimoe", "long_mscale = short_mscale", |c| c["rope_parameters"]["long_mscale"] = json!(1.1)),
        ("phimoe-switch", "long_mscale = short_mscale", |c| c["rope_parameters"]["long_mscale"] = json!(1.1)),
        ("granite-moe-swa", "one rotary base", |c| c["layer_rope_theta"] = json!(vec![10000.0; 4])),
    ];
    assert_breaks_caught(breaks);
}

/// Model families wave 2, the dense Llama relatives: each family's own config key, edited.
#[test]
fn gate_catches_wave2_dense_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("smollm3", "rope on every layer", |c| c["no_rope_layers"] = json!([1, 1, 1, 1])),
        ("internlm3", "qkv_bias ignored", |c| c["qkv_bias"] = json!(false)),
        ("seed-oss", "attention_out_bias ignored", |c| c["attention_out_bias"] = json!(false)),
        ("ernie4_5", "use_bias ignored", |c| c["use_bias"] = json!(false)),
        ("ministral3", "llama_4_scaling_beta 0", |c| c["rope_parameters"]["llama_4_scaling_beta"] = json!(0.0)),
        ("arcee", "relu instead of relu2", |c| c["hidden_act"] = json!("relu")),
        ("apertus", "relu2 instead of xIELU", |c| c["hidden_act"] = json!("relu2")),
        ("cohere2", "no sliding layers (none rotates)", |c| c["sliding_window"] = json!(null)),
        ("cohere2", "every layer slides", |c| c["layer_types"] = json!(vec!["sliding_attention"; 4])),
        ("olmo3", "full layers on the sliding rope", |c| {
            c["rope_parameters"]["full_attention"] = c["rope_parameters"]["sliding_attention"].clone()
        }),
        ("olmo3", "sliding window dropped", |c| c["sliding_window"] = json!(null)),
        ("exaone4", "full layers rotate (no sliding window)", |c| c["sliding_window"] = json!(null)),
        ("exaone4", "every layer slides", |c| c["layer_types"] = json!(vec!["sliding_attention"; 4])),
        ("nemotron", "rotary on whole heads", |c| c["partial_rotary_factor"] = json!(1.0)),
        ("nemotron", "relu instead of relu2", |c| c["hidden_act"] = json!("relu")),
        ("gptj", "rotary on whole heads", |c| c["rotary_dim"] = json!(16)),
        ("granite-swa", "one rotary base, the full layer rotating", |c| {
            c["layer_rope_theta"] = json!(vec![10000.0; 4])
        }),
        ("granite-swa", "no sliding layers", |c| c["layer_types"] = json!(vec!["full_attention"; 4])),
        ("lfm3", "no attention gate", |c| c["use_attention_gate"] = json!(false)),
        ("lfm3", "no sandwich norms", |c| c["use_sandwich_norm"] = json!(false)),
        ("lfm3", "full layers on the sliding rope", |c| {
            c["rope_parameters"]["full_attention"] = c["rope_parameters"]["sliding_attention"].clone()
        }),
        ("lfm3", "no sliding window", |c| c["sliding_window"] = json!(null)),
        ("hyperclovax", "no post norms", |c| c["use_post_norm"] = json!(false)),
        ("hyperclovax", "logits divided, as Granite's", |c| c["logits_scaling"] = json!(1.0 / 0.7 / 0.7)),
    ];
    assert_breaks_caught(breaks);
}

/// Options no config key switches, broken in the loaded model: the gate must fail.
#[test]
fn gate_catches_structural_breaks() {
    use ferrite_models::decoder::{Decoder, TokenMixer};
    use ferrite_models::families::glm::{self, GlmVariant};
    use ferrite_models::families::hunyuan::{self, HunYuanVariant};
    use ferrite_models::families::llama::{self, Variant};
    use ferrite_models::loading::{config::RawConfig, weights::Weights};
    use ferrite_tensor::RopeStyle;
    type Load = fn(&RawConfig, &Weights) -> ferrite_models::Result<Decoder>;
    type Break = fn(&mut Decoder);
    fn halves(d: &mut Decoder) {
        d.ropes.iter_mut().for_each(|r| r.style = RopeStyle::Neox);
    }
    let breaks: &[(&str, &str, Load, Break)] = &[
        ("ernie4_5", "rotary on halves, not adjacent pairs", |r, w| llama::load(r, w, Variant::ERNIE4_5), halves),
        ("glm", "rotary on halves, not adjacent pairs", |r, w| glm::load(r, w, GlmVariant::Glm), halves),
        ("gptj", "rotary on halves, not adjacent pairs", |r, w| ferrite_models::families::gptj::load(r, w), halves),
        ("granite-swa", "no attention sinks", ferrite_models::families::granite::load_swa, |d| {
            for b in &mut d.blocks {
                if let TokenMixer::Attention(a) = &mut b.mixer {
                    a.sinks = None;
                }
            }
        }),
        ("afmoe", "attention output not gated", ferrite_models::families::afmoe::load, |d| {
            for b in &mut d.blocks {
                if let TokenMixer::Attention(a) = &mut b.mixer {
                    a.output_gate = None;
                }
            }
        }),
        (
            "hunyuan-dense",
            "QK-norm before the rotary, not after",
            |r, w| hunyuan::load(r, w, HunYuanVariant::Dense),
            |d| {
                for b in &mut d.blocks {
                    if let TokenMixer::Attention(a) = &mut b.mixer {
                        let (qn, kn) = a.post_rope_norms.take().expect("HunYuan normalises after the rotary");
                        (a.attn.q_norm, a.attn.k_norm) = (Some(qn), Some(kn));
                    }
                }
            },
        ),
    ];
    for &(fixture, what, load, edit) in breaks {
        let dir = fixtures_dir().join("models").join(fixture);
        let (_, reports) =
            ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, move |r, w| {
                let mut model = load(r, w)?;
                edit(&mut model);
                Ok(Box::new(model))
            })
            .unwrap_or_else(|e| panic!("{fixture} ({what}): {e}"));
        let strict = reports.iter().filter(|r| r.strict).count();
        println!("{fixture} with {what}: {strict}/{} strict", reports.len());
        assert!(strict < reports.len(), "{fixture}: {what} went unnoticed ({strict}/{} strict)", reports.len());
    }
}

/// Model families wave 2 (GLM, HunYuan): each family's distinctive config key, edited in a copy
/// of its fixture, must break the gate. Features with no config key of their own (GLM's
/// adjacent-pair rope, HunYuan's post-rope QK-norm) and edits that only make loading fail
/// (GLM-4-MoE-Lite's `mlp_layer_types`) have no entry.
#[test]
fn gate_catches_wave2_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("glm", "full rotary", |c| c["rope_parameters"]["partial_rotary_factor"] = json!(1.0)),
        ("glm", "q/k/v biases dropped", |c| c["attention_bias"] = json!(false)),
        ("glm4", "loaded as Glm (no sandwich norms)", |c| c["architectures"] = json!(["GlmForCausalLM"])),
        ("glm4-moe", "no group limit", |c| {
            c["n_group"] = json!(1);
            c["topk_group"] = json!(1);
        }),
        ("glm4-moe", "routed_scaling_factor 1", |c| c["routed_scaling_factor"] = json!(1.0)),
        ("glm4-moe", "full rotary", |c| c["rope_parameters"]["partial_rotary_factor"] = json!(1.0)),
        ("glm4-moe", "QK-norm off", |c| c["use_qk_norm"] = json!(false)),
        ("glm4-moe-lite", "routed_scaling_factor 1", |c| c["routed_scaling_factor"] = json!(1.0)),
        ("glm4-moe-lite", "rope not interleaved", |c| c["rope_interleave"] = json!(false)),
        ("hunyuan-dense", "rope alpha dropped", |c| {
            c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": c["rope_parameters"]["rope_theta"]})
        }),
        ("hunyuan-moe", "moe_topk 2 on every layer", |c| c["moe_topk"] = json!(2)),
    ];
    assert_breaks_caught(breaks);
}

/// MoE families wave 2: each fixture's distinguishing config key, edited in a copy, must break
/// the gate (tokens, or log-probs where the key only rescales the logits).
#[test]
fn gate_catches_moe_wave2_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("granite-moe", "residual_multiplier 1", |c| c["residual_multiplier"] = json!(1.0)),
        ("granite-moe", "top-1 routing", |c| c["num_experts_per_tok"] = json!(1)),
        ("granite-moe", "logits_scaling 1", |c| c["logits_scaling"] = json!(1.0)),
        ("granite-moe-shared", "no shared MLP", |c| c["shared_intermediate_size"] = json!(0)),
        ("minimax-m2", "full rotary", |c| c["rope_parameters"]["partial_rotary_factor"] = json!(1.0)),
        ("minimax-m2", "top-1 routing", |c| c["num_experts_per_tok"] = json!(1)),
        ("ernie45-moe", "no shared experts", |c| c["moe_num_shared_experts"] = json!(0)),
        ("ernie45-moe", "top-1 routing", |c| c["moe_k"] = json!(1)),
        ("minicpm3", "scale_depth as sqrt(layers)", |c| c["scale_depth"] = json!(null)),
        ("minicpm3", "dim_model_base = hidden", |c| c["dim_model_base"] = json!(null)),
        ("minicpm3", "scale_emb 1", |c| c["scale_emb"] = json!(1.0)),
        ("minicpm3", "long factors = short", |c| {
            c["rope_parameters"]["long_factor"] = c["rope_parameters"]["short_factor"].clone()
        }),
        ("llama4", "no chunked attention", |c| {
            c["attention_chunk_size"] = json!(null);
            c["layer_types"] = json!(null);
        }),
        ("llama4", "no temperature tuning", |c| c["attn_temperature_tuning"] = json!(false)),
        ("llama4", "no L2 QK-norm", |c| c["use_qk_norm"] = json!(false)),
        ("llama4", "rotary on every layer", |c| c["no_rope_layers"] = json!([1, 1, 1, 1])),
    ];
    assert_breaks_caught(breaks);
}

/// gpt-oss: its config keys edited in a copy of each fixture must break the gate.
#[test]
fn gate_catches_gpt_oss_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("gpt_oss", "sliding window dropped", |c| c["layer_types"] = json!(["full_attention", "full_attention"])),
        ("gpt_oss", "swiglu_limit 1.5 -> 7", |c| c["swiglu_limit"] = json!(7.0)),
        ("gpt_oss", "swiglu_alpha 1.702 -> 1", |c| c["swiglu_alpha"] = json!(1.0)),
        ("gpt_oss", "top-2 routing", |c| c["num_experts_per_tok"] = json!(2)),
        ("gpt_oss", "YaRN truncated", |c| c["rope_parameters"]["truncate"] = json!(true)),
        ("gpt_oss_mxfp4", "sliding window dropped", |c| c["layer_types"] = json!(["full_attention", "full_attention"])),
    ];
    assert_breaks_caught(breaks);
}

/// gpt-oss's attention sinks are weights, not a config key: each fixture with the sinks removed
/// after loading must fail the gate.
#[test]
fn gate_catches_gpt_oss_sinks_dropped() {
    use ferrite_models::decoder::TokenMixer;
    use ferrite_models::families::gpt_oss;
    for name in ["gpt_oss", "gpt_oss_mxfp4"] {
        let dir = fixtures_dir().join("models").join(name);
        let (_, reports) =
            ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, |r, w| {
                let mut d = gpt_oss::load(r, w)?;
                for b in &mut d.blocks {
                    if let TokenMixer::Attention(a) = &mut b.mixer {
                        a.sinks = None;
                    }
                }
                Ok(Box::new(d))
            })
            .unwrap();
        let strict = reports.iter().filter(|r| r.strict).count();
        assert!(strict < reports.len(), "{name}: sinks dropped went unnoticed ({strict}/{} strict)", reports.len());
    }
}

/// Gemma 4: its config keys edited in a copy of the fixture, and the features with no key of
/// their own (which layer a KV-sharing layer reads, `layer_scalar`, the value norm) changed in
/// the loaded decoder, must each break the gate. `attention_k_eq_v` and `use_double_wide_mlp`
/// edits only make loading fail (the checkpoint's shapes follow them), so they have no entry.
#[test]
fn gate_catches_gemma4_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("gemma4", "proportional rope rotates every angle", |c| {
            c["rope_parameters"]["full_attention"]["partial_rotary_factor"] = json!(1.0)
        }),
        ("gemma4", "full layers on default rope", |c| {
            c["rope_parameters"]["full_attention"] = json!({"rope_type": "default", "rope_theta": 1000000.0})
        }),
        ("gemma4", "per-layer inputs off", |c| c["hidden_size_per_layer_input"] = json!(0)),
        ("gemma4", "no sliding window", |c| c["sliding_window"] = json!(4096)),
        ("gemma4", "final softcap dropped", |c| c["final_logit_softcapping"] = json!(null)),
    ];
    assert_breaks_caught(breaks);

    use ferrite_models::decoder::{Decoder, TokenMixer};
    type Mutation = fn(&mut Decoder);
    let variants: &[(&str, Mutation)] = &[
        ("shared sliding layer reads layer 0, not the last sliding layer 1", |d| {
            if let TokenMixer::SharedKv(s) = &mut d.blocks[3].mixer {
                s.source = 0;
            }
        }),
        ("layer_scalar ignored", |d| d.layer_scales = None),
        ("value norm dropped", |d| {
            for b in &mut d.blocks {
                if let TokenMixer::Attention(a) = &mut b.mixer {
                    a.v_norm = None;
                }
            }
        }),
    ];
    let dir = fixtures_dir().join("models").join("gemma4");
    for (what, mutate) in variants {
        let (_, reports) =
            ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, move |r, w| {
                let mut d = ferrite_models::families::gemma4::load(r, w)?;
                // Layers 3-4 read layers 1-2's caches: three caches, sized per layer type.
                let kv: Vec<_> = ferrite_models::CausalLM::info(&d)
                    .kv_layers
                    .iter()
                    .map(|s| (s.num_kv_heads, s.k_dim, s.v_dim))
                    .collect();
                assert_eq!(kv, [(2, 16, 16), (2, 16, 16), (1, 32, 32)]);
                mutate(&mut d);
                Ok(Box::new(d))
            })
            .unwrap();
        let strict = reports.iter().filter(|r| r.strict).count();
        println!("gemma4 with {what}: {strict}/{} strict", reports.len());
        assert!(strict < reports.len(), "gemma4: {what} went unnoticed ({strict}/{} strict)", reports.len());
    }
}

/// Gemma 3n: its config keys edited in a copy of the fixture, and weights zeroed to switch off
/// the parts that have no key of their own (AltUp's prediction and correction, LAuReL's
/// low-rank branch), must each break the gate.
#[test]
fn gate_catches_gemma3n_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("gemma3n", "activation sparsity off", |c| c["activation_sparsity_pattern"] = json!([0.0, 0.0, 0.0, 0.0, 0.0])),
        ("gemma3n", "activation sparsity on layer 0 only", |c| {
            c["activation_sparsity_pattern"] = json!([0.95, 0.0, 0.0, 0.0, 0.0])
        }),
        ("gemma3n", "correct_output_scale off", |c| c["altup_correct_scale"] = json!(false)),
        ("gemma3n", "AltUp's active copy 1", |c| c["altup_active_idx"] = json!(1)),
        ("gemma3n", "no sliding window", |c| c["sliding_window"] = json!(4096)),
        ("gemma3n", "local rope base = global", |c| {
            c["rope_parameters"]["sliding_attention"] = c["rope_parameters"]["full_attention"].clone()
        }),
        ("gemma3n", "final softcap dropped", |c| c["final_logit_softcapping"] = json!(null)),
    ];
    assert_breaks_caught(breaks);

    let zeroed = [
        ("altup.prediction_coefs.weight", "AltUp predictions = the copies (prediction coefficients zeroed)"),
        ("altup.correction_coefs.weight", "every copy takes the whole innovation (correction coefficients zeroed)"),
        ("laurel.linear_right.weight", "LAuReL's low-rank branch zeroed"),
    ];
    for (suffix, what) in zeroed {
        let dir = fixture_copy("gemma3n", "zeroed");
        ferrite_testing::gate::edit_f32_tensors(&dir, |name| {
            name.ends_with(suffix).then(|| Box::new(|v: &mut [f32]| v.fill(0.0)) as Box<dyn Fn(&mut [f32])>)
        });
        let (strict, total) = strict_count(&dir);
        std::fs::remove_dir_all(&dir).ok();
        println!("gemma3n with {what}: {strict}/{total} strict");
        assert!(strict < total, "gemma3n: {what} went unnoticed ({strict}/{total} strict)");
    }
}

/// Gemma 3n's released checkpoints are `Gemma3nForConditionalGeneration`: the text model's config
/// under `text_config` and its tensors under `model.language_model.*`. The fixture rewritten that
/// way gives the same tokens, from three KV caches (the two shared layers own none).
#[test]
fn gemma3n_conditional_generation_layout_loads() {
    let dir = fixture_copy("gemma3n", "conditional");
    edit_config(&dir, |c| {
        let mut text = c.take();
        text.as_object_mut().expect("config object").remove("architectures");
        *c = serde_json::json!({
            "architectures": ["Gemma3nForConditionalGeneration"],
            "model_type": "gemma3n",
            "text_config": text,
        });
    });
    rename_tensors(&dir, |name| name.replacen("model.", "model.language_model.", 1));
    let opts = ferrite_models::LoadOptions { progress: false, ..Default::default() };
    let loaded = ferrite_models::load_model(&dir, &opts).unwrap();
    assert_eq!(loaded.model.info().kv_layers.len(), 3);
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "gemma3n in the conditional-generation layout: {strict}/{total} strict");
}

fn drop_key(c: &mut serde_json::Value, key: &str) {
    c.as_object_mut().expect("config object").remove(key);
}

/// The architectures gated through a re-packed native fixture (InternLM2 from Llama, MiniCPM from
/// Granite, ChatGLM from GLM): each remote config key the loader reads, edited in a copy, must
/// break the gate (tokens, or log-probs where the key only rescales the logits).
#[test]
fn gate_catches_repacked_config_breaks() {
    use serde_json::json;
    let breaks: &[(&str, &str, Edit)] = &[
        ("internlm2", "bias ignored", |c| c["bias"] = json!(false)),
        ("internlm2", "rope_theta dropped", |c| c["rope_theta"] = json!(null)),
        ("minicpm", "scale_depth dropped (branches x 1 / sqrt(layers))", |c| drop_key(c, "scale_depth")),
        ("minicpm", "scale_emb dropped", |c| drop_key(c, "scale_emb")),
        ("minicpm", "dim_model_base = hidden_size", |c| c["dim_model_base"] = c["hidden_size"].clone()),
        ("chatglm", "rope_ratio dropped", |c| drop_key(c, "rope_ratio")),
        ("chatglm", "rotate halves (original_rope false)", |c| c["original_rope"] = json!(false)),
        ("chatglm", "add_qkv_bias ignored", |c| c["add_qkv_bias"] = json!(false)),
    ];
    assert_breaks_caught(breaks);
}

/// InternLM2's `wqkv` is grouped per KV head; read as ChatGLM's `[q; k; v]` blocks instead, or
/// with key and value swapped inside each group, the gate must fail.
#[test]
fn gate_catches_internlm2_wrong_qkv_grouping() {
    use ferrite_models::families::internlm2::{self, QkvRows};
    let contiguous: QkvRows = |kv, per, d| {
        let block = |from: usize, to: usize| std::iter::once(kv * from * d..kv * to * d).collect();
        [block(0, per), block(per, per + 1), block(per + 1, per + 2)]
    };
    let swapped: QkvRows = |kv, per, d| {
        let [q, k, v] = internlm2::grouped_qkv_rows(kv, per, d);
        [q, v, k]
    };
    let dir = fixtures_dir().join("models").join("internlm2");
    for (what, rows) in [("[q; k; v] blocks", contiguous), ("value before key in each group", swapped)] {
        let (_, reports) =
            ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, move |r, w| {
                Ok(Box::new(internlm2::load_with(r, w, rows)?))
            })
            .unwrap_or_else(|e| panic!("internlm2 ({what}): {e}"));
        let strict = reports.iter().filter(|r| r.strict).count();
        println!("internlm2 with {what}: {strict}/{} strict", reports.len());
        assert!(strict < reports.len(), "internlm2: {what} went unnoticed ({strict}/{} strict)", reports.len());
    }
}

/// Gemma 3 with its image tokens attending causally, as in a text model.
struct CausalImages {
    inner: ferrite_models::families::gemma3_vl::Gemma3Vl,
    info: ferrite_models::ModelInfo,
}

impl ferrite_models::CausalLM for CausalImages {
    fn info(&self) -> &ferrite_models::ModelInfo {
        &self.info
    }

    fn forward(
        &self,
        input: &ferrite_models::ForwardInput<'_>,
        kv: &mut [ferrite_tensor::PagedKvLayer],
    ) -> ferrite_models::Result<ferrite_tensor::Tensor> {
        self.inner.forward(input, kv)
    }

    fn vision(&self) -> Option<&dyn ferrite_models::VisionEncoder> {
        self.inner.vision()
    }
}

/// Gemma 3's image tokens see each other both ways: computed causally, the image prompts
/// diverge (the text-only one does not).
#[test]
fn gate_catches_gemma3_images_attended_causally() {
    use ferrite_models::CausalLM;
    let dir = fixtures_dir().join("models").join("gemma3-vl");
    let (_, reports) =
        ferrite_testing::gate::run_fixture_with(&dir, DType::F32, ferrite_tensor::Device::Cpu, |raw, w| {
            let inner = ferrite_models::families::gemma3_vl::load(raw, w)?;
            let mut info = inner.info().clone();
            info.vision.as_mut().expect("a vision model").bidirectional = false;
            Ok(Box::new(CausalImages { inner, info }))
        })
        .unwrap();
    let diverged: Vec<&str> = reports.iter().filter(|r| !r.strict).map(|r| r.name.as_str()).collect();
    println!("causal image attention diverges on {diverged:?}");
    assert!(diverged.len() >= 6 && !diverged.contains(&"text-only"), "{}", summarize(&reports));
}

/// Mistral 3 in the `model.*`-rooted layout of transformers' module tree (`model.language_model.*`,
/// `model.vision_tower.*`, `model.multi_modal_projector.*`, `lm_head`) gives the same tokens as the
/// `language_model.*` one transformers saves.
#[test]
fn mistral3_checkpoints_in_the_model_rooted_layout_load() {
    let dir = fixture_copy("mistral3", "model-rooted");
    rename_tensors(&dir, |name| {
        if let Some(rest) = name.strip_prefix("language_model.model.") {
            format!("model.language_model.{rest}")
        } else if let Some(rest) = name.strip_prefix("language_model.") {
            rest.to_string()
        } else {
            format!("model.{name}")
        }
    });
    let (strict, total) = strict_count(&dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(strict, total, "mistral3 in the model-rooted layout: {strict}/{total} strict");
}

/// Mistral 3's prompts hold an image as rows of `[IMG]`, each closed by `[IMG_BREAK]` and the
/// last by `[IMG_END]`, whose text embeddings the model reads between the image's: the oracle's
/// prompts rewritten with the last row closed by `[IMG_BREAK]`, or with each image's rows and
/// columns swapped (its embeddings in the same order), diverge on the image prompts.
#[test]
fn gate_catches_mistral3_row_layout_breaks() {
    let tokenizer = ferrite_tokenizer::Tokenizer::from_dir(&fixtures_dir().join("models/mistral3")).unwrap();
    let id = |token: &str| tokenizer.token_to_id(token).unwrap();
    let (image, row_break, end) = (id("[IMG]"), id("[IMG_BREAK]"), id("[IMG_END]"));
    // `rows` rows of `columns` image tokens, each closed by a break, the last by `last`.
    let layout = |rows: usize, columns: usize, last: u32| {
        let mut out: Vec<u32> =
            (0..rows).flat_map(|_| std::iter::repeat_n(image, columns).chain([row_break])).collect();
        *out.last_mut().unwrap() = last;
        out
    };
    // (what, rows and columns swapped, the last row's token)
    for (what, swapped, last) in
        [("the last row closed by [IMG_BREAK]", false, row_break), ("rows and columns swapped", true, end)]
    {
        let dir = fixture_copy("mistral3", "row-layout");
        let path = dir.join("oracle.json");
        let mut oracle: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for case in oracle["cases"].as_array_mut().unwrap() {
            // Each image's grid in merged 2x2 blocks of patches.
            let mut grids = case["images"].as_array().unwrap().iter().map(|i| {
                let side = |k: usize| i["grid_thw"][k].as_u64().unwrap() as usize / 2;
                (side(1), side(2))
            });
            let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
            let (mut rewritten, mut at) = (Vec::with_capacity(ids.len() + 16), 0);
            while at < ids.len() {
                if ids[at] != image {
                    rewritten.push(ids[at]);
                    at += 1;
                    continue;
                }
                let (rows, columns) = grids.next().unwrap();
                let span = rows * (columns + 1);
                assert_eq!(ids[at..at + span], layout(rows, columns, end), "the processor's layout");
                rewritten.extend(if swapped { layout(columns, rows, last) } else { layout(rows, columns, last) });
                at += span;
            }
            case["prompt_ids"] = serde_json::json!(rewritten);
        }
        std::fs::write(&path, serde_json::to_string(&oracle).unwrap()).unwrap();
        let (_, reports) = run_fixture(&dir, DType::F32).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let diverged: Vec<&str> = reports.iter().filter(|r| !r.strict).map(|r| r.name.as_str()).collect();
        println!(
            "mistral3 with {what}: {}/{} strict, diverged {diverged:?}",
            reports.len() - diverged.len(),
            reports.len()
        );
        assert!(!diverged.is_empty() && !diverged.contains(&"text-only"), "{what} went unnoticed");
    }
}
