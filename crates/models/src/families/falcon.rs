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

use crate::decoder::load::{check_dims, check_heads, CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, ParallelSum, SelfAttention, TokenMixer, Wiring};
use crate::layers::{Attention, DenseMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct FalconConfig {
    num_kv_heads: Option<usize>,
    num_ln_in_parallel_attn: Option<usize>,
    #[serde(default)]
    alibi: bool,
    #[serde(default)]
    new_decoder_architecture: bool,
    #[serde(default = "default_true")]
    multi_query: bool,
    #[serde(default = "default_true")]
    parallel_attn: bool,
    #[serde(default)]
    bias: bool,
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
    let mut names = vec![
        ("layer_norm_epsilon", "layer_norm_eps"),
        ("activation", "hidden_act"),
        ("ffn_hidden_size", "intermediate_size"),
    ];
    // The legacy `n_embed`, where present, is the hidden size.
    if raw.value.get("n_embed").is_some() {
        names.push(("n_embed", "hidden_size"));
    }
    let mapped = raw.renamed(&names);
    let common: CommonConfig = mapped.parse()?;
    let heads = common.num_attention_heads;
    check_dims(&mapped, &[("hidden_size", common.hidden_size), ("num_attention_heads", heads)])?;
    if cfg.new_decoder_architecture {
        check_heads(&mapped, heads, cfg.num_kv_heads.unwrap_or(heads))?;
    }
    let ([q_rows, k_rows, v_rows], kv_heads) = qkv_layout(&cfg, heads, common.hidden_size / heads.max(1));
    let defaults =
        Defaults { eps: 1e-5, layer_norm: true, act: "gelu", tie: true, kv_heads: Some(kv_heads), ..Defaults::LLAMA };
    let mut d = CommonConfig { num_key_value_heads: None, head_dim: None, ..common }.resolve(&mapped, defaults)?;
    d.head_dim = d.hidden / d.heads;
    let (h, ffn, bias) = (d.hidden, d.intermediate.unwrap_or(4 * d.hidden), cfg.bias);
    let two_norms = cfg.new_decoder_architecture && cfg.num_ln_in_parallel_attn.unwrap_or(2) == 2;
    let blocks = d.blocks_at(w, "transformer.h", |_, l| {
        let qkv = l.linear("self_attention.query_key_value", h, (heads + 2 * kv_heads) * d.head_dim, bias)?;
        let attn = Attention {
            q: qkv.select_rows(&q_rows)?,
            k: qkv.select_rows(&k_rows)?,
            v: qkv.select_rows(&v_rows)?,
            o: l.linear("self_attention.dense", h, h, bias)?,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: d.attention_params(1.0 / (d.head_dim as f64).sqrt()),
        };
        let mlp = DenseMlp {
            fc1: l.linear("mlp.dense_h_to_4h", h, ffn, bias)?,
            fc2: l.linear("mlp.dense_4h_to_h", ffn, h, bias)?,
            act: d.act.into(),
        };
        let norm = |leaf: &str| -> Result<Option<Norm>> { Ok(Some(Norm::Layer(d.layer_norm(l, leaf, true)?))) };
        let (attn_norm, mlp_norm, wiring) = if two_norms {
            (norm("ln_attn")?, norm("ln_mlp")?, Wiring::Parallel(ParallelSum::BranchesFirst))
        } else if cfg.parallel_attn {
            (norm("input_layernorm")?, None, Wiring::Parallel(ParallelSum::BranchesFirst))
        } else {
            (norm("input_layernorm")?, norm("post_attention_layernorm")?, Wiring::Sequential { residual_scale: None })
        };
        Ok(Block {
            attn_norm,
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: None,
            mlp_norm,
            mlp: ChannelMixer::Dense(mlp),
            mlp_out_norm: None,
            wiring,
        })
    })?;
    let names = Names { layers: "transformer.h", embed: "transformer.word_embeddings", ..Names::LLAMA };
    let final_norm = Norm::Layer(d.layer_norm(&w.at("transformer"), "ln_f", true)?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![d.rope(raw, 10000.0)?])
}
