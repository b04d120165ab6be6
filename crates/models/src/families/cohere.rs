//! Cohere Command-R (`CohereForCausalLM`): one LayerNorm without bias feeds attention and a
//! SiLU-gated MLP in parallel, `h = (h + attn) + mlp`; rotary embeddings rotate adjacent pairs
//! (interleaved, not halves); optional per-head LayerNorm QK-norm with one weight per head
//! (`use_qk_norm`, weight `[heads, head_dim]`); logits times `logit_scale`; tied LM head.
//!
//! Checkpoint names: Llama's without `post_attention_layernorm`, plus
//! `model.layers.{i}.self_attn.{q,k}_norm` when `use_qk_norm`.
//!
//! Cohere 2 (`Cohere2ForCausalLM`, Command R7B / A) is the same block with sliding-window
//! layers (`layer_types`, or the older `sliding_window_pattern`: every 4th layer full) that
//! alone rotate: full-attention layers have no positional encoding.

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, ParallelSum, SelfAttention, TokenMixer};
use crate::layers::{HeadLayerNorm, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_logit_scale() -> f64 {
    0.0625
}

#[derive(Debug, Clone, Deserialize)]
struct CohereConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default)]
    use_qk_norm: bool,
    #[serde(default = "default_logit_scale")]
    logit_scale: f64,
    sliding_window_pattern: Option<usize>,
}

/// Which generation of Command-R a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CohereVersion {
    /// Command-R: every layer rotates, full attention.
    V1,
    /// Command R7B / A: sliding layers rotate, full layers have no positions.
    V2,
}

pub fn load(raw: &RawConfig, w: &Weights, version: CohereVersion) -> Result<Decoder> {
    let cfg: CohereConfig = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, layer_norm: true, max_positions: 8192, tie: true, ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let sliding = |i: usize| -> Result<bool> {
        Ok(match (version, d.sliding(raw, i)?) {
            (CohereVersion::V1, _) => false,
            (CohereVersion::V2, Some(sliding)) => sliding,
            (CohereVersion::V2, None) => {
                let pattern = cfg.sliding_window_pattern.unwrap_or(4);
                if pattern == 0 {
                    return Err(raw.error("`sliding_window_pattern` must be positive"));
                }
                !(i + 1).is_multiple_of(pattern)
            }
        })
    };
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, d.attention_bias, d.attention_bias)?;
        // A V2 layer rotates exactly when it slides (a config without `sliding_window` rotates none).
        let rope = match version {
            CohereVersion::V1 => Some(0),
            CohereVersion::V2 => {
                let slides = sliding(i)? && d.sliding_window.is_some();
                attn.params.sliding_window = d.sliding_window.filter(|_| slides);
                slides.then_some(0)
            }
        };
        // One weight per head (`[heads, head_dim]`).
        let head_norm = |leaf: &str, count: usize| -> Result<HeadLayerNorm> {
            let weight = s.get_f32(&format!("{leaf}.weight"), &[count, d.head_dim])?.reshape(&[count * d.head_dim])?;
            Ok(HeadLayerNorm { weight: Some(weight), bias: None, head_dim: d.head_dim, eps: d.eps as f32 })
        };
        let head_norms = match cfg.use_qk_norm {
            true => Some((head_norm("q_norm", d.heads)?, head_norm("k_norm", d.kv_heads)?)),
            false => None,
        };
        Ok(Block::parallel(
            // `CohereLayerNorm`: mean-centred, weight only.
            Norm::Layer(d.layer_norm(l, "input_layernorm", false)?),
            TokenMixer::Attention(SelfAttention { head_norms, ..SelfAttention::new(attn, rope) }),
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            ParallelSum::ResidualFirst,
        ))
    })?;
    let rope = d.rope(raw, 500_000.0)?.with_style(RopeStyle::Interleaved);
    let final_norm = Norm::Layer(d.layer_norm(&w.at("model"), "norm", false)?);
    let logits = LogitsPost { scale: Some(cfg.logit_scale as f32), softcap: None };
    Ok(d.finish(raw, w, blocks, final_norm, vec![rope])?.with_logits(logits))
}
