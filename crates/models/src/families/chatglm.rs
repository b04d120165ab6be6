//! ChatGLM (`ChatGLMModel` / `ChatGLMForConditionalGeneration`, remote code: ChatGLM2/3-6B and
//! the original glm-4-9b-chat layout): pre-norm RMSNorm blocks, a fused `query_key_value` (rows:
//! all query heads, then the `multi_query_group_num` key heads, then as many value heads) with
//! biases under `add_qkv_bias`, a SiLU-gated MLP whose `dense_h_to_4h` holds gate then up, and
//! rotary embeddings on the first half of each head (`kv_channels / 2`) with base
//! `10000 * rope_ratio`, rotating adjacent pairs (`original_rope`; rotate-half when false, as vLLM
//! reads it). `add_bias_linear` adds biases to the output and MLP projections.
//!
//! Checkpoint names: `transformer.{embedding.word_embeddings, encoder.{layers.{i}.{input_layernorm,
//! self_attention.{query_key_value,dense}, post_attention_layernorm, mlp.{dense_h_to_4h,
//! dense_4h_to_h}}, final_layernorm}, output_layer}`; `transformer.rotary_pos_emb.inv_freq` is
//! recomputed, not read.

use ferrite_tensor::RopeStyle;
use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Attention, GatedMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

fn one_head() -> usize {
    1
}

fn one() -> f64 {
    1.0
}

/// The keys of the remote `ChatGLMConfig` that are not renamed common keys, with its defaults.
#[derive(Debug, Clone, Deserialize)]
struct ChatGlmConfig {
    #[serde(default = "default_true")]
    rmsnorm: bool,
    #[serde(default)]
    apply_residual_connection_post_layernorm: bool,
    #[serde(default = "default_true")]
    post_layer_norm: bool,
    #[serde(default)]
    add_bias_linear: bool,
    #[serde(default)]
    add_qkv_bias: bool,
    #[serde(default)]
    multi_query_attention: bool,
    #[serde(default = "one_head")]
    multi_query_group_num: usize,
    #[serde(default = "one")]
    rope_ratio: f64,
    #[serde(default = "default_true")]
    original_rope: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: ChatGlmConfig = raw.parse()?;
    if !cfg.rmsnorm {
        return Err(raw.error("`rmsnorm: false` (LayerNorm blocks) is not supported"));
    }
    if cfg.apply_residual_connection_post_layernorm {
        return Err(raw.error("`apply_residual_connection_post_layernorm: true` is not supported"));
    }
    let mapped = raw.renamed(&[
        ("num_layers", "num_hidden_layers"),
        ("padded_vocab_size", "vocab_size"),
        ("ffn_hidden_size", "intermediate_size"),
        ("kv_channels", "head_dim"),
        ("seq_length", "max_position_embeddings"),
        ("layernorm_epsilon", "rms_norm_eps"),
    ]);
    let common: CommonConfig = mapped.parse()?;
    // Without multi-query attention every head has its own key and value.
    let kv_heads = cfg.multi_query_attention.then_some(cfg.multi_query_group_num);
    let d = CommonConfig { num_key_value_heads: kv_heads, ..common }
        .resolve(&mapped, Defaults { eps: 1e-5, ..Defaults::LLAMA })?;
    let (h, inter, bias) = (d.hidden, d.intermediate(&mapped)?, cfg.add_bias_linear);
    let (q_rows, kv_rows) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let layers = "transformer.encoder.layers";
    let blocks = d.blocks_at(w, layers, |_, l| {
        let a = l.at("self_attention");
        let qkv = a.linear("query_key_value", h, q_rows + 2 * kv_rows, bias || cfg.add_qkv_bias)?;
        let [q, k, v]: [Linear; 3] = qkv.split_rows(&[q_rows, kv_rows, kv_rows])?.try_into().expect("three parts");
        let attn = Attention {
            q,
            k,
            v,
            o: a.linear("dense", q_rows, h, bias)?,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: d.attention_params((d.head_dim as f64).powf(-0.5)),
        };
        let m = l.at("mlp");
        let gate_up = m.linear("dense_h_to_4h", h, 2 * inter, bias)?;
        let [gate, up]: [Linear; 2] = gate_up.split_rows(&[inter, inter])?.try_into().expect("two parts");
        let mlp = GatedMlp { gate, up, down: m.linear("dense_4h_to_h", inter, h, bias)?, act: d.act };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            d.rms(l, "post_attention_layernorm")?,
            ChannelMixer::Gated(mlp),
        ))
    })?;
    let params = RopeParameters {
        rope_theta: Some(10000.0 * cfg.rope_ratio),
        partial_rotary_factor: Some(0.5),
        ..RopeParameters::default()
    };
    let style = if cfg.original_rope { RopeStyle::Interleaved } else { RopeStyle::Neox };
    let rope = Rope::new(&params, d.head_dim, d.max_positions, raw)?.with_style(style);
    let final_norm = if cfg.post_layer_norm {
        Some(Norm::Rms(d.rms(&w.at("transformer.encoder"), "final_layernorm")?))
    } else {
        None
    };
    let names = Names {
        layers,
        embed: "transformer.embedding.word_embeddings",
        lm_head: "transformer.output_layer",
        ..Names::LLAMA
    };
    d.finish_at(raw, w, names, blocks, final_norm, vec![rope])
}
