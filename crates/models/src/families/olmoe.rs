//! OLMoE (`OlmoeForCausalLM`): the Mixtral decoder with QK-norm over the full q and k width
//! (one RMSNorm across all heads, before the split into heads), experts of
//! `intermediate_size`, top-k weights renormalised when `norm_topk_prob`, no sliding window.

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
    qk_norm: QkNorm::FullWidth,
    window: WindowRule::None,
    shared_expert: false,
    moe_width_key: false,
};

pub fn load(raw: &RawConfig, w: &Weights) -> Result<MoeDecoder> {
    MoeDecoder::load(raw, w, VARIANT)
}
