//! GPT-NeoX / Pythia (`GPTNeoXForCausalLM`): a fused `query_key_value` projection interleaved per
//! head (`[q_h, k_h, v_h]` for each head h, de-interleaved at load), partial rotary embeddings
//! (`rotary_pct`, default 0.25; base `rotary_emb_base`), LayerNorms with bias, ungated GELU MLP,
//! and the parallel residual `h = (mlp(ln2(h)) + attn(ln1(h))) + h` unless
//! `use_parallel_residual: false`.
//!
//! Checkpoint names: `gpt_neox.{embed_in, final_layer_norm, layers.{i}.{input_layernorm,
//! post_attention_layernorm, attention.query_key_value, attention.dense, mlp.dense_h_to_4h,
//! mlp.dense_4h_to_h}}`, `lm_head` (older checkpoints: `embed_out`).

use serde::Deserialize;
use serde_json::Value;

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, ParallelSum, SelfAttention, Wiring};
use crate::layers::{Attention, DenseMlp, Embedding, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-5
}
fn default_act() -> String {
    "gelu".into()
}
fn default_true() -> bool {
    true
}
fn default_max_positions() -> usize {
    2048
}

#[derive(Debug, Clone, Deserialize)]
pub struct GptNeoXConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_true")]
    pub use_parallel_residual: bool,
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GptNeoXConfig = raw.parse()?;
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    load::check_heads(raw, heads, heads)?;
    let d = h / heads;
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let legacy_base = raw.value.get("rotary_emb_base").and_then(Value::as_f64).unwrap_or(10000.0);
    let mut rope_params = RopeParameters::from_config(raw, legacy_base)?;
    let legacy_pct = raw.value.get("rotary_pct").and_then(Value::as_f64).unwrap_or(0.25);
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(legacy_pct));
    let rope = Rope::new(&rope_params, d, cfg.max_position_embeddings, raw)?;
    let eps = cfg.layer_norm_eps;
    let bias = cfg.attention_bias;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("gpt_neox.layers.{i}");
        let qkv = Linear::load(w, &format!("{p}.attention.query_key_value"), h, 3 * h, bias)?;
        let part = |j: usize| {
            qkv.select_rows(&(0..heads).map(|hd| hd * 3 * d + j * d..hd * 3 * d + (j + 1) * d).collect::<Vec<_>>())
        };
        let attn = Attention {
            q: part(0)?,
            k: part(1)?,
            v: part(2)?,
            o: Linear::load(w, &format!("{p}.attention.dense"), h, h, bias)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, heads, d, (d as f64).powf(-0.5), None, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load(w, &format!("{p}.mlp.dense_h_to_4h"), h, cfg.intermediate_size, true)?,
            fc2: Linear::load(w, &format!("{p}.mlp.dense_4h_to_h"), cfg.intermediate_size, h, true)?,
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
            wiring: if cfg.use_parallel_residual {
                Wiring::Parallel(ParallelSum::BranchesFirst)
            } else {
                Wiring::Sequential { residual_scale: None }
            },
        });
    }
    let embed = Embedding { table: w.get("gpt_neox.embed_in.weight", &[cfg.vocab_size, h])? };
    let head_name = if w.contains("embed_out.weight") { "embed_out" } else { "lm_head" };
    let lm_head = load::lm_head(w, head_name, &embed, cfg.tie_word_embeddings, false)?;
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
        final_norm: Some(Norm::Layer(load::layer_norm(w, "gpt_neox.final_layer_norm", h, eps, true)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
