//! Phi-1/1.5/2 (`PhiForCausalLM`): one LayerNorm (with bias) feeds attention and an ungated GELU
//! MLP in parallel, `h = (attn + mlp) + h`; partial rotary embeddings (`partial_rotary_factor`,
//! default 0.5) on the first dims of each head; biases on every projection, the LM head included.
//!
//! Checkpoint names: `model.embed_tokens`, `model.layers.{i}.{input_layernorm,
//! self_attn.{q,k,v}_proj, self_attn.dense, mlp.fc1, mlp.fc2}`, `model.final_layernorm`, `lm_head`.

use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, ParallelSum, SelfAttention, Wiring};
use crate::layers::{Attention, DenseMlp, Embedding, Linear, Mlp, Norm};
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
    "gelu_new".into()
}

#[derive(Debug, Clone, Deserialize)]
pub struct PhiConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub qk_layernorm: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: PhiConfig = raw.parse()?;
    if cfg.qk_layernorm {
        return Err(raw.error("`qk_layernorm: true` is not supported (no parity fixture covers it)"));
    }
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    load::check_heads(raw, heads, kv_heads)?;
    let head_dim = h / heads;
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(0.5));
    let rope = Rope::new(&rope_params, head_dim, cfg.max_position_embeddings, raw)?;
    let eps = cfg.layer_norm_eps;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * head_dim, true)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * head_dim, true)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * head_dim, true)?,
            o: Linear::load(w, &format!("{p}.self_attn.dense"), heads * head_dim, h, true)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, kv_heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load(w, &format!("{p}.mlp.fc1"), h, cfg.intermediate_size, true)?,
            fc2: Linear::load(w, &format!("{p}.mlp.fc2"), cfg.intermediate_size, h, true)?,
            act,
        };
        blocks.push(Block {
            attn_norm: Some(Norm::Layer(load::layer_norm(w, &format!("{p}.input_layernorm"), h, eps, true)?)),
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm: None,
            mlp: Mlp::Dense(mlp),
            mlp_out_norm: None,
            wiring: Wiring::Parallel(ParallelSum::BranchesFirst),
        });
    }
    let embed = Embedding { table: w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])? };
    let lm_head = load::lm_head(w, "lm_head", &embed, cfg.tie_word_embeddings, true)?;
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
        final_norm: Some(Norm::Layer(load::layer_norm(w, "model.final_layernorm", h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
