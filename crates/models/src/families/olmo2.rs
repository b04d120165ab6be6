//! OLMo-2 (`Olmo2ForCausalLM`): Llama projections and MLP, but the norms sit after each branch
//! (`h = h + norm(attn(h))`, `h = h + norm(mlp(h))`, no pre-norm), and the QK-norm is one RMSNorm
//! over all heads' queries (weight `[heads * head_dim]`) and one over all keys, before RoPE.
//!
//! Checkpoint names: Llama's without `input_layernorm`, plus
//! `model.layers.{i}.{self_attn.{q,k}_norm, post_feedforward_layernorm}`.

use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, Embedding, GatedMlp, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_max_positions() -> usize {
    2048
}
fn default_act() -> String {
    "silu".into()
}

#[derive(Debug, Clone, Deserialize)]
pub struct Olmo2Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub attention_bias: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Olmo2Config = raw.parse()?;
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    load::check_heads(raw, heads, kv_heads)?;
    let d = cfg.head_dim.unwrap_or(h / heads);
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, d, cfg.max_position_embeddings, raw)?;
    let eps = cfg.rms_norm_eps;
    let bias = cfg.attention_bias;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * d, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * d, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * d, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * d, h, bias)?,
            // Full-width: the weight spans every head, so the norm does too.
            q_norm: Some(load::rms(w, &format!("{p}.self_attn.q_norm"), heads * d, eps)?),
            k_norm: Some(load::rms(w, &format!("{p}.self_attn.k_norm"), kv_heads * d, eps)?),
            params: load::attention_params(heads, kv_heads, d, (d as f64).powf(-0.5), None, None),
        };
        blocks.push(Block {
            attn_norm: None,
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: Some(Norm::Rms(load::rms(w, &format!("{p}.post_attention_layernorm"), h, eps)?)),
            mlp_norm: None,
            mlp: Mlp::Gated(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, false)?),
            mlp_out_norm: Some(Norm::Rms(load::rms(w, &format!("{p}.post_feedforward_layernorm"), h, eps)?)),
            wiring: Wiring::Sequential { residual_scale: None },
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
        final_norm: Some(Norm::Rms(load::rms(w, "model.norm", h, eps)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
