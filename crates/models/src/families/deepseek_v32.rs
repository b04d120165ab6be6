//! DeepSeek-V3.2 (`DeepseekV32ForCausalLM`): DeepSeek-V3 with DeepSeek Sparse Attention. Every
//! layer's lightning indexer picks `index_topk` keys per query and MLA attends to those alone
//! ([`crate::layers::dsa`]). The decoder is [`DeepseekVariant::V32`] of
//! [`crate::families::deepseek_v2`]; besides the indexer it differs from V3 as transformers'
//! DeepseekV32 does: MLA's rope is always interleaved (`rope_interleave` is not read), queries
//! always come through the q LoRA (`q_lora_rank` required), and absent keys take
//! DeepseekV32Config's defaults (`first_k_dense_replace` 3, `n_shared_experts` 1,
//! `routed_scaling_factor` 2.5, `n_group` 8, `topk_group` 4), with `mlp_layer_types`, where
//! given, naming each layer dense or sparse. The released checkpoints' config spells the
//! indexer `index_n_heads`, `index_head_dim` and `index_topk`, as transformers does.

use crate::decoder::load::check_dims;
use crate::decoder::Decoder;
use crate::families::deepseek_v2::{self, DeepseekVariant};
use crate::layers::dsa::IndexerDims;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

/// The indexer's shape (transformers' defaults: 64 heads of 128, 2048 keys kept), checked.
pub fn indexer_dims(raw: &RawConfig, qk_rope_head_dim: usize) -> Result<IndexerDims> {
    let dims = IndexerDims {
        heads: raw.count_or("index_n_heads", 64)?,
        head_dim: raw.count_or("index_head_dim", 128)?,
        rope_dim: qk_rope_head_dim,
        topk: raw.count_or("index_topk", 2048)?,
    };
    check_dims(
        raw,
        &[
            ("index_n_heads", dims.heads),
            ("index_head_dim", dims.head_dim),
            ("index_n_heads * index_head_dim", dims.heads.saturating_mul(dims.head_dim)),
        ],
    )?;
    if dims.topk == 0 {
        return Err(raw.error("`index_topk` is 0: every query must keep at least one key"));
    }
    if dims.head_dim < qk_rope_head_dim {
        return Err(raw.error(format!(
            "`index_head_dim` {} is less than `qk_rope_head_dim` {qk_rope_head_dim}, the dims of each indexer \
             head the rotary embedding turns",
            dims.head_dim
        )));
    }
    Ok(dims)
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    deepseek_v2::load(raw, w, DeepseekVariant::V32)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn raw(value: Value) -> RawConfig {
        RawConfig { path: "config.json".into(), value }
    }

    #[test]
    fn indexer_keys_default_as_transformers_and_bad_ones_are_named() {
        let d = indexer_dims(&raw(json!({})), 64).unwrap();
        assert_eq!((d.heads, d.head_dim, d.rope_dim, d.topk), (64, 128, 64, 2048));
        for (config, key) in [
            (json!({"index_topk": 0}), "index_topk"),
            (json!({"index_topk": -1}), "index_topk"),
            (json!({"index_n_heads": "x"}), "index_n_heads"),
            (json!({"index_n_heads": 0}), "index_n_heads"),
            (json!({"index_head_dim": 4}), "index_head_dim"),
            (json!({"index_head_dim": 1u64 << 40}), "index_head_dim"),
        ] {
            let err = indexer_dims(&raw(config.clone()), 8).unwrap_err().to_string();
            assert!(err.contains(key), "{config}: {err}");
        }
    }
}
