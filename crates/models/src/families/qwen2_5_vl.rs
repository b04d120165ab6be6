//! Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`): Qwen2-VL's text decoder and MRoPE, with a
//! vision tower of RMSNorm + SwiGLU blocks that attend within windows of merged tokens
//! (`window_size` pixels a side), except the `fullatt_block_indexes` blocks, which see the
//! whole frame; the merger normalises with RMSNorm. A video's temporal positions count
//! `tokens_per_second` per second of video.
//!
//! Both checkpoint layouts load (transformers 5's `model.visual.*` / `model.language_model.*`,
//! and the Hub's `visual.*` / `model.*`), as for Qwen2-VL.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{activation, check_dims};
use crate::decoder::ChannelMixer;
use crate::families::qwen2_vl::{Merger, PatchShape, QwenVl, TextModel, VideoTime, VisionBlock, VisionTower, Windows};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

/// Qwen2_5_VLVisionConfig, with its defaults (the 7B model's tower). `hidden_size` is the
/// tower's own width here; `out_hidden_size` is the text model's.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct VisionConfig {
    depth: usize,
    hidden_size: usize,
    hidden_act: String,
    intermediate_size: usize,
    num_heads: usize,
    in_channels: usize,
    patch_size: usize,
    spatial_merge_size: usize,
    temporal_patch_size: usize,
    window_size: usize,
    out_hidden_size: usize,
    fullatt_block_indexes: Vec<usize>,
    /// Temporal rotary positions per second of video.
    tokens_per_second: f64,
    rope_parameters: Option<Value>,
}

impl Default for VisionConfig {
    fn default() -> VisionConfig {
        VisionConfig {
            depth: 32,
            hidden_size: 3584,
            hidden_act: "silu".into(),
            intermediate_size: 3420,
            num_heads: 16,
            in_channels: 3,
            patch_size: 14,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            window_size: 112,
            out_hidden_size: 3584,
            fullatt_block_indexes: vec![7, 15, 23, 31],
            tokens_per_second: 4.0,
            rope_parameters: None,
        }
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<QwenVl> {
    QwenVl::assemble(raw, w, TextModel::Qwen2, load_vision)
}

fn load_vision(raw: &RawConfig, cfg: &VisionConfig, v: &Scope, text_hidden: usize) -> Result<VisionTower> {
    let (e, inter) = (cfg.hidden_size, cfg.intermediate_size);
    check_dims(
        raw,
        &[
            ("vision_config.depth", cfg.depth),
            ("vision_config.hidden_size", e),
            ("vision_config.intermediate_size", inter),
            ("vision_config.num_heads", cfg.num_heads),
            ("vision_config.patch_size", cfg.patch_size),
            ("vision_config.temporal_patch_size", cfg.temporal_patch_size),
            ("vision_config.in_channels", cfg.in_channels),
            ("vision_config.spatial_merge_size", cfg.spatial_merge_size),
        ],
    )?;
    if cfg.out_hidden_size != text_hidden {
        return Err(raw.error(format!(
            "vision_config.out_hidden_size {} differs from the text model's hidden size {text_hidden}",
            cfg.out_hidden_size
        )));
    }
    // A window is `window_size` pixels a side, counted in merged tokens.
    let side = cfg.window_size / cfg.spatial_merge_size / cfg.patch_size;
    if side == 0 {
        return Err(raw.error(format!(
            "vision_config.window_size {} is smaller than one merged token ({} pixels)",
            cfg.window_size,
            cfg.spatial_merge_size * cfg.patch_size
        )));
    }
    if let Some(&bad) = cfg.fullatt_block_indexes.iter().find(|&&i| i >= cfg.depth) {
        return Err(
            raw.error(format!("vision_config.fullatt_block_indexes names block {bad} of a {}-block tower", cfg.depth))
        );
    }
    let act = activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?;
    let eps = 1e-6;
    let blocks = (0..cfg.depth)
        .map(|i| {
            let b = v.at(&format!("blocks.{i}"));
            Ok(VisionBlock {
                norm1: Norm::Rms(b.rms("norm1", e, eps)?),
                qkv: b.linear("attn.qkv", e, 3 * e, true)?,
                proj: b.linear("attn.proj", e, e, true)?,
                norm2: Norm::Rms(b.rms("norm2", e, eps)?),
                mlp: ChannelMixer::Gated(b.gated_mlp("mlp", e, inter, act, true)?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let shape = PatchShape {
        in_channels: cfg.in_channels,
        temporal: cfg.temporal_patch_size,
        side: cfg.patch_size,
        merge: cfg.spatial_merge_size,
        bias: false,
    };
    let windows = Windows { side, full_attention_blocks: cfg.fullatt_block_indexes.clone() };
    let merger = Merger::qwen2(v, Norm::Rms(v.rms("merger.ln_q", e, eps)?), e, shape.merge, text_hidden)?;
    let rope = cfg.rope_parameters.as_ref();
    let mut tower = VisionTower::load(raw, v, shape, e, cfg.num_heads, rope, blocks, Some(windows), merger)?;
    tower.video_time = Some(VideoTime::Seconds { tokens_per_second: cfg.tokens_per_second as f32 });
    Ok(tower)
}
