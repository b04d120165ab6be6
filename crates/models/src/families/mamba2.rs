//! Mamba2 (`Mamba2ForCausalLM`): a stack of Mamba2 mixers ([`crate::layers::mamba2`]), each behind
//! an RMSNorm with a residual add, and no attention, MLP or position embeddings. Checkpoints name
//! the stack `backbone` (`backbone.embeddings`, `backbone.layers.{i}.{norm,mixer}`, `norm_f`).

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{check_dims, lm_head};
use crate::decoder::{Block, Decoder, TokenMixer};
use crate::layers::mamba2::{GateNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{Embedding, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// Mamba has no positional limit; this is the context the engine allows unless the config or
/// `--max-model-len` says otherwise.
const DEFAULT_CONTEXT: usize = 32768;

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct Mamba2Config {
    hidden_size: usize,
    num_hidden_layers: usize,
    vocab_size: usize,
    num_heads: usize,
    head_dim: usize,
    #[serde(default = "two")]
    expand: usize,
    state_size: usize,
    #[serde(default = "one")]
    n_groups: usize,
    #[serde(default = "four")]
    conv_kernel: usize,
    #[serde(default)]
    use_bias: bool,
    #[serde(default = "yes")]
    use_conv_bias: bool,
    layer_norm_epsilon: Option<f64>,
    hidden_act: Option<String>,
    #[serde(default)]
    tie_word_embeddings: bool,
    time_step_limit: Option<Vec<Value>>,
    max_position_embeddings: Option<usize>,
}

fn one() -> usize {
    1
}

fn two() -> usize {
    2
}

fn four() -> usize {
    4
}

/// A float as a config writes it: a JSON number, or transformers 5's `{"__float__": "Infinity"}`
/// for a non-finite one.
pub(crate) fn config_float(raw: &RawConfig, key: &str, v: &Value) -> Result<f64> {
    if let Some(x) = v.as_f64() {
        return Ok(x);
    }
    match v.get("__float__").and_then(Value::as_str) {
        Some("Infinity") => Ok(f64::INFINITY),
        Some("-Infinity") => Ok(f64::NEG_INFINITY),
        _ => Err(raw.error(format!("`{key}`: {v} is not a number"))),
    }
}

/// `time_step_limit` as `(min, max)`; `(0, inf)` when absent.
pub(crate) fn dt_limit(raw: &RawConfig, limit: Option<&[Value]>) -> Result<(f32, f32)> {
    let Some(limit) = limit else { return Ok((0.0, f32::INFINITY)) };
    let [lo, hi] = limit else {
        return Err(raw.error(format!("`time_step_limit` has {} entries, expected [min, max]", limit.len())));
    };
    let (lo, hi) = (config_float(raw, "time_step_limit", lo)? as f32, config_float(raw, "time_step_limit", hi)? as f32);
    if lo.is_nan() || hi.is_nan() || lo > hi {
        return Err(raw.error(format!("`time_step_limit` [{lo}, {hi}] is not a range")));
    }
    Ok((lo, hi))
}

/// The `mamba_*` keys of the hybrids that spell their Mamba2 mixers this way (Falcon-H1,
/// Granite 4.0-H), with transformers' defaults.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct MambaKeys {
    mamba_n_heads: Option<usize>,
    /// `"auto"` (the mixer width over `mamba_n_heads`) or a number.
    mamba_d_head: Option<Value>,
    mamba_n_groups: Option<usize>,
    mamba_d_state: Option<usize>,
    mamba_d_conv: Option<usize>,
    mamba_expand: Option<usize>,
    time_step_limit: Option<Vec<Value>>,
}

/// A Mamba2 mixer's head layout as [`MambaKeys`] give it; the biases and norm are each family's.
pub(crate) struct MambaShape {
    pub num_heads: usize,
    pub head_dim: usize,
    pub num_groups: usize,
    pub state_size: usize,
    pub conv_kernel: usize,
    pub dt_limit: (f32, f32),
}

impl MambaKeys {
    /// `mamba_expand x hidden`: the mixer width unless the family's config sets it otherwise.
    pub fn expanded(&self, raw: &RawConfig, hidden: usize) -> Result<usize> {
        let expand = self.mamba_expand.unwrap_or(2);
        check_dims(raw, &[("mamba_expand", expand)])?;
        Ok(expand * hidden)
    }

    /// The heads over a mixer `inner` channels wide; `width` says where that width comes from,
    /// for the error when the heads do not fill it.
    pub fn shape(&self, raw: &RawConfig, inner: usize, width: &str) -> Result<MambaShape> {
        let heads = self.mamba_n_heads.unwrap_or(128);
        check_dims(raw, &[("mamba_n_heads", heads)])?;
        let head_dim = match &self.mamba_d_head {
            None => inner / heads,
            Some(v) if v == "auto" => inner / heads,
            Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| raw.error(format!("`mamba_d_head` {v}")))?,
        };
        let groups = self.mamba_n_groups.unwrap_or(1);
        let state = self.mamba_d_state.unwrap_or(256);
        let conv = self.mamba_d_conv.unwrap_or(4);
        check_dims(
            raw,
            &[
                (width, inner),
                ("mamba_d_head", head_dim),
                ("mamba_n_groups", groups),
                ("mamba_d_state", state),
                ("mamba_d_conv", conv),
            ],
        )?;
        if heads * head_dim != inner || !heads.is_multiple_of(groups) {
            return Err(raw.error(format!(
                "mamba_n_heads {heads} x mamba_d_head {head_dim} must be {width} ({inner}), and mamba_n_groups \
                 {groups} divide the heads"
            )));
        }
        Ok(MambaShape {
            num_heads: heads,
            head_dim,
            num_groups: groups,
            state_size: state,
            conv_kernel: conv,
            dt_limit: dt_limit(raw, self.time_step_limit.as_deref())?,
        })
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Mamba2Config = raw.parse()?;
    if cfg.hidden_act.as_deref().is_some_and(|a| a != "silu") {
        return Err(raw.error(format!("`hidden_act` {:?}: only silu is supported", cfg.hidden_act)));
    }
    check_dims(
        raw,
        &[
            ("hidden_size", cfg.hidden_size),
            ("expand", cfg.expand),
            ("num_heads", cfg.num_heads),
            ("head_dim", cfg.head_dim),
            ("state_size", cfg.state_size),
            ("n_groups", cfg.n_groups),
            ("conv_kernel", cfg.conv_kernel),
            ("vocab_size", cfg.vocab_size),
        ],
    )?;
    if cfg.hidden_size * cfg.expand != cfg.num_heads * cfg.head_dim || !cfg.num_heads.is_multiple_of(cfg.n_groups) {
        return Err(raw.error(format!(
            "hidden_size * expand ({}) must equal num_heads * head_dim ({}), and n_groups {} divide num_heads",
            cfg.hidden_size * cfg.expand,
            cfg.num_heads * cfg.head_dim,
            cfg.n_groups
        )));
    }
    let eps = cfg.layer_norm_epsilon.unwrap_or(1e-5);
    let dims = Mamba2Dims {
        num_heads: cfg.num_heads,
        head_dim: cfg.head_dim,
        num_groups: cfg.n_groups,
        state_size: cfg.state_size,
        conv_kernel: cfg.conv_kernel,
        conv_bias: cfg.use_conv_bias,
        proj_bias: cfg.use_bias,
        out_bias: cfg.use_bias,
        gate_norm: GateNorm::AfterGate,
        dt_limit: dt_limit(raw, cfg.time_step_limit.as_deref())?,
        eps,
    };
    let blocks = (0..cfg.num_hidden_layers)
        .map(|i| {
            let l = w.at(format!("backbone.layers.{i}"));
            let mixer = TokenMixer::Mamba2(Box::new(Mamba2Mixer::load(&l.at("mixer"), cfg.hidden_size, dims)?));
            Ok(Block::mixer_only(Norm::Rms(l.rms("norm", cfg.hidden_size, eps)?), mixer))
        })
        .collect::<Result<Vec<_>>>()?;
    let context = cfg.max_position_embeddings.unwrap_or(DEFAULT_CONTEXT);
    finish_backbone(raw, w, blocks, [cfg.vocab_size, cfg.hidden_size], cfg.tie_word_embeddings, eps, context)
}

/// The decoder around `blocks` with the names of the Mamba line (Mamba2, Nemotron-H):
/// `backbone.embeddings`, `backbone.norm_f` and `lm_head`, no rotary tables.
pub(crate) fn finish_backbone(
    raw: &RawConfig,
    w: &Weights,
    blocks: Vec<Block>,
    [vocab, hidden]: [usize; 2],
    tie: bool,
    eps: f64,
    context: usize,
) -> Result<Decoder> {
    let embed = Embedding { table: w.get("backbone.embeddings.weight", &[vocab, hidden])? };
    let head = lm_head(w, "lm_head", &embed, tie, false)?;
    let final_norm = Norm::Rms(w.at("backbone").rms("norm_f", hidden, eps)?);
    Ok(Decoder::new(raw.architecture()?, context, embed, blocks, Some(final_norm), head, Vec::new()))
}
