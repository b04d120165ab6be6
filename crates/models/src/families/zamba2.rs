//! Zamba2 (`Zamba2ForCausalLM`): a stack of Mamba2 layers ([`crate::layers::mamba2`], each
//! behind an RMSNorm with a residual add) in which the `hybrid` layers of `layers_block_type`
//! first run a shared transformer block ([`crate::layers::shared_block`]) on `[hidden state,
//! input embeddings]` and add its output, through the layer's own `linear`, to the Mamba2
//! input. There are `num_mem_blocks` shared blocks, used round-robin by the hybrid layers in
//! order; each invocation has its own LoRA adapters on the MLP's `gate_up_proj` (and on q, k, v
//! with `use_shared_attention_adapter`) and its own KV cache. The shared attention reads twice
//! the hidden size, its head size is `2 * hidden_size / num_attention_heads` and it scales by
//! `(head_dim / 2)^-0.5`; RoPE only with `use_mem_rope`. `add_bias_linear` puts biases on the
//! Mamba2 projections and the MLP's.
//!
//! The Mamba2 mixers: `mamba_expand * hidden_size` channels in `n_mamba_heads` heads,
//! `mamba_ngroups` B/C groups, a conv with a bias whatever `use_conv_bias` says, the gated RMSNorm
//! after the gate at eps 1e-5 (not `rms_norm_eps`), `dt` clamped below at `time_step_min` on
//! prompts, all as transformers 5 builds them.
//!
//! Checkpoint names: `model.layers.{i}.{input_layernorm, mamba}` for Mamba2 layers,
//! `model.layers.{i}.{mamba_decoder.{input_layernorm, mamba}, linear}` for hybrid ones, and the
//! shared blocks under the first `num_mem_blocks` hybrid layers
//! (`shared_transformer.{input_layernorm, self_attn, pre_ff_layernorm, feed_forward}`), the
//! adapters of the `j`-th hybrid layer at index `j` of their block's `*_adapter_list`. Checkpoints
//! written with the blocks tied hold them there only; an untied save repeats identical copies
//! under every hybrid layer, which are not read. Real configs (transformers 4) call the Mamba2
//! layers `mamba` (transformers 5: `linear_attention`) and keep `rope_theta` at the top level.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{attention_params, check_dims, CommonConfig, Defaults};
use crate::decoder::{Block, ChannelMixer, Decoder, TokenMixer, Wiring};
use crate::families::mamba2::config_float;
use crate::layers::mamba2::{GateNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::shared_block::{Lora, SharedBlock, SharedHybrid};
use crate::layers::{Attention, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct Zamba2Config {
    #[serde(flatten)]
    common: CommonConfig,
    /// `mamba` / `linear_attention` or `hybrid` per layer; transformers 5 also reads it as
    /// `layer_types` (then in `common`).
    layers_block_type: Option<Vec<String>>,
    num_mem_blocks: Option<usize>,
    #[serde(default)]
    use_shared_attention_adapter: bool,
    adapter_rank: Option<usize>,
    #[serde(default)]
    use_mem_rope: bool,
    #[serde(default)]
    add_bias_linear: bool,
    mamba_expand: Option<usize>,
    n_mamba_heads: Option<usize>,
    mamba_ngroups: Option<usize>,
    mamba_d_state: Option<usize>,
    mamba_d_conv: Option<usize>,
    time_step_min: Option<Value>,
    #[serde(default)]
    use_long_context: bool,
}

/// transformers' Zamba2Config defaults.
const DEFAULTS: Defaults = Defaults { eps: 1e-5, max_positions: 4096, act: "gelu", tie: true, ..Defaults::LLAMA };

/// The eps of the Mamba2 mixer's gated RMSNorm, fixed in transformers' Zamba2MambaMixer.
const MIXER_NORM_EPS: f64 = 1e-5;

/// transformers' `layers_block_type` when the config has none (Zamba2-2.7B's 54 layers).
fn default_layer_types() -> Vec<String> {
    let mut types = vec!["mamba"];
    for _ in 0..7 {
        types.extend(["mamba"; 5]);
        types.push("hybrid");
    }
    types.extend(["mamba"; 4]);
    types.push("hybrid");
    types.extend(["mamba"; 3]);
    types.push("hybrid");
    types.extend(["mamba"; 2]);
    types.into_iter().map(String::from).collect()
}

/// Whether each layer is a hybrid one, from `layers_block_type` (or `layer_types`).
fn hybrid_layers(raw: &RawConfig, cfg: &Zamba2Config) -> Result<Vec<bool>> {
    let types = match (&cfg.layers_block_type, &cfg.common.layer_types) {
        (Some(t), _) | (None, Some(t)) => t.clone(),
        (None, None) => default_layer_types(),
    };
    let layers = cfg.common.num_hidden_layers;
    if types.len() != layers {
        return Err(raw.error(format!("`layers_block_type` has {} entries for {layers} layers", types.len())));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "mamba" | "linear_attention" => Ok(false),
            "hybrid" => Ok(true),
            other => Err(raw.error(format!("unsupported layer type `{other}` in `layers_block_type`"))),
        })
        .collect()
}

fn mamba_dims(raw: &RawConfig, cfg: &Zamba2Config, hidden: usize) -> Result<Mamba2Dims> {
    let expand = cfg.mamba_expand.unwrap_or(2);
    let heads = cfg.n_mamba_heads.unwrap_or(8);
    let groups = cfg.mamba_ngroups.unwrap_or(1);
    let state = cfg.mamba_d_state.unwrap_or(64);
    let conv = cfg.mamba_d_conv.unwrap_or(4);
    check_dims(
        raw,
        &[
            ("mamba_expand", expand),
            ("mamba_expand * hidden_size", expand.saturating_mul(hidden)),
            ("n_mamba_heads", heads),
            ("mamba_ngroups", groups),
            ("mamba_d_state", state),
            ("mamba_d_conv", conv),
        ],
    )?;
    let inner = expand * hidden;
    if !inner.is_multiple_of(heads) || !heads.is_multiple_of(groups) {
        return Err(raw.error(format!(
            "n_mamba_heads {heads} must divide mamba_expand x hidden_size ({inner}), and mamba_ngroups {groups} \
             divide n_mamba_heads"
        )));
    }
    let dt_min = match &cfg.time_step_min {
        None => 0.001,
        Some(v) => config_float(raw, "time_step_min", v)? as f32,
    };
    if !(dt_min.is_finite() && dt_min >= 0.0) {
        return Err(raw.error(format!("`time_step_min` {dt_min} is not a finite non-negative number")));
    }
    Ok(Mamba2Dims {
        num_heads: heads,
        head_dim: inner / heads,
        num_groups: groups,
        state_size: state,
        conv_kernel: conv,
        conv_bias: true,
        proj_bias: cfg.add_bias_linear,
        out_bias: cfg.add_bias_linear,
        gate_norm: GateNorm::AfterGate,
        dt_limit: (dt_min, f32::INFINITY),
        eps: MIXER_NORM_EPS,
    })
}

/// The shapes every shared block and adapter has.
struct SharedShape {
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rank: usize,
    eps: f64,
    bias: bool,
    act: ferrite_tensor::Activation,
}

impl SharedShape {
    fn block(&self, s: &Scope) -> Result<SharedBlock> {
        let (wide, q_rows, kv_rows) = (2 * self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let a = s.at("self_attn");
        let scale = (self.head_dim as f64 / 2.0).powf(-0.5);
        let attn = Attention {
            q: a.linear("q_proj", wide, q_rows, false)?,
            k: a.linear("k_proj", wide, kv_rows, false)?,
            v: a.linear("v_proj", wide, kv_rows, false)?,
            o: a.linear("o_proj", q_rows, self.hidden, false)?,
            q_norm: None,
            k_norm: None,
            query_scale: None,
            params: attention_params(self.heads, self.kv_heads, self.head_dim, scale, None, None),
        };
        let f = s.at("feed_forward");
        Ok(SharedBlock {
            input_norm: s.rms("input_layernorm", wide, self.eps)?,
            attn,
            ff_norm: s.rms("pre_ff_layernorm", self.hidden, self.eps)?,
            gate_up: f.linear("gate_up_proj", self.hidden, 2 * self.intermediate, self.bias)?,
            down: f.linear("down_proj", self.intermediate, self.hidden, self.bias)?,
            act: self.act,
        })
    }

    /// `{list}.{j}.0` (down to the rank) and `{list}.{j}.1` (back up).
    fn lora(&self, s: &Scope, list: &str, j: usize, width: usize, out: usize) -> Result<Lora> {
        Ok(Lora {
            down: s.linear(&format!("{list}.{j}.0"), width, self.rank, false)?,
            up: s.linear(&format!("{list}.{j}.1"), self.rank, out, false)?,
        })
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: Zamba2Config = raw.parse()?;
    let mut d = cfg.common.resolve(raw, DEFAULTS)?;
    // transformers derives the shared attention's head size, whatever the config says.
    d.head_dim = 2 * d.hidden / d.heads;
    if cfg.use_long_context {
        d.max_positions = 16384;
    }
    let hybrid = hybrid_layers(raw, &cfg)?;
    let blocks_n = cfg.num_mem_blocks.unwrap_or(1);
    let shape = SharedShape {
        hidden: d.hidden,
        intermediate: cfg.common.intermediate_size.unwrap_or(4 * d.hidden),
        heads: d.heads,
        kv_heads: d.kv_heads,
        head_dim: d.head_dim,
        rank: cfg.adapter_rank.unwrap_or(128),
        eps: d.eps,
        bias: cfg.add_bias_linear,
        act: d.act,
    };
    check_dims(
        raw,
        &[
            ("num_mem_blocks", blocks_n),
            ("adapter_rank", shape.rank),
            ("2 * hidden_size / num_attention_heads", d.head_dim),
            ("intermediate_size", shape.intermediate),
        ],
    )?;
    // The q/k/v adapters map to twice the hidden size and are added to every projection.
    if cfg.use_shared_attention_adapter && (d.kv_heads != d.heads || d.heads * d.head_dim != 2 * d.hidden) {
        return Err(raw.error(format!(
            "`use_shared_attention_adapter` needs num_key_value_heads ({}) equal to num_attention_heads ({}) and \
             num_attention_heads dividing 2 * hidden_size ({})",
            d.kv_heads,
            d.heads,
            2 * d.hidden
        )));
    }
    let dims = mamba_dims(raw, &cfg, d.hidden)?;
    let sources: Vec<usize> = hybrid.iter().enumerate().filter_map(|(i, &h)| h.then_some(i)).take(blocks_n).collect();
    let shared = sources
        .iter()
        .map(|&i| shape.block(&w.at(format!("model.layers.{i}.shared_transformer"))))
        .collect::<Result<Vec<_>>>()?;
    let mut invocation = 0;
    let blocks = d.blocks(w, |i, l| {
        if !hybrid[i] {
            let mixer = Mamba2Mixer::load(&l.at("mamba"), d.hidden, dims)?;
            return Ok(Block::mixer_only(Norm::Rms(d.rms(l, "input_layernorm")?), TokenMixer::Mamba2(Box::new(mixer))));
        }
        let (j, b) = (invocation, invocation % blocks_n);
        invocation += 1;
        let s = w.at(format!("model.layers.{}.shared_transformer", sources[b]));
        let (attn, wide) = (s.at("self_attn"), 2 * d.hidden);
        let qkv_adapters = match cfg.use_shared_attention_adapter {
            true => Some(Box::new([
                shape.lora(&attn, "linear_q_adapter_list", j, wide, wide)?,
                shape.lora(&attn, "linear_k_adapter_list", j, wide, wide)?,
                shape.lora(&attn, "linear_v_adapter_list", j, wide, wide)?,
            ])),
            false => None,
        };
        let m = l.at("mamba_decoder");
        let mixer = SharedHybrid {
            block: shared[b].clone(),
            qkv_adapters,
            gate_up_adapter: shape.lora(
                &s.at("feed_forward"),
                "gate_up_proj_adapter_list",
                j,
                d.hidden,
                2 * shape.intermediate,
            )?,
            rope: cfg.use_mem_rope.then_some(0),
            linear: l.linear("linear", d.hidden, d.hidden, false)?,
            mamba_norm: d.rms(&m, "input_layernorm")?,
            mamba: Mamba2Mixer::load(&m.at("mamba"), d.hidden, dims)?,
            counts_block: j < blocks_n,
        };
        // The mixer normalises its own input (the stream plus the shared block's output).
        Ok(Block {
            attn_norm: None,
            mixer: TokenMixer::SharedHybrid(Box::new(mixer)),
            attn_out_norm: None,
            mlp_norm: None,
            mlp: ChannelMixer::None,
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let ropes = if cfg.use_mem_rope { vec![d.rope(raw, 10000.0)?] } else { Vec::new() };
    let final_norm = Norm::Rms(d.rms(&w.at("model"), "final_layernorm")?);
    d.finish(raw, w, blocks, final_norm, ropes)
}
