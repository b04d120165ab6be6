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

use crate::config::RawConfig;
use crate::decoder::{load, Block, Decoder, LearnedPositions, LogitsPost, SelfAttention, Wiring};
use crate::layers::{Attention, DenseMlp, Embedding, LayerNorm, Linear, Mlp, Norm};
use crate::weights::Weights;
use crate::Result;

/// OPT's position ids start at this row of `embed_positions` (rows 0 and 1 are padding).
const POSITION_OFFSET: usize = 2;

fn default_true() -> bool {
    true
}
fn default_act() -> String {
    "relu".into()
}
fn default_max_positions() -> usize {
    2048
}

#[derive(Debug, Clone, Deserialize)]
pub struct OptConfig {
    pub hidden_size: usize,
    pub ffn_dim: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default = "default_true")]
    pub do_layer_norm_before: bool,
    #[serde(default)]
    pub _remove_final_layer_norm: bool,
    pub word_embed_proj_dim: Option<usize>,
    #[serde(default = "default_act")]
    pub activation_function: String,
    #[serde(default = "default_true")]
    pub enable_bias: bool,
    #[serde(default = "default_true")]
    pub layer_norm_elementwise_affine: bool,
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

/// `nn.LayerNorm(size)` (eps 1e-5), with or without its affine weight and bias.
fn opt_norm(w: &Weights, name: &str, size: usize, affine: bool) -> Result<Norm> {
    Ok(Norm::Layer(if affine {
        LayerNorm::load(w, name, size, 1e-5, true)?
    } else {
        LayerNorm { weight: None, bias: None, eps: 1e-5 }
    }))
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: OptConfig = raw.parse()?;
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    load::check_heads(raw, heads, heads)?;
    let head_dim = h / heads;
    let act = load::activation(raw, "activation_function", &cfg.activation_function)?;
    let proj_dim = cfg.word_embed_proj_dim.unwrap_or(h);
    let root = if w.contains("decoder.embed_tokens.weight") { "decoder" } else { "model.decoder" };
    let (bias, affine) = (cfg.enable_bias, cfg.layer_norm_elementwise_affine);
    let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let p = format!("{root}.layers.{i}");
        let attn = Attention {
            q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, h, bias)?,
            k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, h, bias)?,
            v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, h, bias)?,
            o: Linear::load(w, &format!("{p}.self_attn.out_proj"), h, h, bias)?,
            q_norm: None,
            k_norm: None,
            params: load::attention_params(heads, heads, head_dim, 1.0, None, None),
        };
        let mlp = DenseMlp {
            fc1: Linear::load(w, &format!("{p}.fc1"), h, cfg.ffn_dim, bias)?,
            fc2: Linear::load(w, &format!("{p}.fc2"), cfg.ffn_dim, h, bias)?,
            act,
        };
        blocks.push(Block {
            attn_norm: Some(opt_norm(w, &format!("{p}.self_attn_layer_norm"), h, affine)?),
            attn: SelfAttention {
                attn,
                head_norms: None,
                q_scale: Some((head_dim as f64).powf(-0.5) as f32),
                rope: None,
            },
            attn_out_norm: None,
            mlp_norm: Some(opt_norm(w, &format!("{p}.final_layer_norm"), h, affine)?),
            mlp: Mlp::Dense(mlp),
            mlp_out_norm: None,
            wiring: if cfg.do_layer_norm_before {
                Wiring::Sequential { residual_scale: None }
            } else {
                Wiring::PostNorm
            },
        });
    }
    let embed = Embedding { table: w.get(&format!("{root}.embed_tokens.weight"), &[cfg.vocab_size, proj_dim])? };
    let positions = LearnedPositions {
        table: w.get(&format!("{root}.embed_positions.weight"), &[cfg.max_position_embeddings + POSITION_OFFSET, h])?,
        offset: POSITION_OFFSET,
    };
    let (project_in, project_out) = if proj_dim != h {
        (
            Some(Linear::load(w, &format!("{root}.project_in"), proj_dim, h, false)?),
            Some(Linear::load(w, &format!("{root}.project_out"), h, proj_dim, false)?),
        )
    } else {
        (None, None)
    };
    let final_norm = if cfg.do_layer_norm_before && !cfg._remove_final_layer_norm {
        Some(opt_norm(w, &format!("{root}.final_layer_norm"), h, affine)?)
    } else {
        None
    };
    let lm_head = load::lm_head(w, "lm_head", &embed, cfg.tie_word_embeddings, false)?;
    let extra: Vec<&ferrite_tensor::Tensor> =
        [&project_in, &project_out].into_iter().flatten().map(|l| &l.weight).chain([&positions.table]).collect();
    let info = Decoder::info_for(
        raw.architecture()?,
        cfg.vocab_size,
        cfg.max_position_embeddings,
        &blocks,
        &embed,
        &lm_head,
        &extra,
    );
    Ok(Decoder {
        info,
        embed,
        embed_scale: None,
        project_in,
        positions: Some(positions),
        blocks,
        final_norm,
        project_out,
        lm_head,
        logits: LogitsPost::default(),
        ropes: Vec::new(),
    })
}
