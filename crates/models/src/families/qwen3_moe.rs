//! Qwen3-MoE (`Qwen3MoeForCausalLM`): the Mixtral decoder with per-head QK-norm, experts of
//! `moe_intermediate_size` without a shared expert, top-k weights renormalised when
//! `norm_topk_prob`, and dense layers where `mlp_only_layers` / `decoder_sparse_step` say.

use super::mixtral::{MoeDecoder, MoeVariant, QkNorm, WindowRule};
use crate::config::RawConfig;
use crate::moe::ExpertNames;
use crate::weights::Weights;
use crate::Result;

pub const VARIANT: MoeVariant = MoeVariant {
    moe_prefix: "mlp",
    expert_names: ExpertNames::HF,
    always_renormalize: false,
    default_qkv_bias: false,
    qk_norm: QkNorm::PerHead,
    window: WindowRule::AllLayersIfEnabled,
    shared_expert: false,
    moe_width_key: true,
};

pub fn load(raw: &RawConfig, w: &Weights) -> Result<MoeDecoder> {
    MoeDecoder::load(raw, w, VARIANT)
}
