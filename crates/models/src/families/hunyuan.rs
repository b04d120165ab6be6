//! HunYuan dense (`HunYuanDenseV1ForCausalLM`) and MoE (`HunYuanMoEV1ForCausalLM`): the Llama
//! block with a per-head RMSNorm on queries and keys applied after the rotary embedding
//! (`query_layernorm` / `key_layernorm`, so the cache holds normalised keys). The MoE model has a
//! sparse MLP on every layer: a softmax router (`gate.wg`, kept in f32) choosing `moe_topk`
//! experts (one number, or one per layer) whose weights are renormalised, plus one shared MLP
//! (`shared_mlp`); experts and shared MLP are `intermediate_size` wide.
//!
//! RoPE: the checkpoints write `{"type": "dynamic", "alpha": a}`, which transformers treats as a
//! fixed NTK stretch, not dynamic scaling: the base becomes `rope_theta * a^(d / (d - 2))` for
//! every length (`d = head_dim`). Without `alpha`, `dynamic` is ordinary dynamic NTK.
//!
//! Checkpoint names: Llama's plus `model.layers.{i}.self_attn.{query,key}_layernorm`; MoE layers
//! `model.layers.{i}.mlp.{gate.wg, experts.{e}.{gate,up,down}_proj (or the fused
//! experts.gate_up_proj / down_proj), shared_mlp.{gate,up,down}_proj}`.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Dims};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// `moe_topk`: one count for every layer, or one per layer.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PerLayer {
    One(usize),
    Each(Vec<usize>),
}

#[derive(Debug, Clone, Deserialize)]
struct HunYuanConfig {
    #[serde(flatten)]
    common: CommonConfig,
    /// Cross-layer attention (KV shared between layers); transformers does not implement it.
    #[serde(default)]
    use_cla: bool,
    num_experts: Option<usize>,
    moe_topk: Option<PerLayer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HunYuanVariant {
    Dense,
    Moe,
}

/// The rotary table, with a fixed NTK `alpha` folded into the base.
fn rope(raw: &RawConfig, d: &Dims) -> Result<Rope> {
    let mut params = RopeParameters::from_config(raw, 10000.0)?;
    if let (Some(alpha), "dynamic") = (params.alpha.filter(|&a| a != 0.0), params.kind()) {
        let dim = d.head_dim as f64;
        params.rope_theta = params.rope_theta.map(|base| base * alpha.powf(dim / (dim - 2.0)));
        params.rope_type = Some("default".into());
    }
    Rope::new(&params, d.head_dim, d.max_positions, raw)
}

pub fn load(raw: &RawConfig, w: &Weights, variant: HunYuanVariant) -> Result<Decoder> {
    let cfg: HunYuanConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, Defaults { eps: 1e-5, ..Defaults::LLAMA })?;
    if cfg.use_cla {
        return Err(raw.error("`use_cla` (cross-layer attention) is not supported"));
    }
    let inter = d.intermediate(raw)?;
    let top_k = |i: usize| -> Result<usize> {
        match &cfg.moe_topk {
            None => Ok(1),
            Some(PerLayer::One(k)) => Ok(*k),
            Some(PerLayer::Each(ks)) => {
                ks.get(i).copied().ok_or_else(|| raw.error(format!("`moe_topk` has no entry for layer {i}")))
            }
        }
    };
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        let norms = (s.rms("query_layernorm", d.head_dim, d.eps)?, s.rms("key_layernorm", d.head_dim, d.eps)?);
        let mixer = SelfAttention { post_rope_norms: Some(norms), ..SelfAttention::new(attn, Some(0)) };
        let mlp = match variant {
            HunYuanVariant::Dense => ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            HunYuanVariant::Moe => {
                let m = l.at("mlp");
                let num_experts = cfg.num_experts.unwrap_or(1);
                let router_cfg = RouterConfig {
                    num_experts,
                    top_k: top_k(i)?,
                    scoring: Scoring::Softmax,
                    renormalize: true,
                    renormalize_eps: 0.0,
                    scaling: 1.0,
                    group: None,
                };
                ChannelMixer::Moe(Box::new(SparseMoe {
                    router: Router::load(w, &m.name("gate.wg"), d.hidden, router_cfg, false)?,
                    experts: Experts::load(w, &m.name(""), num_experts, d.hidden, inter, d.act, ExpertNames::HF)?,
                    shared: Some(SharedExpert {
                        mlp: m.gated_mlp("shared_mlp", d.hidden, inter, d.act, false)?,
                        gate: None,
                    }),
                }))
            }
        };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(mixer),
            d.rms(l, "post_attention_layernorm")?,
            mlp,
        ))
    })?;
    let rope = rope(raw, &d)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
