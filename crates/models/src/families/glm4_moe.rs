//! GLM-4.5 (`Glm4MoeForCausalLM`): GQA self-attention with q/k/v biases when `attention_bias`
//! (`o_proj` never has one), an optional per-head RMS QK-norm before RoPE (`use_qk_norm`), and
//! rotary embeddings on the first `partial_rotary_factor` (default 0.5) of each head, rotating
//! halves (not GLM's adjacent pairs). From layer `first_k_dense_replace` on, the MLP is DeepSeek-V3's
//! mixture ([`crate::layers::moe`]): sigmoid scores plus `e_score_correction_bias` for the choice,
//! the best `topk_group` of `n_group` groups by their two best scores, top-k experts, the unbiased
//! scores renormalised (`norm_topk_prob`, +1e-20) and times `routed_scaling_factor`, plus
//! `n_shared_experts` shared experts `moe_intermediate_size` wide each.
//!
//! Checkpoint names: Llama's plus `model.layers.{i}.self_attn.{q,k}_norm`, and on MoE layers
//! `model.layers.{i}.mlp.{gate.weight, gate.e_score_correction_bias, experts.{e}.{gate,up,down}_proj
//! (or the fused experts.gate_up_proj / down_proj), shared_experts.{gate,up,down}_proj}`. The
//! checkpoints' extra next-token-prediction layer (`model.layers.{num_hidden_layers}`, DeepSeek-V3's
//! layout) is read for speculative decoding's `mtp` when asked for.

use serde::Deserialize;

use super::glm::GLM_PARTIAL_ROTARY;
use crate::decoder::load::{check_dims, next_layer_mtp, CommonConfig, Defaults};
use crate::decoder::{ChannelMixer, Decoder};
use crate::layers::moe::{
    ExpertNames, Experts, GroupLimit, GroupScore, Router, RouterConfig, Scoring, SharedExpert, SparseMoe,
};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

fn unit() -> f64 {
    1.0
}

/// `Glm4MoeConfig`'s MoE keys, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct Glm4MoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default)]
    use_qk_norm: bool,
    moe_intermediate_size: usize,
    num_experts_per_tok: usize,
    #[serde(alias = "num_local_experts")]
    n_routed_experts: usize,
    #[serde(default = "one")]
    n_shared_experts: usize,
    #[serde(default = "unit")]
    routed_scaling_factor: f64,
    #[serde(default = "one")]
    n_group: usize,
    #[serde(default = "one")]
    topk_group: usize,
    #[serde(default = "one")]
    first_k_dense_replace: usize,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Glm4MoeConfig = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, max_positions: 131_072, kv_heads: Some(8), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let shared_width = cfg.n_shared_experts.max(1).saturating_mul(cfg.moe_intermediate_size);
    check_dims(
        raw,
        &[("n_routed_experts", cfg.n_routed_experts), ("n_shared_experts * moe_intermediate_size", shared_width)],
    )?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(GLM_PARTIAL_ROTARY));
    let rope = Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?;
    let router_cfg = RouterConfig {
        num_experts: cfg.n_routed_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::Sigmoid,
        renormalize: cfg.norm_topk_prob,
        renormalize_eps: 1e-20,
        scaling: cfg.routed_scaling_factor as f32,
        group: Some(GroupLimit { n_group: cfg.n_group, topk_group: cfg.topk_group, score: GroupScore::TopTwoSum }),
    };
    let (experts, width) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
    let block = |i: usize, l: &crate::loading::weights::Scope| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, false)?;
        if cfg.use_qk_norm {
            attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
            attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
        }
        let m = l.at("mlp");
        let mlp = if i >= cfg.first_k_dense_replace {
            let shared = m.gated_mlp("shared_experts", d.hidden, width * cfg.n_shared_experts, d.act, false)?;
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), true)?,
                experts: Experts::load(w, &m.name(""), experts, d.hidden, width, d.act, ExpertNames::HF)?,
                shared: Some(SharedExpert { mlp: shared, gate: None }),
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, false)?)
        };
        d.llama_block(l, attn, mlp)
    };
    let blocks = d.blocks(w, block)?;
    let mtp = next_layer_mtp(raw, w, &d, block)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])?.with_mtp(mtp)
}
