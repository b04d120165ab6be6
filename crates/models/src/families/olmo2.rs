//! OLMo-2 (`Olmo2ForCausalLM`): Llama projections and MLP, but the norms sit after each branch
//! (`h = h + norm(attn(h))`, `h = h + norm(mlp(h))`, no pre-norm), and the QK-norm is one RMSNorm
//! over all heads' queries (weight `[heads * head_dim]`) and one over all keys, before RoPE.
//!
//! OLMo-3 (`Olmo3ForCausalLM`) is the same block with sliding-window layers (`layer_types`,
//! default every 4th layer full, window 4096) and a rotary table per layer type
//! (`rope_parameters.{sliding_attention,full_attention}`; the older `rope_scaling` applies to
//! full layers only).
//!
//! Checkpoint names: Llama's without `input_layernorm`, plus
//! `model.layers.{i}.self_attn.{q,k}_norm, post_feedforward_layernorm}`.

use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OlmoVersion {
    V2,
    V3,
}

pub fn load(raw: &RawConfig, w: &Weights, version: OlmoVersion) -> Result<Decoder> {
    let d = raw.parse::<CommonConfig>()?.resolve(raw, Defaults { eps: 1e-5, ..Defaults::LLAMA })?;
    let inter = d.intermediate(raw)?;
    let (ropes, window) = match version {
        OlmoVersion::V2 => (vec![d.rope(raw, 10000.0)?], None),
        OlmoVersion::V3 => {
            let theta = raw.value.get("rope_theta").and_then(Value::as_f64).unwrap_or(500_000.0);
            let [local, global] = RopeParameters::sliding_and_full(raw, theta, theta)?;
            let ropes = vec![
                Rope::new(&local, d.head_dim, d.max_positions, raw)?,
                Rope::new(&global, d.head_dim, d.max_positions, raw)?,
            ];
            (ropes, raw.f64_or("sliding_window", Some(4096.0)).map(|v| v as usize))
        }
    };
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        // Full-width: the weight spans every head, so the norm does too.
        attn.q_norm = Some(s.rms("q_norm", d.heads * d.head_dim, d.eps)?);
        attn.k_norm = Some(s.rms("k_norm", d.kv_heads * d.head_dim, d.eps)?);
        let rope = match version {
            OlmoVersion::V2 => 0,
            OlmoVersion::V3 => {
                let sliding = d.sliding(raw, i)?.unwrap_or(!(i + 1).is_multiple_of(4));
                attn.params.sliding_window = window.filter(|_| sliding);
                if sliding {
                    0
                } else {
                    1
                }
            }
        };
        Ok(Block {
            attn_norm: None,
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(rope))),
            attn_out_norm: Some(Norm::Rms(d.rms(l, "post_attention_layernorm")?)),
            mlp_norm: None,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            mlp_out_norm: Some(Norm::Rms(d.rms(l, "post_feedforward_layernorm")?)),
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), ropes)
}
