//! Qwen2 (`Qwen2ForCausalLM`): the Llama decoder with biased q/k/v projections and Qwen's
//! `use_sliding_window` / `max_window_layers` rule.

use super::llama::{LlamaModel, Variant, WindowRule};
use crate::config::RawConfig;
use crate::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<LlamaModel> {
    LlamaModel::load(raw, w, Variant { qkv_bias: true, qk_norm: false, window: WindowRule::FromMaxWindowLayers })
}
