//! InternLM2 (`InternLM2ForCausalLM`, remote code): the Llama computation under InternLM2's names,
//! with q/k/v fused into `attention.wqkv` per KV group — for each KV head, its `heads / kv_heads`
//! query heads, then its key head, then its value head — de-interleaved at load into GQA
//! projections. `bias` (the remote config's default: true) puts biases on `wqkv` and `wo`; the MLP
//! has none.
//!
//! Checkpoint names: `model.{tok_embeddings, norm, layers.{i}.{attention_norm,
//! attention.{wqkv,wo}, ffn_norm, feed_forward.{w1 (gate), w3 (up), w2 (down)}}}`, `output`.

use std::ops::Range;

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::{Attention, GatedMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct InternLm2Config {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "default_true")]
    bias: bool,
}

/// Where q, k and v lie inside a fused projection, given KV heads, query heads per KV head and
/// the head size: each one's row ranges, concatenated in order.
pub type QkvRows = fn(usize, usize, usize) -> [Vec<Range<usize>>; 3];

/// Rows of q, k and v inside `wqkv`: KV group `g` holds `per` query heads, a key and a value.
pub fn grouped_qkv_rows(kv_heads: usize, per: usize, head_dim: usize) -> [Vec<Range<usize>>; 3] {
    let block = |start: usize, n: usize| start * head_dim..(start + n) * head_dim;
    let stride = per + 2;
    [
        (0..kv_heads).map(|g| block(g * stride, per)).collect(),
        (0..kv_heads).map(|g| block(g * stride + per, 1)).collect(),
        (0..kv_heads).map(|g| block(g * stride + per + 1, 1)).collect(),
    ]
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    load_with(raw, w, grouped_qkv_rows)
}

/// [`load`] with `wqkv` split by `rows` (the parity tests show a wrong split fails the gate).
pub fn load_with(raw: &RawConfig, w: &Weights, rows: QkvRows) -> Result<Decoder> {
    let cfg: InternLm2Config = raw.parse()?;
    // The remote model sizes its heads as hidden / heads, whatever else the config says.
    let common = CommonConfig { head_dim: None, ..cfg.common };
    let d = common.resolve(raw, Defaults::LLAMA)?;
    let (h, inter) = (d.hidden, d.intermediate(raw)?);
    let [q_rows, k_rows, v_rows] = rows(d.kv_heads, d.heads / d.kv_heads, d.head_dim);
    let blocks = d.blocks(w, |_, l| {
        let a = l.at("attention");
        let wqkv = a.linear("wqkv", h, (d.heads + 2 * d.kv_heads) * d.head_dim, cfg.bias)?;
        let attn = Attention {
            q: wqkv.select_rows(&q_rows)?,
            k: wqkv.select_rows(&k_rows)?,
            v: wqkv.select_rows(&v_rows)?,
            o: a.linear("wo", d.heads * d.head_dim, h, cfg.bias)?,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: d.attention_params((d.head_dim as f64).powf(-0.5)),
        };
        let f = l.at("feed_forward");
        let mlp = GatedMlp {
            gate: f.linear("w1", h, inter, false)?,
            up: f.linear("w3", h, inter, false)?,
            down: f.linear("w2", inter, h, false)?,
            act: d.act,
        };
        Ok(Block::pre_norm(
            d.rms(l, "attention_norm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "ffn_norm")?,
            ChannelMixer::Gated(mlp),
        ))
    })?;
    let names = Names { embed: "model.tok_embeddings", lm_head: "output", ..Names::LLAMA };
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "norm")?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![d.rope(raw, 10000.0)?])
}
