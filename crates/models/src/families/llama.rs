//! Llama (`LlamaForCausalLM`) and the decoders that differ from it only in details: pre-norm
//! blocks of RMSNorm -> GQA self-attention with rotary embeddings -> RMSNorm -> SiLU-gated MLP.
//! Mistral, Qwen2/3, InternLM3, Seed-OSS, ERNIE 4.5, SmolLM3, Ministral 3 and Arcee are
//! [`Variant`]s of it (registry lines): which keys give the biases, the rotary pairing, NoPE
//! layers, position-scaled queries, an ungated MLP.

use serde::Deserialize;

use ferrite_tensor::{RopeStyle, Xielu};

use crate::decoder::load::{CommonConfig, Defaults, Dims, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::layers::rope::RopeParameters;
use crate::layers::{DenseMlp, MlpActivation, Norm, QueryScale};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
struct LlamaConfig {
    #[serde(flatten)]
    common: CommonConfig,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
    no_rope_layers: Option<Vec<u8>>,
    no_rope_layer_interval: Option<usize>,
}

/// How a family departs from plain Llama.
#[derive(Debug, Clone, Copy)]
pub struct Variant {
    /// What the family's config class fills in for absent keys.
    pub defaults: Defaults,
    /// `rope_theta` when the config has none.
    pub rope_theta: f64,
    /// q/k/v projections carry biases regardless of `attention_bias` (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on queries and keys before rotary embeddings (Qwen3).
    pub qk_norm: bool,
    /// How `sliding_window` is read when the config has no `layer_types`.
    pub window: WindowRule,
    /// Which config keys give the projections their biases.
    pub biases: BiasKeys,
    /// Rotate adjacent pairs instead of halves (ERNIE 4.5).
    pub interleaved_rope: bool,
    /// Some layers have no rotary embedding: SmolLM3's `no_rope_layers`.
    pub nope_layers: bool,
    /// Queries scaled by position after the rotary embedding, from `llama_4_scaling_beta` in the
    /// rope parameters (Ministral 3).
    pub llama4_query_scaling: bool,
    /// `down(act(up(x)))` without a gate projection (Arcee's ReLU² MLP).
    pub ungated_mlp: bool,
    /// `hidden_act` may be (and by default is) `xielu`, whose constants each layer's
    /// `mlp.act_fn` holds (Apertus).
    pub xielu: bool,
    /// The pre-attention and pre-MLP norms' names.
    pub norm_names: [&'static str; 2],
}

impl Variant {
    pub const MISTRAL: Variant = Variant { window: WindowRule::AllLayers, ..Variant::LLAMA };
    pub const QWEN2: Variant = Variant { qkv_bias: true, window: WindowRule::FromMaxWindowLayers, ..Variant::LLAMA };
    pub const QWEN3: Variant = Variant { qk_norm: true, window: WindowRule::FromMaxWindowLayers, ..Variant::LLAMA };
    pub const INTERNLM3: Variant = Variant {
        defaults: Defaults { eps: 1e-5, head_dim: Some(128), ..Defaults::LLAMA },
        biases: BiasKeys::InternLm3,
        ..Variant::LLAMA
    };
    pub const SEED_OSS: Variant = Variant {
        defaults: Defaults { head_dim: Some(128), ..Defaults::LLAMA },
        biases: BiasKeys::SeparateOutput,
        ..Variant::LLAMA
    };
    pub const ERNIE4_5: Variant = Variant {
        defaults: Defaults { eps: 1e-5, tie: true, head_dim: Some(128), ..Defaults::LLAMA },
        rope_theta: 500_000.0,
        biases: BiasKeys::UseBias,
        interleaved_rope: true,
        ..Variant::LLAMA
    };
    pub const SMOLLM3: Variant = Variant {
        defaults: Defaults { tie: true, ..Defaults::LLAMA },
        window: WindowRule::LayerTypesIfEnabled,
        nope_layers: true,
        ..Variant::LLAMA
    };
    pub const MINISTRAL3: Variant = Variant {
        defaults: Defaults { eps: 1e-5, head_dim: Some(128), ..Defaults::LLAMA },
        rope_theta: 1_000_000.0,
        llama4_query_scaling: true,
        ..Variant::LLAMA
    };
    pub const ARCEE: Variant = Variant {
        defaults: Defaults { eps: 1e-5, act: "relu2", ..Defaults::LLAMA },
        ungated_mlp: true,
        ..Variant::LLAMA
    };
    pub const APERTUS: Variant = Variant {
        defaults: Defaults { eps: 1e-5, ..Defaults::LLAMA },
        rope_theta: 12_000_000.0,
        qk_norm: true,
        ungated_mlp: true,
        xielu: true,
        norm_names: ["attention_layernorm", "feedforward_layernorm"],
        ..Variant::LLAMA
    };
    pub const LLAMA: Variant = Variant {
        defaults: Defaults::LLAMA,
        rope_theta: 10000.0,
        qkv_bias: false,
        qk_norm: false,
        window: WindowRule::None,
        biases: BiasKeys::Llama,
        interleaved_rope: false,
        nope_layers: false,
        llama4_query_scaling: false,
        ungated_mlp: false,
        xielu: false,
        norm_names: ["input_layernorm", "post_attention_layernorm"],
    };
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowRule {
    /// Llama has no sliding window.
    #[default]
    None,
    /// Every layer slides when `sliding_window` is set (Mistral).
    AllLayers,
    /// Layers from `max_window_layers` on slide when `use_sliding_window` is true (Qwen2/Qwen3).
    FromMaxWindowLayers,
    /// The `sliding_attention` entries of `layer_types` slide, and only when
    /// `use_sliding_window` is true (SmolLM3).
    LayerTypesIfEnabled,
}

/// The config keys that switch the projections' biases on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BiasKeys {
    /// `attention_bias` for q/k/v/o, `mlp_bias` for the MLP.
    #[default]
    Llama,
    /// `attention_bias` for q/k/v, `attention_out_bias` for o (Seed-OSS).
    SeparateOutput,
    /// `use_bias` for every projection (ERNIE 4.5).
    UseBias,
    /// InternLM3's `qkv_bias` for q/k/v and `bias` for o and the MLP (transformers 5 saves them
    /// as `attention_bias` / `mlp_bias`, which are read when the old keys are absent).
    InternLm3,
}

struct Biases {
    qkv: bool,
    o: bool,
    mlp: bool,
}

impl BiasKeys {
    fn read(self, raw: &RawConfig, d: &Dims) -> Biases {
        let flag = |key: &str| raw.value.get(key).and_then(serde_json::Value::as_bool);
        match self {
            BiasKeys::Llama => Biases { qkv: d.attention_bias, o: d.attention_bias, mlp: d.mlp_bias },
            BiasKeys::SeparateOutput => {
                Biases { qkv: d.attention_bias, o: flag("attention_out_bias").unwrap_or(false), mlp: d.mlp_bias }
            }
            BiasKeys::UseBias => {
                let on = flag("use_bias").unwrap_or(false);
                Biases { qkv: on, o: on, mlp: on }
            }
            BiasKeys::InternLm3 => {
                let qkv = flag("qkv_bias").unwrap_or(d.attention_bias);
                let rest = flag("bias").unwrap_or(d.mlp_bias);
                Biases { qkv, o: rest, mlp: rest }
            }
        }
    }
}

pub fn load(raw: &RawConfig, w: &Weights, variant: Variant) -> Result<Decoder> {
    load_at(raw, w, variant, "model", "lm_head")
}

/// [`load`] of a text model kept under `prefix` (`model.language_model` in a vision-language
/// checkpoint) with its LM head at `lm_head`.
pub fn load_at(raw: &RawConfig, w: &Weights, variant: Variant, prefix: &str, lm_head: &str) -> Result<Decoder> {
    let cfg: LlamaConfig = raw.parse()?;
    let mut common = cfg.common.clone();
    let xielu = variant.xielu && common.hidden_act.as_deref().unwrap_or("xielu") == "xielu";
    if xielu {
        // Not a fixed function: each layer's MLP reads its constants below.
        common.hidden_act = None;
    }
    let d = common.resolve(raw, variant.defaults)?;
    let inter = d.intermediate(raw)?;
    let biases = variant.biases.read(raw, &d);
    let rotary = rotary_layers(raw, &cfg, &d, variant)?;
    let query_scale = if variant.llama4_query_scaling { llama4_query_scale(raw, variant)? } else { None };
    let layers = format!("{prefix}.layers");
    let blocks = d.blocks_at(w, &layers, |i, l| {
        let s = l.at("self_attn");
        let mut attn = d.attention(&s, variant.qkv_bias || biases.qkv, biases.o)?;
        if variant.qk_norm {
            attn.q_norm = Some(s.rms("q_norm", d.head_dim, d.eps)?);
            attn.k_norm = Some(s.rms("k_norm", d.head_dim, d.eps)?);
        }
        attn.query_scale = query_scale;
        let sliding = match (d.sliding(raw, i)?, variant.window) {
            (Some(sliding), WindowRule::LayerTypesIfEnabled) => sliding && cfg.use_sliding_window.unwrap_or(false),
            (Some(sliding), _) => sliding,
            (None, WindowRule::None | WindowRule::LayerTypesIfEnabled) => false,
            (None, WindowRule::AllLayers) => true,
            (None, WindowRule::FromMaxWindowLayers) => {
                cfg.use_sliding_window.unwrap_or(false) && i >= cfg.max_window_layers.unwrap_or(0)
            }
        };
        attn.params.sliding_window = d.sliding_window.filter(|_| sliding);
        let mlp = if variant.ungated_mlp {
            let m = l.at("mlp");
            ChannelMixer::Dense(DenseMlp {
                fc1: m.linear("up_proj", d.hidden, inter, biases.mlp)?,
                fc2: m.linear("down_proj", inter, d.hidden, biases.mlp)?,
                act: if xielu { MlpActivation::Xielu(xielu_constants(&m.at("act_fn"))?) } else { d.act.into() },
            })
        } else {
            ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, biases.mlp)?)
        };
        let [attn_norm, mlp_norm] = variant.norm_names;
        Ok(Block::pre_norm(
            d.rms(l, attn_norm)?,
            TokenMixer::Attention(SelfAttention::new(attn, rotary[i].then_some(0))),
            d.rms(l, mlp_norm)?,
            mlp,
        ))
    })?;
    let mut rope = d.rope(raw, variant.rope_theta)?;
    if variant.interleaved_rope {
        rope = rope.with_style(RopeStyle::Interleaved);
    }
    let embed = format!("{prefix}.embed_tokens");
    let names = Names { layers: &layers, embed: &embed, embed_dim: None, lm_head, lm_head_bias: false };
    d.finish_at(raw, w, names, blocks, Some(Norm::Rms(d.rms(&w.at(prefix), "norm")?)), vec![rope])
}

/// An xIELU's constants from its module: `alpha_p`, `alpha_n`, and the buffers `beta`, `eps`
/// (0.5 and -1e-6 where a checkpoint leaves them out), softplus taken in f32 as torch does.
fn xielu_constants(s: &Scope) -> Result<Xielu> {
    let w = s.weights();
    let scalar = |leaf: &str| -> Result<f32> { Ok(s.get_f32(leaf, &[1])?.to_f32_vec()[0]) };
    let softplus = |x: f32| if x > 20.0 { x } else { x.exp().ln_1p() };
    let beta = w.get_scalar_opt(&s.name("beta"))?.unwrap_or(0.5);
    Ok(Xielu {
        alpha_p: softplus(scalar("alpha_p")?),
        alpha_n: beta + softplus(scalar("alpha_n")?),
        beta,
        eps: w.get_scalar_opt(&s.name("eps"))?.unwrap_or(-1e-6),
    })
}

/// Whether each layer applies the rotary embedding. SmolLM3's `no_rope_layers` holds a 1 for
/// each layer that does; without it every `no_rope_layer_interval`-th layer (default 4) does not.
fn rotary_layers(raw: &RawConfig, cfg: &LlamaConfig, d: &Dims, variant: Variant) -> Result<Vec<bool>> {
    if !variant.nope_layers {
        return Ok(vec![true; d.layers]);
    }
    match &cfg.no_rope_layers {
        Some(flags) if flags.len() != d.layers => {
            Err(raw.error(format!("`no_rope_layers` has {} entries for {} layers", flags.len(), d.layers)))
        }
        Some(flags) => Ok(flags.iter().map(|&f| f != 0).collect()),
        None => {
            let interval = cfg.no_rope_layer_interval.unwrap_or(4);
            if interval == 0 {
                return Err(raw.error("`no_rope_layer_interval` must be positive"));
            }
            Ok((0..d.layers).map(|i| !(i + 1).is_multiple_of(interval)).collect())
        }
    }
}

/// Ministral 3's query scaling: `llama_4_scaling_beta` and `original_max_position_embeddings`
/// from the rope parameters; none when the beta is absent.
fn llama4_query_scale(raw: &RawConfig, variant: Variant) -> Result<Option<QueryScale>> {
    let section = ["rope_parameters", "rope_scaling"].iter().find_map(|k| raw.value.get(*k).filter(|v| v.is_object()));
    let Some(beta) = section.and_then(|s| s.get("llama_4_scaling_beta")).and_then(serde_json::Value::as_f64) else {
        return Ok(None);
    };
    let params = RopeParameters::from_config(raw, variant.rope_theta)?;
    let original_max = params.original_max_position_embeddings.filter(|&m| m > 0).ok_or_else(|| {
        raw.error("`llama_4_scaling_beta` needs a positive `original_max_position_embeddings` in the rope parameters")
    })?;
    Ok(Some(QueryScale::Llama4 { beta, original_max }))
}
