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
//!
//! Granite MoE Hybrid (`GraniteMoeHybridForCausalLM`, Granite 4.0-H, [`Variant::HYBRID`]) is the
//! shared variant whose token mixers are Mamba2 layers (`model.layers.{i}.mamba`, see
//! [`crate::layers::mamba2`]) or attention, by `layer_types` (`mamba` / `attention`, or
//! transformers 5's `linear_attention` / `full_attention`); its attention has no position
//! embeddings unless `position_embedding_type` is `rope`, and a model without experts
//! (`num_local_experts` 0) has only the shared MLP.

use serde::Deserialize;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::families::granite::{Multipliers, SwaLayers};
use crate::families::mamba2::MambaKeys;
use crate::layers::mamba2::{GateNorm, Mamba2Dims, Mamba2Mixer};
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
    position_embedding_type: Option<String>,
    #[serde(flatten)]
    mamba: MambaKeys,
    mamba_conv_bias: Option<bool>,
    mamba_proj_bias: Option<bool>,
}

/// What the shared and hybrid variants add.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// A dense `shared_mlp` next to the experts, `shared_intermediate_size` wide.
    pub shared_mlp: bool,
    /// Mamba2 layers where `layer_types` says (Granite 4.0-H).
    pub hybrid: bool,
    /// GraniteMoeSWA: GraniteSWA's per-layer windows, sinks and rotary bases ([`SwaLayers`]).
    pub swa: bool,
}

impl Variant {
    pub const SHARED: Variant = Variant { shared_mlp: true, hybrid: false, swa: false };
    pub const HYBRID: Variant = Variant { shared_mlp: true, hybrid: true, swa: false };
    pub const SHARED_SWA: Variant = Variant { shared_mlp: true, hybrid: false, swa: true };
}

/// Granite 4.0-H's Mamba2 dimensions, with transformers' defaults.
fn mamba_dims(raw: &RawConfig, cfg: &GraniteMoeConfig, hidden: usize, eps: f64) -> Result<Mamba2Dims> {
    let shape = cfg.mamba.shape(raw, cfg.mamba.expanded(raw, hidden)?, "mamba_expand x hidden_size")?;
    Ok(Mamba2Dims {
        num_heads: shape.num_heads,
        head_dim: shape.head_dim,
        num_groups: shape.num_groups,
        state_size: shape.state_size,
        conv_kernel: shape.conv_kernel,
        conv_bias: cfg.mamba_conv_bias.unwrap_or(true),
        proj_bias: cfg.mamba_proj_bias.unwrap_or(false),
        out_bias: cfg.mamba_proj_bias.unwrap_or(false),
        gate_norm: GateNorm::AfterGate,
        dt_limit: shape.dt_limit,
        eps,
    })
}

/// Whether layer `i` is a Mamba2 layer, by `layer_types` (all Mamba2 when absent, as transformers
/// fills them in).
fn is_mamba(raw: &RawConfig, types: Option<&[String]>, i: usize) -> Result<bool> {
    match types.map(|t| t[i].as_str()) {
        None | Some("mamba" | "linear_attention") => Ok(true),
        Some("attention" | "full_attention") => Ok(false),
        Some(other) => {
            Err(raw
                .error(format!("`layer_types` names layer type `{other}`; Granite MoE Hybrid has mamba and attention")))
        }
    }
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
    let mamba = variant.hybrid.then(|| mamba_dims(raw, &cfg, d.hidden, d.eps)).transpose()?;
    let rope = !variant.hybrid || cfg.position_embedding_type.as_deref() == Some("rope");
    let swa = variant.swa.then(|| SwaLayers::read(raw, &d)).transpose()?;
    let blocks = d.blocks(w, |i, l| {
        let mixer = match mamba {
            Some(dims) if is_mamba(raw, d.layer_types.as_deref(), i)? => {
                TokenMixer::Mamba2(Box::new(Mamba2Mixer::load(&l.at("mamba"), d.hidden, dims)?))
            }
            _ => {
                let s = l.at("self_attn");
                let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
                attn.params = d.attention_params(cfg.multipliers.attention);
                TokenMixer::Attention(match &swa {
                    Some(swa) => swa.attention(i, attn, &s)?,
                    None => SelfAttention::new(attn, rope.then_some(0)),
                })
            }
        };
        let m = l.at("block_sparse_moe");
        let (router, gate_up, down) = match w.contains(&m.name("experts.gate_up_proj")) {
            true => (m.name("router"), m.name("experts.gate_up_proj"), m.name("experts.down_proj")),
            false => (m.name("router.layer"), m.name("input_linear.weight"), m.name("output_linear.weight")),
        };
        let shared = match (variant.shared_mlp, cfg.shared_intermediate_size) {
            (false, _) | (true, 0) => None,
            (true, s) => {
                let sm = l.at("shared_mlp");
                let fused = sm.linear("input_linear", d.hidden, 2 * s, false)?;
                let [gate, up]: [_; 2] = fused.split_rows(&[s, s])?.try_into().expect("two sizes, two parts");
                let down = sm.linear("output_linear", s, d.hidden, false)?;
                Some(GatedMlp { gate, up, down, act: d.act })
            }
        };
        let mlp = match (cfg.num_local_experts, shared) {
            // Granite 4.0-H without experts: the shared MLP alone.
            (0, Some(shared)) if variant.hybrid => ChannelMixer::Gated(shared),
            (_, shared) => ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &router, d.hidden, router_cfg.clone(), false)?,
                experts: Experts::load_stacked(
                    w,
                    &gate_up,
                    &down,
                    cfg.num_local_experts,
                    d.hidden,
                    inter,
                    d.act,
                    StackedLayout::OutIn,
                )?,
                shared: shared.map(|mlp| SharedExpert { mlp, gate: None }),
            })),
        };
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(cfg.multipliers.residual as f32) },
            ..Block::pre_norm(d.rms(l, "input_layernorm")?, mixer, d.rms(l, "post_attention_layernorm")?, mlp)
        })
    })?;
    let ropes = match swa {
        Some(swa) => swa.ropes,
        None => vec![d.rope(raw, 10000.0)?],
    };
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), ropes)?;
    Ok(cfg.multipliers.scale_ends(decoder))
}
