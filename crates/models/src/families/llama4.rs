//! Llama 4 text (`Llama4ForCausalLM`, `model_type: llama4_text`): pre-norm GQA blocks where
//! - rotary layers (`no_rope_layers[i] == 1`; by default all but every `no_rope_layer_interval`-th)
//!   rotate adjacent pairs (complex multiplication), then L2-normalise each query and key head
//!   (`use_qk_norm`, a weightless RMSNorm), and attend only within their chunk of
//!   `attention_chunk_size` positions (`layer_types` `chunked_attention`);
//! - NoPE layers attend to every earlier position without rotary embeddings, their queries scaled
//!   by position (`attn_temperature_tuning`: `log1p(floor((p + 1) / floor_scale)) * attn_scale + 1`);
//! - MoE layers (`moe_layers`, by default every `interleave_moe_layer_step`-th) route each token to
//!   its top-k experts by raw logit, multiply the expert's *input* by the logit's sigmoid and add a
//!   shared expert; the other layers have a dense MLP of `intermediate_size_mlp`.
//!
//! Checkpoint names: Llama's attention and norms; `model.layers.{i}.feed_forward.{router,
//! shared_expert.{gate,up,down}_proj}`, the stacked experts `feed_forward.experts.gate_up_proj
//! [experts, hidden, 2 * intermediate]` and `down_proj [experts, intermediate, hidden]` (used as
//! `x @ w`), or the dense `feed_forward.{gate,up,down}_proj`.

use ferrite_tensor::{RopeStyle, Tensor};
use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::moe::{Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe, StackedLayout};
use crate::layers::{Norm, QueryScale, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn sixteen() -> usize {
    16
}

fn one() -> usize {
    1
}

fn four() -> usize {
    4
}

fn default_floor_scale() -> f64 {
    8192.0
}

fn default_attn_scale() -> f64 {
    0.1
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Llama4Config {
    #[serde(flatten)]
    common: CommonConfig,
    intermediate_size_mlp: Option<usize>,
    #[serde(default = "sixteen")]
    num_local_experts: usize,
    #[serde(default = "one")]
    num_experts_per_tok: usize,
    moe_layers: Option<Vec<usize>>,
    #[serde(default = "one")]
    interleave_moe_layer_step: usize,
    #[serde(default = "yes")]
    use_qk_norm: bool,
    no_rope_layers: Option<Vec<u8>>,
    #[serde(default = "four")]
    no_rope_layer_interval: usize,
    #[serde(default = "default_floor_scale")]
    floor_scale: f64,
    #[serde(default = "default_attn_scale")]
    attn_scale: f64,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Llama4Config = raw.parse()?;
    let defaults =
        Defaults { eps: 1e-5, max_positions: 131_072, kv_heads: Some(8), head_dim: Some(128), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let inter = d.intermediate(raw)?;
    // Absent: 8192; null: no chunking.
    let chunk = match raw.value.get("attention_chunk_size") {
        None => Some(8192),
        Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&c| c > 0)
                .ok_or_else(|| raw.error("`attention_chunk_size` is not a positive integer"))? as usize,
        ),
    };
    // Released checkpoints write a number here (Scout: 4); transformers only tests its truth.
    let tuning = match raw.value.get("attn_temperature_tuning") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(_) => return Err(raw.error("`attn_temperature_tuning` is not a boolean")),
    };
    // transformers' defaults: an empty or missing `no_rope_layers` means rotary on all but every
    // `no_rope_layer_interval`-th layer.
    let uses_rope: Vec<bool> = match cfg.no_rope_layers.as_deref() {
        Some(list) if !list.is_empty() => list.iter().map(|&v| v != 0).collect(),
        _ if cfg.no_rope_layer_interval == 0 => return Err(raw.error("`no_rope_layer_interval` is 0")),
        _ => (0..d.layers).map(|i| !(i + 1).is_multiple_of(cfg.no_rope_layer_interval)).collect(),
    };
    if uses_rope.len() < d.layers {
        return Err(raw.error(format!("`no_rope_layers` has {} entries for {} layers", uses_rope.len(), d.layers)));
    }
    let moe_layers = match &cfg.moe_layers {
        Some(list) => list.clone(),
        None if cfg.interleave_moe_layer_step == 0 => return Err(raw.error("`interleave_moe_layer_step` is 0")),
        None => (cfg.interleave_moe_layer_step - 1..d.layers).step_by(cfg.interleave_moe_layer_step).collect(),
    };
    let chunked = |i: usize| -> Result<bool> {
        match d.layer_types.as_ref().map(|t| t[i].as_str()) {
            None => Ok(uses_rope[i] && chunk.is_some()),
            Some("chunked_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            Some(other) => Err(raw.error(format!("unsupported layer type `{other}` in `layer_types`"))),
        }
    };
    let router_cfg = RouterConfig {
        num_experts: cfg.num_local_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::SigmoidOfTopK,
        renormalize: false,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let temperature =
        QueryScale::Temperature { floor_scale: cfg.floor_scale as f32, attn_scale: cfg.attn_scale as f32 };
    let l2 = RmsNorm {
        weight: Tensor::from_f32(vec![1.0; d.head_dim], &[d.head_dim])?.to_device(w.device())?,
        eps: d.eps as f32,
        offset: 0.0,
    };
    let blocks = d.blocks(w, |i, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        if chunked(i)? {
            attn.params.attention_chunk =
                Some(chunk.ok_or_else(|| raw.error("`chunked_attention` layers need `attention_chunk_size`"))?);
        }
        let rope = uses_rope[i];
        // Tuning applies to NoPE layers and the QK-norm to rotary ones, so the order in which
        // `attend` applies them (norm, then scale) never matters.
        attn.query_scale = (!rope && tuning).then_some(temperature);
        let mixer = SelfAttention {
            post_rope_norms: (rope && cfg.use_qk_norm).then(|| (l2.clone(), l2.clone())),
            ..SelfAttention::new(attn, rope.then_some(0))
        };
        let f = l.at("feed_forward");
        let mlp = if moe_layers.contains(&i) {
            let mut experts = Experts::load_stacked(
                w,
                &f.name("experts.gate_up_proj"),
                &f.name("experts.down_proj"),
                cfg.num_local_experts,
                d.hidden,
                inter,
                d.act,
                StackedLayout::InOut,
            )?;
            experts.scale_inputs = true;
            let shared = SharedExpert { mlp: f.gated_mlp("shared_expert", d.hidden, inter, d.act, false)?, gate: None };
            let router = Router::load(w, &f.name("router"), d.hidden, router_cfg.clone(), false)?;
            ChannelMixer::Moe(Box::new(SparseMoe { router, experts, shared: Some(shared) }))
        } else {
            let width = cfg.intermediate_size_mlp.unwrap_or(16_384);
            ChannelMixer::Gated(l.gated_mlp("feed_forward", d.hidden, width, d.act, false)?)
        };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(mixer),
            d.rms(l, "post_attention_layernorm")?,
            mlp,
        ))
    })?;
    let rope = d.rope(raw, 500_000.0)?.with_style(RopeStyle::Interleaved);
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
