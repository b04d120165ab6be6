//! Granite MoE (`GraniteMoeForCausalLM`, PowerMoE / Granite 3.0 MoE) and Granite MoE Shared
//! (`GraniteMoeSharedForCausalLM`, its [`Variant::SHARED`]): Granite's four multipliers
//! (embeddings times `embedding_multiplier`, each branch times `residual_multiplier`, attention
//! scaled by `attention_multiplier`, logits divided by `logits_scaling`) around a sparse MoE whose
//! router takes the top-k raw logits and weights them by a softmax over those k alone. The shared
//! variant adds a dense gated MLP (`shared_intermediate_size`, none when 0) to the routed output
//! before the residual multiplier.
//!
//! Checkpoint names: Llama's attention and norms, plus under `model.layers.{i}.block_sparse_moe`
//! the stacked experts `input_linear.weight [experts, 2 * intermediate, hidden]` (gate rows, then
//! up) and `output_linear.weight [experts, hidden, intermediate]`, and the gate
//! `router.layer.weight` (transformers 5 in memory: `experts.{gate_up_proj, down_proj}`,
//! `router.weight`, read too); the shared MLP is `model.layers.{i}.shared_mlp.{input_linear,
//! output_linear}` with fused gate | up rows.

use serde::Deserialize;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::families::granite::Multipliers;
use crate::layers::moe::{Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe, StackedLayout};
use crate::layers::{GatedMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn eight() -> usize {
    8
}

fn two() -> usize {
    2
}

#[derive(Debug, Clone, Deserialize)]
struct GraniteMoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(flatten)]
    multipliers: Multipliers,
    #[serde(default = "eight")]
    num_local_experts: usize,
    #[serde(default = "two")]
    num_experts_per_tok: usize,
    #[serde(default)]
    shared_intermediate_size: usize,
}

/// What the shared variant adds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// A dense `shared_mlp` next to the experts, `shared_intermediate_size` wide.
    pub shared_mlp: bool,
}

impl Variant {
    pub const SHARED: Variant = Variant { shared_mlp: true };
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Variant) -> Result<Decoder> {
    let cfg: GraniteMoeConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, Defaults::LLAMA)?;
    check_dims(raw, &[("shared_intermediate_size", cfg.shared_intermediate_size.max(1))])?;
    let inter = d.intermediate(raw)?;
    let router_cfg = RouterConfig {
        num_experts: cfg.num_local_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::SoftmaxOfTopK,
        renormalize: false,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        attn.params = d.attention_params(cfg.multipliers.attention);
        let m = l.at("block_sparse_moe");
        let (router, gate_up, down) = match w.contains(&m.name("experts.gate_up_proj")) {
            true => (m.name("router"), m.name("experts.gate_up_proj"), m.name("experts.down_proj")),
            false => (m.name("router.layer"), m.name("input_linear.weight"), m.name("output_linear.weight")),
        };
        let experts = Experts::load_stacked(
            w,
            &gate_up,
            &down,
            cfg.num_local_experts,
            d.hidden,
            inter,
            d.act,
            StackedLayout::OutIn,
        )?;
        let shared = match (variant.shared_mlp, cfg.shared_intermediate_size) {
            (false, _) | (true, 0) => None,
            (true, s) => {
                let sm = l.at("shared_mlp");
                let fused = sm.linear("input_linear", d.hidden, 2 * s, false)?;
                let [gate, up]: [_; 2] = fused.split_rows(&[s, s])?.try_into().expect("two sizes, two parts");
                let down = sm.linear("output_linear", s, d.hidden, false)?;
                Some(SharedExpert { mlp: GatedMlp { gate, up, down, act: d.act }, gate: None })
            }
        };
        let moe = SparseMoe { router: Router::load(w, &router, d.hidden, router_cfg.clone(), false)?, experts, shared };
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(cfg.multipliers.residual as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Moe(Box::new(moe)),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![d.rope(raw, 10000.0)?])?;
    Ok(cfg.multipliers.scale_ends(decoder))
}
