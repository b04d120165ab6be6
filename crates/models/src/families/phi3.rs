//! Phi-3 (`Phi3ForCausalLM`): the Llama block with a fused `qkv_proj` (rows: q, then k, then v)
//! and a fused `gate_up_proj` (rows: gate, then up), both split at load, an optional sliding
//! window on every layer, and LongRoPE scaling (`rope_type: longrope`, legacy `su` / `yarn`):
//! short factors while the sequence fits `original_max_position_embeddings` (a top-level key
//! that wins over the rope section), long factors beyond, and cos/sin scaled by
//! `sqrt(1 + ln(factor) / ln(original_max))`.
//!
//! Checkpoint names: `model.layers.{i}.{input_layernorm, self_attn.{qkv_proj,o_proj},
//! post_attention_layernorm, mlp.{gate_up_proj,down_proj}}`, `model.norm`, `lm_head`.

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
    4096
}
fn default_act() -> String {
    "silu".into()
}

#[derive(Debug, Clone, Deserialize)]
pub struct Phi3Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_max_positions")]
    pub original_max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub sliding_window: Option<usize>,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Phi3Config = raw.parse()?;
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    load::check_heads(raw, heads, kv_heads)?;
    let head_dim = h / heads;
    let act = load::activation(raw, "hidden_act", &cfg.hidden_act)?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    if matches!(rope_params.kind(), "su" | "yarn") {
        rope_params.rope_type = Some("longrope".into());
    }
    if rope_params.kind() == "longrope" {
        rope_params.original_max_position_embeddings = Some(cfg.original_max_position_embeddings);
    }
    let rope = Rope::new(&rope_params, head_dim, cfg.max_position_embeddings, raw)?;
    let (q_rows, kv_rows, inter) = (heads * head_dim, kv_heads * head_dim, cfg.intermediate_size);
    let eps = cfg.rms_norm_eps;
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let qkv = Linear::load(w, &format!("{p}.self_attn.qkv_proj"), h, q_rows + 2 * kv_rows, false)?;
        let [q, k, v]: [Linear; 3] = qkv.split_rows(&[q_rows, kv_rows, kv_rows])?.try_into().expect("three parts");
        let attn = Attention {
            q,
            k,
            v,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), q_rows, h, false)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(
                heads,
                kv_heads,
                head_dim,
                (head_dim as f64).powf(-0.5),
                cfg.sliding_window,
                None,
            ),
        };
        let gate_up = Linear::load(w, &format!("{p}.mlp.gate_up_proj"), h, 2 * inter, false)?;
        let [gate, up]: [Linear; 2] = gate_up.split_rows(&[inter, inter])?.try_into().expect("two parts");
        let down = Linear::load(w, &format!("{p}.mlp.down_proj"), inter, h, false)?;
        blocks.push(Block {
            attn_norm: Some(Norm::Rms(load::rms(w, &format!("{p}.input_layernorm"), h, eps)?)),
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some(0) },
            attn_out_norm: None,
            mlp_norm: Some(Norm::Rms(load::rms(w, &format!("{p}.post_attention_layernorm"), h, eps)?)),
            mlp: Mlp::Gated(GatedMlp { gate, up, down, act }),
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
        final_norm: Some(Norm::Rms(load::rms(w, "model.norm", h, eps)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost::default(),
        ropes: vec![rope],
    })
}
