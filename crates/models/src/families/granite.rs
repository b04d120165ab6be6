//! Granite (`GraniteForCausalLM`, IBM Granite 3.x dense): the Llama block with four scalars —
//! embeddings times `embedding_multiplier`, each branch output times `residual_multiplier` before
//! it joins the residual, attention scores scaled by `attention_multiplier` instead of
//! `head_dim^-0.5`, and logits divided by `logits_scaling`.
//!
//! Checkpoint names are Llama's.
//!
//! HyperCLOVAX (`HyperCLOVAXForCausalLM`, [`load_hyperclovax`]) is Granite with an RMSNorm on each
//! branch's output before the residual multiplier (`post_norm1`, `post_norm2`; `use_post_norm`),
//! logits *multiplied* by `logits_scaling`, and `attention_multiplier` defaulting to
//! `head_dim^-0.5`.
//!
//! GraniteSWA (`GraniteSWAForCausalLM`, granite-swash) adds per-layer attention
//! ([`SwaLayers`]): sliding-window layers, a learned sink logit per head, and a rotary base per
//! layer (`layer_rope_theta`, 0 for none).

use serde::Deserialize;

use crate::decoder::load::{is_sliding, CommonConfig, Defaults, Dims};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Attention, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
struct GraniteConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(flatten)]
    multipliers: Multipliers,
}

/// The four scalars, read under Granite's config names (Granite-MoE's too).
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct Multipliers {
    #[serde(default = "one", rename = "embedding_multiplier")]
    pub embedding: f64,
    #[serde(default = "one", rename = "residual_multiplier")]
    pub residual: f64,
    #[serde(default = "one", rename = "attention_multiplier")]
    pub attention: f64,
    #[serde(default = "one")]
    pub logits_scaling: f64,
}

impl Multipliers {
    /// `decoder` with its embeddings times the embedding multiplier and its logits divided by
    /// `logits_scaling`.
    pub fn scale_ends(&self, decoder: Decoder) -> Decoder {
        let logits = LogitsPost { scale: Some((1.0 / self.logits_scaling) as f32), softcap: None };
        decoder.with_embed_scale(self.embedding as f32).with_logits(logits)
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GraniteConfig = raw.parse()?;
    load_scaled(raw, w, &cfg.common, Defaults::LLAMA, cfg.multipliers)
}

pub fn load_hyperclovax(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GraniteConfig = raw.parse()?;
    let m = cfg.multipliers;
    let d = cfg.common.resolve(raw, Defaults::LLAMA)?;
    let attention_scale = raw.f64_or("attention_multiplier", None).unwrap_or((d.head_dim as f64).powf(-0.5));
    let post_norm = raw.value.get("use_post_norm").and_then(serde_json::Value::as_bool).unwrap_or(true);
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        attn.params = d.attention_params(attention_scale);
        let post =
            |leaf: &str| -> Result<Option<Norm>> { post_norm.then(|| Ok(Norm::Rms(d.rms(l, leaf)?))).transpose() };
        Ok(Block {
            attn_out_norm: post("post_norm1")?,
            mlp_out_norm: post("post_norm2")?,
            wiring: Wiring::Sequential { residual_scale: Some(m.residual as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![d.rope(raw, 10000.0)?])?;
    let logits = LogitsPost { scale: Some(m.logits_scaling as f32), softcap: None };
    Ok(decoder.with_embed_scale(m.embedding as f32).with_logits(logits))
}

/// GraniteSWA (and GraniteMoeSWA)'s per-layer attention: `layer_types` (default: every fourth
/// layer from 0 full, the others sliding over `sliding_window`, default 128), a learned sink logit
/// per head (`self_attn.sinks`; transformers scales the output by `sigmoid(lse - sink)`, the same
/// function as a sink in the softmax denominator), and `layer_rope_theta` (default the global
/// base; 0: no positions), one rotary table per distinct base.
pub(crate) struct SwaLayers {
    windows: Vec<Option<usize>>,
    rope_of_layer: Vec<Option<usize>>,
    pub ropes: Vec<Rope>,
}

impl SwaLayers {
    pub fn read(raw: &RawConfig, d: &Dims) -> Result<SwaLayers> {
        let window = raw.f64_or("sliding_window", Some(128.0)).map(|v| v as usize);
        let sliding: Vec<bool> = match &d.layer_types {
            Some(types) => (0..d.layers).map(|i| is_sliding(raw, types, i)).collect::<Result<_>>()?,
            None => (0..d.layers).map(|i| i % 4 != 0).collect(),
        };
        let params = RopeParameters::from_config(raw, 10000.0)?;
        let global = params.rope_theta.unwrap_or(10000.0);
        let thetas: Vec<f64> = match raw.value.get("layer_rope_theta").filter(|v| !v.is_null()) {
            Some(v) => {
                let thetas: Option<Vec<f64>> = v.as_array().map(|a| a.iter().filter_map(|t| t.as_f64()).collect());
                match thetas {
                    Some(t) if t.len() == d.layers && t.iter().all(|&x| x >= 0.0) => t,
                    _ => {
                        return Err(raw.error(format!(
                            "`layer_rope_theta` must list {} non-negative bases (0 for no positions)",
                            d.layers
                        )))
                    }
                }
            }
            None => vec![global; d.layers],
        };
        let mut distinct: Vec<f64> = thetas.iter().copied().filter(|&t| t > 0.0).collect();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        let ropes = distinct
            .iter()
            .map(|&theta| {
                let p = RopeParameters { rope_theta: Some(theta), ..params.clone() };
                Rope::new(&p, d.head_dim, d.max_positions, raw)
            })
            .collect::<Result<_>>()?;
        let rope_of_layer = thetas.iter().map(|&t| distinct.iter().position(|&x| x == t)).collect();
        let windows = sliding.into_iter().map(|slides| window.filter(|_| slides)).collect();
        Ok(SwaLayers { windows, rope_of_layer, ropes })
    }

    /// Layer `i`'s attention under `s` (its `self_attn` scope): window, sinks and rotary table.
    pub fn attention(&self, i: usize, mut attn: Attention, s: &Scope) -> Result<SelfAttention> {
        attn.params.sliding_window = self.windows[i];
        let sinks = s.get_f32("sinks", &[attn.params.num_heads])?;
        Ok(SelfAttention { sinks: Some(sinks), ..SelfAttention::new(attn, self.rope_of_layer[i]) })
    }
}

pub fn load_swa(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GraniteConfig = raw.parse()?;
    let m = cfg.multipliers;
    let d = cfg.common.resolve(raw, Defaults { tie: true, max_positions: 8192, eps: 1e-5, ..Defaults::LLAMA })?;
    let swa = SwaLayers::read(raw, &d)?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        attn.params = d.attention_params(m.attention);
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(m.residual as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(swa.attention(i, attn, &s)?),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), swa.ropes)?;
    Ok(m.scale_ends(decoder))
}

/// The Llama-named decoder with Granite's multipliers (MiniCPM's are the same four, spelled otherwise).
pub(crate) fn load_scaled(
    raw: &RawConfig,
    w: &Weights,
    common: &CommonConfig,
    defaults: Defaults,
    m: Multipliers,
) -> Result<Decoder> {
    let d = common.resolve(raw, defaults)?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        attn.params = d.attention_params(m.attention);
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(m.residual as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![d.rope(raw, 10000.0)?])?;
    Ok(m.scale_ends(decoder))
}
