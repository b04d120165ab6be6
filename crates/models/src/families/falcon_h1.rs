//! Falcon-H1 (`FalconH1ForCausalLM`): every layer runs GQA attention and a Mamba2 mixer
//! ([`crate::layers::mamba2`]) side by side on the same `input_layernorm` output and adds both
//! to the residual ([`ParallelHybrid`]), then a SwiGLU MLP behind `pre_ff_layernorm`. muP
//! multipliers sit throughout: the embeddings (`embedding_multiplier`), the attention's input,
//! keys (before the rotary embedding) and output (`attention_in_multiplier`, `key_multiplier`,
//! `attention_out_multiplier`), the mixer's input and output (`ssm_in_multiplier`,
//! `ssm_out_multiplier`) and its `in_proj` output per z / x / B / C / dt section
//! (`ssm_multipliers`, transformers' `mup_vector`), the MLP's gate and down projections
//! (`mlp_multipliers`) and the logits (`lm_head_multiplier`).
//!
//! The mixer is `mamba_d_ssm` wide (else `mamba_expand * hidden_size`), its gated RMSNorm
//! optional (`mamba_rms_norm`) and applied before or after the gate (`mamba_norm_before_gate`);
//! `in_proj` has a bias by `mamba_proj_bias`, `out_proj` by `projectors_bias`. Real checkpoints
//! use transformers' key names; those written by transformers 4 keep `rope_theta` at the top
//! level. Checkpoint names: `model.layers.{i}.{self_attn, mamba, feed_forward, input_layernorm,
//! pre_ff_layernorm}`, `model.final_layernorm`.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, LogitsPost, ParallelHybrid, TokenMixer};
use crate::families::mamba2::{config_float, MambaKeys};
use crate::layers::mamba2::{GateNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{Norm, ScaledGatedMlp};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct FalconH1Config {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(flatten)]
    mamba: MambaKeys,
    mamba_d_ssm: Option<usize>,
    #[serde(default = "yes")]
    mamba_conv_bias: bool,
    #[serde(default)]
    mamba_proj_bias: bool,
    #[serde(default = "yes")]
    mamba_norm_before_gate: bool,
    #[serde(default)]
    mamba_rms_norm: bool,
    #[serde(default)]
    projectors_bias: bool,
    embedding_multiplier: Option<Value>,
    lm_head_multiplier: Option<Value>,
    key_multiplier: Option<Value>,
    attention_in_multiplier: Option<Value>,
    attention_out_multiplier: Option<Value>,
    ssm_in_multiplier: Option<Value>,
    ssm_out_multiplier: Option<Value>,
    mlp_multipliers: Option<Vec<Value>>,
    ssm_multipliers: Option<Vec<Value>>,
}

/// transformers' FalconH1Config defaults.
const DEFAULTS: Defaults = Defaults { eps: 1e-5, max_positions: 8192, kv_heads: Some(8), ..Defaults::LLAMA };

/// A finite multiplier under `key`, 1 when absent.
fn multiplier(raw: &RawConfig, key: &str, v: Option<&Value>) -> Result<f32> {
    let x = match v {
        None => return Ok(1.0),
        Some(v) => config_float(raw, key, v)? as f32,
    };
    match x.is_finite() {
        true => Ok(x),
        false => Err(raw.error(format!("`{key}` {x} is not a finite number"))),
    }
}

/// `N` multipliers under `key`, all 1 when absent.
fn multipliers<const N: usize>(raw: &RawConfig, key: &str, v: Option<&[Value]>) -> Result<[f32; N]> {
    let Some(v) = v else { return Ok([1.0; N]) };
    if v.len() != N {
        return Err(raw.error(format!("`{key}` has {} entries, expected {N}", v.len())));
    }
    let mut out = [1.0; N];
    for (o, x) in out.iter_mut().zip(v) {
        *o = multiplier(raw, key, Some(x))?;
    }
    Ok(out)
}

/// The Mamba2 mixer's dimensions, with transformers' defaults.
fn mamba_dims(raw: &RawConfig, cfg: &FalconH1Config, hidden: usize, eps: f64) -> Result<Mamba2Dims> {
    let inner = match cfg.mamba_d_ssm {
        Some(width) => width,
        None => cfg.mamba.expanded(raw, hidden)?,
    };
    let shape = cfg.mamba.shape(raw, inner, "mamba_d_ssm (else mamba_expand x hidden_size)")?;
    let gate_norm = match (cfg.mamba_rms_norm, cfg.mamba_norm_before_gate) {
        (false, _) => GateNorm::None,
        (true, true) => GateNorm::BeforeGate,
        (true, false) => GateNorm::AfterGate,
    };
    Ok(Mamba2Dims {
        num_heads: shape.num_heads,
        head_dim: shape.head_dim,
        num_groups: shape.num_groups,
        state_size: shape.state_size,
        conv_kernel: shape.conv_kernel,
        conv_bias: cfg.mamba_conv_bias,
        proj_bias: cfg.mamba_proj_bias,
        out_bias: cfg.projectors_bias,
        gate_norm,
        dt_limit: shape.dt_limit,
        eps,
    })
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: FalconH1Config = raw.parse()?;
    let d = cfg.common.resolve(raw, DEFAULTS)?;
    // The mixer's conv runs `hidden_act` too, and ferrite's conv has SiLU only.
    if cfg.common.hidden_act.as_deref().is_some_and(|a| a != "silu") {
        return Err(raw.error(format!("`hidden_act` {:?}: only silu is supported", cfg.common.hidden_act)));
    }
    let inter = d.intermediate(raw)?;
    let dims = mamba_dims(raw, &cfg, d.hidden, d.eps)?;
    let m = |key: &str, v: &Option<Value>| multiplier(raw, key, v.as_ref());
    let (attn_in, key_scale, attn_out) = (
        m("attention_in_multiplier", &cfg.attention_in_multiplier)?,
        m("key_multiplier", &cfg.key_multiplier)?,
        m("attention_out_multiplier", &cfg.attention_out_multiplier)?,
    );
    let (ssm_in, ssm_out) =
        (m("ssm_in_multiplier", &cfg.ssm_in_multiplier)?, m("ssm_out_multiplier", &cfg.ssm_out_multiplier)?);
    let mup: [f32; 5] = multipliers(raw, "ssm_multipliers", cfg.ssm_multipliers.as_deref())?;
    let [gate_scale, down_scale] = multipliers(raw, "mlp_multipliers", cfg.mlp_multipliers.as_deref())?;
    let blocks = d.blocks(w, |_, l| {
        let mixer = ParallelHybrid {
            attn: d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?,
            rope: 0,
            attn_in,
            key_scale,
            attn_out,
            ssm: Mamba2Mixer::load(&l.at("mamba"), d.hidden, dims)?.with_in_scales(mup)?,
            ssm_in,
            ssm_out,
        };
        let mlp = ScaledGatedMlp {
            mlp: l.gated_mlp("feed_forward", d.hidden, inter, d.act, d.mlp_bias)?,
            gate_scale,
            down_scale,
        };
        Ok(Block::pre_norm(
            d.rms(l, "input_layernorm")?,
            TokenMixer::ParallelHybrid(Box::new(mixer)),
            d.rms(l, "pre_ff_layernorm")?,
            ChannelMixer::ScaledGated(mlp),
        ))
    })?;
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "final_layernorm")?);
    let decoder = d.finish(raw, w, blocks, final_norm, vec![d.rope(raw, 10000.0)?])?;
    let logits = LogitsPost { scale: Some(m("lm_head_multiplier", &cfg.lm_head_multiplier)?), softcap: None };
    Ok(decoder.with_embed_scale(m("embedding_multiplier", &cfg.embedding_multiplier)?).with_logits(logits))
}
