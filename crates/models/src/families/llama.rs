//! Llama (`LlamaForCausalLM`) and the decoders that differ from it only in details: pre-norm
//! blocks of RMSNorm -> GQA self-attention with rotary embeddings -> RMSNorm -> SiLU-gated MLP.
//! Mistral, Qwen2 and Qwen3 are [`Variant`]s of it (registry lines).

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct LlamaConfig {
    #[serde(flatten)]
    common: CommonConfig,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
}

/// How a family departs from plain Llama.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// q/k/v projections carry biases regardless of `attention_bias` (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on queries and keys before rotary embeddings (Qwen3).
    pub qk_norm: bool,
    /// How `sliding_window` is read when the config has no `layer_types`.
    pub window: WindowRule,
}

impl Variant {
    pub const MISTRAL: Variant = Variant { qkv_bias: false, qk_norm: false, window: WindowRule::AllLayers };
    pub const QWEN2: Variant = Variant { qkv_bias: true, qk_norm: false, window: WindowRule::FromMaxWindowLayers };
    pub const QWEN3: Variant = Variant { qkv_bias: false, qk_norm: true, window: WindowRule::FromMaxWindowLayers };
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowRule {
    /// Llama has no sliding window.
    #[default]
    None,
    /// Every layer slides when `sliding_window` is set (Mistral).
    AllLayers,
    /// Layers from `max_window_layers` on slide when `use_sliding_window` is true (Qwen2/Qwen3).
    FromMaxWindowLayers,
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Variant) -> Result<Decoder> {
    let cfg: LlamaConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, Defaults::LLAMA)?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, variant.qkv_bias || d.attention_bias, d.attention_bias)?;
        if variant.qk_norm {
            attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
            attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
        }
        let sliding = match (d.sliding(raw, i)?, variant.window) {
            (Some(sliding), _) => sliding,
            (None, WindowRule::None) => false,
            (None, WindowRule::AllLayers) => true,
            (None, WindowRule::FromMaxWindowLayers) => {
                cfg.use_sliding_window.unwrap_or(false) && i >= cfg.max_window_layers.unwrap_or(0)
            }
        };
        attn.params.sliding_window = d.sliding_window.filter(|_| sliding);
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "post_attention_layernorm")?,
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
        ))
    })?;
    let rope = d.rope(raw, 10000.0)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
