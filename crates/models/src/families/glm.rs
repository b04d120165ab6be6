//! GLM-4 (`GlmForCausalLM`, the `glm-4-9b-chat-hf` layout) and GLM-4-0414 (`Glm4ForCausalLM`):
//! the Llama block with q/k/v biases (`attention_bias`, default true; `o_proj` has none), a fused
//! `gate_up_proj` (rows: gate, then up) split at load, and rotary embeddings on the first half of
//! each head (`partial_rotary_factor`, default 0.5) rotating adjacent pairs. Glm4 adds sandwich
//! norms: `post_self_attn_layernorm` on the attention output and `post_mlp_layernorm` on the MLP
//! output, before each joins the residual.
//!
//! Checkpoint names: `model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
//! post_attention_layernorm, mlp.{gate_up_proj,down_proj}}` (+ Glm4's
//! `post_self_attn_layernorm`, `post_mlp_layernorm`), `model.norm`, `lm_head`.

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{GatedMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// `GlmConfig` / `Glm4Config` defaults (the glm-4-9b shapes).
const GLM: Defaults = Defaults {
    eps: 1.5625e-7,
    layer_norm: false,
    max_positions: 131_072,
    act: "silu",
    tie: false,
    kv_heads: Some(2),
    head_dim: Some(128),
};

/// The configs' `partial_rotary_factor` when neither the rope section nor the top level has one.
pub(crate) const GLM_PARTIAL_ROTARY: f64 = 0.5;

#[derive(Debug, Clone, Deserialize)]
struct GlmConfig {
    #[serde(flatten)]
    common: CommonConfig,
    /// Biases on q/k/v (not `o_proj`); true unless the config says otherwise.
    attention_bias: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlmVariant {
    Glm,
    /// Sandwich norms around attention and MLP.
    Glm4,
}

pub fn load(raw: &RawConfig, w: &Weights, variant: GlmVariant) -> Result<Decoder> {
    let cfg: GlmConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, GLM)?;
    let qkv_bias = cfg.attention_bias.unwrap_or(true);
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(GLM_PARTIAL_ROTARY));
    let rope = Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?.with_style(RopeStyle::Interleaved);
    let (h, inter) = (d.hidden, d.intermediate(raw)?);
    let blocks = d.blocks(w, |_, l| {
        let attn = d.attention(&l.at("self_attn"), qkv_bias, false)?;
        let gate_up = l.linear("mlp.gate_up_proj", h, 2 * inter, false)?;
        let [gate, up]: [Linear; 2] = gate_up.split_rows(&[inter, inter])?.try_into().expect("two parts");
        let down = l.linear("mlp.down_proj", inter, h, false)?;
        let out_norm = |leaf: &str| -> Result<Option<Norm>> {
            match variant {
                GlmVariant::Glm => Ok(None),
                GlmVariant::Glm4 => Ok(Some(Norm::Rms(d.rms(l, leaf)?))),
            }
        };
        Ok(Block {
            attn_norm: Some(Norm::Rms(d.rms(l, "input_layernorm")?)),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: out_norm("post_self_attn_layernorm")?,
            mlp_norm: Some(Norm::Rms(d.rms(l, "post_attention_layernorm")?)),
            mlp: ChannelMixer::Gated(GatedMlp { gate, up, down, act: d.act }),
            mlp_out_norm: out_norm("post_mlp_layernorm")?,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
