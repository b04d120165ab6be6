//! Qwen3-VL (`Qwen3VLForConditionalGeneration`): a ViT over 16x16x2 pixel patches with learned
//! absolute positions (a square grid resampled bilinearly to each image's patch grid) besides the
//! 2-D rotary embedding, LayerNorm + GELU(tanh) blocks, a merger into the text model's width, and
//! DeepStack: after some of its blocks a merger of their output makes a feature that the first
//! decoder layers add to the image tokens' hidden states. The text model is Qwen3's (QK-norm)
//! with MRoPE's frequencies interleaved over the three axes; Qwen3-VL-MoE's is Qwen3-MoE's.
//! Qwen3.5 (`Qwen3_5ForConditionalGeneration`, `Qwen3_5MoeForConditionalGeneration`) puts the same
//! tower, without DeepStack, before its Gated DeltaNet hybrid text model.
//!
//! Videos: the processor writes each temporal patch as its timestamp text (`<1.5 seconds>`) and
//! its own vision start, placeholders and vision end, so the patches' positions come from their
//! runs ([`VideoTime::Timestamps`]) and not from a temporal index.

use serde::Deserialize;
use serde_json::Value;

use crate::decoder::load::{activation, check_dims};
use crate::families::qwen2_vl::{
    Merger, PatchShape, PositionGrid, QwenVl, TextModel, VideoTime, VisionBlock, VisionTower,
};
use crate::layers::Norm;
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

/// Qwen3VLVisionConfig, with its defaults. `hidden_size` is the tower's width, `out_hidden_size`
/// the text model's.
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
    out_hidden_size: usize,
    num_position_embeddings: usize,
    deepstack_visual_indexes: Vec<usize>,
    rope_parameters: Option<Value>,
}

impl Default for VisionConfig {
    fn default() -> VisionConfig {
        VisionConfig {
            depth: 27,
            hidden_size: 1152,
            hidden_act: "gelu_pytorch_tanh".into(),
            intermediate_size: 4304,
            num_heads: 16,
            in_channels: 3,
            patch_size: 16,
            spatial_merge_size: 2,
            temporal_patch_size: 2,
            out_hidden_size: 3584,
            num_position_embeddings: 2304,
            deepstack_visual_indexes: vec![8, 16, 24],
            rope_parameters: None,
        }
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<QwenVl> {
    QwenVl::assemble(raw, w, TextModel::Qwen3, load_vision)
}

/// Qwen3-VL-MoE (`Qwen3VLMoeForConditionalGeneration`): the same tower before a Qwen3-MoE text
/// model.
pub fn load_moe(raw: &RawConfig, w: &Weights) -> Result<QwenVl> {
    QwenVl::assemble(raw, w, TextModel::Qwen3Moe, load_vision)
}

/// Qwen3.5 with images (`Qwen3_5ForConditionalGeneration`, `Qwen3_5MoeForConditionalGeneration`):
/// Qwen3-VL's tower without DeepStack before Qwen3.5's hybrid text model.
pub fn load_qwen3_5(raw: &RawConfig, w: &Weights, variant: crate::families::qwen3_next::Variant) -> Result<QwenVl> {
    QwenVl::assemble(raw, w, TextModel::Qwen3_5(variant), |raw, cfg: &VisionConfig, v, text_hidden| {
        let cfg = VisionConfig { deepstack_visual_indexes: Vec::new(), ..cfg.clone() };
        load_vision(raw, &cfg, v, text_hidden)
    })
}

fn load_vision(raw: &RawConfig, cfg: &VisionConfig, v: &Scope, text_hidden: usize) -> Result<VisionTower> {
    let (e, inter, merge) = (cfg.hidden_size, cfg.intermediate_size, cfg.spatial_merge_size);
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
            ("vision_config.spatial_merge_size", merge),
            ("vision_config.num_position_embeddings", cfg.num_position_embeddings),
        ],
    )?;
    if cfg.out_hidden_size != text_hidden {
        return Err(raw.error(format!(
            "vision_config.out_hidden_size {} differs from the text model's hidden size {text_hidden}",
            cfg.out_hidden_size
        )));
    }
    let side = (cfg.num_position_embeddings as f64).sqrt() as usize;
    if side * side != cfg.num_position_embeddings {
        return Err(raw.error(format!(
            "vision_config.num_position_embeddings {} is not a square grid",
            cfg.num_position_embeddings
        )));
    }
    if let Some(&bad) = cfg.deepstack_visual_indexes.iter().find(|&&i| i >= cfg.depth) {
        return Err(raw.error(format!(
            "vision_config.deepstack_visual_indexes names block {bad} of a {}-block tower",
            cfg.depth
        )));
    }
    let act = activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?;
    let eps = 1e-6;
    let blocks = VisionBlock::layer_norm_blocks(v, cfg.depth, e, inter, act, ["mlp.linear_fc1", "mlp.linear_fc2"])?;
    let merged = e * merge * merge;
    let merger = |scope: &Scope, norm_after_merge: bool| -> Result<Merger> {
        let norm_width = if norm_after_merge { merged } else { e };
        Ok(Merger {
            norm: Norm::Layer(scope.layer_norm("norm", norm_width, eps, true)?),
            norm_after_merge,
            fc1: scope.linear("linear_fc1", merged, merged, true)?,
            fc2: scope.linear("linear_fc2", merged, text_hidden, true)?,
        })
    };
    let shape = PatchShape {
        in_channels: cfg.in_channels,
        temporal: cfg.temporal_patch_size,
        side: cfg.patch_size,
        merge,
        bias: true,
    };
    let final_merger = merger(&v.at("merger"), false)?;
    let rope = cfg.rope_parameters.as_ref();
    let mut tower = VisionTower::load(raw, v, shape, e, cfg.num_heads, rope, blocks, None, final_merger)?;
    tower.deepstack = cfg
        .deepstack_visual_indexes
        .iter()
        .enumerate()
        .map(|(k, &block)| Ok((block, merger(&v.at(&format!("deepstack_merger_list.{k}")), true)?)))
        .collect::<Result<_>>()?;
    let table = v.weights().get(&v.name("pos_embed.weight"), &[cfg.num_position_embeddings, e])?;
    tower.positions = Some(PositionGrid { table: table.to_f32_vec(), side });
    tower.video_time = Some(VideoTime::Timestamps);
    Ok(tower)
}
