//! GPT-2 (`GPT2LMHeadModel`): learned absolute positions (`wpe`), pre-LayerNorm blocks, a fused
//! `c_attn` (q, k, v in that order) and every projection a `Conv1D` whose weight is stored
//! `[in, out]` (transposed to the `Linear` layout at load), tanh-GELU MLP, tied LM head.
//! `scale_attn_weights: false` drops the `head_dim^-0.5` scale and
//! `scale_attn_by_inverse_layer_idx` divides it by `layer + 1`.
//!
//! Checkpoint names: `transformer.{wte, wpe, ln_f, h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2,
//! mlp.c_fc, mlp.c_proj}}`; checkpoints saved from `GPT2Model` drop the `transformer.` prefix.

use serde::Deserialize;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LearnedPositions, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, DenseMlp, Embedding, Linear, Mlp, Norm};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu_new".into()
}
fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
pub struct Gpt2Config {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_positions: usize,
    pub n_inner: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default = "default_act")]
    pub activation_function: String,
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    pub add_cross_attention: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Gpt2Config = raw.parse()?;
    if cfg.add_cross_attention {
        return Err(raw.error("`add_cross_attention: true` (an encoder-decoder) is not supported"));
    }
    let h = cfg.n_embd;
    let heads = cfg.n_head;
    load::check_heads(raw, heads, heads)?;
    let head_dim = h / heads;
    let inner = cfg.n_inner.unwrap_or(4 * h);
    let act = load::activation(raw, "activation_function", &cfg.activation_function)?;
    let root = if w.contains("transformer.wte.weight") { "transformer." } else { "" };
    let eps = cfg.layer_norm_epsilon;
    let mut blocks = Vec::with_capacity(cfg.n_layer);
    for i in 0..cfg.n_layer {
        let p = format!("{root}h.{i}");
        let c_attn = Linear::load_conv1d(w, &format!("{p}.attn.c_attn"), h, 3 * h)?;
        let [q, k, v]: [Linear; 3] = c_attn.split_rows(&[h, h, h])?.try_into().expect("three parts");
        let mut scale = if cfg.scale_attn_weights { (head_dim as f64).powf(-0.5) } else { 1.0 };
        if cfg.scale_attn_by_inverse_layer_idx {
            scale /= (i + 1) as f64;
        }
        let attn = Attention {
            q,
            k,
            v,
            o: Linear::load_conv1d(w, &format!("{p}.attn.c_proj"), h, h)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, heads, head_dim, scale, None, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load_conv1d(w, &format!("{p}.mlp.c_fc"), h, inner)?,
            fc2: Linear::load_conv1d(w, &format!("{p}.mlp.c_proj"), inner, h)?,
            act,
        };
        blocks.push(Block {
            attn_norm: Some(Norm::Layer(load::layer_norm(w, &format!("{p}.ln_1"), h, eps, true)?)),
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: None },
            attn_out_norm: None,
            mlp_norm: Some(Norm::Layer(load::layer_norm(w, &format!("{p}.ln_2"), h, eps, true)?)),
            mlp: Mlp::Dense(mlp),
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        });
    }
    let embed = Embedding { table: w.get(&format!("{root}wte.weight"), &[cfg.vocab_size, h])? };
    let positions = LearnedPositions { table: w.get(&format!("{root}wpe.weight"), &[cfg.n_positions, h])?, offset: 0 };
    let lm_head = load::lm_head(w, "lm_head", &embed, cfg.tie_word_embeddings, false)?;
    let info = Decoder::info_for(
        raw.architecture()?,
        cfg.vocab_size,
        cfg.n_positions,
        &blocks,
        &embed,
        &lm_head,
        &[&positions.table],
    );
    Ok(Decoder {
        info,
        embed,
        embed_scale: None,
        project_in: None,
        positions: Some(positions),
        blocks,
        final_norm: Some(Norm::Layer(load::layer_norm(w, &format!("{root}ln_f"), h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: Vec::new(),
    })
}
