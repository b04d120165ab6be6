//! Nemotron (`NemotronForCausalLM`; Nemotron-4, Minitron, Nemotron-Mini): pre-norm layers whose
//! norms are "LayerNorm1P" (a LayerNorm with bias whose weight is stored minus one: it applies
//! `weight + 1`, added in the weight's dtype as torch does), GQA attention with rotary embeddings
//! on the first half of each head by default (`partial_rotary_factor` 0.5, halves rotated), and an
//! ungated MLP `down(relu2(up(x)))`. Config keys: `norm_eps`, `head_dim`, `attention_bias`,
//! `mlp_bias`.

use serde::Deserialize;

use ferrite_tensor::Tensor;

use crate::decoder::load::{CommonConfig, Defaults, Dims};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{DenseMlp, LayerNorm, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct NemotronConfig {
    #[serde(flatten)]
    common: CommonConfig,
    norm_eps: Option<f64>,
}

/// A LayerNorm1P under `s`: its `weight + 1` rounded to the checkpoint's compute dtype.
fn layer_norm_1p(s: &Scope, leaf: &str, d: &Dims) -> Result<Norm> {
    let LayerNorm { weight, bias, eps } = d.layer_norm(s, leaf, true)?;
    let w = s.weights();
    let plus_one = match weight {
        Some(weight) => {
            let values: Vec<f32> = weight.to_f32_vec().iter().map(|v| v + 1.0).collect();
            let rounded = Tensor::from_f32_as(values, &[d.hidden], w.dtype().of_values())?.to_f32_vec();
            Some(Tensor::from_f32(rounded, &[d.hidden])?.to_device(w.device())?)
        }
        None => None,
    };
    Ok(Norm::Layer(LayerNorm { weight: plus_one, bias, eps }))
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: NemotronConfig = raw.parse()?;
    let eps = cfg.norm_eps.unwrap_or(1e-5);
    let common = CommonConfig { layer_norm_eps: Some(eps), ..cfg.common.clone() };
    let defaults = Defaults { eps, layer_norm: true, act: "relu2", max_positions: 4096, ..Defaults::LLAMA };
    let d = common.resolve(raw, defaults)?;
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        let m = l.at("mlp");
        Ok(Block {
            attn_norm: Some(layer_norm_1p(l, "input_layernorm", &d)?),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: None,
            mlp_norm: Some(layer_norm_1p(l, "post_attention_layernorm", &d)?),
            mlp: ChannelMixer::Dense(DenseMlp {
                fc1: m.linear("up_proj", d.hidden, inter, d.mlp_bias)?,
                fc2: m.linear("down_proj", inter, d.hidden, d.mlp_bias)?,
                act: d.act.into(),
            }),
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let mut rope_params = RopeParameters::from_config(raw, 10000.0)?;
    rope_params.partial_rotary_factor = rope_params.partial_rotary_factor.or(Some(0.5));
    let rope = Rope::new(&rope_params, d.head_dim, d.max_positions, raw)?;
    d.finish(raw, w, blocks, layer_norm_1p(&w.at("model"), "norm", &d)?, vec![rope])
}
