//! ERNIE 4.5 MoE (`Ernie4_5_MoeForCausalLM`): Llama-shaped GQA attention with rotary embeddings
//! on interleaved pairs (GLM style), biases on every projection and the LM head when `use_bias`,
//! and a sparse MoE on layers `moe_layer_start_index..=moe_layer_end_index` every
//! `moe_layer_interval` (dense MLPs elsewhere). The router scores experts by softmax in f32; the
//! top-`moe_k` are chosen on the scores plus `moe_statics.e_score_correction_bias` and weighted by
//! the plain scores renormalised (divided by `max(sum, moe_norm_min)`; the sum of `k` softmax
//! scores never falls below `moe_norm_min`'s 1e-12 in f32, so this is the plain sum). The
//! `moe_num_shared_experts` shared experts are one gated MLP of `moe_intermediate_size *
//! moe_num_shared_experts`, added after the routed output.
//!
//! Checkpoint names: Llama's, plus under `model.layers.{i}.mlp` the gate, `moe_statics
//! .e_score_correction_bias [1, experts]`, `experts.{e}.{gate,up,down}_proj` and
//! `shared_experts.{gate,up,down}_proj`.

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{ChannelMixer, Decoder};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct ErnieMoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default)]
    use_bias: bool,
    moe_intermediate_size: Option<usize>,
    #[serde(alias = "num_experts_per_tok")]
    moe_k: Option<usize>,
    #[serde(alias = "num_experts")]
    moe_num_experts: Option<usize>,
    moe_num_shared_experts: Option<usize>,
    moe_layer_start_index: Option<usize>,
    moe_layer_end_index: Option<i64>,
    moe_layer_interval: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: ErnieMoeConfig = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, max_positions: 131_072, tie: true, kv_heads: Some(4), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let inter = d.intermediate(raw)?;
    let bias = cfg.use_bias;
    let num_experts = cfg.moe_num_experts.unwrap_or(64);
    let width = cfg.moe_intermediate_size.unwrap_or(1536);
    let router_cfg = RouterConfig {
        num_experts,
        top_k: cfg.moe_k.unwrap_or(6),
        scoring: Scoring::Softmax,
        renormalize: true,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let start = cfg.moe_layer_start_index.unwrap_or(1);
    let end = match cfg.moe_layer_end_index.unwrap_or(-1) {
        -1 => d.layers.saturating_sub(1),
        e if e >= 0 => e as usize,
        e => return Err(raw.error(format!("unsupported `moe_layer_end_index` {e}"))),
    };
    let interval = cfg.moe_layer_interval.unwrap_or(1);
    if interval == 0 {
        return Err(raw.error("`moe_layer_interval` is 0"));
    }
    let blocks = d.blocks(w, |i, l| {
        let attn = d.attention(&l.at("self_attn"), bias, bias)?;
        let m = l.at("mlp");
        let sparse = (i + 1).is_multiple_of(interval) && i >= start && i <= end;
        let mlp =
            if sparse {
                let router = Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), false)?
                    .with_correction_bias(w, &m.name("moe_statics.e_score_correction_bias"), &[1, num_experts])?;
                let shared = match cfg.moe_num_shared_experts.unwrap_or(2) {
                    0 => None,
                    n => Some(SharedExpert {
                        mlp: m.gated_mlp("shared_experts", d.hidden, width * n, d.act, bias)?,
                        gate: None,
                    }),
                };
                let experts = Experts::load(w, &m.name(""), num_experts, d.hidden, width, d.act, ExpertNames::HF)?;
                ChannelMixer::Moe(Box::new(SparseMoe { router, experts, shared }))
            } else {
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, bias)?)
            };
        d.llama_block(l, attn, mlp)
    })?;
    let rope = d.rope(raw, 500_000.0)?.with_style(RopeStyle::Interleaved);
    let names = Names { lm_head_bias: bias, ..Names::LLAMA };
    d.finish_at(raw, w, names, blocks, Some(Norm::Rms(d.rms(&w.at("model"), "norm")?)), vec![rope])
}
