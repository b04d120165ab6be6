//! Arcee AFMoE (`AfmoeForCausalLM`, the Trinity models): sandwich RMSNorms around attention and
//! MLP (`input_layernorm` / `post_attention_layernorm`, `pre_mlp_layernorm` / `post_mlp_layernorm`),
//! a per-head RMS QK-norm, the attention output gated by `sigmoid(gate_proj(x))` before `o_proj`,
//! and local/global attention: sliding-window layers rotate, every `global_attn_every_n_layers`-th
//! layer (or `layer_types`) attends to everything without rotary embeddings. From layer
//! `num_dense_layers` on the MLP is a mixture: sigmoid scores, the choice made on the scores plus
//! `expert_bias`, the chosen unbiased scores renormalised (+1e-20) and times `route_scale`
//! (DeepSeek-V3's router without groups), plus `num_shared_experts` shared experts in one MLP.
//! `mup_enabled` multiplies the embeddings by `sqrt(hidden_size)`.
//!
//! Checkpoint names: Llama's plus `self_attn.{q_norm, k_norm, gate_proj}`, `pre_mlp_layernorm`,
//! `post_mlp_layernorm`, and on MoE layers `mlp.{router.gate, expert_bias, shared_experts.*,
//! experts.{e}.{gate,up,down}_proj}` (or the fused `experts.gate_up_proj` / `down_proj`).

use serde::Deserialize;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn one() -> usize {
    1
}

fn two() -> usize {
    2
}

fn four() -> usize {
    4
}

fn unit() -> f64 {
    1.0
}

/// `AfmoeConfig`'s own keys, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct AfmoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    moe_intermediate_size: usize,
    #[serde(default = "one")]
    num_dense_layers: usize,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default = "two")]
    num_shared_experts: usize,
    #[serde(default = "unit")]
    route_scale: f64,
    #[serde(default = "four")]
    global_attn_every_n_layers: usize,
    #[serde(default)]
    mup_enabled: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: AfmoeConfig = raw.parse()?;
    let d = cfg.common.clone().resolve(raw, Defaults { eps: 1e-5, max_positions: 16_384, ..Defaults::LLAMA })?;
    let shared_width = cfg.num_shared_experts.saturating_mul(cfg.moe_intermediate_size);
    check_dims(
        raw,
        &[
            ("num_experts", cfg.num_experts),
            ("global_attn_every_n_layers", cfg.global_attn_every_n_layers),
            ("num_shared_experts * moe_intermediate_size", shared_width),
        ],
    )?;
    let window = raw.f64_or("sliding_window", Some(1024.0)).map(|v| v as usize);
    let router_cfg = RouterConfig {
        num_experts: cfg.num_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::Sigmoid,
        renormalize: true,
        renormalize_eps: 1e-20,
        scaling: cfg.route_scale as f32,
        group: None,
    };
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
        attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
        let sliding = match d.sliding(raw, i)? {
            Some(sliding) => sliding,
            None => (i + 1) % cfg.global_attn_every_n_layers != 0,
        };
        attn.params.sliding_window = window.filter(|_| sliding);
        let gate = s.linear("gate_proj", d.hidden, d.heads * d.head_dim, false)?;
        let mixer = SelfAttention { output_gate: Some(gate), ..SelfAttention::new(attn, sliding.then_some(0)) };
        let m = l.at("mlp");
        let mlp = if i >= cfg.num_dense_layers {
            let shared = m.gated_mlp("shared_experts", d.hidden, shared_width, d.act, false)?;
            let router = Router::load(w, &m.name("router.gate"), d.hidden, router_cfg.clone(), false)?
                .with_correction_bias(w, &m.name("expert_bias"), &[cfg.num_experts])?;
            ChannelMixer::Moe(Box::new(SparseMoe {
                router,
                experts: Experts::load(
                    w,
                    &m.name(""),
                    cfg.num_experts,
                    d.hidden,
                    cfg.moe_intermediate_size,
                    d.act,
                    ExpertNames::HF,
                )?,
                shared: Some(SharedExpert { mlp: shared, gate: None }),
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, false)?)
        };
        Ok(Block {
            attn_norm: Some(Norm::Rms(d.rms(l, "input_layernorm")?)),
            mixer: TokenMixer::Attention(mixer),
            attn_out_norm: Some(Norm::Rms(d.rms(l, "post_attention_layernorm")?)),
            mlp_norm: Some(Norm::Rms(d.rms(l, "pre_mlp_layernorm")?)),
            mlp,
            mlp_out_norm: Some(Norm::Rms(d.rms(l, "post_mlp_layernorm")?)),
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let rope = d.rope(raw, 10000.0)?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])?;
    // A Python float times the f32 activations: the factor rounded to f32.
    Ok(match cfg.mup_enabled {
        true => decoder.with_embed_scale((d.hidden as f64).sqrt() as f32),
        false => decoder,
    })
}
