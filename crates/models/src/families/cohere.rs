//! Cohere Command-R (`CohereForCausalLM`): one LayerNorm without bias feeds attention and a
//! SiLU-gated MLP in parallel, `h = (h + attn) + mlp`; rotary embeddings rotate adjacent pairs
//! (interleaved, not halves); optional per-head LayerNorm QK-norm with one weight per head
//! (`use_qk_norm`, weight `[heads, head_dim]`); logits times `logit_scale`; tied LM head.
//!
//! Checkpoint names: Llama's without `post_attention_layernorm`, plus
//! `model.layers.{i}.self_attn.{q,k}_norm` when `use_qk_norm`.

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, ParallelSum, SelfAttention, Wiring};
use crate::layers::{Attention, Embedding, GatedMlp, HeadLayerNorm, LayerNorm, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_max_positions() -> usize {
    8192
}
fn default_act() -> String {
    "silu".into()
}
fn default_true() -> bool {
    true
}
fn default_logit_scale() -> f64 {
    0.0625
}

#[derive(Debug, Clone, Deserialize)]
pub struct CohereConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub use_qk_norm: bool,
    #[serde(default = "default_logit_scale")]
    pub logit_scale: f64,
}

/// `CohereLayerNorm`: mean-centred, weight only.
fn cohere_norm(w: &Weights, name: &str, size: usize, eps: f64) -> Result<LayerNorm> {
    LayerNorm::load(w, name, size, eps, false)
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: CohereConfig = raw.parse()?;
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    load::check_heads(raw, heads, kv_heads)?;
    let d = cfg.head_dim.unwrap_or(h / heads);
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let rope = Rope::new(&RopeParameters::from_config(raw, 500_000.0)?, d, cfg.max_position_embeddings, raw)?
        .with_style(RopeStyle::Interleaved);
    let eps = cfg.layer_norm_eps;
    let bias = cfg.attention_bias;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * d, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * d, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * d, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * d, h, bias)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, kv_heads, d, (d as f64).powf(-0.5), None, None),
        };
        let head_norm = |n: &str, count: usize| -> Result<HeadLayerNorm> {
            let weight = w.get_f32(&format!("{p}.self_attn.{n}.weight"), &[count, d])?.reshape(&[count * d])?;
            Ok(HeadLayerNorm { weight: Some(weight), bias: None, head_dim: d, eps: eps as f32 })
        };
        let head_norms =
            if cfg.use_qk_norm { Some((head_norm("q_norm", heads)?, head_norm("k_norm", kv_heads)?)) } else { None };
        blocks.push(Block {
            attn_norm: Some(Norm::Layer(cohere_norm(w, &format!("{p}.input_layernorm"), h, eps)?)),
            attn: SelfAttention { attn, head_norms, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm: None,
            mlp: Mlp::Gated(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, false)?),
            mlp_out_norm: None,
            wiring: Wiring::Parallel(ParallelSum::ResidualFirst),
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
        final_norm: Some(Norm::Layer(cohere_norm(w, "model.norm", h, eps)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost { scale: Some(cfg.logit_scale as f32), softcap: None },
        ropes: vec![rope],
    })
}
