//! Mamba (`MambaForCausalLM`) and Falcon-Mamba (`FalconMambaForCausalLM`): a stack of Mamba 1
//! mixers ([`crate::layers::mamba`]), each behind an RMSNorm with a residual add, with the names
//! of the Mamba line (`backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`, `norm_f`).
//! Falcon-Mamba adds weightless RMSNorms of the time step, B and C (`mixer_rms_eps`).

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::check_dims;
use crate::decoder::{Block, Decoder, TokenMixer};
use crate::families::mamba2::finish_backbone;
use crate::layers::mamba::{MambaDims, MambaMixer, SsmNorms};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// Mamba has no positional limit; this is the context the engine allows unless the config or
/// `--max-model-len` says otherwise.
const DEFAULT_CONTEXT: usize = 32768;

fn yes() -> bool {
    true
}

fn two() -> usize {
    2
}

fn four() -> usize {
    4
}

fn sixteen() -> usize {
    16
}

#[derive(Debug, Clone, Deserialize)]
struct MambaConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    vocab_size: usize,
    #[serde(default = "sixteen")]
    state_size: usize,
    #[serde(default = "two")]
    expand: usize,
    intermediate_size: Option<usize>,
    #[serde(default = "four")]
    conv_kernel: usize,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "yes")]
    use_conv_bias: bool,
    hidden_act: Option<String>,
    layer_norm_epsilon: Option<f64>,
    /// `"auto"` (`ceil(hidden_size / 16)`) or a number.
    time_step_rank: Option<Value>,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    /// Falcon-Mamba's.
    mixer_rms_eps: Option<f64>,
    max_position_embeddings: Option<usize>,
}

/// Which of the two: Falcon-Mamba normalises the scan's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Mamba,
    FalconMamba,
}

/// The time step's rank: `"auto"` (or absent) is `ceil(hidden_size / 16)`, as transformers sets it.
pub(crate) fn dt_rank(raw: &RawConfig, key: &str, value: Option<&Value>, hidden: usize) -> Result<usize> {
    match value {
        None => Ok(hidden.div_ceil(16)),
        Some(Value::String(s)) if s == "auto" => Ok(hidden.div_ceil(16)),
        Some(v) => v
            .as_u64()
            .map(|r| r as usize)
            .ok_or_else(|| raw.error(format!("`{key}` {v}: expected \"auto\" or a count"))),
    }
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Variant) -> Result<Decoder> {
    let cfg: MambaConfig = raw.parse()?;
    if cfg.hidden_act.as_deref().is_some_and(|a| a != "silu") {
        return Err(raw.error(format!("`hidden_act` {:?}: only silu is supported", cfg.hidden_act)));
    }
    let dt_rank = dt_rank(raw, "time_step_rank", cfg.time_step_rank.as_ref(), cfg.hidden_size)?;
    check_dims(
        raw,
        &[
            ("hidden_size", cfg.hidden_size),
            ("expand", cfg.expand),
            ("state_size", cfg.state_size),
            ("conv_kernel", cfg.conv_kernel),
            ("time_step_rank", dt_rank),
            ("vocab_size", cfg.vocab_size),
        ],
    )?;
    let eps = cfg.layer_norm_epsilon.unwrap_or(1e-5);
    // transformers derives the width from `expand`, but an `intermediate_size` in config.json
    // (every saved config has one) is set over it.
    let inner = cfg.intermediate_size.unwrap_or(cfg.expand * cfg.hidden_size);
    check_dims(raw, &[("intermediate_size", inner)])?;
    let dims = MambaDims {
        inner,
        state_size: cfg.state_size,
        conv_kernel: cfg.conv_kernel,
        dt_rank,
        conv_bias: cfg.use_conv_bias,
        proj_bias: cfg.use_bias,
    };
    let blocks = (0..cfg.num_hidden_layers)
        .map(|i| {
            let l = w.at(format!("backbone.layers.{i}"));
            let norms = match variant {
                Variant::Mamba => None,
                Variant::FalconMamba => {
                    Some(SsmNorms::weightless(&dims, cfg.mixer_rms_eps.unwrap_or(1e-6), w.device())?)
                }
            };
            let mixer = MambaMixer::load(&l.at("mixer"), cfg.hidden_size, dims, norms)?;
            Ok(Block::mixer_only(Norm::Rms(l.rms("norm", cfg.hidden_size, eps)?), TokenMixer::Mamba(Box::new(mixer))))
        })
        .collect::<Result<Vec<_>>>()?;
    let context = cfg.max_position_embeddings.unwrap_or(DEFAULT_CONTEXT);
    finish_backbone(raw, w, blocks, [cfg.vocab_size, cfg.hidden_size], cfg.tie_word_embeddings, eps, context)
}
