//! Phi-3 (`Phi3ForCausalLM`): the Llama block with a fused `qkv_proj` (rows: q, then k, then v)
//! and a fused `gate_up_proj` (rows: gate, then up), both split at load, an optional sliding
//! window on every layer, and LongRoPE scaling (`rope_type: longrope`, legacy `su` / `yarn`):
//! short factors while the sequence fits `original_max_position_embeddings` (a top-level key
//! that wins over the rope section), long factors beyond, and cos/sin scaled by
//! `sqrt(1 + ln(factor) / ln(original_max))`.
//!
//! Checkpoint names: `model.layers.{i}.{input_layernorm, self_attn.{qkv_proj,o_proj},
//! post_attention_layernorm, mlp.{gate_up_proj,down_proj}}`, `model.norm`, `lm_head`.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Attention, GatedMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct Phi3Config {
    #[serde(flatten)]
    common: CommonConfig,
    original_max_position_embeddings: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Phi3Config = raw.parse()?;
    let mut d = cfg.common.resolve(raw, Defaults { eps: 1e-5, max_positions: 4096, ..Defaults::LLAMA })?;
    // Phi3Config has no `head_dim`.
    d.head_dim = d.hidden / d.heads;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    if matches!(rope_params.kind(), "su" | "yarn") {
        rope_params.rope_type = Some("longrope".into());
    }
    if rope_params.kind() == "longrope" {
        rope_params.original_max_position_embeddings = Some(cfg.original_max_position_embeddings.unwrap_or(4096));
    }
    let rope = Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?;
    let (h, q_rows, kv_rows, inter) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate(raw)?);
    let blocks = d.blocks(w, |_, l| {
        let qkv = l.linear("self_attn.qkv_proj", h, q_rows + 2 * kv_rows, false)?;
        let [q, k, v]: [Linear; 3] = qkv.split_rows(&[q_rows, kv_rows, kv_rows])?.try_into().expect("three parts");
        let mut params = d.attention_params((d.head_dim as f64).powf(-0.5));
        params.sliding_window = d.sliding_window;
        let o = l.linear("self_attn.o_proj", q_rows, h, false)?;
        let attn = Attention { q, k, v, o, q_norm: None, k_norm: None, query_scale: None, params };
        let gate_up = l.linear("mlp.gate_up_proj", h, 2 * inter, false)?;
        let [gate, up]: [Linear; 2] = gate_up.split_rows(&[inter, inter])?.try_into().expect("two parts");
        let down = l.linear("mlp.down_proj", inter, h, false)?;
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "post_attention_layernorm")?,
            ChannelMixer::Gated(GatedMlp { gate, up, down, act: d.act }),
        ))
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}
