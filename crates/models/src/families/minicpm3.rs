//! MiniCPM3 (`MiniCPM3ForCausalLM`): DeepSeek-V2's multi-head latent attention
//! ([`crate::layers::mla`], `q_lora_rank` low-rank queries by default) with the standard
//! rotate-half rotary on the rope part (LongRoPE in the released checkpoint, without Phi-3's
//! recompute) and a dense SiLU-gated MLP, plus MiniCPM's multipliers: embeddings times
//! `scale_emb`, each branch times `scale_depth / sqrt(num_hidden_layers)` before it joins the
//! residual, and the final hidden states divided by `hidden_size / dim_model_base` before the
//! (tied) LM head, applied here to the logits, which the head maps linearly.
//!
//! Checkpoint names: Llama's norms and MLP, DeepSeek's MLA projections under `self_attn`.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, TokenMixer, Wiring};
use crate::layers::mla::{self, Mla, MlaCacheMode, MlaDims};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_kv_lora_rank() -> usize {
    256
}

fn default_qk_nope() -> usize {
    64
}

fn default_qk_rope() -> usize {
    32
}

fn default_scale_emb() -> f64 {
    12.0
}

#[derive(Debug, Clone, Deserialize)]
struct MiniCpm3Config {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "default_kv_lora_rank")]
    kv_lora_rank: usize,
    #[serde(default = "default_qk_nope")]
    qk_nope_head_dim: usize,
    #[serde(default = "default_qk_rope")]
    qk_rope_head_dim: usize,
    v_head_dim: Option<usize>,
    #[serde(default = "default_scale_emb")]
    scale_emb: f64,
}

/// A key whose absence means `default` and whose `null` means `None` (`q_lora_rank`,
/// `scale_depth`, `dim_model_base`: the config class's defaults, or an explicit no-op).
fn nullable(raw: &RawConfig, key: &str, default: f64) -> Result<Option<f64>> {
    match raw.value.get(key) {
        None => Ok(Some(default)),
        Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| raw.error(format!("`{key}` is not a number"))),
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: MiniCpm3Config = raw.parse()?;
    let defaults = Defaults { eps: 1e-5, max_positions: 32_768, tie: true, ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let v_head_dim = cfg.v_head_dim.unwrap_or(1);
    check_dims(
        raw,
        &[
            ("kv_lora_rank", cfg.kv_lora_rank),
            ("qk_rope_head_dim", cfg.qk_rope_head_dim),
            (
                "num_attention_heads * (qk_nope_head_dim + v_head_dim)",
                d.heads.saturating_mul(cfg.qk_nope_head_dim.saturating_add(v_head_dim)),
            ),
            ("kv_lora_rank + qk_rope_head_dim", cfg.kv_lora_rank.saturating_add(cfg.qk_rope_head_dim)),
        ],
    )?;
    let inter = d.intermediate(raw)?;
    let dims = MlaDims {
        num_heads: d.heads,
        q_lora_rank: nullable(raw, "q_lora_rank", 768.0)?.map(|r| r as usize),
        kv_lora_rank: cfg.kv_lora_rank,
        qk_nope_head_dim: cfg.qk_nope_head_dim,
        qk_rope_head_dim: cfg.qk_rope_head_dim,
        v_head_dim: cfg.v_head_dim.unwrap_or(d.hidden / d.heads),
    };
    let layers = d.layers as f64;
    let residual = nullable(raw, "scale_depth", 1.4)?.unwrap_or(layers.sqrt()) / layers.sqrt();
    let dim_model_base = nullable(raw, "dim_model_base", 256.0)?.unwrap_or(d.hidden as f64);
    let rope_params = RopeParameters::from_config(raw, 10000.0)?;
    let rope = Rope::new(&rope_params, cfg.qk_rope_head_dim, d.max_positions, raw)?.without_recompute();
    let scale = mla::softmax_scale(raw, &rope_params, dims.qk_head_dim())?;
    let blocks = d.blocks(w, |_, l| {
        let mla = Mla::load(w, &l.name("self_attn"), d.hidden, dims, d.attention_bias, scale, MlaCacheMode::default())?;
        Ok(Block {
            wiring: Wiring::Sequential { residual_scale: Some(residual as f32) },
            ..Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Latent { mla, rope: Some(0) },
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, d.mlp_bias)?),
            )
        })
    })?;
    let decoder = d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])?;
    let logits = LogitsPost { scale: Some((dim_model_base / d.hidden as f64) as f32), softcap: None };
    Ok(decoder.with_embed_scale(cfg.scale_emb as f32).with_logits(logits))
}
