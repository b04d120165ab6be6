//! Jamba (`JambaForCausalLM`): Llama-style pre-norm layers whose token mixer is attention without
//! position embeddings on every `attn_layer_period`-th layer (from `attn_layer_offset`) and a
//! Mamba (1) mixer elsewhere ([`crate::layers::mamba`], its time step, B and C through RMSNorms
//! with weights), and whose channel mixer is a mixture of experts on every
//! `expert_layer_period`-th layer (from `expert_layer_offset`; softmax over all experts, the top
//! k weights not renormalised) and a gated MLP elsewhere. Norms are `input_layernorm` and
//! `pre_ff_layernorm`, the last one `model.final_layernorm`.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::mamba::{MambaDims, MambaMixer, SsmNorms};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SparseMoe};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct JambaConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "sixteen")]
    num_experts: usize,
    #[serde(default = "two")]
    num_experts_per_tok: usize,
    #[serde(default = "two")]
    expert_layer_period: usize,
    #[serde(default = "one")]
    expert_layer_offset: usize,
    #[serde(default = "eight")]
    attn_layer_period: usize,
    #[serde(default = "four")]
    attn_layer_offset: usize,
    #[serde(default = "sixteen")]
    mamba_d_state: usize,
    #[serde(default = "four")]
    mamba_d_conv: usize,
    #[serde(default = "two")]
    mamba_expand: usize,
    /// `"auto"` (`ceil(hidden_size / 16)`) or a number.
    mamba_dt_rank: Option<Value>,
    #[serde(default = "yes")]
    mamba_conv_bias: bool,
    #[serde(default)]
    mamba_proj_bias: bool,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn four() -> usize {
    4
}
fn eight() -> usize {
    8
}
fn sixteen() -> usize {
    16
}

/// transformers' JambaConfig defaults.
const DEFAULTS: Defaults = Defaults { max_positions: 262144, ..Defaults::LLAMA };

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: JambaConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, DEFAULTS)?;
    let dt_rank = crate::families::mamba::dt_rank(raw, "mamba_dt_rank", cfg.mamba_dt_rank.as_ref(), d.hidden)?;
    check_dims(
        raw,
        &[
            ("attn_layer_period", cfg.attn_layer_period),
            ("expert_layer_period", cfg.expert_layer_period),
            ("mamba_d_state", cfg.mamba_d_state),
            ("mamba_d_conv", cfg.mamba_d_conv),
            ("mamba_expand", cfg.mamba_expand),
            ("mamba_dt_rank", dt_rank),
            ("num_experts", cfg.num_experts),
            ("num_experts_per_tok", cfg.num_experts_per_tok),
        ],
    )?;
    if cfg.attn_layer_offset >= cfg.attn_layer_period || cfg.expert_layer_offset >= cfg.expert_layer_period {
        return Err(raw.error(format!(
            "attn_layer_offset {} / expert_layer_offset {} must be below their periods {} / {}",
            cfg.attn_layer_offset, cfg.expert_layer_offset, cfg.attn_layer_period, cfg.expert_layer_period
        )));
    }
    if cfg.num_experts_per_tok > cfg.num_experts {
        return Err(raw.error(format!(
            "num_experts_per_tok {} exceeds num_experts {}",
            cfg.num_experts_per_tok, cfg.num_experts
        )));
    }
    let inter = d.intermediate(raw)?;
    let dims = MambaDims {
        inner: cfg.mamba_expand * d.hidden,
        state_size: cfg.mamba_d_state,
        conv_kernel: cfg.mamba_d_conv,
        dt_rank,
        conv_bias: cfg.mamba_conv_bias,
        proj_bias: cfg.mamba_proj_bias,
    };
    let router_cfg = RouterConfig {
        num_experts: cfg.num_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::Softmax,
        renormalize: false,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let blocks = d.blocks(w, |i, l| {
        let mixer = if i % cfg.attn_layer_period == cfg.attn_layer_offset {
            TokenMixer::Attention(SelfAttention::new(d.attention(&l.at("self_attn"), false, false)?, None))
        } else {
            let m = l.at("mamba");
            let norms = SsmNorms {
                dt: m.rms("dt_layernorm", dt_rank, d.eps)?,
                b: m.rms("b_layernorm", dims.state_size, d.eps)?,
                c: m.rms("c_layernorm", dims.state_size, d.eps)?,
            };
            TokenMixer::Mamba(Box::new(MambaMixer::load(&m, d.hidden, dims, Some(norms))?))
        };
        let f = l.at("feed_forward");
        // transformers builds a plain MLP where a layer would have one expert.
        let mlp = if i % cfg.expert_layer_period == cfg.expert_layer_offset && cfg.num_experts > 1 {
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &f.name("router"), d.hidden, router_cfg.clone(), false)?,
                experts: Experts::load(w, &f.name(""), cfg.num_experts, d.hidden, inter, d.act, ExpertNames::HF)?,
                shared: None,
            }))
        } else {
            ChannelMixer::Gated(f.gated_mlp("", d.hidden, inter, d.act, false)?)
        };
        Ok(Block::pre_norm(d.rms(l, "input_layernorm")?, mixer, d.rms(l, "pre_ff_layernorm")?, mlp))
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "final_layernorm")?), vec![])
}
