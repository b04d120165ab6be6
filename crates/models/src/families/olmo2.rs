//! OLMo-2 (`Olmo2ForCausalLM`): Llama projections and MLP, but the norms sit after each branch
//! (`h = h + norm(attn(h))`, `h = h + norm(mlp(h))`, no pre-norm), and the QK-norm is one RMSNorm
//! over all heads' queries (weight `[heads * head_dim]`) and one over all keys, before RoPE.
//!
//! Checkpoint names: Llama's without `input_layernorm`, plus
//! `model.layers.{i}.{self_attn.{q,k}_norm, post_feedforward_layernorm}`.

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let d = raw.parse::<CommonConfig>()?.resolve(raw, Defaults { eps: 1e-5, ..Defaults::LLAMA })?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        // Full-width: the weight spans every head, so the norm does too.
        attn.q_norm = Some(s.rms("q_norm", d.heads * d.head_dim, d.eps)?);
        attn.k_norm = Some(s.rms("k_norm", d.kv_heads * d.head_dim, d.eps)?);
        Ok(Block {
            attn_norm: None,
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: Some(Norm::Rms(d.rms(l, "post_attention_layernorm")?)),
            mlp_norm: None,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            mlp_out_norm: Some(Norm::Rms(d.rms(l, "post_feedforward_layernorm")?)),
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![d.rope(raw, 10000.0)?])
}
