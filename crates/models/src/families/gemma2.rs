//! Gemma 2 (`Gemma2ForCausalLM`): Gemma with sandwich norms (RMSNorm before and after both the
//! attention and the MLP), attention logits soft-capped at `attn_logit_softcapping`, final logits
//! soft-capped at `final_logit_softcapping`, queries scaled by `query_pre_attn_scalar^-0.5`, and
//! layers alternating sliding-window / global attention (`layer_types`; by default even layers
//! slide). Gemma 3 text reuses this loader through [`load_sandwich`].
//!
//! Checkpoint names: Gemma's plus `model.layers.{i}.{pre,post}_feedforward_layernorm`.

use serde::Deserialize;

use super::gemma::{gemma_norm, no_encoder, scale_embedding, GEMMA};
use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// The fields Gemma 2 and Gemma 3 text configs share. Keys whose transformers default is not
/// "absent" (softcaps, sliding window) are read by [`Sandwich`] from the raw JSON.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Gemma2Config {
    #[serde(flatten)]
    common: CommonConfig,
    hidden_activation: Option<String>,
    #[serde(default = "default_query_scalar")]
    query_pre_attn_scalar: f64,
    use_bidirectional_attention: Option<bool>,
}

fn default_query_scalar() -> f64 {
    256.0
}

/// What Gemma 3 changes in the Gemma 2 block.
pub(crate) struct Sandwich {
    /// Per-head `(1 + w)` RMSNorm on queries and keys (Gemma 3).
    pub qk_norm: bool,
    /// Rotary tables `[sliding, full]` over `head_dim` (default 256) and the max positions; a
    /// single table serves both layer types when they agree.
    pub ropes: fn(raw: &RawConfig, head_dim: usize, max_positions: usize) -> Result<Vec<Rope>>,
    /// Index into `ropes` for sliding and for full layers.
    pub rope_of: fn(sliding: bool) -> usize,
    /// Gemma 2 passes `attn_logit_softcapping` to attention; Gemma 3 defines it but does not.
    pub attn_softcap: Option<f64>,
    pub final_softcap: Option<f64>,
    pub sliding_window: Option<usize>,
    /// The layer pattern when `layer_types` is absent.
    pub default_sliding: fn(layer: usize, raw: &RawConfig) -> bool,
    pub default_max_positions: usize,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let opts = Sandwich {
        qk_norm: false,
        ropes: |raw, head_dim, max_pos| {
            Ok(vec![Rope::new(&RopeParameters::from_config(raw, 10000.0)?, head_dim, max_pos, raw)?])
        },
        rope_of: |_| 0,
        attn_softcap: raw.f64_or("attn_logit_softcapping", Some(50.0)),
        final_softcap: raw.f64_or("final_logit_softcapping", Some(30.0)),
        sliding_window: raw.f64_or("sliding_window", Some(4096.0)).map(|v| v as usize),
        default_sliding: |i, _| (i + 1) % 2 != 0,
        default_max_positions: 8192,
    };
    load_sandwich(raw, w, opts)
}

pub(crate) fn load_sandwich(raw: &RawConfig, w: &Weights, opts: Sandwich) -> Result<Decoder> {
    load_sandwich_at(raw, w, opts, "model", "lm_head")
}

/// [`load_sandwich`] of a text model whose layers, embedding and final norm are under `prefix`
/// and whose LM head is `lm_head` (a vision-language checkpoint's language model).
pub(crate) fn load_sandwich_at(
    raw: &RawConfig,
    w: &Weights,
    opts: Sandwich,
    prefix: &str,
    lm_head: &str,
) -> Result<Decoder> {
    let cfg: Gemma2Config = raw.parse()?;
    no_encoder(raw, cfg.use_bidirectional_attention)?;
    let defaults = Defaults { kv_heads: Some(4), max_positions: opts.default_max_positions, ..GEMMA };
    let mut d = cfg.common.resolve(raw, defaults)?;
    d.act = crate::decoder::load::activation(
        raw,
        "hidden_activation",
        cfg.hidden_activation.as_deref().unwrap_or(GEMMA.act),
    )?;
    let inter = d.intermediate(raw)?;
    let scale = cfg.query_pre_attn_scalar.powf(-0.5);
    let layers = format!("{prefix}.layers");
    let blocks = d.blocks_at(w, &layers, |i, l| {
        let sliding = d.sliding(raw, i)?.unwrap_or_else(|| (opts.default_sliding)(i, raw));
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        if opts.qk_norm {
            attn.q_norm = Some(gemma_norm(&s, "q_norm", d.head_dim, d.eps)?);
            attn.k_norm = Some(gemma_norm(&s, "k_norm", d.head_dim, d.eps)?);
        }
        attn.params = crate::decoder::load::attention_params(
            d.heads,
            d.kv_heads,
            d.head_dim,
            scale,
            if sliding { opts.sliding_window } else { None },
            opts.attn_softcap,
        );
        let norm = |leaf: &str| -> Result<Option<Norm>> { Ok(Some(Norm::Rms(gemma_norm(l, leaf, d.hidden, d.eps)?))) };
        Ok(Block {
            attn_norm: norm("input_layernorm")?,
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some((opts.rope_of)(sliding)))),
            attn_out_norm: norm("post_attention_layernorm")?,
            mlp_norm: norm("pre_feedforward_layernorm")?,
            mlp: ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            mlp_out_norm: norm("post_feedforward_layernorm")?,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let final_norm = Norm::Rms(gemma_norm(&w.at(prefix), "norm", d.hidden, d.eps)?);
    let ropes = (opts.ropes)(raw, d.head_dim, d.max_positions)?;
    let logits = LogitsPost { scale: None, softcap: opts.final_softcap.map(|c| c as f32) };
    let embed = format!("{prefix}.embed_tokens");
    let names = Names { layers: &layers, embed: &embed, embed_dim: None, lm_head, lm_head_bias: false };
    Ok(scale_embedding(d.finish_at(raw, w, names, blocks, Some(final_norm), ropes)?).with_logits(logits))
}
