//! Kimi Linear (`KimiLinearForCausalLM`): Kimi Delta Attention layers ([`crate::layers::kda`])
//! interleaved with multi-head latent attention ([`crate::layers::mla`]) that applies no rotary
//! embedding at all (the rope part of each head is used as projected), in Llama's pre-norm layer.
//! Channel mixers are dense gated MLPs for the first layers and DeepSeek-V3-style MoE blocks
//! after: sigmoid scores with `e_score_correction_bias` for the choice, group-limited by the sum
//! of each group's two best, renormalised (+1e-20) and times `routed_scaling_factor`, plus shared
//! experts. Released checkpoints spell several keys as the remote code did (`num_experts`,
//! `num_experts_per_token`, `num_shared_experts`, `moe_renormalize`, `num_expert_group`,
//! `model_max_length`, the 1-indexed layer lists of `linear_attn_config`); transformers saves the
//! same spellings and also reads its own attribute names.

use serde::Deserialize;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, TokenMixer};
use crate::layers::kda::{KdaDims, KimiDeltaAttention};
use crate::layers::mla::{Mla, MlaCacheMode, MlaDims};
use crate::layers::moe::{
    ExpertNames, Experts, GroupLimit, GroupScore, Router, RouterConfig, Scoring, SharedExpert, SparseMoe,
};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// The remote code's `linear_attn_config`: transformers reads the layer split and the KDA shape
/// from it when the config has no `layer_types` / `linear_*` keys of its own.
#[derive(Debug, Clone, Default, Deserialize)]
struct LinearAttnConfig {
    full_attn_layers: Option<Vec<usize>>,
    kda_layers: Option<Vec<usize>>,
    head_dim: Option<usize>,
    num_heads: Option<usize>,
    short_conv_kernel_size: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
struct KimiLinearConfig {
    #[serde(flatten)]
    common: CommonConfig,
    moe_intermediate_size: Option<usize>,
    q_lora_rank: Option<usize>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    routed_scaling_factor: Option<f64>,
    topk_group: Option<usize>,
    first_k_dense_replace: Option<usize>,
    mlp_layer_types: Option<Vec<String>>,
    linear_head_dim: Option<usize>,
    linear_num_heads: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    linear_attn_config: Option<LinearAttnConfig>,
    // Each pair: the name transformers stores (its `attribute_map` target, also the remote
    // code's), then its attribute name.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_token: Option<usize>,
    num_experts_per_tok: Option<usize>,
    num_shared_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    moe_renormalize: Option<bool>,
    norm_topk_prob: Option<bool>,
    num_expert_group: Option<usize>,
    n_group: Option<usize>,
    model_max_length: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: KimiLinearConfig = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, max_positions: cfg.model_max_length.unwrap_or(1_048_576), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let linear = cfg.linear_attn_config.clone().unwrap_or_default();
    let kda = KdaDims {
        num_heads: cfg.linear_num_heads.or(linear.num_heads).unwrap_or(32),
        head_dim: cfg.linear_head_dim.or(linear.head_dim).unwrap_or(128),
        conv_kernel: cfg.linear_conv_kernel_dim.or(linear.short_conv_kernel_size).unwrap_or(4),
    };
    let mla = MlaDims {
        num_heads: d.heads,
        q_lora_rank: cfg.q_lora_rank,
        kv_lora_rank: cfg.kv_lora_rank.unwrap_or(512),
        qk_nope_head_dim: cfg.qk_nope_head_dim.unwrap_or(128),
        qk_rope_head_dim: cfg.qk_rope_head_dim.unwrap_or(64),
        v_head_dim: cfg.v_head_dim.unwrap_or(128),
    };
    let num_experts = cfg.num_experts.or(cfg.num_local_experts).unwrap_or(256);
    let top_k = cfg.num_experts_per_token.or(cfg.num_experts_per_tok).unwrap_or(8);
    let shared = cfg.num_shared_experts.or(cfg.n_shared_experts).unwrap_or(1);
    let moe_inter = cfg.moe_intermediate_size.unwrap_or(1024);
    check_dims(
        raw,
        &[
            ("linear_num_heads", kda.num_heads),
            ("linear_head_dim", kda.head_dim),
            ("linear_conv_kernel_dim", kda.conv_kernel),
            ("kv_lora_rank", mla.kv_lora_rank),
            ("q_lora_rank", mla.q_lora_rank.unwrap_or(1)),
            ("qk_nope_head_dim", mla.qk_nope_head_dim),
            ("qk_rope_head_dim", mla.qk_rope_head_dim),
            ("v_head_dim", mla.v_head_dim),
            ("moe_intermediate_size", moe_inter),
            ("num_experts", num_experts),
            ("num_experts_per_token", top_k),
            ("num_shared_experts * moe_intermediate_size", shared.max(1).saturating_mul(moe_inter)),
            (
                "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                d.heads.saturating_mul(mla.qk_nope_head_dim.saturating_add(mla.v_head_dim)),
            ),
            ("linear_num_heads * linear_head_dim", kda.num_heads.saturating_mul(kda.head_dim)),
        ],
    )?;
    if top_k > num_experts {
        return Err(raw.error(format!("`num_experts_per_token` {top_k} exceeds `num_experts` {num_experts}")));
    }
    let layer_types = layer_types(raw, d.layer_types.as_deref(), &linear, d.layers)?;
    let sparse = mlp_sparse(raw, &cfg, d.layers)?;
    let router_cfg = RouterConfig {
        num_experts,
        top_k,
        scoring: Scoring::Sigmoid,
        renormalize: cfg.moe_renormalize.or(cfg.norm_topk_prob).unwrap_or(true),
        renormalize_eps: 1e-20,
        scaling: cfg.routed_scaling_factor.unwrap_or(2.446) as f32,
        group: Some(GroupLimit {
            n_group: cfg.num_expert_group.or(cfg.n_group).unwrap_or(1),
            topk_group: cfg.topk_group.unwrap_or(1),
            score: GroupScore::TopTwoSum,
        }),
    };
    // transformers scores groups by their two best experts.
    let per_group = num_experts / router_cfg.group.map_or(1, |g| g.n_group.max(1));
    if per_group < 2 {
        return Err(raw
            .error(format!("`num_expert_group` leaves {per_group} expert per group; the router needs two per group")));
    }
    let scale = (mla.qk_head_dim() as f64).powf(-0.5) as f32;
    // transformers' default `intermediate_size`.
    let inter = d.intermediate.unwrap_or(9216);
    let blocks = d.blocks(w, |i, l| {
        let mixer = match layer_types[i] {
            LayerKind::Kda => TokenMixer::KimiDelta(Box::new(KimiDeltaAttention::load(
                &l.at("self_attn"),
                d.hidden,
                kda,
                d.act,
                d.eps,
            )?)),
            LayerKind::Full => TokenMixer::Latent {
                mla: Mla::load(
                    w,
                    &l.name("self_attn"),
                    d.hidden,
                    mla,
                    d.attention_bias,
                    scale,
                    MlaCacheMode::default(),
                )?,
                rope: None,
            },
        };
        // Checkpoints (and transformers' saves) name every layer's MLP `block_sparse_moe` and keep
        // the routed experts apart (`experts.{e}.w1/w2/w3`); transformers' modules say `mlp` and
        // stack them.
        let m = if w.contains(&l.name("block_sparse_moe.gate.weight"))
            || w.contains(&l.name("block_sparse_moe.gate_proj.weight"))
        {
            l.at("block_sparse_moe")
        } else {
            l.at("mlp")
        };
        let mlp = if sparse[i] {
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router_cfg.clone(), true)?,
                experts: Experts::load(w, &m.name(""), num_experts, d.hidden, moe_inter, d.act, ExpertNames::MIXTRAL)?,
                shared: match shared {
                    0 => None,
                    n => Some(SharedExpert {
                        mlp: m.gated_mlp("shared_experts", d.hidden, moe_inter * n, d.act, false)?,
                        gate: None,
                    }),
                },
            }))
        } else {
            ChannelMixer::Gated(m.gated_mlp("", d.hidden, inter, d.act, false)?)
        };
        Ok(Block::pre_norm(d.rms(l, "input_layernorm")?, mixer, d.rms(l, "post_attention_layernorm")?, mlp))
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerKind {
    Kda,
    Full,
}

/// transformers' order: `layer_types`, else the 1-indexed `full_attn_layers` / `kda_layers` of
/// `linear_attn_config` (every layer must be named), else full attention at every fourth layer
/// from layer 4 (`i % 4 == 0`, not layer 0).
fn layer_types(
    raw: &RawConfig,
    types: Option<&[String]>,
    linear: &LinearAttnConfig,
    layers: usize,
) -> Result<Vec<LayerKind>> {
    if let Some(types) = types {
        return types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(LayerKind::Kda),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(raw.error(format!(
                    "`layer_types` names layer type `{other}`; Kimi Linear has linear_attention and full_attention"
                ))),
            })
            .collect();
    }
    let (Some(full), Some(kda)) = (&linear.full_attn_layers, &linear.kda_layers) else {
        return Ok((0..layers).map(|i| if i > 0 && i % 4 == 0 { LayerKind::Full } else { LayerKind::Kda }).collect());
    };
    let mut kinds = vec![None; layers];
    for (list, key, kind) in [(full, "full_attn_layers", LayerKind::Full), (kda, "kda_layers", LayerKind::Kda)] {
        for &n in list {
            if n == 0 || n > layers {
                return Err(
                    raw.error(format!("`linear_attn_config.{key}` names layer {n}; layers are numbered 1 to {layers}"))
                );
            }
            kinds[n - 1] = Some(kind);
        }
    }
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, k)| {
            k.ok_or_else(|| {
                raw.error(format!(
                    "`linear_attn_config` names layer {} in neither `full_attn_layers` nor `kda_layers`",
                    i + 1
                ))
            })
        })
        .collect()
}

/// Which layers' MLPs are sparse: `mlp_layer_types` (`dense` / `sparse`), else all from
/// `first_k_dense_replace` (default 1) on.
fn mlp_sparse(raw: &RawConfig, cfg: &KimiLinearConfig, layers: usize) -> Result<Vec<bool>> {
    match &cfg.mlp_layer_types {
        None => {
            let dense = cfg.first_k_dense_replace.unwrap_or(1);
            Ok((0..layers).map(|i| i >= dense).collect())
        }
        Some(types) if types.len() != layers => {
            Err(raw.error(format!("`mlp_layer_types` has {} entries for {layers} layers", types.len())))
        }
        Some(types) => types
            .iter()
            .map(|t| match t.as_str() {
                "sparse" => Ok(true),
                "dense" => Ok(false),
                other => Err(raw.error(format!("`mlp_layer_types` names `{other}`; expected dense or sparse"))),
            })
            .collect(),
    }
}
