//! Mixtral (`MixtralForCausalLM`) and the decoders that share its shape: Llama-style GQA
//! self-attention with rotary embeddings, and a sparse mixture-of-experts channel mixer
//! ([`crate::layers::moe`]) in place of the dense MLP (dense where `mlp_only_layers` /
//! `decoder_sparse_step` say). Qwen2-MoE, Qwen3-MoE and OLMoE are [`MoeVariant`]s of it.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Dims};
use crate::decoder::{Block, ChannelMixer, Decoder};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn one() -> usize {
    1
}

#[derive(Debug, Clone, Deserialize)]
struct MoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    /// Qwen2-MoE: biases on q/k/v (default true).
    qkv_bias: Option<bool>,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    /// Mixtral's name for the expert count; the others say `num_experts`.
    num_local_experts: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: usize,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
    clip_qkv: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each head (Qwen3-MoE).
    PerHead,
    /// RMSNorm over all heads at once, before the split into heads (OLMoE).
    FullWidth,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    None,
    /// `sliding_window` on every layer when set (Mixtral).
    AllLayers,
    /// `sliding_window` on every layer when `use_sliding_window` (Qwen3-MoE).
    AllLayersIfEnabled,
    /// `layer_types`, else even layers below `max_window_layers` when `use_sliding_window` (Qwen2-MoE).
    Qwen2Moe,
}

/// How a family departs from Mixtral.
#[derive(Debug, Clone, Copy)]
pub struct MoeVariant {
    /// Checkpoint prefix of the feed-forward block under `model.layers.{i}.`.
    pub moe_prefix: &'static str,
    pub expert_names: ExpertNames,
    /// The top-k weights are always renormalised (Mixtral), else as `norm_topk_prob` says.
    pub always_renormalize: bool,
    /// q/k/v biases unless `qkv_bias` says otherwise (Qwen2-MoE).
    pub default_qkv_bias: bool,
    pub qk_norm: QkNorm,
    pub window: WindowRule,
    /// A shared expert behind a sigmoid gate (Qwen2-MoE).
    pub shared_expert: bool,
    /// Experts are `moe_intermediate_size` wide (Qwen-MoE), else `intermediate_size`.
    pub moe_width_key: bool,
    /// transformers' `rope_theta` when the config has none.
    pub default_rope_theta: f64,
}

const QWEN_MOE: MoeVariant = MoeVariant {
    moe_prefix: "mlp",
    expert_names: ExpertNames::HF,
    always_renormalize: false,
    default_qkv_bias: false,
    qk_norm: QkNorm::None,
    window: WindowRule::None,
    shared_expert: false,
    moe_width_key: true,
    default_rope_theta: 10_000.0,
};

impl MoeVariant {
    pub const MIXTRAL: MoeVariant = MoeVariant {
        moe_prefix: "block_sparse_moe",
        expert_names: ExpertNames::MIXTRAL,
        always_renormalize: true,
        window: WindowRule::AllLayers,
        moe_width_key: false,
        default_rope_theta: 1_000_000.0,
        ..QWEN_MOE
    };
    /// Biased q/k/v, a gated shared expert, Qwen2's sliding-window rule.
    pub const QWEN2_MOE: MoeVariant =
        MoeVariant { default_qkv_bias: true, window: WindowRule::Qwen2Moe, shared_expert: true, ..QWEN_MOE };
    pub const QWEN3_MOE: MoeVariant =
        MoeVariant { qk_norm: QkNorm::PerHead, window: WindowRule::AllLayersIfEnabled, ..QWEN_MOE };
    /// Qwen3-VL-MoE's text model: Qwen3-MoE whose router always renormalises.
    pub const QWEN3_VL_MOE: MoeVariant = MoeVariant { always_renormalize: true, ..MoeVariant::QWEN3_MOE };
    /// Experts of `intermediate_size`, QK-norm over the full q and k width.
    pub const OLMOE: MoeVariant = MoeVariant { qk_norm: QkNorm::FullWidth, moe_width_key: false, ..QWEN_MOE };
}

pub fn load(raw: &RawConfig, w: &Weights, variant: MoeVariant) -> Result<Decoder> {
    let d = raw.parse::<MoeConfig>()?.common.resolve(raw, Defaults::LLAMA)?;
    let blocks = moe_blocks(raw, w, &d, variant, "model.layers")?;
    let rope = d.rope(raw, variant.default_rope_theta)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}

/// The decoder layers under `layers` of a mixture-of-experts config of dimensions `d`.
pub(crate) fn moe_blocks(
    raw: &RawConfig,
    w: &Weights,
    d: &Dims,
    variant: MoeVariant,
    layers: &str,
) -> Result<Vec<Block>> {
    let cfg: MoeConfig = raw.parse()?;
    if cfg.clip_qkv.is_some() {
        return Err(raw.error("`clip_qkv` (clamping q/k/v) is not supported"));
    }
    let num_experts = cfg.num_local_experts.or(cfg.num_experts).unwrap_or(0);
    let (expert_width, width_key) = match variant.moe_width_key {
        true => (cfg.moe_intermediate_size, "moe_intermediate_size"),
        false => (d.intermediate, "intermediate_size"),
    };
    let qkv_bias = cfg.qkv_bias.unwrap_or(variant.default_qkv_bias) || d.attention_bias;
    let router_cfg = RouterConfig {
        num_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::Softmax,
        renormalize: variant.always_renormalize || cfg.norm_topk_prob.unwrap_or(false),
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    // transformers' rule: a layer is sparse unless listed in `mlp_only_layers`, when there are
    // experts and `(layer + 1)` is a multiple of `decoder_sparse_step`.
    let is_sparse = |i: usize| {
        !cfg.mlp_only_layers.contains(&i)
            && num_experts > 0
            && cfg.decoder_sparse_step > 0
            && (i + 1).is_multiple_of(cfg.decoder_sparse_step)
    };
    let enabled = cfg.use_sliding_window.unwrap_or(false);
    d.blocks_at(w, layers, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, qkv_bias, d.attention_bias)?;
        (attn.q_norm, attn.k_norm) = match variant.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => (Some(s.rms("q_norm", d.head_dim, d.eps)?), Some(s.rms("k_norm", d.head_dim, d.eps)?)),
            QkNorm::FullWidth => (
                Some(s.rms("q_norm", d.heads * d.head_dim, d.eps)?),
                Some(s.rms("k_norm", d.kv_heads * d.head_dim, d.eps)?),
            ),
        };
        let sliding = match variant.window {
            WindowRule::None => false,
            WindowRule::AllLayers => true,
            WindowRule::AllLayersIfEnabled => enabled,
            WindowRule::Qwen2Moe => match d.sliding(raw, i)? {
                Some(sliding) => sliding,
                None => enabled && i.is_multiple_of(2) && i < cfg.max_window_layers.unwrap_or(28),
            },
        };
        attn.params.sliding_window = d.sliding_window.filter(|_| sliding);
        let m = l.at(variant.moe_prefix);
        let mlp = if is_sparse(i) {
            let width = expert_width.ok_or_else(|| raw.error(format!("missing field `{width_key}`")))?;
            let shared = match variant.shared_expert {
                true => {
                    let sw = cfg
                        .shared_expert_intermediate_size
                        .ok_or_else(|| raw.error("missing field `shared_expert_intermediate_size`"))?;
                    Some(SharedExpert {
                        mlp: m.gated_mlp("shared_expert", d.hidden, sw, d.act, false)?,
                        gate: Some(m.linear("shared_expert_gate", d.hidden, 1, false)?),
                    })
                }
                false => None,
            };
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), false)?,
                experts: Experts::load(w, &m.name(""), num_experts, d.hidden, width, d.act, variant.expert_names)?,
                shared,
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, false)?)
        };
        d.llama_block(l, attn, mlp)
    })
}
