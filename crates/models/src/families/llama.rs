//! Llama (`LlamaForCausalLM`) and the decoders that share its shape: pre-norm blocks of
//! RMSNorm -> GQA self-attention with rotary embeddings -> RMSNorm -> SiLU-gated MLP.

use ferrite_tensor::{ops, Activation, AttentionParams, PagedKvLayer, Tensor};
use serde::Deserialize;

use crate::config::RawConfig;
use crate::layers::{Attention, Embedding, GatedMlp, Linear, RmsNorm};
use crate::model::{CausalLM, ForwardInput, KvLayerSpec, ModelInfo};
use crate::rope::{Rope, RopeParameters};
use crate::weights::Weights;
use crate::Result;

fn default_eps() -> f64 {
    1e-6
}
fn default_max_positions() -> usize {
    2048
}
fn default_act() -> String {
    "silu".into()
}

/// The `config.json` fields the Llama-style decoders read.
#[derive(Debug, Clone, Deserialize)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_max_positions")]
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
}

/// How a family departs from plain Llama.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// q/k/v projections carry biases regardless of `attention_bias` (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on queries and keys before rotary embeddings (Qwen3).
    pub qk_norm: bool,
    /// How `sliding_window` is read when the config has no `layer_types`.
    pub window: WindowRule,
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
}

struct Block {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: GatedMlp,
}

pub struct LlamaModel {
    info: ModelInfo,
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

impl LlamaConfig {
    fn layer_window(&self, layer: usize, rule: WindowRule) -> Option<usize> {
        if let Some(types) = &self.layer_types {
            return match types.get(layer).map(String::as_str) {
                Some("sliding_attention") => self.sliding_window,
                _ => None,
            };
        }
        match rule {
            WindowRule::None => None,
            WindowRule::AllLayers => self.sliding_window,
            WindowRule::FromMaxWindowLayers => {
                if self.use_sliding_window.unwrap_or(false) && layer >= self.max_window_layers.unwrap_or(0) {
                    self.sliding_window
                } else {
                    None
                }
            }
        }
    }
}

impl LlamaModel {
    pub fn load(raw: &RawConfig, w: &Weights, variant: Variant) -> Result<LlamaModel> {
        let cfg: LlamaConfig = raw.parse()?;
        let h = cfg.hidden_size;
        let heads = cfg.num_attention_heads;
        let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
        let head_dim = cfg.head_dim.unwrap_or(h / heads);
        let act = Activation::from_hf(&cfg.hidden_act)
            .ok_or_else(|| raw.error(format!("unsupported `hidden_act` `{}`", cfg.hidden_act)))?;
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(
                raw.error(format!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"))
            );
        }
        if let Some(types) = &cfg.layer_types {
            if types.len() != cfg.num_hidden_layers {
                return Err(raw.error(format!(
                    "`layer_types` has {} entries for {} layers",
                    types.len(),
                    cfg.num_hidden_layers
                )));
            }
        }
        let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, head_dim, cfg.max_position_embeddings, raw)?;
        let qkv_bias = variant.qkv_bias || cfg.attention_bias;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let qk_norm = |n: &str| -> Result<Option<RmsNorm>> {
                if variant.qk_norm {
                    Ok(Some(RmsNorm::load(w, &format!("{p}.self_attn.{n}"), head_dim, cfg.rms_norm_eps)?))
                } else {
                    Ok(None)
                }
            };
            let attn = Attention {
                q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * head_dim, qkv_bias)?,
                k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * head_dim, qkv_bias)?,
                v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * head_dim, qkv_bias)?,
                o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * head_dim, h, cfg.attention_bias)?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
                params: AttentionParams {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim,
                    v_head_dim: head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    sliding_window: cfg.layer_window(i, variant.window),
                    softcap: None,
                },
            };
            layers.push(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), h, cfg.rms_norm_eps)?,
                attn,
                post_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), h, cfg.rms_norm_eps)?,
                mlp: GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, cfg.mlp_bias)?,
            });
        }
        let embed = Embedding { table: w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])? };
        let lm_head = if cfg.tie_word_embeddings || !w.contains("lm_head.weight") {
            Linear { weight: embed.table.clone(), bias: None }
        } else {
            Linear::load(w, "lm_head", h, cfg.vocab_size, false)?
        };
        let norm = RmsNorm::load(w, "model.norm", h, cfg.rms_norm_eps)?;
        let weight_bytes = embed.table.size_in_bytes()
            + if cfg.tie_word_embeddings { 0 } else { lm_head.weight.size_in_bytes() }
            + layers
                .iter()
                .map(|b| {
                    [&b.attn.q, &b.attn.k, &b.attn.v, &b.attn.o, &b.mlp.gate, &b.mlp.up, &b.mlp.down]
                        .iter()
                        .map(|l| l.weight.size_in_bytes())
                        .sum::<usize>()
                })
                .sum::<usize>();
        let info = ModelInfo {
            architecture: raw.architecture()?,
            vocab_size: cfg.vocab_size,
            max_position_embeddings: cfg.max_position_embeddings,
            kv_layers: vec![
                KvLayerSpec { num_kv_heads: kv_heads, k_dim: head_dim, v_dim: head_dim };
                cfg.num_hidden_layers
            ],
            weight_bytes,
        };
        Ok(LlamaModel { info, embed, layers, norm, lm_head, rope })
    }
}

impl CausalLM for LlamaModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn rotary_depends_on_length(&self) -> bool {
        self.rope.depends_on_length()
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.lm_head.forward(&self.hidden_states(input, kv)?)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let meta = input.meta;
        let mut h = self.embed.forward(input.tokens)?;
        let (cos, sin) = self.rope.cos_sin(meta, h.device())?;
        // Each residual add is fused into the norm that follows it; the last block's output is
        // added (in the final norm) after the logit rows are gathered.
        let mut pending: Option<Tensor> = None;
        for (block, cache) in self.layers.iter().zip(kv.iter_mut()) {
            let x = match pending.take() {
                Some(out) => {
                    let (x, sum) = block.input_norm.forward_add(&out, &h)?;
                    h = sum;
                    x
                }
                None => block.input_norm.forward(&h)?,
            };
            let attn = block.attn.forward(&x, Some((&self.rope, &cos, &sin)), meta, cache)?;
            let (x, sum) = block.post_norm.forward_add(&attn, &h)?;
            h = sum;
            pending = Some(block.mlp.forward(&x)?);
        }
        let h = ops::gather_rows(&h, input.logit_rows)?;
        match pending {
            Some(out) => Ok(self.norm.forward_add(&ops::gather_rows(&out, input.logit_rows)?, &h)?.0),
            None => self.norm.forward(&h),
        }
    }
}
