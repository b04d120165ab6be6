//! Gemma 2 (`Gemma2ForCausalLM`): Gemma with sandwich norms (RMSNorm before and after both the
//! attention and the MLP), attention logits soft-capped at `attn_logit_softcapping`, final logits
//! soft-capped at `final_logit_softcapping`, queries scaled by `query_pre_attn_scalar^-0.5`, and
//! layers alternating sliding-window / global attention (`layer_types`; by default even layers
//! slide). Gemma 3 text reuses this loader through [`load_sandwich`].
//!
//! Checkpoint names: Gemma's plus `model.layers.{i}.{pre,post}_feedforward_layernorm`.

use serde::Deserialize;
use serde_json::Value;

use super::gemma::{gemma_norm, scaled_embedding};
use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, GatedMlp, Linear, Mlp, Norm};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-6
}
fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}

/// The fields Gemma 2 and Gemma 3 text configs share. Keys whose transformers default is not
/// "absent" (softcaps, sliding window) are read by [`Sandwich`] from the raw JSON.
#[derive(Debug, Clone, Deserialize)]
pub struct Gemma2Config {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_kv_heads")]
    pub num_key_value_heads: usize,
    #[serde(default = "default_head_dim")]
    pub head_dim: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    pub max_position_embeddings: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_activation: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default = "default_query_scalar")]
    pub query_pre_attn_scalar: f64,
    pub layer_types: Option<Vec<String>>,
    pub use_bidirectional_attention: Option<bool>,
}

fn default_kv_heads() -> usize {
    4
}
fn default_head_dim() -> usize {
    256
}
fn default_query_scalar() -> f64 {
    256.0
}

/// A key whose transformers default applies only when it is absent (`null` means "off").
pub(crate) fn f64_or(raw: &RawConfig, key: &str, default: Option<f64>) -> Option<f64> {
    match raw.value.get(key) {
        None => default,
        Some(v) => v.as_f64(),
    }
}

/// What Gemma 3 changes in the Gemma 2 block.
pub(crate) struct Sandwich {
    /// Per-head `(1 + w)` RMSNorm on queries and keys (Gemma 3).
    pub qk_norm: bool,
    /// Rotary tables `[sliding, full]`; a single table serves both layer types when they agree.
    pub ropes: Vec<Rope>,
    /// Index into `ropes` for sliding and for full layers.
    pub rope_of: fn(sliding: bool) -> usize,
    /// Gemma 2 passes `attn_logit_softcapping` to attention; Gemma 3 defines it but does not.
    pub attn_softcap: Option<f64>,
    pub final_softcap: Option<f64>,
    pub sliding_window: Option<usize>,
    /// The layer pattern when `layer_types` is absent.
    pub default_sliding: fn(layer: usize, raw: &RawConfig) -> bool,
    pub default_max_positions: usize,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Gemma2Config = raw.parse()?;
    let max_pos = cfg.max_position_embeddings.unwrap_or(8192);
    let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, cfg.head_dim, max_pos, raw)?;
    let opts = Sandwich {
        qk_norm: false,
        ropes: vec![rope],
        rope_of: |_| 0,
        attn_softcap: f64_or(raw, "attn_logit_softcapping", Some(50.0)),
        final_softcap: f64_or(raw, "final_logit_softcapping", Some(30.0)),
        sliding_window: f64_or(raw, "sliding_window", Some(4096.0)).map(|v| v as usize),
        default_sliding: |i, _| (i + 1) % 2 != 0,
        default_max_positions: 8192,
    };
    load_sandwich(raw, w, &cfg, opts)
}

pub(crate) fn load_sandwich(raw: &RawConfig, w: &Weights, cfg: &Gemma2Config, opts: Sandwich) -> Result<Decoder> {
    if cfg.use_bidirectional_attention.unwrap_or(false) {
        return Err(raw.error("`use_bidirectional_attention: true` (an encoder) is not a causal LM"));
    }
    let h = cfg.hidden_size;
    let (heads, kv_heads, head_dim) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    load::check_heads(raw, heads, kv_heads)?;
    let act = load::activation(raw, "hidden_activation", &cfg.hidden_activation)?;
    if let Some(types) = &cfg.layer_types {
        if types.len() != cfg.num_hidden_layers {
            return Err(raw.error(format!(
                "`layer_types` has {} entries for {} layers",
                types.len(),
                cfg.num_hidden_layers
            )));
        }
    }
    let eps = cfg.rms_norm_eps;
    let scale = cfg.query_pre_attn_scalar.powf(-0.5);
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let sliding = match &cfg.layer_types {
            Some(types) => load::is_sliding(raw, types, i)?,
            None => (opts.default_sliding)(i, raw),
        };
        let window = if sliding { opts.sliding_window } else { None };
        let bias = cfg.attention_bias;
        let qk_norm = |n: &str| -> Result<_> {
            opts.qk_norm.then(|| gemma_norm(w, &format!("{p}.self_attn.{n}"), head_dim, eps)).transpose()
        };
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * head_dim, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * head_dim, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * head_dim, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * head_dim, h, bias)?,
            q_norm: qk_norm("q_norm")?,
            k_norm: qk_norm("k_norm")?,
            params: load::attention_params(heads, kv_heads, head_dim, scale, window, opts.attn_softcap),
        };
        let norm =
            |n: &str| -> Result<Option<Norm>> { Ok(Some(Norm::Rms(gemma_norm(w, &format!("{p}.{n}"), h, eps)?))) };
        blocks.push(Block {
            attn_norm: norm("input_layernorm")?,
            attn: SelfAttention { attn, head_norms: None, q_scale: None, rope: Some((opts.rope_of)(sliding)) },
            attn_out_norm: norm("post_attention_layernorm")?,
            mlp_norm: norm("pre_feedforward_layernorm")?,
            mlp: Mlp::Gated(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, false)?),
            mlp_out_norm: norm("post_feedforward_layernorm")?,
            wiring: Wiring::Sequential { residual_scale: None },
        });
    }
    let (embed, embed_scale) = scaled_embedding(w, cfg.vocab_size, h)?;
    let lm_head = load::lm_head(w, "lm_head", &embed, cfg.tie_word_embeddings, false)?;
    let max_pos = cfg.max_position_embeddings.unwrap_or(opts.default_max_positions);
    let info = Decoder::info_for(raw.architecture()?, cfg.vocab_size, max_pos, &blocks, &embed, &lm_head, &[]);
    Ok(Decoder {
        info,
        embed,
        embed_scale: Some(embed_scale),
        project_in: None,
        positions: None,
        blocks,
        final_norm: Some(Norm::Rms(gemma_norm(w, "model.norm", h, eps)?)),
        project_out: None,
        lm_head,
        logits: LogitsPost { scale: None, softcap: opts.final_softcap.map(|c| c as f32) },
        ropes: opts.ropes,
    })
}

/// The Gemma 3 rope sections `[sliding_attention, full_attention]`: nested `rope_parameters`
/// (transformers 5), else the legacy `rope_local_base_freq` / `rope_theta` / `rope_scaling` keys
/// (the scaling applies to global layers only).
pub(crate) fn gemma3_rope_sections(raw: &RawConfig) -> Result<[RopeParameters; 2]> {
    let obj = &raw.value;
    let nested = obj
        .get("rope_parameters")
        .filter(|v| v.get("sliding_attention").is_some() || v.get("full_attention").is_some());
    let local_theta = obj.get("rope_local_base_freq").and_then(Value::as_f64).unwrap_or(10_000.0);
    let global_theta = obj.get("rope_theta").and_then(Value::as_f64).unwrap_or(1_000_000.0);
    let empty = Value::Object(Default::default());
    match nested {
        Some(n) => Ok([
            RopeParameters::from_section(raw, n.get("sliding_attention").unwrap_or(&empty), local_theta)?,
            RopeParameters::from_section(raw, n.get("full_attention").unwrap_or(&empty), global_theta)?,
        ]),
        None => {
            let scaling = obj.get("rope_scaling").filter(|v| v.is_object()).unwrap_or(&empty);
            Ok([
                RopeParameters::from_section(raw, &empty, local_theta)?,
                RopeParameters::from_section(raw, scaling, global_theta)?,
            ])
        }
    }
}
