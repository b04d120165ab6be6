//! OLMo Hybrid (`OlmoHybridForCausalLM`): Gated DeltaNet layers ([`crate::layers::gdn`], with
//! separate q/k/v/g/a/b projections and beta scaled to [0, 2] where `linear_allow_neg_eigval`)
//! in Llama's pre-norm layer, and OLMo 3's attention layers (full-width QK-norm, the norms after
//! attention and MLP) where `layer_types` says `full_attention`. Released checkpoints carry no
//! RoPE (`rope_parameters` null): their attention layers are NoPE; with a `rope_theta` the
//! attention layers rotate.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::gdn::{GatedDeltaNet, GdnDims, GdnProjections};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// FLA's gated RMSNorm epsilon, which transformers keeps for the DeltaNet output norm whatever
/// `rms_norm_eps` says.
const GATED_NORM_EPS: f64 = 1e-5;

fn yes() -> bool {
    true
}

fn four() -> usize {
    4
}

#[derive(Debug, Clone, Deserialize)]
struct OlmoHybridConfig {
    #[serde(flatten)]
    common: CommonConfig,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    #[serde(default = "four")]
    linear_conv_kernel_dim: usize,
    #[serde(default = "yes")]
    linear_allow_neg_eigval: bool,
}

const DEFAULTS: Defaults = Defaults { max_positions: 65536, ..Defaults::LLAMA };

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: OlmoHybridConfig = raw.parse()?;
    let d = cfg.common.resolve(raw, DEFAULTS)?;
    let inter = d.intermediate(raw)?;
    let num_k_heads = cfg.linear_num_key_heads.unwrap_or(d.heads);
    let num_v_heads = cfg.linear_num_value_heads.unwrap_or(d.heads);
    // transformers: `int(0.75 * hidden_size / linear_num_key_heads)`, then twice that for values.
    let k_dim = cfg.linear_key_head_dim.unwrap_or((0.75 * d.hidden as f64 / num_k_heads.max(1) as f64) as usize);
    let v_dim = cfg.linear_value_head_dim.unwrap_or(2 * k_dim);
    check_dims(
        raw,
        &[
            ("linear_num_key_heads", num_k_heads),
            ("linear_num_value_heads", num_v_heads),
            ("linear_key_head_dim", k_dim),
            ("linear_value_head_dim", v_dim),
            ("linear_conv_kernel_dim", cfg.linear_conv_kernel_dim),
        ],
    )?;
    if !num_v_heads.is_multiple_of(num_k_heads) {
        return Err(raw.error(format!(
            "linear_num_value_heads {num_v_heads} must be a multiple of linear_num_key_heads {num_k_heads}"
        )));
    }
    let dims = GdnDims { num_k_heads, num_v_heads, k_dim, v_dim, conv_kernel: cfg.linear_conv_kernel_dim };
    let types = d.layer_types.clone().unwrap_or_else(|| default_layer_types(d.layers));
    let rope_theta =
        [&raw.value["rope_parameters"]["rope_theta"], &raw.value["rope_theta"]].into_iter().find_map(Value::as_f64);
    let ropes = match rope_theta {
        Some(theta) => vec![d.rope(raw, theta)?],
        None => vec![],
    };
    // transformers' names, or OLMo-core's as released checkpoints (and transformers' saves) have
    // them.
    let norm = |l: &crate::loading::weights::Scope, hf: &str, core: &str| {
        let leaf = if w.contains(&l.name(&format!("{hf}.weight"))) { hf } else { core };
        d.rms(l, leaf)
    };
    let blocks = d.blocks(w, |i, l| {
        let mlp = ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?);
        match types[i].as_str() {
            "linear_attention" => {
                let mut gdn = GatedDeltaNet::load(
                    &l.at("linear_attn"),
                    d.hidden,
                    dims,
                    GdnProjections::OlmoHybrid,
                    GATED_NORM_EPS,
                )?;
                gdn.beta_scale = if cfg.linear_allow_neg_eigval { 2.0 } else { 1.0 };
                Ok(Block::pre_norm(
                    norm(l, "input_layernorm", "attention_layer_norm")?,
                    TokenMixer::GatedDeltaNet(Box::new(gdn)),
                    norm(l, "post_attention_layernorm", "feedforward_layer_norm")?,
                    mlp,
                ))
            }
            "full_attention" => {
                let s = l.at("self_attn");
                let mut attn = d.attention(&s, false, false)?;
                attn.q_norm = Some(s.rms("q_norm", d.heads * d.head_dim, d.eps)?);
                attn.k_norm = Some(s.rms("k_norm", d.kv_heads * d.head_dim, d.eps)?);
                Ok(Block {
                    attn_norm: None,
                    mixer: TokenMixer::Attention(SelfAttention::new(attn, rope_theta.map(|_| 0))),
                    attn_out_norm: Some(Norm::Rms(norm(l, "post_attention_layernorm", "feedforward_layer_norm")?)),
                    mlp_norm: None,
                    mlp,
                    mlp_out_norm: Some(Norm::Rms(d.rms(l, "post_feedforward_layernorm")?)),
                    wiring: Wiring::Sequential { residual_scale: None },
                })
            }
            other => Err(raw.error(format!(
                "`layer_types` names layer type `{other}`; OLMo Hybrid has linear_attention and full_attention"
            ))),
        }
    })?;
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), ropes)
}

/// transformers' default: linear attention except every fourth layer (and at least the last).
fn default_layer_types(layers: usize) -> Vec<String> {
    let mut types: Vec<String> =
        (0..layers).map(|i| if i % 4 == 3 { "full_attention" } else { "linear_attention" }.to_string()).collect();
    if !types.iter().any(|t| t == "full_attention") {
        if let Some(last) = types.last_mut() {
            *last = "full_attention".to_string();
        }
    }
    types
}
