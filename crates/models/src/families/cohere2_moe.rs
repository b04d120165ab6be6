//! Cohere 2 MoE (`Cohere2MoeForCausalLM`): Command R7B's parallel block, `h = (h + attn) + mlp`
//! from one norm (a bias-free LayerNorm, or an RMSNorm where `rms_norm_eps` is set), adjacent-pair
//! rotary on the sliding-window layers alone (and on the dense prefix layers when
//! `prefix_dense_sliding_window_pattern` is 1), logits times `logit_scale`, tied LM head. Its
//! `mlp_layer_types` (else `first_k_dense_replace`) put dense MLPs `prefix_dense_intermediate_size`
//! wide first and mixtures after: top-k of the router logits, then a softmax over those k
//! (`expert_selection_fn: softmax`) or their sigmoids, renormalised when `norm_topk_prob`;
//! `num_shared_experts` shared experts in one MLP, summed with the routed output or averaged with
//! it (`shared_expert_combination_strategy`).
//!
//! Checkpoint names: Cohere's, plus on MoE layers `mlp.{gate.weight, experts.gate_up_proj,
//! experts.down_proj (or per expert), shared_experts.{gate,up,down}_proj}`.

use ferrite_tensor::{ops, RopeStyle};
use serde::Deserialize;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, ParallelSum, SelfAttention, TokenMixer};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

fn default_logit_scale() -> f64 {
    0.0625
}

fn one() -> usize {
    1
}

fn four() -> usize {
    4
}

fn yes() -> bool {
    true
}

fn average() -> String {
    "average".into()
}

fn softmax() -> String {
    "softmax".into()
}

/// `Cohere2MoeConfig`'s own keys, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct Cohere2MoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "default_logit_scale")]
    logit_scale: f64,
    num_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    num_shared_experts: usize,
    #[serde(default = "average")]
    shared_expert_combination_strategy: String,
    #[serde(default = "softmax")]
    expert_selection_fn: String,
    mlp_layer_types: Option<Vec<String>>,
    #[serde(default)]
    first_k_dense_replace: usize,
    #[serde(default = "one")]
    prefix_dense_sliding_window_pattern: usize,
    #[serde(default = "four")]
    sliding_window_pattern: usize,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
    prefix_dense_intermediate_size: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Cohere2MoeConfig = raw.parse()?;
    let rms = cfg.common.rms_norm_eps.is_some();
    let defaults = Defaults { eps: 1e-5, layer_norm: !rms, max_positions: 8192, tie: true, ..Defaults::LLAMA };
    let d = cfg.common.clone().resolve(raw, defaults)?;
    check_dims(
        raw,
        &[
            ("num_experts", cfg.num_experts),
            ("sliding_window_pattern", cfg.sliding_window_pattern),
            ("prefix_dense_sliding_window_pattern", cfg.prefix_dense_sliding_window_pattern),
        ],
    )?;
    let scoring = match cfg.expert_selection_fn.as_str() {
        "softmax" => Scoring::SoftmaxOfTopK,
        "sigmoid" => Scoring::SigmoidOfTopK,
        other => return Err(raw.error(format!("unsupported `expert_selection_fn` `{other}` (softmax or sigmoid)"))),
    };
    // `(routed + shared) / 2` is `routed / 2 + shared / 2` exactly (halving is exact in binary
    // floating point), so averaging halves the routing weights and the shared down projection.
    let shared_factor = match (cfg.num_shared_experts, cfg.shared_expert_combination_strategy.as_str()) {
        (0, _) | (_, "sum") => 1.0,
        (_, "average") => 0.5,
        (_, other) => {
            return Err(
                raw.error(format!("unsupported `shared_expert_combination_strategy` `{other}` (sum or average)"))
            )
        }
    };
    let router_cfg = RouterConfig {
        num_experts: cfg.num_experts,
        top_k: cfg.num_experts_per_tok,
        scoring,
        // The softmax over the chosen logits sums to one already.
        renormalize: scoring == Scoring::SigmoidOfTopK && cfg.norm_topk_prob,
        renormalize_eps: 0.0,
        scaling: shared_factor,
        group: None,
    };
    let n = d.layers;
    let dense: Vec<bool> = match &cfg.mlp_layer_types {
        Some(types) if types.len() == n => types
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(true),
                "sparse" => Ok(false),
                other => Err(raw.error(format!("unsupported `mlp_layer_types` entry `{other}` (dense or sparse)"))),
            })
            .collect::<Result<_>>()?,
        Some(types) => return Err(raw.error(format!("`mlp_layer_types` has {} entries for {n} layers", types.len()))),
        None => (0..n).map(|i| i < cfg.first_k_dense_replace).collect(),
    };
    // Without `layer_types`: the dense prefix and the rest each count their own pattern.
    let sliding = |i: usize| -> Result<bool> {
        if let Some(sliding) = d.sliding(raw, i)? {
            return Ok(sliding);
        }
        let k = cfg.first_k_dense_replace.min(n);
        Ok(match i < k {
            true => !(i + 1).is_multiple_of(cfg.prefix_dense_sliding_window_pattern),
            false => !(i - k + 1).is_multiple_of(cfg.sliding_window_pattern),
        })
    };
    let norm = |s: &Scope, leaf: &str| -> Result<Norm> {
        Ok(match rms {
            true => Norm::Rms(d.rms(s, leaf)?),
            false => Norm::Layer(d.layer_norm(s, leaf, false)?),
        })
    };
    let blocks = d.blocks(w, |i, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        let slides = sliding(i)? && d.sliding_window.is_some();
        attn.params.sliding_window = d.sliding_window.filter(|_| slides);
        let rotates = slides || (dense[i] && cfg.prefix_dense_sliding_window_pattern == 1);
        let m = l.at("mlp");
        let mlp = if dense[i] {
            let width = cfg.prefix_dense_intermediate_size.map_or_else(|| d.intermediate(raw), Ok)?;
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, width, d.act, false)?)
        } else {
            let inter = d.intermediate(raw)?;
            let shared = match cfg.num_shared_experts {
                0 => None,
                k => {
                    let mut mlp = m.gated_mlp("shared_experts", d.hidden, inter.saturating_mul(k), d.act, false)?;
                    if shared_factor != 1.0 {
                        mlp.down.weight = ops::scale(&mlp.down.weight, shared_factor)?;
                    }
                    Some(SharedExpert { mlp, gate: None })
                }
            };
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), false)?,
                experts: Experts::load(w, &m.name(""), cfg.num_experts, d.hidden, inter, d.act, ExpertNames::HF)?,
                shared,
            }))
        };
        Ok(Block::parallel(
            norm(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, rotates.then_some(0))),
            mlp,
            ParallelSum::ResidualFirst,
        ))
    })?;
    let rope = d.rope(raw, 10000.0)?.with_style(RopeStyle::Interleaved);
    let final_norm = norm(&w.at("model"), "norm")?;
    let logits = LogitsPost { scale: Some(cfg.logit_scale as f32), softcap: None };
    Ok(d.finish(raw, w, blocks, final_norm, vec![rope])?.with_logits(logits))
}
