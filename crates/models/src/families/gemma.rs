//! Gemma (`GemmaForCausalLM`): Llama-shaped pre-norm blocks with GeGLU (tanh GELU) MLPs, RMSNorms
//! stored as `w` and applied as `(1 + w)`, token embeddings scaled by `sqrt(hidden_size)` (cast
//! to the weights' dtype first, as transformers does), tied LM head.
//!
//! Checkpoint names are Llama's: `model.embed_tokens`, `model.layers.{i}.{input_layernorm,
//! self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`, `model.norm`.

use ferrite_tensor::Activation;
use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, scalar_in_dtype, Block, Decoder, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, Embedding, GatedMlp, Linear, Mlp, Norm, RmsNorm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> usize {
    8192
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
pub struct GemmaConfig {
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
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub attention_bias: bool,
    pub use_bidirectional_attention: Option<bool>,
}

/// A Gemma `(1 + w)` RMSNorm.
pub(crate) fn gemma_norm(w: &Weights, name: &str, size: usize, eps: f64) -> Result<RmsNorm> {
    Ok(RmsNorm::load(w, name, size, eps)?.with_offset(1.0))
}

/// `model.embed_tokens`, scaled by `sqrt(hidden)` in the weights' dtype.
pub(crate) fn scaled_embedding(w: &Weights, vocab: usize, hidden: usize) -> Result<(Embedding, f32)> {
    let embed = Embedding { table: w.get("model.embed_tokens.weight", &[vocab, hidden])? };
    let scale = scalar_in_dtype((hidden as f64).sqrt(), embed.table.dtype());
    Ok((embed, scale))
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GemmaConfig = raw.parse()?;
    if cfg.use_bidirectional_attention.unwrap_or(false) {
        return Err(raw.error("`use_bidirectional_attention: true` (an encoder) is not a causal LM"));
    }
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    // transformers' GemmaConfig defaults (16 KV heads, head_dim 256) when the keys are absent.
    let kv_heads = cfg.num_key_value_heads.unwrap_or(16);
    let head_dim = cfg.head_dim.unwrap_or(256);
    load::check_heads(raw, heads, kv_heads)?;
    // transformers maps the legacy `gelu` of the original Gemma configs to the tanh approximation.
    let act = match cfg.hidden_act.as_deref().unwrap_or("gelu_pytorch_tanh") {
        "gelu" => Activation::GeluTanh,
        other => load::activation(raw, "hidden_act", other)?,
    };
    let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, head_dim, cfg.max_position_embeddings, raw)?;
    let eps = cfg.rms_norm_eps;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let bias = cfg.attention_bias;
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * head_dim, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * head_dim, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * head_dim, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * head_dim, h, bias)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, kv_heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
        };
        blocks.push(Block {
            attn_norm: Some(Norm::Rms(gemma_norm(w, &format!("{p}.input_layernorm"), h, eps)?)),
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm: Some(Norm::Rms(gemma_norm(w, &format!("{p}.post_attention_layernorm"), h, eps)?)),
            mlp: Mlp::Gated(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, false)?),
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        });
    }
    let (embed, scale) = scaled_embedding(w, cfg.vocab_size, h)?;
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
        embed_scale: Some(scale),
        project_in: None,
        positions: None,
        blocks,
        final_norm: Some(Norm::Rms(gemma_norm(w, "model.norm", h, eps)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
