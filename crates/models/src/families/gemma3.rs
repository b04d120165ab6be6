//! Gemma 3 text (`Gemma3ForCausalLM`, `model_type: gemma3_text`): the Gemma 2 block with per-head
//! `(1 + w)` RMSNorm on queries and keys, separate rotary bases for local (sliding) and global
//! layers (`rope_parameters.{sliding_attention,full_attention}`, or the legacy
//! `rope_local_base_freq` / `rope_theta`), the sliding pattern from `layer_types` (legacy:
//! every `sliding_window_pattern`-th layer is global), and final-logit softcapping only where the
//! config sets it. transformers 5.24 defines `attn_logit_softcapping` for Gemma 3 but never passes
//! it to attention, so it is ignored here too.
//!
//! Checkpoint names: Gemma 2's plus `model.layers.{i}.self_attn.{q,k}_norm`.

use super::gemma2::{load_sandwich_at, Sandwich};
use crate::decoder::Decoder;
use crate::layers::rope::{Rope, RopeParameters};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::Result;

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Decoder> {
    load_at(raw, w, "model", "lm_head")
}

/// The text model with its layers, embedding and final norm under `prefix` and its LM head at
/// `lm_head` (Gemma 3's vision-language checkpoints).
pub fn load_at(raw: &RawConfig, w: &Weights, prefix: &str, lm_head: &str) -> Result<Decoder> {
    let opts = Sandwich {
        qk_norm: true,
        ropes: |raw, head_dim, max_pos| {
            let [local, global] = RopeParameters::sliding_and_full(raw, 10_000.0, 1_000_000.0)?;
            Ok(vec![Rope::new(&local, head_dim, max_pos, raw)?, Rope::new(&global, head_dim, max_pos, raw)?])
        },
        rope_of: |sliding| if sliding { 0 } else { 1 },
        attn_softcap: None,
        final_softcap: raw.f64_or("final_logit_softcapping", None),
        sliding_window: raw.f64_or("sliding_window", Some(4096.0)).map(|v| v as usize),
        default_sliding: |i, raw| {
            let pattern = raw.value.get("sliding_window_pattern").and_then(|v| v.as_u64()).unwrap_or(6) as usize;
            (i + 1) % pattern.max(1) != 0
        },
        default_max_positions: 131_072,
    };
    load_sandwich_at(raw, w, opts, prefix, lm_head)
}
