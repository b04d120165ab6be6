//! Nemotron-H (`NemotronHForCausalLM`): one mixer per layer behind an RMSNorm and a residual add,
//! the mixer chosen by the layer pattern: Mamba2 (`M`, [`crate::layers::mamba2`]), attention
//! without position embeddings (`*`), or a relu² MLP with no gate (`-`). Real checkpoints spell the
//! pattern `hybrid_override_pattern`; transformers 5 saves it as `layers_block_type`.
//!
//! The reference clamps dt from below at `time_step_min` on prompts (its chunked scan) but not in
//! single-token decode, and ignores `time_step_limit`: ferrite does the same to stay token-exact.

use serde::Deserialize;

use crate::decoder::load::{activation, attention_params, check_dims, check_heads};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::families::mamba2::finish_backbone;
use crate::layers::mamba2::{GateNorm, Mamba2Dims, Mamba2Mixer};
use crate::layers::{Attention, DenseMlp, MlpActivation, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
struct NemotronHConfig {
    hidden_size: usize,
    vocab_size: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    #[serde(alias = "attention_head_dim")]
    head_dim: Option<usize>,
    intermediate_size: usize,
    mlp_hidden_act: Option<String>,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    attention_bias: bool,
    mamba_num_heads: usize,
    mamba_head_dim: usize,
    ssm_state_size: usize,
    #[serde(alias = "mamba_n_groups")]
    n_groups: usize,
    #[serde(alias = "mamba_d_conv")]
    conv_kernel: usize,
    #[serde(default = "yes", alias = "mamba_conv_bias")]
    use_conv_bias: bool,
    #[serde(default)]
    use_bias: bool,
    #[serde(alias = "mamba_dt_min")]
    time_step_min: Option<f64>,
    layer_norm_epsilon: Option<f64>,
    #[serde(default)]
    tie_word_embeddings: bool,
    max_position_embeddings: Option<usize>,
    hybrid_override_pattern: Option<String>,
    #[serde(alias = "layer_types")]
    layers_block_type: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerKind {
    Mamba,
    Attention,
    Mlp,
}

fn layer_kinds(raw: &RawConfig, cfg: &NemotronHConfig) -> Result<Vec<LayerKind>> {
    let unsupported = |what: &str, key: &str| {
        raw.error(format!("`{key}` names layer type {what}: Nemotron-H's MoE layers are not supported yet"))
    };
    match (&cfg.layers_block_type, &cfg.hybrid_override_pattern) {
        (Some(types), _) => types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" | "mamba" => Ok(LayerKind::Mamba),
                "full_attention" | "attention" => Ok(LayerKind::Attention),
                "mlp" => Ok(LayerKind::Mlp),
                "moe" => Err(unsupported("`moe`", "layers_block_type")),
                other => Err(raw.error(format!(
                    "`layers_block_type` names layer type `{other}`; Nemotron-H has linear_attention, \
                     full_attention, mlp and moe"
                ))),
            })
            .collect(),
        (None, Some(pattern)) => pattern
            .chars()
            .map(|c| match c {
                'M' => Ok(LayerKind::Mamba),
                '*' => Ok(LayerKind::Attention),
                '-' => Ok(LayerKind::Mlp),
                'E' => Err(unsupported("`E`", "hybrid_override_pattern")),
                other => Err(raw.error(format!(
                    "`hybrid_override_pattern` names layer type `{other}`; Nemotron-H has M, *, - and E"
                ))),
            })
            .collect(),
        (None, None) => Err(raw.error("missing field `hybrid_override_pattern` (or `layers_block_type`)")),
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: NemotronHConfig = raw.parse()?;
    let kinds = layer_kinds(raw, &cfg)?;
    let (hidden, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    let head_dim = cfg.head_dim.unwrap_or(hidden / heads.max(1));
    check_heads(raw, heads, kv_heads)?;
    check_dims(
        raw,
        &[
            ("hidden_size", hidden),
            ("head_dim", head_dim),
            ("intermediate_size", cfg.intermediate_size),
            ("mamba_num_heads", cfg.mamba_num_heads),
            ("mamba_head_dim", cfg.mamba_head_dim),
            ("ssm_state_size", cfg.ssm_state_size),
            ("n_groups", cfg.n_groups),
            ("conv_kernel", cfg.conv_kernel),
            ("vocab_size", cfg.vocab_size),
            ("layers", kinds.len()),
        ],
    )?;
    if !cfg.mamba_num_heads.is_multiple_of(cfg.n_groups) {
        return Err(
            raw.error(format!("n_groups {} does not divide mamba_num_heads {}", cfg.n_groups, cfg.mamba_num_heads))
        );
    }
    let dt_min = cfg.time_step_min.unwrap_or(0.001) as f32;
    if dt_min.is_nan() || dt_min < 0.0 {
        return Err(raw.error(format!("`time_step_min` {dt_min} is not a non-negative number")));
    }
    let eps = cfg.layer_norm_epsilon.unwrap_or(1e-5);
    let dims = Mamba2Dims {
        num_heads: cfg.mamba_num_heads,
        head_dim: cfg.mamba_head_dim,
        num_groups: cfg.n_groups,
        state_size: cfg.ssm_state_size,
        conv_kernel: cfg.conv_kernel,
        conv_bias: cfg.use_conv_bias,
        proj_bias: cfg.use_bias,
        out_bias: cfg.use_bias,
        gate_norm: GateNorm::AfterGate,
        dt_limit: (dt_min, f32::INFINITY),
        eps,
    };
    let act = activation(raw, "mlp_hidden_act", cfg.mlp_hidden_act.as_deref().unwrap_or("relu2"))?;
    let blocks = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let l = w.at(format!("backbone.layers.{i}"));
            let (m, norm) = (l.at("mixer"), Norm::Rms(l.rms("norm", hidden, eps)?));
            Ok(match kind {
                LayerKind::Mamba => {
                    Block::mixer_only(norm, TokenMixer::Mamba2(Box::new(Mamba2Mixer::load(&m, hidden, dims)?)))
                }
                LayerKind::Attention => {
                    let (q_rows, kv_rows, bias) = (heads * head_dim, kv_heads * head_dim, cfg.attention_bias);
                    let attn = Attention {
                        q: m.linear("q_proj", hidden, q_rows, bias)?,
                        k: m.linear("k_proj", hidden, kv_rows, bias)?,
                        v: m.linear("v_proj", hidden, kv_rows, bias)?,
                        o: m.linear("o_proj", q_rows, hidden, bias)?,
                        q_norm: None,
                        k_norm: None,
                        query_scale: None,
                        params: attention_params(heads, kv_heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
                    };
                    Block::mixer_only(norm, TokenMixer::Attention(SelfAttention::new(attn, None)))
                }
                LayerKind::Mlp => {
                    let mlp = DenseMlp {
                        fc1: m.linear("up_proj", hidden, cfg.intermediate_size, cfg.mlp_bias)?,
                        fc2: m.linear("down_proj", cfg.intermediate_size, hidden, cfg.mlp_bias)?,
                        act: MlpActivation::Fixed(act),
                    };
                    Block::channel_only(norm, ChannelMixer::Dense(mlp))
                }
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let context = cfg.max_position_embeddings.unwrap_or(4096);
    finish_backbone(raw, w, blocks, [cfg.vocab_size, hidden], cfg.tie_word_embeddings, eps, context)
}
