//! Mixtral (`MixtralForCausalLM`) and the decoders that share its shape: Llama-style GQA
//! self-attention with rotary embeddings, and a sparse mixture-of-experts feed-forward block
//! ([`crate::moe`]) in place of the dense MLP. Qwen2-MoE, Qwen3-MoE and OLMoE build this decoder
//! with a [`MoeVariant`].

use ferrite_tensor::{ops, Activation, AttentionParams, AttnMetadata, PagedKvLayer, Tensor};
use serde::Deserialize;

use crate::config::RawConfig;
use crate::layers::{Attention, Embedding, GatedMlp, Linear, RmsNorm};
use crate::model::{CausalLM, ForwardInput, KvLayerSpec, ModelInfo};
use crate::moe::{ExpertNames, Experts, FeedForward, Router, RouterConfig, Scoring, SharedExpert, SparseMoe};
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
fn one() -> usize {
    1
}

/// The `config.json` fields these decoders read.
#[derive(Debug, Clone, Deserialize)]
pub struct MoeDecoderConfig {
    pub hidden_size: usize,
    /// Dense layers' MLP width (Qwen-MoE `mlp_only_layers`), or the experts' width (Mixtral, OLMoE).
    pub intermediate_size: Option<usize>,
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
    /// Qwen2-MoE: biases on q/k/v (default true).
    pub qkv_bias: Option<bool>,
    pub sliding_window: Option<usize>,
    pub use_sliding_window: Option<bool>,
    pub max_window_layers: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    /// Mixtral's name for the expert count; the others say `num_experts`.
    pub num_local_experts: Option<usize>,
    pub num_experts: Option<usize>,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: Option<usize>,
    pub shared_expert_intermediate_size: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    pub clip_qkv: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each head (Qwen3-MoE).
    PerHead,
    /// RMSNorm over all heads at once, before the split into heads (OLMoE).
    FullWidth,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    None,
    /// `sliding_window` on every layer when set (Mixtral).
    AllLayers,
    /// `sliding_window` on every layer when `use_sliding_window` (Qwen3-MoE).
    AllLayersIfEnabled,
    /// `layer_types`, else even layers below `max_window_layers` when `use_sliding_window` (Qwen2-MoE).
    Qwen2Moe,
}

/// How a family departs from Mixtral.
#[derive(Debug, Clone, Copy)]
pub struct MoeVariant {
    /// Checkpoint prefix of the feed-forward block under `model.layers.{i}.`.
    pub moe_prefix: &'static str,
    pub expert_names: ExpertNames,
    /// The top-k weights are always renormalised (Mixtral), else as `norm_topk_prob` says.
    pub always_renormalize: bool,
    /// q/k/v biases unless `qkv_bias` says otherwise (Qwen2-MoE).
    pub default_qkv_bias: bool,
    pub qk_norm: QkNorm,
    pub window: WindowRule,
    /// A shared expert behind a sigmoid gate (Qwen2-MoE).
    pub shared_expert: bool,
    /// Experts are `moe_intermediate_size` wide (Qwen-MoE), else `intermediate_size`.
    pub moe_width_key: bool,
}

impl MoeVariant {
    pub const MIXTRAL: MoeVariant = MoeVariant {
        moe_prefix: "block_sparse_moe",
        expert_names: ExpertNames::MIXTRAL,
        always_renormalize: true,
        default_qkv_bias: false,
        qk_norm: QkNorm::None,
        window: WindowRule::AllLayers,
        shared_expert: false,
        moe_width_key: false,
    };
}

impl MoeDecoderConfig {
    fn layer_window(&self, layer: usize, rule: WindowRule) -> Option<usize> {
        let enabled = self.use_sliding_window.unwrap_or(false);
        match rule {
            WindowRule::None => None,
            WindowRule::AllLayers => self.sliding_window,
            WindowRule::AllLayersIfEnabled => self.sliding_window.filter(|_| enabled),
            WindowRule::Qwen2Moe => {
                let sliding = match &self.layer_types {
                    Some(types) => types.get(layer).map(String::as_str) == Some("sliding_attention"),
                    None => enabled && layer.is_multiple_of(2) && layer < self.max_window_layers.unwrap_or(28),
                };
                if sliding {
                    self.sliding_window
                } else {
                    None
                }
            }
        }
    }

    /// transformers' rule: a layer is sparse unless listed in `mlp_only_layers`, when there are
    /// experts and `(layer + 1)` is a multiple of `decoder_sparse_step`.
    fn is_sparse(&self, layer: usize, num_experts: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && num_experts > 0
            && self.decoder_sparse_step > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// Llama-style attention; OLMoE normalises q and k over their full width, which
/// [`Attention`] (per-head QK-norm) does not do, so that case runs here.
struct MoeAttention {
    inner: Attention,
    full_width_norm: Option<(RmsNorm, RmsNorm)>,
}

impl MoeAttention {
    fn forward(
        &self,
        x: &Tensor,
        rope: (&Rope, &Tensor, &Tensor),
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let Some((q_norm, k_norm)) = &self.full_width_norm else {
            return self.inner.forward(x, Some(rope), meta, cache);
        };
        let a = &self.inner;
        let (rope, cos, sin) = rope;
        let q = rope.apply(&q_norm.forward(&a.q.forward(x)?)?, cos, sin)?;
        let k = rope.apply(&k_norm.forward(&a.k.forward(x)?)?, cos, sin)?;
        let v = a.v.forward(x)?;
        ops::write_kv(cache, &k, &v, meta)?;
        a.o.forward(&ops::paged_attention(&q, cache, meta, &a.params)?)
    }
}

struct Block {
    input_norm: RmsNorm,
    attn: MoeAttention,
    post_norm: RmsNorm,
    ffn: FeedForward,
}

pub struct MoeDecoder {
    info: ModelInfo,
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

impl MoeDecoder {
    pub fn load(raw: &RawConfig, w: &Weights, variant: MoeVariant) -> Result<MoeDecoder> {
        let cfg: MoeDecoderConfig = raw.parse()?;
        let h = cfg.hidden_size;
        let heads = cfg.num_attention_heads;
        let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
        let head_dim = cfg.head_dim.unwrap_or(h / heads.max(1));
        let act = Activation::from_hf(&cfg.hidden_act)
            .ok_or_else(|| raw.error(format!("unsupported `hidden_act` `{}`", cfg.hidden_act)))?;
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(
                raw.error(format!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"))
            );
        }
        if cfg.clip_qkv.is_some() {
            return Err(raw.error("`clip_qkv` (clamping q/k/v) is not supported"));
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
        let num_experts = cfg.num_local_experts.or(cfg.num_experts).unwrap_or(0);
        let expert_width = if variant.moe_width_key { cfg.moe_intermediate_size } else { cfg.intermediate_size };
        let need = |v: Option<usize>, key: &str| v.ok_or_else(|| raw.error(format!("missing field `{key}`")));
        let rope = Rope::new(&RopeParameters::from_config(raw, 10000.0)?, head_dim, cfg.max_position_embeddings, raw)?;
        let qkv_bias = cfg.qkv_bias.unwrap_or(variant.default_qkv_bias) || cfg.attention_bias;
        let router_cfg = RouterConfig {
            num_experts,
            top_k: cfg.num_experts_per_tok,
            scoring: Scoring::Softmax,
            renormalize: variant.always_renormalize || cfg.norm_topk_prob.unwrap_or(false),
            renormalize_eps: 0.0,
            scaling: 1.0,
            group: None,
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let norm = |n: &str, size: usize| RmsNorm::load(w, &format!("{p}.self_attn.{n}"), size, cfg.rms_norm_eps);
            let per_head = variant.qk_norm == QkNorm::PerHead;
            let inner = Attention {
                q: Linear::load(w, &format!("{p}.self_attn.q_proj"), h, heads * head_dim, qkv_bias)?,
                k: Linear::load(w, &format!("{p}.self_attn.k_proj"), h, kv_heads * head_dim, qkv_bias)?,
                v: Linear::load(w, &format!("{p}.self_attn.v_proj"), h, kv_heads * head_dim, qkv_bias)?,
                o: Linear::load(w, &format!("{p}.self_attn.o_proj"), heads * head_dim, h, cfg.attention_bias)?,
                q_norm: if per_head { Some(norm("q_norm", head_dim)?) } else { None },
                k_norm: if per_head { Some(norm("k_norm", head_dim)?) } else { None },
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
            let full_width_norm = if variant.qk_norm == QkNorm::FullWidth {
                Some((norm("q_norm", heads * head_dim)?, norm("k_norm", kv_heads * head_dim)?))
            } else {
                None
            };
            let mp = format!("{p}.{}", variant.moe_prefix);
            let ffn = if cfg.is_sparse(i, num_experts) {
                let width = need(
                    expert_width,
                    if variant.moe_width_key { "moe_intermediate_size" } else { "intermediate_size" },
                )?;
                let shared = if variant.shared_expert {
                    let sw = need(cfg.shared_expert_intermediate_size, "shared_expert_intermediate_size")?;
                    Some(SharedExpert {
                        mlp: GatedMlp::load(w, &format!("{mp}.shared_expert"), h, sw, act, false)?,
                        gate: Some(Linear::load(w, &format!("{mp}.shared_expert_gate"), h, 1, false)?),
                    })
                } else {
                    None
                };
                FeedForward::Moe(Box::new(SparseMoe {
                    router: Router::load(w, &format!("{mp}.gate"), h, router_cfg.clone(), false)?,
                    experts: Experts::load(w, &mp, num_experts, h, width, act, variant.expert_names)?,
                    shared,
                }))
            } else {
                let width = need(cfg.intermediate_size, "intermediate_size")?;
                FeedForward::Dense(GatedMlp::load(w, &format!("{p}.mlp"), h, width, act, false)?)
            };
            layers.push(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), h, cfg.rms_norm_eps)?,
                attn: MoeAttention { inner, full_width_norm },
                post_norm: RmsNorm::load(w, &format!("{p}.post_attention_layernorm"), h, cfg.rms_norm_eps)?,
                ffn,
            });
        }
        let embed = Embedding { table: w.get("model.embed_tokens.weight", &[cfg.vocab_size, h])? };
        let tied = cfg.tie_word_embeddings || !w.contains("lm_head.weight");
        let lm_head = if tied {
            Linear { weight: embed.table.clone(), bias: None }
        } else {
            Linear::load(w, "lm_head", h, cfg.vocab_size, false)?
        };
        let norm = RmsNorm::load(w, "model.norm", h, cfg.rms_norm_eps)?;
        let weight_bytes = embed.table.size_in_bytes()
            + if tied { 0 } else { lm_head.weight.size_in_bytes() }
            + layers
                .iter()
                .map(|b| {
                    let a = &b.attn.inner;
                    [&a.q, &a.k, &a.v, &a.o].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
                        + b.ffn.weight_bytes()
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
        Ok(MoeDecoder { info, embed, layers, norm, lm_head, rope })
    }
}

impl CausalLM for MoeDecoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn rotary_depends_on_length(&self) -> bool {
        self.rope.depends_on_length()
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let meta = input.meta;
        let mut h = self.embed.forward(input.tokens)?;
        let (cos, sin) = self.rope.cos_sin(meta, h.device())?;
        for (block, cache) in self.layers.iter().zip(kv.iter_mut()) {
            let x = block.input_norm.forward(&h)?;
            let x = block.attn.forward(&x, (&self.rope, &cos, &sin), meta, cache)?;
            h = ops::add(&h, &x)?;
            let x = block.post_norm.forward(&h)?;
            h = ops::add(&h, &block.ffn.forward(&x)?)?;
        }
        let h = ops::gather_rows(&h, input.logit_rows)?;
        self.lm_head.forward(&self.norm.forward(&h)?)
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<MoeDecoder> {
    MoeDecoder::load(raw, w, MoeVariant::MIXTRAL)
}
