//! Granite (`GraniteForCausalLM`, IBM Granite 3.x dense): the Llama block with four scalars —
//! embeddings times `embedding_multiplier`, each branch output times `residual_multiplier` before
//! it joins the residual, attention scores scaled by `attention_multiplier` instead of
//! `head_dim^-0.5`, and logits divided by `logits_scaling`.
//!
//! Checkpoint names are Llama's.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, SelfAttention, TokenMixer, Wiring};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
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
