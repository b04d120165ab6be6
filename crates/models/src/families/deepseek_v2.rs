//! DeepSeek-V2 (`DeepseekV2ForCausalLM`) and the decoders that share its shape: multi-head
//! latent attention ([`crate::mla`]) with interleaved rotary embeddings on the rope part, and a
//! mixture of routed + shared experts ([`crate::moe`]) from layer `first_k_dense_replace` on
//! (dense MLPs before). DeepSeek-V3 builds it with [`DeepseekVariant::V3`].

use ferrite_tensor::{ops, Activation, PagedKvLayer, RopeStyle, Tensor};
use serde::Deserialize;

use crate::config::RawConfig;
use crate::layers::{Embedding, GatedMlp, Linear, RmsNorm};
use crate::mla::{Mla, MlaCacheMode, MlaDims};
use crate::model::{CausalLM, ForwardInput, ModelInfo};
use crate::moe::{
    ExpertNames, Experts, FeedForward, GroupLimit, GroupScore, Router, RouterConfig, Scoring, SharedExpert, SparseMoe,
};
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
fn default_scaling() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
pub struct DeepseekConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
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
    /// Biases on the dense and shared-expert MLPs (V2 only).
    #[serde(default)]
    pub mlp_bias: bool,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: Option<usize>,
    pub num_experts_per_tok: usize,
    #[serde(default)]
    pub first_k_dense_replace: usize,
    #[serde(default = "default_scaling")]
    pub routed_scaling_factor: f64,
    /// V2: `greedy` or `group_limited_greedy`.
    pub topk_method: Option<String>,
    pub n_group: Option<usize>,
    pub topk_group: Option<usize>,
    pub norm_topk_prob: Option<bool>,
    /// V3: the rope dims are interleaved pairs (default true).
    pub rope_interleave: Option<bool>,
}

/// How the routed experts are chosen, and how the rope part is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeepseekVariant {
    /// Softmax scores, `greedy` or `group_limited_greedy` (best expert per group) top-k, times
    /// `routed_scaling_factor`; transformers ignores `norm_topk_prob` here. Interleaved rope.
    V2,
    /// Sigmoid scores plus `e_score_correction_bias` for the choice, top-`topk_group` of
    /// `n_group` groups by their two best scores, then top-k; the unbiased scores renormalised
    /// when `norm_topk_prob` (+1e-20) and times `routed_scaling_factor`. Interleaved rope unless
    /// `rope_interleave` is false.
    V3,
}

struct Block {
    input_norm: RmsNorm,
    attn: Mla,
    post_norm: RmsNorm,
    ffn: FeedForward,
}

pub struct DeepseekModel {
    info: ModelInfo,
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

impl DeepseekModel {
    pub fn load(raw: &RawConfig, w: &Weights, variant: DeepseekVariant, mode: MlaCacheMode) -> Result<DeepseekModel> {
        let cfg: DeepseekConfig = raw.parse()?;
        let h = cfg.hidden_size;
        let heads = cfg.num_attention_heads;
        let act = Activation::from_hf(&cfg.hidden_act)
            .ok_or_else(|| raw.error(format!("unsupported `hidden_act` `{}`", cfg.hidden_act)))?;
        let dims = MlaDims {
            num_heads: heads,
            q_lora_rank: cfg.q_lora_rank,
            kv_lora_rank: cfg.kv_lora_rank,
            qk_nope_head_dim: cfg.qk_nope_head_dim,
            qk_rope_head_dim: cfg.qk_rope_head_dim,
            v_head_dim: cfg.v_head_dim,
        };
        let rope_params = RopeParameters::from_config(raw, 10000.0)?;
        let style = match (variant, cfg.rope_interleave) {
            (DeepseekVariant::V3, Some(false)) => RopeStyle::Neox,
            _ => RopeStyle::Interleaved,
        };
        let rope = Rope::new(&rope_params, cfg.qk_rope_head_dim, cfg.max_position_embeddings, raw)?.with_style(style);
        // transformers' `yarn_apply_mscale`: any non-default rope with `mscale_all_dim` scales the
        // softmax by mscale(factor, mscale_all_dim)^2.
        let mut scale = (dims.qk_head_dim() as f64).powf(-0.5);
        if rope_params.kind() != "default" {
            if let Some(all) = rope_params.mscale_all_dim.filter(|&m| m != 0.0) {
                let factor = rope_params.factor.ok_or_else(|| raw.error("`mscale_all_dim` needs rope `factor`"))?;
                let m = yarn_mscale(factor, all);
                scale = scale * m * m;
            }
        }
        let group = |score| -> Result<Option<GroupLimit>> {
            match (cfg.n_group, cfg.topk_group) {
                (Some(n_group), Some(topk_group)) => Ok(Some(GroupLimit { n_group, topk_group, score })),
                _ => Err(raw.error("grouped routing needs `n_group` and `topk_group`")),
            }
        };
        let router_cfg = match variant {
            DeepseekVariant::V2 => RouterConfig {
                num_experts: cfg.n_routed_experts,
                top_k: cfg.num_experts_per_tok,
                scoring: Scoring::Softmax,
                renormalize: false,
                renormalize_eps: 0.0,
                scaling: cfg.routed_scaling_factor as f32,
                group: match cfg.topk_method.as_deref().unwrap_or("greedy") {
                    "greedy" => None,
                    "group_limited_greedy" => group(GroupScore::Max)?,
                    other => return Err(raw.error(format!("unsupported `topk_method` `{other}`"))),
                },
            },
            DeepseekVariant::V3 => RouterConfig {
                num_experts: cfg.n_routed_experts,
                top_k: cfg.num_experts_per_tok,
                scoring: Scoring::Sigmoid,
                renormalize: cfg.norm_topk_prob.unwrap_or(true),
                renormalize_eps: 1e-20,
                scaling: cfg.routed_scaling_factor as f32,
                group: group(GroupScore::TopTwoSum)?,
            },
        };
        let mlp_bias = variant == DeepseekVariant::V2 && cfg.mlp_bias;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn = Mla::load(w, &format!("{p}.self_attn"), h, dims, cfg.attention_bias, scale as f32, mode)?;
            let ffn = if i >= cfg.first_k_dense_replace {
                let mp = format!("{p}.mlp");
                let shared = match cfg.n_shared_experts.unwrap_or(0) {
                    0 => None,
                    n => Some(SharedExpert {
                        mlp: GatedMlp::load(
                            w,
                            &format!("{mp}.shared_experts"),
                            h,
                            cfg.moe_intermediate_size * n,
                            act,
                            mlp_bias,
                        )?,
                        gate: None,
                    }),
                };
                FeedForward::Moe(Box::new(SparseMoe {
                    router: Router::load(
                        w,
                        &format!("{mp}.gate"),
                        h,
                        router_cfg.clone(),
                        variant == DeepseekVariant::V3,
                    )?,
                    experts: Experts::load(
                        w,
                        &mp,
                        cfg.n_routed_experts,
                        h,
                        cfg.moe_intermediate_size,
                        act,
                        ExpertNames::HF,
                    )?,
                    shared,
                }))
            } else {
                FeedForward::Dense(GatedMlp::load(w, &format!("{p}.mlp"), h, cfg.intermediate_size, act, mlp_bias)?)
            };
            layers.push(Block {
                input_norm: RmsNorm::load(w, &format!("{p}.input_layernorm"), h, cfg.rms_norm_eps)?,
                attn,
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
            + layers.iter().map(|b| b.attn.weight_bytes() + b.ffn.weight_bytes()).sum::<usize>();
        let info = ModelInfo {
            architecture: raw.architecture()?,
            vocab_size: cfg.vocab_size,
            max_position_embeddings: cfg.max_position_embeddings,
            kv_layers: layers.iter().map(|b| b.attn.kv_spec()).collect(),
            weight_bytes,
        };
        Ok(DeepseekModel { info, embed, layers, norm, lm_head, rope })
    }
}

impl CausalLM for DeepseekModel {
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

pub fn load(raw: &RawConfig, w: &Weights) -> Result<DeepseekModel> {
    DeepseekModel::load(raw, w, DeepseekVariant::V2, MlaCacheMode::default())
}
