//! MiniMax-M2 (`MiniMaxM2ForCausalLM`): Llama-shaped GQA attention whose QK-norm is one RMSNorm
//! over all heads' queries (weight `[heads * head_dim]`) and one over all keys, before a partial
//! rotary embedding (`partial_rotary_factor`, or the released checkpoints' legacy `rotary_dim`);
//! every layer a sparse MoE with a sigmoid router whose `e_score_correction_bias` steers the
//! choice of the top-k experts but not their weights, which are the chosen sigmoids renormalised.
//!
//! Checkpoint names: Llama's attention and norms plus `self_attn.{q,k}_norm`, and under
//! `model.layers.{i}.block_sparse_moe` the gate, `e_score_correction_bias` and Mixtral's
//! `experts.{e}.{w1,w3,w2}`.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SparseMoe};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct MiniMaxM2Config {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(alias = "num_experts")]
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    /// The legacy spelling of the rotary span (`partial_rotary_factor = rotary_dim / head_dim`).
    rotary_dim: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: MiniMaxM2Config = raw.parse()?;
    let defaults = Defaults { max_positions: 196_608, kv_heads: Some(8), head_dim: Some(128), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let inter = d.intermediate(raw)?;
    let num_experts = cfg.num_local_experts.unwrap_or(256);
    let router_cfg = RouterConfig {
        num_experts,
        top_k: cfg.num_experts_per_tok.unwrap_or(8),
        scoring: Scoring::Sigmoid,
        renormalize: true,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let blocks = d.blocks(w, |_, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, false, false)?;
        attn.q_norm = Some(s.rms("q_norm", d.heads * d.head_dim, d.eps)?);
        attn.k_norm = Some(s.rms("k_norm", d.kv_heads * d.head_dim, d.eps)?);
        let m = l.at("block_sparse_moe");
        let router = Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), false)?.with_correction_bias(
            w,
            &m.name("e_score_correction_bias"),
            &[num_experts],
        )?;
        let experts = Experts::load(w, &m.name(""), num_experts, d.hidden, inter, d.act, ExpertNames::MIXTRAL)?;
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "post_attention_layernorm")?,
            ChannelMixer::Moe(Box::new(SparseMoe { router, experts, shared: None })),
        ))
    })?;
    let mut rope = RopeParameters::from_config(raw, 5_000_000.0)?;
    if rope.partial_rotary_factor.is_none() {
        rope.partial_rotary_factor = cfg.rotary_dim.map(|r| r as f64 / d.head_dim as f64);
    }
    let rope = Rope::new(&rope, d.head_dim, d.max_positions, raw)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
