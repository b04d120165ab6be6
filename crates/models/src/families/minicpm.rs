//! MiniCPM (`MiniCPMForCausalLM`, remote code, dense): the Llama computation under Llama's names
//! with Granite's four scalars under MiniCPM's keys — embeddings times `scale_emb`, each branch
//! times `scale_depth / sqrt(num_hidden_layers)` before it joins the residual, and the final hidden
//! state divided by `hidden_size / dim_model_base` before the LM head (applied to the logits here,
//! which the head maps linearly); attention keeps `head_dim^-0.5`. The remote config class
//! defaults each scalar to 1 and ties the LM head. MiniCPM-MoE (`num_experts`) is not supported.

use serde::Deserialize;

use super::granite::{self, Multipliers};
use crate::decoder::load::{CommonConfig, Defaults};
use crate::decoder::Decoder;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
struct MiniCpmConfig {
    #[serde(flatten)]
    common: CommonConfig,
    #[serde(default = "one")]
    scale_emb: f64,
    #[serde(default = "one")]
    scale_depth: f64,
    #[serde(default = "one")]
    dim_model_base: f64,
    #[serde(default)]
    num_experts: usize,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    let cfg: MiniCpmConfig = raw.parse()?;
    if cfg.num_experts > 0 {
        return Err(raw.error(format!("`num_experts` {}: MiniCPM-MoE is not supported", cfg.num_experts)));
    }
    if cfg.dim_model_base <= 0.0 {
        return Err(raw.error("`dim_model_base` must be positive"));
    }
    // The remote model sizes its heads as hidden / heads, whatever else the config says.
    let common = CommonConfig { head_dim: None, ..cfg.common };
    let heads = common.num_attention_heads.max(1);
    let m = Multipliers {
        embedding: cfg.scale_emb,
        residual: cfg.scale_depth / (common.num_hidden_layers as f64).sqrt(),
        attention: ((common.hidden_size / heads) as f64).powf(-0.5),
        logits_scaling: common.hidden_size as f64 / cfg.dim_model_base,
    };
    granite::load_scaled(raw, w, &common, Defaults { tie: true, ..Defaults::LLAMA }, m)
}
