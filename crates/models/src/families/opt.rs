//! OPT (`OPTForCausalLM`): learned absolute positions looked up at `position + 2`, multi-head
//! attention whose queries are scaled by `head_dim^-0.5` right after `q_proj` (the product itself
//! is unscaled), a ReLU MLP (`fc1`, `fc2`), LayerNorms either before each branch
//! (`do_layer_norm_before`, most sizes) or after each residual add (opt-350m), optional
//! `project_in` / `project_out` when `word_embed_proj_dim` differs from the hidden size.
//!
//! Checkpoint names: `model.decoder.{embed_tokens, embed_positions, project_in, project_out,
//! final_layer_norm, layers.{i}.{self_attn.{q,k,v,out}_proj, self_attn_layer_norm, fc1, fc2,
//! final_layer_norm}}`, `lm_head` (tied by default); older checkpoints drop the `model.` prefix.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, LearnedPositions, SelfAttention, TokenMixer, Wiring};
use crate::layers::{DenseMlp, LayerNorm, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

/// OPT's position ids start at this row of `embed_positions` (rows 0 and 1 are padding).
const POSITION_OFFSET: usize = 2;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct OptConfig {
    #[serde(default = "default_true")]
    do_layer_norm_before: bool,
    #[serde(default)]
    _remove_final_layer_norm: bool,
    word_embed_proj_dim: Option<usize>,
    #[serde(default = "default_true")]
    enable_bias: bool,
    #[serde(default = "default_true")]
    layer_norm_elementwise_affine: bool,
}

/// `nn.LayerNorm(size)` (eps 1e-5), with or without its affine weight and bias.
fn opt_norm(s: &Scope, leaf: &str, size: usize, affine: bool) -> Result<Norm> {
    Ok(Norm::Layer(match affine {
        true => s.layer_norm(leaf, size, 1e-5, true)?,
        false => LayerNorm { weight: None, bias: None, eps: 1e-5 },
    }))
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: OptConfig = raw.parse()?;
    let mapped = raw.renamed(&[("ffn_dim", "intermediate_size"), ("activation_function", "hidden_act")]);
    let common = CommonConfig { num_key_value_heads: None, head_dim: None, ..mapped.parse::<CommonConfig>()? };
    let d = common.resolve(&mapped, Defaults { act: "relu", tie: true, ..Defaults::LLAMA })?;
    let (h, inter, proj_dim) = (d.hidden, d.intermediate(raw)?, cfg.word_embed_proj_dim.unwrap_or(d.hidden));
    let root = w.at(if w.contains("decoder.embed_tokens.weight") { "decoder" } else { "model.decoder" });
    let (bias, affine) = (cfg.enable_bias, cfg.layer_norm_elementwise_affine);
    let layers = root.name("layers");
    let blocks = d.blocks_at(w, &layers, |_, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention_named(&s, ["q_proj", "k_proj", "v_proj", "out_proj"], bias, bias)?;
        // The queries are scaled right after `q_proj`; the product itself is unscaled.
        attn.params.scale = 1.0;
        let q_scale = Some((d.head_dim as f64).powf(-0.5) as f32);
        let mlp = DenseMlp {
            fc1: l.linear("fc1", h, inter, bias)?,
            fc2: l.linear("fc2", inter, h, bias)?,
            act: d.act.into(),
        };
        Ok(Block {
            attn_norm: Some(opt_norm(l, "self_attn_layer_norm", h, affine)?),
            mixer: TokenMixer::Attention(SelfAttention { q_scale, ..SelfAttention::new(attn, None) }),
            attn_out_norm: None,
            mlp_norm: Some(opt_norm(l, "final_layer_norm", h, affine)?),
            mlp: ChannelMixer::Dense(mlp),
            mlp_out_norm: None,
            wiring: if cfg.do_layer_norm_before {
                Wiring::Sequential { residual_scale: None }
            } else {
                Wiring::PostNorm
            },
        })
    })?;
    let positions = LearnedPositions {
        table: root.get("embed_positions.weight", &[d.max_positions + POSITION_OFFSET, h])?,
        offset: POSITION_OFFSET,
    };
    let (project_in, project_out) = match proj_dim != h {
        true => (
            Some(root.linear("project_in", proj_dim, h, false)?),
            Some(root.linear("project_out", h, proj_dim, false)?),
        ),
        false => (None, None),
    };
    let final_norm = match cfg.do_layer_norm_before && !cfg._remove_final_layer_norm {
        true => Some(opt_norm(&root, "final_layer_norm", h, affine)?),
        false => None,
    };
    let embed = root.name("embed_tokens");
    let names = Names { layers: &layers, embed: &embed, embed_dim: Some(proj_dim), ..Names::LLAMA };
    let decoder = d.finish_at(raw, w, names, blocks, final_norm, Vec::new())?;
    Ok(decoder.with_positions(positions).with_projections(project_in, project_out))
}
