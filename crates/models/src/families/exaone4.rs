//! EXAONE 4.0 (`Exaone4ForCausalLM`): OLMo-2's post-branch norms (`h = h + norm(attn(h))`,
//! `h = h + norm(mlp(h))`) with a per-head RMS QK-norm, and hybrid attention: sliding-window
//! layers rotate, full-attention layers have no positional encoding ("global NoPE"). Without a
//! `sliding_window` every layer is full and rotates. The pattern is `layer_types`, else
//! `sliding_window_pattern`: a period (every n-th layer full, default 4) or a string such as
//! `"LLLG"` (L local, G global) repeated over the layers.
//!
//! Checkpoint names: Llama's without `input_layernorm`, plus
//! `model.layers.{i}.{self_attn.{q,k}_norm, post_feedforward_layernorm}`.

use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let d = raw.parse::<CommonConfig>()?.resolve(raw, Defaults { eps: 1e-5, ..Defaults::LLAMA })?;
    let inter = d.intermediate(raw)?;
    let window = raw.f64_or("sliding_window", Some(4096.0)).map(|v| v as usize);
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, false, false)?;
        attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
        attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
        let sliding = match d.sliding(raw, i)? {
            Some(sliding) => sliding,
            None if window.is_none() => false,
            None => pattern_slides(raw, i)?,
        };
        attn.params.sliding_window = window.filter(|_| sliding);
        let rotates = window.is_none() || sliding;
        Ok(Block {
            attn_norm: None,
            mixer: TokenMixer::Attention(SelfAttention::new(attn, rotates.then_some(0))),
            attn_out_norm: Some(Norm::Rms(d.rms(l, "post_attention_layernorm")?)),
            mlp_norm: None,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            mlp_out_norm: Some(Norm::Rms(d.rms(l, "post_feedforward_layernorm")?)),
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let rope = d.rope(raw, 10000.0)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}

/// Whether layer `i` slides by `sliding_window_pattern` (the config has no `layer_types`).
fn pattern_slides(raw: &RawConfig, i: usize) -> Result<bool> {
    match raw.value.get("sliding_window_pattern") {
        Some(Value::String(p)) if !p.is_empty() && p.chars().all(|c| c == 'L' || c == 'G') => {
            Ok(p.as_bytes()[i % p.len()] == b'L')
        }
        None => Ok(!(i + 1).is_multiple_of(4)),
        Some(v) => match v.as_u64() {
            Some(period) if period > 0 => Ok(!(i + 1).is_multiple_of(period as usize)),
            _ => Err(raw.error(format!("unsupported `sliding_window_pattern` {v}"))),
        },
    }
}
