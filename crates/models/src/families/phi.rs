//! Phi-1/1.5/2 (`PhiForCausalLM`): one LayerNorm (with bias) feeds attention and an ungated GELU
//! MLP in parallel, `h = (attn + mlp) + h`; partial rotary embeddings (`partial_rotary_factor`,
//! default 0.5) on the first dims of each head; biases on every projection, the LM head included.
//!
//! Checkpoint names: `model.embed_tokens`, `model.layers.{i}.{input_layernorm,
//! self_attn.{q,k,v}_proj, self_attn.dense, mlp.fc1, mlp.fc2}`, `model.final_layernorm`, `lm_head`.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, ParallelSum, SelfAttention, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{DenseMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct PhiConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default)]
    qk_layernorm: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: PhiConfig = raw.parse()?;
    if cfg.qk_layernorm {
        return Err(raw.error("`qk_layernorm: true` is not supported (no parity fixture covers it)"));
    }
    let defaults = Defaults { eps: 1e-5, layer_norm: true, act: "gelu_new", ..Defaults::LLAMA };
    let mut d = CommonConfig { head_dim: None, ..cfg.common }.resolve(raw, defaults)?;
    d.head_dim = d.hidden / d.heads;
    let (h, inter) = (d.hidden, d.intermediate(raw)?);
    let blocks = d.blocks(w, |_, l| {
        let names = ["q_proj", "k_proj", "v_proj", "dense"];
        let attn = d.attention_named(&l.at("self_attn"), names, true, true)?;
        let mlp = DenseMlp {
            fc1: l.linear("mlp.fc1", h, inter, true)?,
            fc2: l.linear("mlp.fc2", inter, h, true)?,
            act: d.act.into(),
        };
        Ok(Block::parallel(
            Norm::Layer(d.layer_norm(l, "input_layernorm", true)?),
            TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            ChannelMixer::Dense(mlp),
            ParallelSum::BranchesFirst,
        ))
    })?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(0.5));
    let rope = Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?;
    let final_norm = Norm::Layer(d.layer_norm(&w.at("model"), "final_layernorm", true)?);
    d.finish_at(raw, w, Names { lm_head_bias: true, ..Names::LLAMA }, blocks, Some(final_norm), vec![rope])
}
