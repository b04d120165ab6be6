//! Qwen3 (`Qwen3ForCausalLM`): the Llama decoder with per-head RMSNorm on queries and keys
//! (QK-norm) and an explicit `head_dim`.

use super::llama::{LlamaModel, Variant, WindowRule};
use crate::config::RawConfig;
use crate::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<LlamaModel> {
    LlamaModel::load(raw, w, Variant { qkv_bias: false, qk_norm: true, window: WindowRule::FromMaxWindowLayers })
}
