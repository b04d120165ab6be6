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
    #[serde(default = "one")]
    embedding_multiplier: f64,
    #[serde(default = "one")]
    residual_multiplier: f64,
    #[serde(default = "one")]
    attention_multiplier: f64,
    #[serde(default = "one")]
    logits_scaling: f64,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GraniteConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, Defaults::LLAMA)?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        attn.params = d.attention_params(cfg.attention_multiplier);
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(cfg.residual_multiplier as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![d.rope(raw, 10000.0)?])?;
    let logits = LogitsPost { scale: Some((1.0 / cfg.logits_scaling) as f32), softcap: None };
    Ok(decoder.with_embed_scale(cfg.embedding_multiplier as f32).with_logits(logits))
}
