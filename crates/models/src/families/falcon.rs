//! Falcon (`FalconForCausalLM`), rotary variants: a fused `query_key_value` whose layout depends on
//! the config — multi-query (`[q_0..q_{H-1}, k, v]`, Falcon-7B), per-head `[q_h, k_h, v_h]`
//! (`multi_query: false`), or grouped (`new_decoder_architecture`, Falcon-40B/180B: per KV group
//! `H/G` queries then one key and one value) — de-interleaved at load into GQA projections;
//! LayerNorms with bias; an ungated GELU MLP; parallel attention + MLP, `h = (mlp + attn) + h`,
//! reading one shared norm or, in the new architecture, `ln_attn` and `ln_mlp`; tied LM head.
//! ALiBi checkpoints (`alibi: true`, Falcon-RW) are rejected: the op set has no ALiBi bias.
//!
//! Checkpoint names: `transformer.{word_embeddings, ln_f, h.{i}.{input_layernorm | ln_attn + ln_mlp,
//! post_attention_layernorm, self_attention.{query_key_value,dense}, mlp.{dense_h_to_4h,dense_4h_to_h}}}`.

use std::ops::Range;

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
fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "gelu".into()
}
fn default_max_positions() -> usize {
    2048
}

#[derive(Debug, Clone, Deserialize)]
pub struct FalconConfig {
    #[serde(alias = "n_embed")]
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_kv_heads: Option<usize>,
    pub num_ln_in_parallel_attn: Option<usize>,
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    #[serde(default)]
    pub alibi: bool,
    #[serde(default)]
    pub new_decoder_architecture: bool,
    #[serde(default = "default_true")]
    pub multi_query: bool,
    #[serde(default = "default_true")]
    pub parallel_attn: bool,
    #[serde(default)]
    pub bias: bool,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub ffn_hidden_size: Option<usize>,
    #[serde(default = "default_act")]
    pub activation: String,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// Row ranges of q, k and v inside the fused projection, and the number of KV heads.
fn qkv_layout(cfg: &FalconConfig, heads: usize, d: usize) -> ([Vec<Range<usize>>; 3], usize) {
    let block = |start: usize, n: usize| start * d..(start + n) * d;
    if cfg.new_decoder_architecture {
        let groups = cfg.num_kv_heads.unwrap_or(heads);
        let per = heads / groups;
        let stride = per + 2;
        let q = (0..groups).map(|g| block(g * stride, per)).collect();
        let k = (0..groups).map(|g| block(g * stride + per, 1)).collect();
        let v = (0..groups).map(|g| block(g * stride + per + 1, 1)).collect();
        ([q, k, v], groups)
    } else if cfg.multi_query {
        ([vec![block(0, heads)], vec![block(heads, 1)], vec![block(heads + 1, 1)]], 1)
    } else {
        let part = |j: usize| (0..heads).map(|h| block(h * 3 + j, 1)).collect();
        ([part(0), part(1), part(2)], heads)
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: FalconConfig = raw.parse()?;
    if cfg.alibi {
        return Err(raw.error("`alibi: true` (Falcon-RW) is not supported: the op set has no ALiBi attention bias"));
    }
    if cfg.new_decoder_architecture && !cfg.parallel_attn {
        return Err(raw.error("`new_decoder_architecture` without `parallel_attn` is not a layout transformers runs"));
    }
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let d = h / heads;
    let ([q_rows, k_rows, v_rows], kv_heads) = qkv_layout(&cfg, heads, d);
    load::check_heads(raw, heads, kv_heads)?;
    let fused_rows = (heads + 2 * kv_heads) * d;
    let ffn = cfg.ffn_hidden_size.unwrap_or(4 * h);
    let act = load::activation(raw, "activation", &cfg.activation)?;
    let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, d, cfg.max_position_embeddings, raw)?;
    let eps = cfg.layer_norm_epsilon;
    let two_norms = cfg.new_decoder_architecture && cfg.num_ln_in_parallel_attn.unwrap_or(2) == 2;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("transformer.h.{i}");
        let qkv = Linear::load(w, &format!("{p}.self_attention.query_key_value"), h, fused_rows, cfg.bias)?;
        let attn = Attention {
            q: qkv.select_rows(&q_rows)?,
            k: qkv.select_rows(&k_rows)?,
            v: qkv.select_rows(&v_rows)?,
            o: Linear::load(w, &format!("{p}.self_attention.dense"), h, h, cfg.bias)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, kv_heads, d, 1.0 / (d as f64).sqrt(), None, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load(w, &format!("{p}.mlp.dense_h_to_4h"), h, ffn, cfg.bias)?,
            fc2: Linear::load(w, &format!("{p}.mlp.dense_4h_to_h"), ffn, h, cfg.bias)?,
            act,
        };
        let norm = |n: &str| -> Result<Option<Norm>> {
            Ok(Some(Norm::Layer(load::layer_norm(w, &format!("{p}.{n}"), h, eps, true)?)))
        };
        let (attn_norm, mlp_norm, wiring) = if two_norms {
            (norm("ln_attn")?, norm("ln_mlp")?, Wiring::Parallel(ParallelSum::BranchesFirst))
        } else if cfg.parallel_attn {
            (norm("input_layernorm")?, None, Wiring::Parallel(ParallelSum::BranchesFirst))
        } else {
            (norm("input_layernorm")?, norm("post_attention_layernorm")?, Wiring::Sequential { residual_scale: None })
        };
        blocks.push(Block {
            attn_norm,
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm,
            mlp: Mlp::Dense(mlp),
            mlp_out_norm: None,
            wiring,
        });
    }
    let embed = Embedding { table: w.get("transformer.word_embeddings.weight", &[cfg.vocab_size, h])? };
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
        final_norm: Some(Norm::Layer(load::layer_norm(w, "transformer.ln_f", h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
