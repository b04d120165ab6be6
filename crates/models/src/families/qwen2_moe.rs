//! Qwen2-MoE (`Qwen2MoeForCausalLM`): the Mixtral decoder with biased q/k/v, experts of
//! `moe_intermediate_size`, a shared expert behind a sigmoid `shared_expert_gate`, top-k weights
//! renormalised only when `norm_topk_prob`, dense layers where `mlp_only_layers` /
//! `decoder_sparse_step` say, and Qwen2's sliding-window layer rule.

use super::mixtral::{MoeDecoder, MoeVariant, QkNorm, WindowRule};
use crate::config::RawConfig;
use crate::moe::ExpertNames;
use crate::weights::Weights;
use crate::Result;

pub const VARIANT: MoeVariant = MoeVariant {
    moe_prefix: "mlp",
    expert_names: ExpertNames::HF,
    always_renormalize: false,
    default_qkv_bias: true,
    qk_norm: QkNorm::None,
    window: WindowRule::Qwen2Moe,
    shared_expert: true,
    moe_width_key: true,
};

pub fn load(raw: &RawConfig, w: &Weights) -> Result<MoeDecoder> {
    MoeDecoder::load(raw, w, VARIANT)
}
