//! Gemma (`GemmaForCausalLM`): Llama-shaped pre-norm blocks with GeGLU (tanh GELU) MLPs, RMSNorms
//! stored as `w` and applied as `(1 + w)`, token embeddings scaled by `sqrt(hidden_size)` (cast
//! to the weights' dtype first, as transformers does), tied LM head.
//!
//! Checkpoint names are Llama's.

use ferrite_tensor::Activation;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{scalar_in_dtype, Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::{Norm, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Scope;
use crate::loading::weights::Weights;
use crate::Result;

/// transformers' GemmaConfig defaults (16 KV heads, head_dim 256) when the keys are absent.
pub(crate) const GEMMA: Defaults = Defaults {
    max_positions: 8192,
    act: "gelu_pytorch_tanh",
    tie: true,
    kv_heads: Some(16),
    head_dim: Some(256),
    ..Defaults::LLAMA
};

#[derive(Debug, Clone, Deserialize)]
struct GemmaConfig {
    #[serde(flatten)]
    common: CommonConfig,
    use_bidirectional_attention: Option<bool>,
}

/// A Gemma `(1 + w)` RMSNorm.
pub(crate) fn gemma_norm(s: &Scope, leaf: &str, size: usize, eps: f64) -> Result<RmsNorm> {
    Ok(s.rms(leaf, size, eps)?.with_offset(1.0))
}

pub(crate) fn no_encoder(raw: &RawConfig, bidirectional: Option<bool>) -> Result<()> {
    match bidirectional {
        Some(true) => Err(raw.error("`use_bidirectional_attention: true` (an encoder) is not a causal LM")),
        _ => Ok(()),
    }
}

/// The embeddings scaled by `sqrt(hidden)` in the weights' dtype.
pub(crate) fn scale_embedding(decoder: Decoder) -> Decoder {
    let hidden = decoder.embed.table.shape()[1];
    let scale = scalar_in_dtype((hidden as f64).sqrt(), decoder.embed.table.dtype());
    decoder.with_embed_scale(scale)
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GemmaConfig = raw.parse()?;
    no_encoder(raw, cfg.use_bidirectional_attention)?;
    let mut d = cfg.common.resolve(raw, GEMMA)?;
    // transformers maps the legacy `gelu` of the original Gemma configs to the tanh approximation.
    if cfg.common.hidden_act.as_deref() == Some("gelu") {
        d.act = Activation::GeluTanh;
    }
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        Ok(Block::pre_norm(
            gemma_norm(l, "input_layernorm", d.hidden, d.eps)?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            gemma_norm(l, "post_attention_layernorm", d.hidden, d.eps)?,
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
        ))
    })?;
    let final_norm = Norm::Rms(gemma_norm(&w.at("model"), "norm", d.hidden, d.eps)?);
    Ok(scale_embedding(d.finish(raw, w, blocks, final_norm, vec![d.rope(raw, 10000.0)?])?))
}
