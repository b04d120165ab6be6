//! PhiMoE (`PhiMoEForCausalLM`, Phi-3.5-MoE): Mixtral's layout with LayerNorms (weight and bias,
//! eps `rms_norm_eps`), q/k/v/o biases when `attention_bias`, an LM head bias when `lm_head_bias`,
//! and `sparsemixer` routing: the best expert, weighted by the softmax over the logits close to
//! its own (within `2 router_jitter_noise`, relative), then the best of the rest the same way
//! ([`Scoring::SparseMixer`]). Its LongRoPE turns every position with the short factors and scales
//! cos/sin by `short_mscale`, or `long_mscale` once a sequence passes the original length, and
//! generate recomputes the cache there ([`Rope::with_phimoe_mscales`]).
//!
//! Checkpoint names: Mixtral's (`model.layers.{i}.block_sparse_moe.{gate, experts.{e}.{w1,w2,w3}}`,
//! or the fused `mlp.router` / `mlp.experts.gate_up_proj` / `down_proj` that transformers 5 writes).

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer, Wiring};
use crate::layers::moe::{ExpertNames, Experts, Router, RouterConfig, Scoring, SparseMoe};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn sixteen() -> usize {
    16
}

fn two() -> usize {
    2
}

fn jitter() -> f64 {
    0.01
}

#[derive(Debug, Clone, Deserialize)]
struct PhimoeConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "sixteen")]
    num_local_experts: usize,
    #[serde(default = "two")]
    num_experts_per_tok: usize,
    #[serde(default = "jitter")]
    router_jitter_noise: f64,
    #[serde(default)]
    lm_head_bias: bool,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    // LayerNorms, which read their epsilon from `rms_norm_eps`.
    let mapped = raw.renamed(&[("rms_norm_eps", "layer_norm_eps")]);
    let cfg: PhimoeConfig = mapped.parse()?;
    let defaults = Defaults { eps: 1e-5, layer_norm: true, max_positions: 4096 * 32, ..Defaults::LLAMA };
    let d = cfg.common.clone().resolve(&mapped, defaults)?;
    let router_cfg = RouterConfig {
        num_experts: cfg.num_local_experts,
        top_k: cfg.num_experts_per_tok,
        scoring: Scoring::SparseMixer { jitter_eps: cfg.router_jitter_noise },
        renormalize: false,
        renormalize_eps: 0.0,
        scaling: 1.0,
        group: None,
    };
    let fused = w.contains("model.layers.0.mlp.router.weight");
    let (moe, gate, names) = match fused {
        true => ("mlp", "mlp.router", ExpertNames::HF),
        false => ("block_sparse_moe", "block_sparse_moe.gate", ExpertNames::MIXTRAL),
    };
    let inter = d.intermediate(raw)?;
    let blocks = d.blocks(w, |_, l| {
        let mut attn = d.attention(&l.at("self_attn"), d.attention_bias, d.attention_bias)?;
        attn.params.sliding_window = d.sliding_window;
        let mlp = ChannelMixer::Moe(Box::new(SparseMoe {
            router: Router::load(w, &l.name(gate), d.hidden, router_cfg.clone(), false)?,
            experts: Experts::load(w, &l.name(moe), cfg.num_local_experts, d.hidden, inter, d.act, names)?,
            shared: None,
        }));
        Ok(Block {
            attn_norm: Some(Norm::Layer(d.layer_norm(l, "input_layernorm", true)?)),
            mixer: TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
            attn_out_norm: None,
            mlp_norm: Some(Norm::Layer(d.layer_norm(l, "post_attention_layernorm", true)?)),
            mlp,
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        })
    })?;
    let params = RopeParameters::from_config(raw, 10000.0)?;
    let mut rope = Rope::new(&params, d.head_dim, d.max_positions, raw)?;
    if params.kind() == "longrope" {
        let mscale = |key: &str| -> Result<f32> {
            let obj = raw.value.get("rope_parameters").or_else(|| raw.value.get("rope_scaling"));
            obj.and_then(|o| o.get(key)).and_then(Value::as_f64).map(|v| v as f32).ok_or_else(|| {
                raw.error(format!("LongRoPE needs `rope_parameters.{key}` (PhiMoE scales cos/sin by it)"))
            })
        };
        rope = rope.with_phimoe_mscales(mscale("short_mscale")?, mscale("long_mscale")?);
    } else if params.kind() != "default" {
        return Err(raw.error(format!("unsupported rope type `{}` (PhiMoE: default or longrope)", params.kind())));
    }
    let names = Names { lm_head_bias: cfg.lm_head_bias, ..Names::LLAMA };
    let final_norm = Norm::Layer(d.layer_norm(&w.at("model"), "norm", true)?);
    d.finish_at(raw, w, names, blocks, Some(final_norm), vec![rope])
}
