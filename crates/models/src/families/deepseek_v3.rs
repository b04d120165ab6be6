//! DeepSeek-V3 (`DeepseekV3ForCausalLM`): the DeepSeek-V2 decoder (multi-head latent attention,
//! routed + shared experts after `first_k_dense_replace` dense layers) with V3's `noaux_tc`
//! router: sigmoid scores, `e_score_correction_bias` steering the choice, top-`topk_group` of
//! `n_group` expert groups, `norm_topk_prob` and `routed_scaling_factor`.

use super::deepseek_v2::{DeepseekModel, DeepseekVariant};
use crate::config::RawConfig;
use crate::mla::MlaCacheMode;
use crate::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<DeepseekModel> {
    DeepseekModel::load(raw, w, DeepseekVariant::V3, MlaCacheMode::default())
}
