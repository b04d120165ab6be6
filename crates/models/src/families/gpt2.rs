//! GPT-2 (`GPT2LMHeadModel`): learned absolute positions (`wpe`), pre-LayerNorm blocks, a fused
//! `c_attn` (q, k, v in that order) and every projection a `Conv1D` whose weight is stored
//! `[in, out]` (transposed to the `Linear` layout at load), tanh-GELU MLP, tied LM head.
//! `scale_attn_weights: false` drops the `head_dim^-0.5` scale and
//! `scale_attn_by_inverse_layer_idx` divides it by `layer + 1`.
//!
//! Checkpoint names: `transformer.{wte, wpe, ln_f, h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2,
//! mlp.c_fc, mlp.c_proj}}`; checkpoints saved from `GPT2Model` drop the `transformer.` prefix.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, LearnedPositions, SelfAttention, TokenMixer, Wiring};
use crate::layers::{Attention, DenseMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Gpt2Config {
    #[serde(default = "default_true")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    add_cross_attention: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Gpt2Config = raw.parse()?;
    if cfg.add_cross_attention {
        return Err(raw.error("`add_cross_attention: true` (an encoder-decoder) is not supported"));
    }
    let mapped = raw.renamed(&[
        ("n_embd", "hidden_size"),
        ("n_layer", "num_hidden_layers"),
        ("n_head", "num_attention_heads"),
        ("n_positions", "max_position_embeddings"),
        ("n_inner", "intermediate_size"),
        ("layer_norm_epsilon", "layer_norm_eps"),
        ("activation_function", "hidden_act"),
    ]);
    let common = CommonConfig { num_key_value_heads: None, head_dim: None, ..mapped.parse::<CommonConfig>()? };
    let defaults = Defaults { eps: 1e-5, layer_norm: true, act: "gelu_new", tie: true, ..Defaults::LLAMA };
    let d = common.resolve(&mapped, defaults)?;
    let (h, inner) = (d.hidden, d.intermediate.unwrap_or(4 * d.hidden));
    let root = if w.contains("transformer.wte.weight") { "transformer" } else { "" };
    let at = |leaf: &str| w.at(root).name(leaf);
    let blocks = d.blocks_at(w, &at("h"), |i, l| {
        // Every projection is a `Conv1D`, stored `[in, out]`.
        let conv = |leaf: &str, n_in, n_out| Linear::load_conv1d(w, &l.name(leaf), n_in, n_out);
        let [q, k, v]: [Linear; 3] =
            conv("attn.c_attn", h, 3 * h)?.split_rows(&[h, h, h])?.try_into().expect("three parts");
        let mut scale = if cfg.scale_attn_weights { (d.head_dim as f64).powf(-0.5) } else { 1.0 };
        if cfg.scale_attn_by_inverse_layer_idx {
            scale /= (i + 1) as f64;
        }
        let o = conv("attn.c_proj", h, h)?;
        let attn =
            Attention { q, k, v, o, q_norm: None, k_norm: None, query_scale: None, params: d.attention_params(scale) };
        let mlp = DenseMlp { fc1: conv("mlp.c_fc", h, inner)?, fc2: conv("mlp.c_proj", inner, h)?, act: d.act.into() };
        Ok(Block {
            attn_norm: Some(Norm::Layer(d.layer_norm(l, "ln_1", true)?)),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, None)),
            attn_out_norm: None,
            mlp_norm: Some(Norm::Layer(d.layer_norm(l, "ln_2", true)?)),
            mlp: ChannelMixer::Dense(mlp),
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let positions = LearnedPositions { table: w.get(&at("wpe.weight"), &[d.max_positions, h])?, offset: 0 };
    let final_norm = Norm::Layer(d.layer_norm(&w.at(root), "ln_f", true)?);
    let (layers, embed) = (at("h"), at("wte"));
    let names = Names { layers: &layers, embed: &embed, ..Names::LLAMA };
    Ok(d.finish_at(raw, w, names, blocks, Some(final_norm), Vec::new())?.with_positions(positions))
}
