//! DeepSeek-V2 (`DeepseekV2ForCausalLM`) and the decoders that share its shape: multi-head
//! latent attention ([`crate::layers::mla`]) with interleaved rotary embeddings on the rope part, and a
//! mixture of routed + shared experts ([`crate::layers::moe`]) from layer `first_k_dense_replace` on
//! (dense MLPs before). DeepSeek-V3 is its [`DeepseekVariant::V3`] (a registry line).

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, TokenMixer};
use crate::layers::mla::{self, Mla, MlaCacheMode, MlaDims};
use crate::layers::moe::{
    ExpertNames, Experts, GroupLimit, GroupScore, Router, RouterConfig, Scoring, SharedExpert, SparseMoe,
};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_scaling() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
struct DeepseekConfig {
    #[serde(flatten)]
    common: CommonConfig,
    moe_intermediate_size: usize,
    q_lora_rank: Option<usize>,
    kv_lora_rank: usize,
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    v_head_dim: usize,
    n_routed_experts: usize,
    n_shared_experts: Option<usize>,
    num_experts_per_tok: usize,
    #[serde(default)]
    first_k_dense_replace: usize,
    #[serde(default = "default_scaling")]
    routed_scaling_factor: f64,
    /// V2: `greedy` or `group_limited_greedy`.
    topk_method: Option<String>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    norm_topk_prob: Option<bool>,
    /// V3: the rope dims are interleaved pairs (default true).
    rope_interleave: Option<bool>,
}

/// How the routed experts are chosen, and how the rope part is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeepseekVariant {
    /// Softmax scores, `greedy` or `group_limited_greedy` (best expert per group) top-k, times
    /// `routed_scaling_factor`; transformers ignores `norm_topk_prob` here. Interleaved rope.
    V2,
    /// Sigmoid scores plus `e_score_correction_bias` for the choice, top-`topk_group` of
    /// `n_group` groups by their two best scores, then top-k; the unbiased scores renormalised
    /// when `norm_topk_prob` (+1e-20) and times `routed_scaling_factor`. Interleaved rope unless
    /// `rope_interleave` is false.
    V3,
}

/// Loads a DeepSeek decoder; `mode` says how MLA uses the paged cache (tests pick the latent one).
pub fn load_with(raw: &RawConfig, w: &Weights, variant: DeepseekVariant, mode: MlaCacheMode) -> Result<Decoder> {
    let cfg: DeepseekConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, Defaults::LLAMA)?;
    let dims = MlaDims {
        num_heads: d.heads,
        q_lora_rank: cfg.q_lora_rank,
        kv_lora_rank: cfg.kv_lora_rank,
        qk_nope_head_dim: cfg.qk_nope_head_dim,
        qk_rope_head_dim: cfg.qk_rope_head_dim,
        v_head_dim: cfg.v_head_dim,
    };
    let rope_params = RopeParameters::from_config(raw, 10000.0)?;
    let style = match (variant, cfg.rope_interleave) {
        (DeepseekVariant::V3, Some(false)) => RopeStyle::Neox,
        _ => RopeStyle::Interleaved,
    };
    let rope = Rope::new(&rope_params, cfg.qk_rope_head_dim, d.max_positions, raw)?.with_style(style);
    let scale = mla::softmax_scale(raw, &rope_params, dims.qk_head_dim())?;
    let group = |score| -> Result<Option<GroupLimit>> {
        match (cfg.n_group, cfg.topk_group) {
            (Some(n_group), Some(topk_group)) => Ok(Some(GroupLimit { n_group, topk_group, score })),
            _ => Err(raw.error("grouped routing needs `n_group` and `topk_group`")),
        }
    };
    let (scoring, renormalize, renormalize_eps, group) = match variant {
        // transformers ignores `norm_topk_prob` for V2.
        DeepseekVariant::V2 => match cfg.topk_method.as_deref().unwrap_or("greedy") {
            "greedy" => (Scoring::Softmax, false, 0.0, None),
            "group_limited_greedy" => (Scoring::Softmax, false, 0.0, group(GroupScore::Max)?),
            other => return Err(raw.error(format!("unsupported `topk_method` `{other}`"))),
        },
        DeepseekVariant::V3 => {
            (Scoring::Sigmoid, cfg.norm_topk_prob.unwrap_or(true), 1e-20, group(GroupScore::TopTwoSum)?)
        }
    };
    let router_cfg = RouterConfig {
        num_experts: cfg.n_routed_experts,
        top_k: cfg.num_experts_per_tok,
        scoring,
        renormalize,
        renormalize_eps,
        scaling: cfg.routed_scaling_factor as f32,
        group,
    };
    let mlp_bias = variant == DeepseekVariant::V2 && d.mlp_bias;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |i, l| {
        let mla = Mla::load(w, &l.name("self_attn"), d.hidden, dims, d.attention_bias, scale, mode)?;
        let m = l.at("mlp");
        let mlp = if i >= cfg.first_k_dense_replace {
            let shared = match cfg.n_shared_experts.unwrap_or(0) {
                0 => None,
                n => Some(SharedExpert {
                    mlp: m.gated_mlp("shared_experts", d.hidden, cfg.moe_intermediate_size * n, d.act, mlp_bias)?,
                    gate: None,
                }),
            };
            let (experts, width) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), variant == DeepseekVariant::V3)?,
                experts: Experts::load(w, &m.name(""), experts, d.hidden, width, d.act, ExpertNames::HF)?,
                shared,
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, mlp_bias)?)
        };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Latent { mla, rope: 0 },
            d.rms(l, "post_attention_layernorm")?,
            mlp,
        ))
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}

pub fn load(raw: &RawConfig, w: &Weights, variant: DeepseekVariant) -> Result<Decoder> {
    load_with(raw, w, variant, MlaCacheMode::default())
}
