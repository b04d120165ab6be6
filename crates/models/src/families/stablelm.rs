//! StableLM (`StableLmForCausalLM`; StableLM-3B-4E1T, StableLM 2): LayerNorms with bias, partial
//! rotary embeddings (`partial_rotary_factor`, default 0.25), optional q/k/v biases
//! (`use_qkv_bias`), a SiLU-gated MLP; optionally a per-head LayerNorm on queries and keys with one
//! weight per head (`qk_layernorm`) and the parallel residual `h = (h + attn) + mlp(ln1(h))`
//! (`use_parallel_residual`, StableLM 2 12B).
//!
//! Checkpoint names: Llama's, with LayerNorm biases, `model.norm` a LayerNorm and the QK-norms at
//! `self_attn.{q,k}_layernorm.norms.{head}.weight`.

use ferrite_tensor::{ops, Tensor};
use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, ParallelSum, SelfAttention, Wiring};
use crate::layers::{Attention, Embedding, GatedMlp, HeadLayerNorm, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "silu".into()
}
fn default_heads() -> usize {
    32
}
fn default_max_positions() -> usize {
    4096
}

#[derive(Debug, Clone, Deserialize)]
pub struct StableLmConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_heads")]
    pub num_key_value_heads: usize,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub use_qkv_bias: bool,
    #[serde(default)]
    pub qk_layernorm: bool,
    #[serde(default)]
    pub use_parallel_residual: bool,
}

/// `norms.{0..heads}.weight` of a `StableLmLayerNormPerHead`, as one `[heads * head_dim]` row.
fn per_head_norm(w: &Weights, prefix: &str, heads: usize, d: usize, eps: f64) -> Result<HeadLayerNorm> {
    let parts = (0..heads)
        .map(|i| Ok(w.get_f32(&format!("{prefix}.norms.{i}.weight"), &[d])?.reshape(&[1, d])?))
        .collect::<Result<Vec<Tensor>>>()?;
    let weight = ops::concat_cols(&parts.iter().collect::<Vec<_>>())?.reshape(&[heads * d])?;
    Ok(HeadLayerNorm { weight: Some(weight), bias: None, head_dim: d, eps: eps as f32 })
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: StableLmConfig = raw.parse()?;
    let h = cfg.hidden_size;
    let (heads, kv_heads) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    load::check_heads(raw, heads, kv_heads)?;
    let d = h / heads;
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(0.25));
    let rope = Rope::new(&rope_params, d, cfg.max_position_embeddings, raw)?;
    let eps = cfg.layer_norm_eps;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let bias = cfg.use_qkv_bias;
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * d, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * d, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * d, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * d, h, false)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, kv_heads, d, (d as f64).powf(-0.5), None, None),
        };
        let head_norms = if cfg.qk_layernorm {
            Some((
                per_head_norm(w, &format!("{p}.self_attn.q_layernorm"), heads, d, eps)?,
                per_head_norm(w, &format!("{p}.self_attn.k_layernorm"), kv_heads, d, eps)?,
            ))
        } else {
            None
        };
        let norm =
            |n: &str| -> Result<Norm> { Ok(Norm::Layer(load::layer_norm(w, &format!("{p}.{n}"), h, eps, true)?)) };
        let (mlp_norm, wiring) = if cfg.use_parallel_residual {
            (None, Wiring::Parallel(ParallelSum::ResidualFirst))
        } else {
            (Some(norm("post_attention_layernorm")?), Wiring::Sequential { residual_scale: None })
        };
        blocks.push(Block {
            attn_norm: Some(norm("input_layernorm")?),
            attn: SelfAttention { attn, head_norms, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm,
            mlp: Mlp::Gated(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, false)?),
            mlp_out_norm: None,
            wiring,
        });
    }
    let embed = Embedding { table: w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])? };
    let lm_head = load::lm_head(w, "lm_head", &embed, cfg.tie_word_embeddings, false)?;
    let info = Decoder::info_for(
        raw.architecture()?,
        cfg.vocab_size,
        cfg.max_position_embeddings,
        &blocks,
        &embed,
        &lm_head,
        &[],
    );
    Ok(Decoder {
        info,
        embed,
        embed_scale: None,
        project_in: None,
        positions: None,
        blocks,
        final_norm: Some(Norm::Layer(load::layer_norm(w, "model.norm", h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
