//! StarCoder2 (`Starcoder2ForCausalLM`): pre-LayerNorm blocks (with bias, `norm_epsilon`), GQA
//! attention with biased projections (`use_bias`), an ungated tanh-GELU MLP (`c_fc`, `c_proj`),
//! sliding-window attention on every layer when `sliding_window` is set, tied LM head.
//!
//! Checkpoint names: `model.embed_tokens`, `model.layers.{i}.{input_layernorm,
//! self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.c_fc, mlp.c_proj}`, `model.norm`.

use serde::Deserialize;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::{DenseMlp, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Starcoder2Config {
    #[serde(flatten)]
    common: CommonConfig,
    norm_epsilon: Option<f64>,
    #[serde(default = "default_true")]
    use_bias: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Starcoder2Config = raw.parse()?;
    let defaults =
        Defaults { max_positions: 4096, act: "gelu_pytorch_tanh", tie: true, kv_heads: Some(2), ..Defaults::LLAMA };
    let mut d = cfg.common.resolve(raw, defaults)?;
    d.eps = cfg.norm_epsilon.unwrap_or(1e-5);
    let (inter, bias) = (d.intermediate(raw)?, cfg.use_bias);
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), bias, bias)?;
        attn.params.sliding_window = d.sliding_window;
        let mlp = DenseMlp {
            fc1: l.linear("mlp.c_fc", d.hidden, inter, bias)?,
            fc2: l.linear("mlp.c_proj", inter, d.hidden, bias)?,
            act: d.act.into(),
        };
        Ok(Block {
            attn_norm: Some(Norm::Layer(d.layer_norm(l, "input_layernorm", true)?)),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: None,
            mlp_norm: Some(Norm::Layer(d.layer_norm(l, "post_attention_layernorm", true)?)),
            mlp: ChannelMixer::Dense(mlp),
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let final_norm = Norm::Layer(d.layer_norm(&w.at("model"), "norm", true)?);
    d.finish(raw, w, blocks, final_norm, vec![d.rope(raw, 10000.0)?])
}
