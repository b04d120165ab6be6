//! StableLM (`StableLmForCausalLM`; StableLM-3B-4E1T, StableLM 2): LayerNorms with bias, partial
//! rotary embeddings (`partial_rotary_factor`, default 0.25), optional q/k/v biases
//! (`use_qkv_bias`), a SiLU-gated MLP; optionally a per-head LayerNorm on queries and keys with one
//! weight per head (`qk_layernorm`) and the parallel residual `h = (h + attn) + mlp(ln1(h))`
//! (`use_parallel_residual`, StableLM 2 12B).
//!
//! Checkpoint names: Llama's, with LayerNorm biases, `model.norm` a LayerNorm and the QK-norms at
//! `self_attn.{q,k}_layernorm.norms.{head}.weight`.

use ferrite_tensor::{ops, Tensor};
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, ParallelSum, SelfAttention, TokenMixer, Wiring};
use crate::layers::{HeadLayerNorm, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct StableLmConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default)]
    use_qkv_bias: bool,
    #[serde(default)]
    qk_layernorm: bool,
    #[serde(default)]
    use_parallel_residual: bool,
}

/// `norms.{0..heads}.weight` of a `StableLmLayerNormPerHead`, as one `[heads * head_dim]` row.
fn per_head_norm(s: &Scope, heads: usize, d: usize, eps: f64) -> Result<HeadLayerNorm> {
    let parts = (0..heads)
        .map(|i| Ok(s.get_f32(&format!("norms.{i}.weight"), &[d])?.reshape(&[1, d])?))
        .collect::<Result<Vec<Tensor>>>()?;
    let weight = ops::concat_cols(&parts.iter().collect::<Vec<_>>())?.reshape(&[heads * d])?;
    Ok(HeadLayerNorm { weight: Some(weight), bias: None, head_dim: d, eps: eps as f32 })
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: StableLmConfig = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, layer_norm: true, max_positions: 4096, kv_heads: Some(32), ..Defaults::LLAMA };
    let mut d = cfg.common.resolve(raw, defaults)?;
    // StableLmConfig has no `head_dim`.
    d.head_dim = d.hidden / d.heads;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let s = l.at("self_attn");
        let attn = d.attention(&s, cfg.use_qkv_bias, false)?;
        let head_norms = match cfg.qk_layernorm {
            true => Some((
                per_head_norm(&s.at("q_layernorm"), d.heads, d.head_dim, d.eps)?,
                per_head_norm(&s.at("k_layernorm"), d.kv_heads, d.head_dim, d.eps)?,
            )),
            false => None,
        };
        let norm = |leaf: &str| -> Result<Norm> { Ok(Norm::Layer(d.layer_norm(l, leaf, true)?)) };
        let (mlp_norm, wiring) = match cfg.use_parallel_residual {
            true => (None, Wiring::Parallel(ParallelSum::ResidualFirst)),
            false => (Some(norm("post_attention_layernorm")?), Wiring::Sequential { residual_scale: None }),
        };
        Ok(Block {
            attn_norm: Some(norm("input_layernorm")?),
            mixer: TokenMixer::Attention(SelfAttention { head_norms, ..SelfAttention::new(attn, Some(0)) }),
            attn_out_norm: None,
            mlp_norm,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            mlp_out_norm: None,
            wiring,
        })
    })?;
    let mut rope_params = crate::layers::rope::RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(0.25));
    let rope = crate::layers::rope::Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?;
    d.finish(raw, w, blocks, Norm::Layer(d.layer_norm(&w.at("model"), "norm", true)?), vec![rope])
}
