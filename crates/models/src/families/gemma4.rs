//! Gemma 4 text (`Gemma4ForCausalLM`, `model_type: gemma4_text`): Gemma 3's sandwich block with
//! plain-weight RMSNorms (`x * w`, not `1 + w`), a weightless RMS norm on the values, attention
//! scale 1, and:
//! - two layer types with their own head size: sliding layers use `head_dim`, full layers
//!   `global_head_dim` (default 512) and, with `attention_k_eq_v`, `num_global_key_value_heads`
//!   and values taken from `k_proj` (transformers 5.24 saves these as `per_layer_config`, also read);
//! - proportional rope on full layers (`rope_type: proportional`, see [`crate::layers::rope`]);
//! - KV sharing: the last `num_kv_shared_layers` layers project queries only and attend over the
//!   cache of the last earlier layer of their type, so they own no KV cache (and, with
//!   `use_double_wide_mlp`, have MLPs twice as wide);
//! - per-layer inputs (`hidden_size_per_layer_input`, see [`crate::decoder::per_layer`]);
//! - `layer_scalar`, a per-layer factor on the stream after each layer.
//!
//! The MoE block (`enable_moe_block`) and bidirectional attention are refused.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::gemma::{scale_embedding, GEMMA};
use crate::decoder::load::{
    activation, attention_params, check_dims, check_heads, is_sliding, kv_sources, CommonConfig, Defaults,
    NormedAttention,
};
use crate::decoder::per_layer::PerLayerInputs;
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct Gemma4Config {
    #[serde(flatten)]
    common: CommonConfig,
    hidden_activation: Option<String>,
    use_bidirectional_attention: Option<String>,
    #[serde(default)]
    attention_k_eq_v: bool,
    #[serde(default)]
    num_kv_shared_layers: usize,
    #[serde(default)]
    enable_moe_block: bool,
    #[serde(default)]
    use_double_wide_mlp: bool,
    global_head_dim: Option<usize>,
    num_global_key_value_heads: Option<usize>,
    per_layer_config: Option<BTreeMap<String, LayerOverride>>,
}

#[derive(Debug, Clone, Deserialize)]
struct LayerOverride {
    head_dim: Option<usize>,
    num_key_value_heads: Option<usize>,
}

const GEMMA4: Defaults = Defaults { kv_heads: Some(4), max_positions: 131_072, ..GEMMA };

/// A key whose transformers default is not "absent": the default when the key is missing, `None`
/// when it is null or 0 (the feature off).
fn size_or(raw: &RawConfig, key: &str, default: usize) -> Option<usize> {
    match raw.value.get(key) {
        None => Some(default),
        Some(v) => v.as_u64().filter(|&n| n > 0).map(|n| n as usize),
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Gemma4Config = raw.parse()?;
    if cfg.use_bidirectional_attention.as_deref() == Some("all") {
        return Err(raw.error("`use_bidirectional_attention: all` (an encoder) is not a causal LM"));
    }
    if cfg.enable_moe_block {
        return Err(raw.error("`enable_moe_block` (Gemma 4 MoE) is not supported yet"));
    }
    let mut d = cfg.common.resolve(raw, GEMMA4)?;
    d.act = activation(raw, "hidden_activation", cfg.hidden_activation.as_deref().unwrap_or(GEMMA4.act))?;
    let inter = d.intermediate(raw)?;
    let layers = d.layers;
    // transformers' defaults: five sliding layers to one full, and the last layer always full.
    let mut types: Vec<bool> = match &d.layer_types {
        Some(t) => (0..layers).map(|i| is_sliding(raw, t, i)).collect::<Result<_>>()?,
        None => (0..layers).map(|i| (i + 1) % 6 != 0).collect(),
    };
    if let Some(last) = types.last_mut() {
        *last = false;
    }
    let window = Some(raw.f64_or("sliding_window", Some(512.0)).map_or(512, |v| v as usize));

    let overrides = cfg.per_layer_config.as_ref();
    let dims = |i: usize| -> Result<(usize, usize)> {
        let (head_dim, kv_heads) = match overrides {
            Some(o) => {
                let o = o.get(&i.to_string());
                (o.and_then(|o| o.head_dim).unwrap_or(d.head_dim), o.and_then(|o| o.num_key_value_heads))
            }
            None if types[i] => (d.head_dim, None),
            None => {
                (cfg.global_head_dim.unwrap_or(512), cfg.num_global_key_value_heads.filter(|_| cfg.attention_k_eq_v))
            }
        };
        let kv_heads = kv_heads.unwrap_or(d.kv_heads);
        check_heads(raw, d.heads, kv_heads)?;
        Ok((head_dim, kv_heads))
    };

    let sources = kv_sources(raw, &types, cfg.num_kv_shared_layers)?;

    // One rotary table per layer type, over that type's head size.
    let ropes_params = match raw.value.get("rope_parameters").filter(|v| v.is_object()) {
        Some(_) => RopeParameters::sliding_and_full(raw, 10_000.0, 1_000_000.0)?,
        None => [
            RopeParameters { rope_theta: Some(10_000.0), ..Default::default() },
            RopeParameters {
                rope_type: Some("proportional".into()),
                partial_rotary_factor: Some(0.25),
                rope_theta: Some(1_000_000.0),
                ..Default::default()
            },
        ],
    };
    let type_head_dim = |sliding: bool| -> Result<Option<usize>> {
        types.iter().position(|&t| t == sliding).map(&dims).transpose().map(|o| o.map(|(h, _)| h))
    };
    let mut ropes = Vec::new();
    for (sliding, params) in [(true, &ropes_params[0]), (false, &ropes_params[1])] {
        // A type with no layer still gets a table, so that `rope_of` indexes stay fixed.
        let head_dim = type_head_dim(sliding)?.unwrap_or(d.head_dim);
        ropes.push(Rope::new(params, head_dim, d.max_positions, raw)?);
    }
    let rope_of = |sliding: bool| if sliding { 0 } else { 1 };

    let eps = d.eps;
    let blocks = d.blocks(w, |i, l| {
        let sliding = types[i];
        let (head_dim, kv_heads) = dims(i)?;
        if type_head_dim(sliding)? != Some(head_dim) {
            return Err(raw.error(format!("layer {i} has head_dim {head_dim}, unlike the other layers of its type")));
        }
        if let Some(src) = sources[i] {
            if dims(src)? != (head_dim, kv_heads) {
                return Err(raw.error(format!("layer {i} cannot share the keys and values of layer {src}")));
            }
        }
        let mixer = NormedAttention {
            params: attention_params(d.heads, kv_heads, head_dim, 1.0, if sliding { window } else { None }, None),
            eps,
            bias: d.attention_bias,
            rope: rope_of(sliding),
            source: sources[i],
            values_from_keys: cfg.attention_k_eq_v && !sliding,
        }
        .load(&l.at("self_attn"), d.hidden)?;
        let shared = sources[i].is_some();
        let width = if shared && cfg.use_double_wide_mlp { 2 * inter } else { inter };
        let norm = |leaf: &str| -> Result<Option<Norm>> { Ok(Some(Norm::Rms(d.rms(l, leaf)?))) };
        Ok(Block {
            attn_norm: norm("input_layernorm")?,
            mixer,
            attn_out_norm: norm("post_attention_layernorm")?,
            mlp_norm: norm("pre_feedforward_layernorm")?,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, width, d.act, false)?),
            mlp_out_norm: norm("post_feedforward_layernorm")?,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;

    let scales = (0..layers)
        .map(|i| Ok(w.get_f32(&format!("model.layers.{i}.layer_scalar"), &[1])?.to_f32_vec()[0]))
        .collect::<Result<Vec<f32>>>()?;
    let per_layer = match size_or(raw, "hidden_size_per_layer_input", 256) {
        None => None,
        Some(width) => {
            let vocab = size_or(raw, "vocab_size_per_layer_input", 262_144)
                .ok_or_else(|| raw.error("`vocab_size_per_layer_input` must be positive"))?;
            check_dims(
                raw,
                &[
                    ("vocab_size_per_layer_input", vocab),
                    ("hidden_size_per_layer_input * layers", layers.saturating_mul(width)),
                ],
            )?;
            Some(PerLayerInputs::load(&w.at("model"), layers, d.hidden, width, vocab, d.act, eps)?)
        }
    };
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "norm")?);
    let logits = LogitsPost { scale: None, softcap: raw.f64_or("final_logit_softcapping", None).map(|c| c as f32) };
    let decoder = scale_embedding(d.finish(raw, w, blocks, final_norm, ropes)?).with_logits(logits);
    Ok(decoder.with_per_layer(per_layer, Some(scales)))
}
