//! StarCoder2 (`Starcoder2ForCausalLM`): pre-LayerNorm blocks (with bias, `norm_epsilon`), GQA
//! attention with biased projections (`use_bias`), an ungated tanh-GELU MLP (`c_fc`, `c_proj`),
//! sliding-window attention on every layer when `sliding_window` is set, tied LM head.
//!
//! Checkpoint names: `model.embed_tokens`, `model.layers.{i}.{input_layernorm,
//! self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.c_fc, mlp.c_proj}`, `model.norm`.

use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, DenseMlp, Embedding, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_max_positions() -> usize {
    4096
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn default_true() -> bool {
    true
}
fn default_kv_heads() -> usize {
    2
}

#[derive(Debug, Clone, Deserialize)]
pub struct Starcoder2Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: usize,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub norm_epsilon: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_true")]
    pub use_bias: bool,
    pub sliding_window: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Starcoder2Config = raw.parse()?;
    let h = cfg.hidden_size;
    let (heads, kv_heads) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    load::check_heads(raw, heads, kv_heads)?;
    let d = cfg.head_dim.unwrap_or(h / heads);
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, d, cfg.max_position_embeddings, raw)?;
    let (eps, bias) = (cfg.norm_epsilon, cfg.use_bias);
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
            params: load::attention_params(heads, kv_heads, d, (d as f64).powf(-0.5), cfg.sliding_window, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load(w, &format!("{p}.mlp.c_fc"), h, cfg.intermediate_size, bias)?,
            fc2: Linear::load(w, &format!("{p}.mlp.c_proj"), cfg.intermediate_size, h, bias)?,
            act,
        };
        let norm = |n: &str| -> Result<Option<Norm>> {
            Ok(Some(Norm::Layer(load::layer_norm(w, &format!("{p}.{n}"), h, eps, true)?)))
        };
        blocks.push(Block {
            attn_norm: norm("input_layernorm")?,
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm: norm("post_attention_layernorm")?,
            mlp: Mlp::Dense(mlp),
            mlp_out_norm: None,
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
        final_norm: Some(Norm::Layer(load::layer_norm(w, "model.norm", h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
