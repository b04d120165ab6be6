//! gpt-oss (`GptOssForCausalLM`): GQA attention with biases on q/k/v/o, YaRN rotary embeddings,
//! a learned attention sink per head (`self_attn.sinks`: a logit that joins each softmax's
//! denominator and weighs no value), sliding-window and full layers alternating by `layer_types`
//! (even layers slide by default), and a sparse MoE on every layer: the router is a biased
//! Linear whose top-k logits are softmaxed, and the experts apply gpt-oss's clamped SwiGLU
//! (`swiglu_alpha`, `swiglu_limit`) with biases on both projections.
//!
//! Checkpoint names: Llama's, plus `self_attn.sinks [heads]`, `mlp.router.{weight,bias}` and
//! `mlp.experts.{gate_up_proj [E, H, 2I], gate_up_proj_bias [E, 2I], down_proj [E, I, H],
//! down_proj_bias [E, H]}`, `gate_up_proj`'s columns interleaving gate and up (gate even, up odd).
//! The Hub checkpoints (`quantization_config.quant_method: mxfp4`) keep the two expert weights as
//! `{name}_blocks [E, out, in / 32, 16]` (uint8, two e2m1 values a byte, low nibble first) and
//! `{name}_scales [E, out, in / 32]` (e8m0 exponents biased by 127); they are dequantized at load
//! as transformers' `convert_moe_packed_tensors` does (`ldexp(FP4_VALUES[nibble], scale - 127)`).

use ferrite_tensor::{Activation, Tensor};
use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::moe::{ClampedSwiglu, Experts, Router, RouterConfig, Scoring, SparseMoe};
use crate::layers::rope::RopeParameters;
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct GptOssConfig {
    #[serde(flatten)]
    common: CommonConfig,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    swiglu_alpha: Option<f64>,
    swiglu_limit: Option<f64>,
}

/// The e2m1 values of the 16 nibbles (transformers' `FP4_VALUES`).
const FP4_VALUES: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// How the checkpoint stores the expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpertFormat {
    /// `[E, in, out]` in the checkpoint dtype.
    Dense,
    /// MXFP4 blocks and scales, `[E, out, ...]`.
    Mxfp4,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: GptOssConfig = raw.parse()?;
    let defaults =
        Defaults { eps: 1e-5, max_positions: 131_072, kv_heads: Some(8), head_dim: Some(64), ..Defaults::LLAMA };
    let d = cfg.common.resolve(raw, defaults)?;
    let obj = &raw.value;
    // GptOssConfig's defaults: biased attention, a window of 128 (an explicit null: none).
    let bias = obj.get("attention_bias").and_then(Value::as_bool).unwrap_or(true);
    let window = match obj.get("sliding_window") {
        None => Some(128),
        Some(_) => d.sliding_window,
    };
    let format = match obj.get("quantization_config").map(|q| q.get("quant_method").and_then(Value::as_str)) {
        None => ExpertFormat::Dense,
        Some(Some("mxfp4")) => ExpertFormat::Mxfp4,
        Some(other) => {
            return Err(raw.error(format!("unsupported `quantization_config.quant_method` {other:?}")));
        }
    };
    let inter = d.intermediate.unwrap_or(2880);
    let num_experts = cfg.num_local_experts.unwrap_or(128);
    let router_cfg = RouterConfig {
        num_experts,
        top_k: cfg.num_experts_per_tok.unwrap_or(4),
        scoring: Scoring::SoftmaxOfTopK,
        renormalize: false,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let glu = ClampedSwiglu {
        alpha: cfg.swiglu_alpha.unwrap_or(1.702) as f32,
        limit: cfg.swiglu_limit.unwrap_or(7.0) as f32,
    };
    let blocks = d.blocks(w, |i, l| {
        let a = l.at("self_attn");
        let mut attn = d.attention(&a, bias, bias)?;
        // Without `layer_types` transformers slides the even layers.
        if d.sliding(raw, i)?.unwrap_or(i % 2 == 0) {
            attn.params.sliding_window = window;
        }
        let sinks = a.get_f32("sinks", &[d.heads])?;
        let m = l.at("mlp");
        let router =
            Router::load(w, &m.name("router"), d.hidden, router_cfg.clone(), false)?.with_bias(w, &m.name("router"))?;
        let experts = load_experts(w, &m.name("experts"), format, num_experts, d.hidden, inter, glu)?;
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::Attention(SelfAttention { sinks: Some(sinks), ..SelfAttention::new(attn, Some(0)) }),
            d.rms(l, "post_attention_layernorm")?,
            ChannelMixer::Moe(Box::new(SparseMoe { router, experts, shared: None })),
        ))
    })?;
    let has_rope = ["rope_parameters", "rope_scaling"].iter().any(|k| obj.get(*k).is_some_and(Value::is_object));
    let rope = if has_rope {
        d.rope(raw, 150_000.0)?
    } else {
        // GptOssConfig's default rope section.
        let section = serde_json::json!({
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
            "original_max_position_embeddings": 4096,
        });
        let params = RopeParameters::from_section(raw, &section, 150_000.0)?;
        crate::layers::rope::Rope::new(&params, d.head_dim, d.max_positions, raw)?
    };
    d.finish(raw, w, blocks, Norm::Rms(d.rms(&w.at("model"), "norm")?), vec![rope])
}

/// The experts under `prefix`, as [`Experts`] keeps them: `gate_up [E, 2I, H]` with each expert's
/// gate rows (the checkpoint's even columns) before its up rows (the odd ones), `down [E, H, I]`.
fn load_experts(
    w: &Weights,
    prefix: &str,
    format: ExpertFormat,
    e: usize,
    h: usize,
    i: usize,
    glu: ClampedSwiglu,
) -> Result<Experts> {
    let gate_up = split_gate_up(&expert_weight(w, &format!("{prefix}.gate_up_proj"), format, e, 2 * i, h)?, e, i, h);
    let down = expert_weight(w, &format!("{prefix}.down_proj"), format, e, h, i)?;
    let gu_bias = w.get(&format!("{prefix}.gate_up_proj_bias"), &[e, 2 * i])?.to_f32_vec();
    let down_bias = w.get(&format!("{prefix}.down_proj_bias"), &[e, h])?;
    let tensor = |v: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::from_f32_as(v, shape, w.dtype())?.to_device(w.device())?)
    };
    Ok(Experts {
        biases: Some((tensor(split_gate_up(&gu_bias, e, i, 1), &[e, 2 * i])?, down_bias)),
        clamped_swiglu: Some(glu),
        ..Experts::new(tensor(gate_up, &[e, 2 * i, h])?, tensor(down, &[e, h, i])?, e, i, Activation::Silu)
    })
}

/// Expert weight `name` as f32 `[e, out, inp]` (each expert in the `Linear` layout). Load-time
/// only: the values pass through host memory.
fn expert_weight(w: &Weights, name: &str, format: ExpertFormat, e: usize, out: usize, inp: usize) -> Result<Vec<f32>> {
    match format {
        ExpertFormat::Dense => {
            let v = w.get(name, &[e, inp, out])?.to_f32_vec();
            Ok((0..e)
                .flat_map(|x| {
                    let m = &v[x * inp * out..(x + 1) * inp * out];
                    (0..out).flat_map(move |o| (0..inp).map(move |k| m[k * out + o]))
                })
                .collect())
        }
        ExpertFormat::Mxfp4 => {
            if !inp.is_multiple_of(32) {
                return Err(crate::ModelError::Config {
                    path: name.into(),
                    message: format!("MXFP4 rows of {inp} values are not whole blocks of 32"),
                });
            }
            let groups = inp / 32;
            let blocks = w.get_f32(&format!("{name}_blocks"), &[e, out, groups, 16])?.to_f32_vec();
            let scales = w.get_f32(&format!("{name}_scales"), &[e, out, groups])?.to_f32_vec();
            Ok(dequantize_mxfp4(&blocks, &scales))
        }
    }
}

/// Blocks (bytes as loaded, 16 a group) and scales (one a group) -> the group's 32 values:
/// `FP4_VALUES[nibble] * 2^(scale - 127)`, the low nibble first. The products are exact in f32
/// (a 2-bit mantissa times a power of two within range), as `torch.ldexp` gives them.
fn dequantize_mxfp4(blocks: &[f32], scales: &[f32]) -> Vec<f32> {
    blocks
        .chunks(16)
        .zip(scales)
        .flat_map(|(group, &scale)| {
            let factor = 2f32.powi(scale as i32 - 127);
            group.iter().flat_map(move |&b| {
                let b = b as u8;
                [FP4_VALUES[(b & 0x0F) as usize] * factor, FP4_VALUES[(b >> 4) as usize] * factor]
            })
        })
        .collect()
}

/// `[e, 2i, cols]` whose rows interleave gate and up (gate at even rows) -> each expert's gate
/// rows, then its up rows.
fn split_gate_up(v: &[f32], e: usize, i: usize, cols: usize) -> Vec<f32> {
    (0..e)
        .flat_map(|x| {
            let m = &v[x * 2 * i * cols..(x + 1) * 2 * i * cols];
            [0, 1].into_iter().flat_map(move |parity| (0..i).flat_map(move |r| &m[(2 * r + parity) * cols..][..cols]))
        })
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxfp4_dequantizes_low_nibble_first_with_the_biased_exponent() {
        // Nibbles 0x2 (1.0) low and 0xB (-1.5) high; 31 more values of 0; exponent 127 + 3.
        let mut blocks = vec![0.0f32; 16];
        blocks[0] = f32::from(0xB2u8);
        let got = dequantize_mxfp4(&blocks, &[130.0]);
        assert_eq!(got.len(), 32);
        assert_eq!(&got[..3], &[8.0, -12.0, 0.0]);
        // Scale 0 is 2^-127: the smallest value a block can hold, not zero.
        assert_eq!(dequantize_mxfp4(&[f32::from(0x01u8); 16], &[0.0])[0], 0.5 * 2f32.powi(-127));
    }

    #[test]
    fn gate_up_rows_split_into_gate_then_up() {
        // One expert, i = 2, rows g0 u0 g1 u1 of one column.
        assert_eq!(split_gate_up(&[1.0, 2.0, 3.0, 4.0], 1, 2, 1), [1.0, 3.0, 2.0, 4.0]);
    }
}
