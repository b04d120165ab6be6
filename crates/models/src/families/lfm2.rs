//! LFM2 (`Lfm2ForCausalLM`, Liquid AI): pre-norm layers (`operator_norm`, `ffn_norm`) whose token
//! mixer is either GQA attention with per-head RMS QK-norm (`q_layernorm`, `k_layernorm`) before
//! RoPE, or a gated short convolution ([`crate::layers::short_conv`], `conv_L_cache` taps), by
//! `layer_types` (`full_attention` / `conv`; real checkpoints also give `full_attn_idxs`). The MLP
//! is SwiGLU (`w1` gate, `w3` up, `w2` down) whose width, with `block_auto_adjust_ff_dim`, is
//! `2/3` of `intermediate_size`, times `block_ffn_dim_multiplier`, rounded up to a multiple of
//! `block_multiple_of`. The final norm is `model.embedding_norm`; embeddings are tied by default.
//!
//! Real `config.json` files spell some keys the older way: `block_ff_dim` (intermediate_size),
//! `tie_embedding`, `norm_eps` (both read).
//!
//! LFM2-MoE (`Lfm2MoeForCausalLM`, [`Lfm2Variant::Moe`]) keeps the first `num_dense_layers` MLPs
//! dense (`intermediate_size` wide, unadjusted) and routes the rest: sigmoid scores, plus
//! `expert_bias` for the choice only (`use_expert_bias`), top-k, renormalised (+1e-6) and times
//! `routed_scaling_factor`; experts `feed_forward.experts.{e}.{w1,w3,w2}` (or transformers 5's
//! fused tensors).
//!
//! LFM3 (`Lfm3ForCausalLM`, [`load_lfm3`]) adds sliding-window attention layers to the conv and
//! full ones (`layer_types`; by default layer `i` is full when `i % 4 == 2`, sliding when `i % 4
//! == 0` past the first, else conv), rotary per layer type (`rope_parameters.{sliding_attention,
//! full_attention}`; full layers by default proportional over half the head at base 1e6),
//! Qwen3-named attention (`q_proj` .. `o_proj`, `q_norm`, `k_norm`) whose heads are each scaled by
//! `sigmoid(gate_proj(x))` (`use_attention_gate`), sandwich norms (`post_operator_norm`,
//! `post_ffn_norm`; `use_sandwich_norm`) and a plain SwiGLU `intermediate_size` wide.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SparseMoe};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::short_conv::ShortConv;
use crate::layers::{GatedMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn three() -> usize {
    3
}

fn multiple() -> usize {
    256
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Lfm2Config {
    #[serde(flatten)]
    common: CommonConfig,
    norm_eps: Option<f64>,
    #[serde(default)]
    conv_bias: bool,
    #[serde(rename = "conv_L_cache", default = "three")]
    conv_l_cache: usize,
    #[serde(default = "multiple")]
    block_multiple_of: usize,
    block_ffn_dim_multiplier: Option<f64>,
    #[serde(default = "yes")]
    block_auto_adjust_ff_dim: bool,
    full_attn_idxs: Option<Vec<usize>>,
    #[serde(flatten)]
    moe: MoeKeys,
}

/// `Lfm2MoeConfig`'s keys, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct MoeKeys {
    #[serde(default = "two")]
    num_dense_layers: usize,
    #[serde(default = "thirty_two")]
    num_experts: usize,
    #[serde(default = "four")]
    num_experts_per_tok: usize,
    moe_intermediate_size: Option<usize>,
    #[serde(default = "yes")]
    use_expert_bias: bool,
    #[serde(default = "unit")]
    routed_scaling_factor: f64,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
}

fn two() -> usize {
    2
}

fn four() -> usize {
    4
}

fn thirty_two() -> usize {
    32
}

fn unit() -> f64 {
    1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lfm2Variant {
    Dense,
    Moe,
}

/// The config with the older key spellings read as the newer ones (the newer win).
fn respelled(raw: &RawConfig) -> RawConfig {
    let mut value = raw.value.clone();
    if let Some(obj) = value.as_object_mut() {
        for (old, new) in [("block_ff_dim", "intermediate_size"), ("tie_embedding", "tie_word_embeddings")] {
            if let Some(v) = obj.get(old).cloned() {
                obj.entry(new).or_insert(v);
            }
        }
    }
    RawConfig { path: raw.path.clone(), value }
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Lfm2Variant) -> Result<Decoder> {
    let raw = &respelled(raw);
    let cfg: Lfm2Config = raw.parse()?;
    let eps = cfg.norm_eps.or(cfg.common.rms_norm_eps).unwrap_or(1e-5);
    let defaults = Defaults { eps, tie: true, ..Defaults::LLAMA };
    let common = CommonConfig { rms_norm_eps: Some(eps), ..cfg.common.clone() };
    let d = common.resolve(raw, defaults)?;
    if cfg.conv_l_cache < 2 {
        return Err(raw.error(format!("`conv_L_cache` {} must be at least 2", cfg.conv_l_cache)));
    }
    let width = match variant {
        Lfm2Variant::Dense => mlp_width(raw, &cfg, d.intermediate(raw)?)?,
        Lfm2Variant::Moe => d.intermediate(raw)?,
    };
    let moe = &cfg.moe;
    let router = RouterConfig {
        num_experts: moe.num_experts,
        top_k: moe.num_experts_per_tok,
        scoring: Scoring::Sigmoid,
        renormalize: moe.norm_topk_prob,
        renormalize_eps: 1e-6,
        scaling: moe.routed_scaling_factor as f32,
        group: None,
    };
    let attention = attention_layers(raw, &cfg, d.layers)?;
    let blocks = d.blocks(w, |i, l| {
        let mixer = if attention[i] {
            let s = l.at("self_attn");
            let mut attn = d.attention_named(&s, ["q_proj", "k_proj", "v_proj", "out_proj"], false, false)?;
            attn.q_norm = Some(s.rms("q_layernorm", d.head_dim, d.eps)?);
            attn.k_norm = Some(s.rms("k_layernorm", d.head_dim, d.eps)?);
            TokenMixer::Attention(SelfAttention::new(attn, Some(0)))
        } else {
            TokenMixer::ShortConv(Box::new(ShortConv::load(&l.at("conv"), d.hidden, cfg.conv_l_cache, cfg.conv_bias)?))
        };
        let m = l.at("feed_forward");
        let mlp = if variant == Lfm2Variant::Moe && i >= moe.num_dense_layers {
            let width = moe.moe_intermediate_size.ok_or_else(|| raw.error("missing field `moe_intermediate_size`"))?;
            let mut gate = Router::load(w, &m.name("gate"), d.hidden, router.clone(), false)?;
            if moe.use_expert_bias {
                gate = gate.with_correction_bias(w, &m.name("expert_bias"), &[moe.num_experts])?;
            }
            let experts = Experts::load(w, &m.name(""), moe.num_experts, d.hidden, width, d.act, ExpertNames::MIXTRAL)?;
            ChannelMixer::Moe(Box::new(SparseMoe { router: gate, experts, shared: None }))
        } else {
            ChannelMixer::Gated(GatedMlp {
                gate: Linear::load(w, &m.name("w1"), d.hidden, width, false)?,
                up: Linear::load(w, &m.name("w3"), d.hidden, width, false)?,
                down: Linear::load(w, &m.name("w2"), width, d.hidden, false)?,
                act: d.act,
            })
        };
        Ok(Block::pre_norm(d.rms(l, "operator_norm")?, mixer, d.rms(l, "ffn_norm")?, mlp))
    })?;
    let rope = d.rope(raw, 1_000_000.0)?;
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "embedding_norm")?);
    d.finish_at(raw, w, Names::LLAMA, blocks, Some(final_norm), vec![rope])
}

/// `Lfm2MLP`'s width.
fn mlp_width(raw: &RawConfig, cfg: &Lfm2Config, intermediate: usize) -> Result<usize> {
    if !cfg.block_auto_adjust_ff_dim {
        return Ok(intermediate);
    }
    let mut width = 2 * intermediate / 3;
    if let Some(m) = cfg.block_ffn_dim_multiplier {
        if cfg.block_multiple_of == 0 {
            return Err(raw.error("`block_multiple_of` must be positive"));
        }
        width = (m * width as f64) as usize;
        width = cfg.block_multiple_of * width.div_ceil(cfg.block_multiple_of);
    }
    match width {
        0 => Err(raw.error(format!("the MLP width from `intermediate_size` {intermediate} is 0"))),
        w => Ok(w),
    }
}

/// Whether each layer is attention (else a short conv): `layer_types`, else `full_attn_idxs`,
/// else every layer attention, as `Lfm2Config` fills it in.
fn attention_layers(raw: &RawConfig, cfg: &Lfm2Config, layers: usize) -> Result<Vec<bool>> {
    match raw.value.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(types)) => {
            if types.len() != layers {
                return Err(raw.error(format!("`layer_types` has {} entries for {layers} layers", types.len())));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(true),
                    Some("conv") => Ok(false),
                    _ => {
                        Err(raw.error(format!("`layer_types` names layer type {t}; LFM2 has full_attention and conv")))
                    }
                })
                .collect()
        }
        Some(v) => Err(raw.error(format!("`layer_types` must be a list, got {v}"))),
        None => match &cfg.full_attn_idxs {
            Some(idxs) => {
                if let Some(bad) = idxs.iter().find(|&&i| i >= layers) {
                    return Err(raw.error(format!("`full_attn_idxs` names layer {bad} of {layers}")));
                }
                Ok((0..layers).map(|i| idxs.contains(&i)).collect())
            }
            None => Ok(vec![true; layers]),
        },
    }
}

/// An LFM3 layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lfm3Layer {
    Conv,
    Sliding,
    Full,
}

#[derive(Debug, Clone, Deserialize)]
struct Lfm3Config {
    #[serde(flatten)]
    common: CommonConfig,
    norm_eps: Option<f64>,
    #[serde(default)]
    conv_bias: bool,
    #[serde(rename = "conv_L_cache", default = "seven")]
    conv_l_cache: usize,
    #[serde(default = "yes")]
    use_sandwich_norm: bool,
    #[serde(default = "yes")]
    use_attention_gate: bool,
}

fn seven() -> usize {
    7
}

pub fn load_lfm3(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Lfm3Config = raw.parse()?;
    let eps = cfg.norm_eps.or(cfg.common.rms_norm_eps).unwrap_or(1e-5);
    let common = CommonConfig { rms_norm_eps: Some(eps), ..cfg.common.clone() };
    let d = common.resolve(raw, Defaults { eps, tie: true, ..Defaults::LLAMA })?;
    if cfg.conv_l_cache < 2 {
        return Err(raw.error(format!("`conv_L_cache` {} must be at least 2", cfg.conv_l_cache)));
    }
    let kinds: Vec<Lfm3Layer> = match raw.value.get("layer_types").filter(|v| !v.is_null()) {
        Some(Value::Array(types)) if types.len() == d.layers => types
            .iter()
            .map(|t| match t.as_str() {
                Some("conv") => Ok(Lfm3Layer::Conv),
                Some("sliding_attention") => Ok(Lfm3Layer::Sliding),
                Some("full_attention") => Ok(Lfm3Layer::Full),
                _ => Err(raw.error(format!(
                    "`layer_types` names layer type {t}; LFM3 has conv, sliding_attention and full_attention"
                ))),
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(raw.error(format!("`layer_types` must list {} layer types, got {v}", d.layers))),
        None => (0..d.layers)
            .map(|i| match i % 4 {
                2 => Lfm3Layer::Full,
                0 if i > 0 => Lfm3Layer::Sliding,
                _ => Lfm3Layer::Conv,
            })
            .collect(),
    };
    let window = raw.f64_or("sliding_window", Some(256.0)).map(|v| v as usize);
    let [sliding_rope, full_rope] = match raw.value.get("rope_parameters").filter(|v| !v.is_null()) {
        Some(_) => RopeParameters::sliding_and_full(raw, 10_000.0, 1_000_000.0)?,
        // `Lfm3Config`'s own default.
        None => [
            RopeParameters { rope_theta: Some(10_000.0), ..RopeParameters::default() },
            RopeParameters {
                rope_type: Some("proportional".into()),
                rope_theta: Some(1_000_000.0),
                partial_rotary_factor: Some(0.5),
                ..RopeParameters::default()
            },
        ],
    };
    let ropes = vec![
        Rope::new(&sliding_rope, d.head_dim, d.max_positions, raw)?,
        Rope::new(&full_rope, d.head_dim, d.max_positions, raw)?,
    ];
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |i, l| {
        let mixer = match kinds[i] {
            Lfm3Layer::Conv => TokenMixer::ShortConv(Box::new(ShortConv::load(
                &l.at("conv"),
                d.hidden,
                cfg.conv_l_cache,
                cfg.conv_bias,
            )?)),
            kind => {
                let s = l.at("self_attn");
                let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
                attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
                attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
                attn.params.sliding_window = window.filter(|_| kind == Lfm3Layer::Sliding);
                let rope = Some(usize::from(kind == Lfm3Layer::Full));
                // One gate per head, as a gate per output element: each head's row repeated over
                // its elements gives every element the head's sigmoid.
                let output_gate = match cfg.use_attention_gate {
                    true => {
                        // Checkpoints name it `gate_proj` (transformers' module is `g_proj`).
                        let leaf = if w.contains(&s.name("g_proj.weight")) { "g_proj" } else { "gate_proj" };
                        let g = s.linear(leaf, d.hidden, d.heads, false)?;
                        let rows: Vec<std::ops::Range<usize>> =
                            (0..d.heads).flat_map(|h| std::iter::repeat_n(h..h + 1, d.head_dim)).collect();
                        Some(g.select_rows(&rows)?)
                    }
                    false => None,
                };
                TokenMixer::Attention(SelfAttention { output_gate, ..SelfAttention::new(attn, rope) })
            }
        };
        let m = l.at("feed_forward");
        let mlp = ChannelMixer::Gated(GatedMlp {
            gate: Linear::load(w, &m.name("w1"), d.hidden, inter, false)?,
            up: Linear::load(w, &m.name("w3"), d.hidden, inter, false)?,
            down: Linear::load(w, &m.name("w2"), inter, d.hidden, false)?,
            act: d.act,
        });
        let sandwich = |leaf: &str| -> Result<Option<Norm>> {
            cfg.use_sandwich_norm.then(|| Ok(Norm::Rms(d.rms(l, leaf)?))).transpose()
        };
        Ok(Block {
            attn_norm: Some(Norm::Rms(d.rms(l, "operator_norm")?)),
            mixer,
            attn_out_norm: sandwich("post_operator_norm")?,
            mlp_norm: Some(Norm::Rms(d.rms(l, "ffn_norm")?)),
            mlp,
            mlp_out_norm: sandwich("post_ffn_norm")?,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "embedding_norm")?);
    d.finish_at(raw, w, Names::LLAMA, blocks, Some(final_norm), ropes)
}
