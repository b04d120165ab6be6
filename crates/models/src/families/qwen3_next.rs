//! Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5 (`Qwen3_5ForCausalLM`,
//! `Qwen3_5MoeForCausalLM`): hybrids of Gated DeltaNet layers ([`crate::layers::gdn`]) and gated
//! full attention, 3:1 by default. Real Qwen3.5 checkpoints are `Qwen3_5(Moe)ForConditionalGeneration`
//! with the text config in `text_config` and the text weights under `model.language_model.`; their
//! text part loads from that layout (here; `qwen3_vl::load_qwen3_5` adds the vision tower). The
//! checkpoint's MTP head (`mtp.*`: one gated-attention block behind an `fc` that joins the next
//! token's embedding and the model's hidden state) loads when speculative decoding asks for it.
//! Attention
//! projects a sigmoid output gate alongside its queries (`q_proj` holds `[query, gate]` per head),
//! normalises q and k per head with `(1 + w)` RMSNorms and rotates a quarter of each head. Every
//! RMSNorm of the stream is `(1 + w)` too. The MoE variants' channel mixers are sparse MoE blocks
//! with a sigmoid-gated shared expert; Qwen3.5's are dense.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Dims, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, Mtp, SelfAttention, TokenMixer};
use crate::layers::gdn::{GatedDeltaNet, GdnDims, GdnProjections};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
use crate::layers::{Attention, Norm, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Qwen3Next,
    Qwen3_5,
    Qwen3_5Moe,
}

/// Where the checkpoint keeps the text model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `*ForCausalLM`: `model.*` and a flat config.
    CausalLm,
    /// `*ForConditionalGeneration`: `model.language_model.*` and `text_config`.
    ConditionalGeneration,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct HybridConfig {
    #[serde(flatten)]
    common: CommonConfig,
    /// The pattern as real checkpoints spell it: every `full_attention_interval`-th layer is full
    /// attention, the others linear (transformers derives `layer_types` from it).
    full_attention_interval: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    #[serde(default = "yes")]
    norm_topk_prob: bool,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
}

/// transformers' defaults for both config classes.
const DEFAULTS: Defaults = Defaults {
    eps: 1e-6,
    layer_norm: false,
    max_positions: 32768,
    act: "silu",
    tie: false,
    kv_heads: Some(2),
    head_dim: Some(256),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerKind {
    Linear,
    Full,
}

fn layer_kinds(raw: &RawConfig, cfg: &HybridConfig, d: &Dims) -> Result<Vec<LayerKind>> {
    if let Some(types) = &d.layer_types {
        return types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(LayerKind::Linear),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(raw.error(format!(
                    "`layer_types` names layer type `{other}`; this family has `linear_attention` and \
                     `full_attention`"
                ))),
            })
            .collect();
    }
    let interval = cfg.full_attention_interval.unwrap_or(4);
    if interval == 0 {
        return Err(raw.error("`full_attention_interval` must be at least 1"));
    }
    Ok((0..d.layers)
        .map(|i| if (i + 1).is_multiple_of(interval) { LayerKind::Full } else { LayerKind::Linear })
        .collect())
}

/// `(1 + w)` RMSNorm (the weights are stored centred on zero).
fn centred_rms(s: &Scope, leaf: &str, size: usize, eps: f64) -> Result<RmsNorm> {
    Ok(s.rms(leaf, size, eps)?.with_offset(1.0))
}

/// Gated attention: `q_proj` rows are `[query, gate]` per head, split here into the query
/// projection and the output gate.
fn gated_attention(s: &Scope, d: &Dims) -> Result<SelfAttention> {
    let (h, hd) = (d.hidden, d.head_dim);
    let q_and_gate = s.linear("q_proj", h, 2 * d.heads * hd, d.attention_bias)?;
    let per_head = |offset: usize| -> Vec<std::ops::Range<usize>> {
        (0..d.heads).map(|i| 2 * hd * i + offset..2 * hd * i + offset + hd).collect()
    };
    let (q_rows, kv_rows, bias) = (d.heads * hd, d.kv_heads * hd, d.attention_bias);
    let attn = Attention {
        q: q_and_gate.select_rows(&per_head(0))?,
        k: s.linear("k_proj", h, kv_rows, bias)?,
        v: s.linear("v_proj", h, kv_rows, bias)?,
        o: s.linear("o_proj", q_rows, h, bias)?,
        q_norm: Some(centred_rms(s, "q_norm", hd, d.eps)?),
        k_norm: Some(centred_rms(s, "k_norm", hd, d.eps)?),
        query_scale: None,
        params: d.attention_params((hd as f64).powf(-0.5)),
    };
    Ok(SelfAttention { output_gate: Some(q_and_gate.select_rows(&per_head(hd))?), ..SelfAttention::new(attn, Some(0)) })
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Variant, layout: Layout) -> Result<Decoder> {
    let (raw, base) = match layout {
        Layout::CausalLm => (raw.clone(), "model"),
        Layout::ConditionalGeneration => (raw.text_config()?, "model.language_model"),
    };
    let raw = &raw;
    let cfg: HybridConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, DEFAULTS)?;
    let kinds = layer_kinds(raw, &cfg, &d)?;
    let dims = GdnDims {
        num_k_heads: cfg.linear_num_key_heads.unwrap_or(16),
        num_v_heads: cfg.linear_num_value_heads.unwrap_or(32),
        k_dim: cfg.linear_key_head_dim.unwrap_or(128),
        v_dim: cfg.linear_value_head_dim.unwrap_or(128),
        conv_kernel: cfg.linear_conv_kernel_dim.unwrap_or(4),
    };
    crate::decoder::load::check_dims(
        raw,
        &[
            ("linear_num_key_heads", dims.num_k_heads),
            ("linear_num_value_heads", dims.num_v_heads),
            ("linear_key_head_dim", dims.k_dim),
            ("linear_value_head_dim", dims.v_dim),
            ("linear_conv_kernel_dim", dims.conv_kernel),
        ],
    )?;
    if !dims.num_v_heads.is_multiple_of(dims.num_k_heads) {
        return Err(raw.error(format!(
            "`linear_num_value_heads` {} is not a multiple of `linear_num_key_heads` {}",
            dims.num_v_heads, dims.num_k_heads
        )));
    }
    let num_experts = match variant {
        Variant::Qwen3Next => cfg.num_experts.unwrap_or(512),
        Variant::Qwen3_5 => 0,
        Variant::Qwen3_5Moe => cfg.num_experts.unwrap_or(256),
    };
    let is_sparse = |i: usize| {
        !cfg.mlp_only_layers.contains(&i)
            && num_experts > 0
            && cfg.decoder_sparse_step > 0
            && (i + 1).is_multiple_of(cfg.decoder_sparse_step)
    };
    let projections = match variant {
        Variant::Qwen3Next => GdnProjections::Interleaved,
        Variant::Qwen3_5 | Variant::Qwen3_5Moe => GdnProjections::Separate,
    };
    // Qwen3.5-MoE always renormalises its top-k (its config has no `norm_topk_prob`).
    let renormalize = cfg.norm_topk_prob || variant == Variant::Qwen3_5Moe;
    let block = |l: &Scope, kind: LayerKind, sparse: bool| -> Result<Block> {
        let mixer = match kind {
            LayerKind::Linear => TokenMixer::GatedDeltaNet(Box::new(GatedDeltaNet::load(
                &l.at("linear_attn"),
                d.hidden,
                dims,
                projections,
                d.eps,
            )?)),
            LayerKind::Full => TokenMixer::Attention(gated_attention(&l.at("self_attn"), &d)?),
        };
        let m = l.at("mlp");
        let mlp = if sparse {
            let need = |v: Option<usize>, key: &str| v.ok_or_else(|| raw.error(format!("missing field `{key}`")));
            let router = RouterConfig {
                num_experts,
                top_k: cfg.num_experts_per_tok.unwrap_or(10),
                scoring: Scoring::Softmax,
                renormalize,
                renormalize_eps: 0.0,
                scaling: 1.0,
                group: None,
            };
            let width = need(cfg.moe_intermediate_size, "moe_intermediate_size")?;
            let shared_width = need(cfg.shared_expert_intermediate_size, "shared_expert_intermediate_size")?;
            ChannelMixer::Moe(Box::new(SparseMoe {
                router: Router::load(w, &m.name("gate"), d.hidden, router, false)?,
                experts: Experts::load(w, &m.name(""), num_experts, d.hidden, width, d.act, ExpertNames::HF)?,
                shared: Some(SharedExpert {
                    mlp: m.gated_mlp("shared_expert", d.hidden, shared_width, d.act, false)?,
                    gate: Some(m.linear("shared_expert_gate", d.hidden, 1, false)?),
                }),
            }))
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, d.intermediate(raw)?, d.act, false)?)
        };
        Ok(Block::pre_norm(
            centred_rms(l, "input_layernorm", d.hidden, d.eps)?,
            mixer,
            centred_rms(l, "post_attention_layernorm", d.hidden, d.eps)?,
            mlp,
        ))
    };
    let layers = format!("{base}.layers");
    let blocks = d.blocks_at(w, &layers, |i, l| block(l, kinds[i], is_sparse(i)))?;
    // vLLM builds the MTP block as a full-attention layer numbered 0 (sparse where layer 0 would be).
    let mtp = if w.loads_mtp() {
        if !w.contains("mtp.fc.weight") {
            return Err(raw.error("the checkpoint has no MTP head (`mtp.*` tensors) for speculative decoding's `mtp`"));
        }
        let m = w.at("mtp");
        Some(Mtp {
            norm_embedding: Norm::Rms(centred_rms(&m, "pre_fc_norm_embedding", d.hidden, d.eps)?),
            norm_hidden: Norm::Rms(centred_rms(&m, "pre_fc_norm_hidden", d.hidden, d.eps)?),
            fc: m.linear("fc", 2 * d.hidden, d.hidden, false)?,
            block: block(&m.at("layers.0"), LayerKind::Full, is_sparse(0))?,
            norm: Norm::Rms(centred_rms(&m, "norm", d.hidden, d.eps)?),
            head: None,
            zero_first_embedding: false,
            feeds_back_normed: true,
        })
    } else {
        if w.contains("mtp.fc.weight") {
            tracing::info!("the checkpoint's MTP head (mtp.*) is not loaded: speculative decoding's `mtp` reads it");
        }
        None
    };
    let rope = d.rope(raw, 10_000.0)?;
    let final_norm = Norm::Rms(centred_rms(&w.at(base), "norm", d.hidden, d.eps)?);
    let embed = format!("{base}.embed_tokens");
    let names = Names { layers: &layers, embed: &embed, embed_dim: None, lm_head: "lm_head", lm_head_bias: false };
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![rope])?.with_mtp(mtp)
}
