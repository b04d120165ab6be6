//! DeepSeek-V2 (`DeepseekV2ForCausalLM`) and the decoders that share its shape: multi-head
//! latent attention ([`crate::layers::mla`]) with interleaved rotary embeddings on the rope part, and a
//! mixture of routed + shared experts ([`crate::layers::moe`]) from layer `first_k_dense_replace` on
//! (dense MLPs before). DeepSeek-V3 is its [`DeepseekVariant::V3`], DeepSeek-V3.2 its
//! [`DeepseekVariant::V32`] (with the sparse-attention indexer, see
//! [`crate::families::deepseek_v32`]) and GLM-4.7-Flash its [`DeepseekVariant::Glm4MoeLite`].

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{check_dims, next_layer_mtp, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, TokenMixer};
use crate::families::deepseek_v32;
use crate::layers::dsa::Indexer;
use crate::layers::mla::{self, Mla, MlaCacheMode, MlaDims};
use crate::layers::moe::{
    ExpertNames, Experts, GroupLimit, GroupScore, Router, RouterConfig, Scoring, SharedExpert, SparseMoe,
};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

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
    first_k_dense_replace: Option<usize>,
    routed_scaling_factor: Option<f64>,
    /// V2: `greedy` or `group_limited_greedy`.
    topk_method: Option<String>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    norm_topk_prob: Option<bool>,
    /// V3: the rope dims are interleaved pairs (default true).
    rope_interleave: Option<bool>,
    /// GLM-4-MoE-Lite and V3.2: `dense` or `sparse` per layer, in place of `first_k_dense_replace`.
    mlp_layer_types: Option<Vec<String>>,
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
    /// GLM-4-MoE-Lite (`Glm4MoeLiteForCausalLM`): V3's attention and router, with
    /// `mlp_layer_types` choosing the sparse layers (default: all but the first), one shared
    /// expert and no group limit unless the config says otherwise, and `routed_scaling_factor`
    /// 1.8 by default.
    Glm4MoeLite,
    /// DeepSeek-V3.2: V3 with a lightning indexer in every layer choosing the keys MLA attends to;
    /// rope always interleaved, the q LoRA required, DeepseekV32Config's defaults for absent keys
    /// (see [`crate::families::deepseek_v32`]).
    V32,
}

impl DeepseekVariant {
    /// The sigmoid `noaux_tc` router with its correction bias.
    fn noaux_tc(self) -> bool {
        self != DeepseekVariant::V2
    }
}

/// Loads a DeepSeek decoder; `mode` says how MLA uses the paged cache (tests pick the latent one).
pub fn load_with(raw: &RawConfig, w: &Weights, variant: DeepseekVariant, mode: MlaCacheMode) -> Result<Decoder> {
    let cfg: DeepseekConfig = raw.parse()?;
    let lite = variant == DeepseekVariant::Glm4MoeLite;
    let v32 = variant == DeepseekVariant::V32;
    let indexer = if v32 {
        let q_lora_rank = cfg
            .q_lora_rank
            .ok_or_else(|| raw.error("`q_lora_rank` is not set: DeepSeek-V3.2's indexer reads the q LoRA latent"))?;
        Some((q_lora_rank, deepseek_v32::indexer_dims(raw, cfg.qk_rope_head_dim)?))
    } else {
        None
    };
    let defaults = match lite {
        true => Defaults { eps: 1e-5, max_positions: 202_752, ..Defaults::LLAMA },
        false => Defaults::LLAMA,
    };
    let d = cfg.common.resolve(raw, defaults)?;
    check_dims(
        raw,
        &[
            ("moe_intermediate_size", cfg.moe_intermediate_size),
            ("q_lora_rank", cfg.q_lora_rank.unwrap_or(1)),
            ("kv_lora_rank", cfg.kv_lora_rank),
            ("qk_nope_head_dim", cfg.qk_nope_head_dim),
            ("qk_rope_head_dim", cfg.qk_rope_head_dim),
            ("v_head_dim", cfg.v_head_dim),
            ("n_routed_experts", cfg.n_routed_experts),
            ("num_experts_per_tok", cfg.num_experts_per_tok),
            (
                "n_shared_experts * moe_intermediate_size",
                cfg.n_shared_experts.unwrap_or(1).max(1).saturating_mul(cfg.moe_intermediate_size),
            ),
            (
                "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                d.heads.saturating_mul(cfg.qk_nope_head_dim.saturating_add(cfg.v_head_dim)),
            ),
        ],
    )?;
    let dims = MlaDims {
        num_heads: d.heads,
        q_lora_rank: cfg.q_lora_rank,
        kv_lora_rank: cfg.kv_lora_rank,
        qk_nope_head_dim: cfg.qk_nope_head_dim,
        qk_rope_head_dim: cfg.qk_rope_head_dim,
        v_head_dim: cfg.v_head_dim,
    };
    let rope_params = RopeParameters::from_config(raw, 10000.0)?;
    let style = match (variant.noaux_tc(), cfg.rope_interleave) {
        (true, Some(false)) if !v32 => RopeStyle::Neox,
        _ => RopeStyle::Interleaved,
    };
    let rope = Rope::new(&rope_params, cfg.qk_rope_head_dim, d.max_positions, raw)?.with_style(style);
    let scale = mla::softmax_scale(raw, &rope_params, dims.qk_head_dim())?;
    let group = |score| -> Result<Option<GroupLimit>> {
        let (n_group, topk_group) = match variant {
            DeepseekVariant::Glm4MoeLite => (Some(1), Some(1)),
            DeepseekVariant::V32 => (Some(8), Some(4)),
            DeepseekVariant::V2 | DeepseekVariant::V3 => (None, None),
        };
        match (cfg.n_group.or(n_group), cfg.topk_group.or(topk_group)) {
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
        DeepseekVariant::V3 | DeepseekVariant::Glm4MoeLite | DeepseekVariant::V32 => {
            (Scoring::Sigmoid, cfg.norm_topk_prob.unwrap_or(true), 1e-20, group(GroupScore::TopTwoSum)?)
        }
    };
    let router_cfg = RouterConfig {
        num_experts: cfg.n_routed_experts,
        top_k: cfg.num_experts_per_tok,
        scoring,
        renormalize,
        renormalize_eps,
        scaling: cfg.routed_scaling_factor.unwrap_or(match variant {
            DeepseekVariant::Glm4MoeLite => 1.8,
            DeepseekVariant::V32 => 2.5,
            DeepseekVariant::V2 | DeepseekVariant::V3 => 1.0,
        }) as f32,
        group,
    };
    let mlp_bias = variant == DeepseekVariant::V2 && d.mlp_bias;
    let inter = d.intermediate(raw)?;
    let sparse = |i: usize| -> Result<bool> {
        let types = cfg.mlp_layer_types.as_deref().filter(|_| lite || v32);
        match types.map(|types| types.get(i).map(String::as_str)) {
            None if lite => Ok(i > 0),
            None => Ok(i >= cfg.first_k_dense_replace.unwrap_or(if v32 { 3 } else { 0 })),
            Some(Some("sparse")) => Ok(true),
            Some(Some("dense")) => Ok(false),
            Some(Some(other)) => Err(raw.error(format!("unsupported layer type `{other}` in `mlp_layer_types`"))),
            Some(None) => Err(raw.error(format!("`mlp_layer_types` has no entry for layer {i}"))),
        }
    };
    let n_shared = cfg.n_shared_experts.unwrap_or(if lite || v32 { 1 } else { 0 });
    let block = |i: usize, l: &Scope| -> Result<Block> {
        let mut mla = Mla::load(w, &l.name("self_attn"), d.hidden, dims, d.attention_bias, scale, mode)?;
        if let Some((q_lora_rank, index)) = indexer {
            let prefix = l.name("self_attn.indexer");
            mla = mla.with_indexer(Indexer::load(w, &prefix, d.hidden, q_lora_rank, index)?)?;
        }
        let m = l.at("mlp");
        let mlp = if sparse(i)? {
            let shared = match n_shared {
                0 => None,
                n => Some(SharedExpert {
                    mlp: m.gated_mlp("shared_experts", d.hidden, cfg.moe_intermediate_size * n, d.act, mlp_bias)?,
                    gate: None,
                }),
            };
            let (experts, width) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), variant.noaux_tc())?,
                experts: Experts::load(w, &m.name(""), experts, d.hidden, width, d.act, ExpertNames::HF)?,
                shared,
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, mlp_bias)?)
        };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Latent { mla, rope: Some(0) },
            d.rms(l, "post_attention_layernorm")?,
            mlp,
        ))
    };
    let blocks = d.blocks(w, block)?;
    // The MTP head is the checkpoint's extra layer after the last (`num_nextn_predict_layers`).
    let mtp = next_layer_mtp(raw, w, &d, block)?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])?.with_mtp(mtp)
}

pub fn load(raw: &RawConfig, w: &Weights, variant: DeepseekVariant) -> Result<Decoder> {
    load_with(raw, w, variant, MlaCacheMode::default())
}
