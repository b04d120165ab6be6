//! Qwen2-VL (`Qwen2VLForConditionalGeneration`): a ViT over 14x14x2 pixel patches (2-D rotary
//! embeddings, full attention within each image, LayerNorm + quick-GELU MLP blocks) whose
//! outputs are merged 2x2 into the text model's width, then a Qwen2 decoder whose rotary
//! embedding is MRoPE: each frequency band turns with a token's temporal, height or width
//! position, and an image's tokens are placed on its patch grid.
//!
//! Both checkpoint layouts load: transformers 5 (`text_config`, `model.language_model.*`,
//! `model.visual.*`) and the one the Hub's Qwen2-VL checkpoints were saved in (text keys at the
//! top level, `model.*`, `visual.*`).

use serde::Deserialize;
use serde_json::Value;

use ferrite_tensor::{ops, Activation, AttentionParams, DType, Device, RopeStyle, Tensor};

use crate::decoder::load::{activation, attention_params, check_dims, CommonConfig, Defaults, Names};
use crate::decoder::{Block, ChannelMixer, Decoder, SelfAttention, TokenMixer};
use crate::families::mixtral::MoeVariant;
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{DenseMlp, Linear, Norm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::model::{
    image_input_error, pixel_input, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder, VisionInfo, Visual,
    VisualGrid,
};
use crate::Result;

/// The text decoder of a Qwen vision-language model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextModel {
    /// Qwen2's (Qwen2-VL, Qwen2.5-VL): biased QKV, heads of `hidden_size / num_attention_heads`,
    /// MRoPE sections in turn.
    Qwen2,
    /// Qwen3's (Qwen3-VL): QK-norm, the config's `head_dim`, MRoPE sections interleaved.
    Qwen3,
    /// Qwen3-MoE's (Qwen3-VL-MoE): Qwen3's with sparse expert layers.
    Qwen3Moe,
    /// Qwen3.5's hybrid (Gated DeltaNet and gated attention layers), dense or MoE, its attention
    /// layers' MRoPE interleaved as Qwen3-VL's.
    Qwen3_5(crate::families::qwen3_next::Variant),
}

impl TextModel {
    /// The config class's defaults where they differ from Llama's, and its rope base.
    fn defaults(self) -> (Defaults, f64) {
        match self {
            TextModel::Qwen2 => (Defaults { eps: 1e-5, max_positions: 32768, ..Defaults::LLAMA }, 1_000_000.0),
            TextModel::Qwen3 => {
                (Defaults { max_positions: 128_000, head_dim: Some(128), ..Defaults::LLAMA }, 500_000.0)
            }
            TextModel::Qwen3Moe | TextModel::Qwen3_5(_) => {
                (Defaults { max_positions: 128_000, ..Defaults::LLAMA }, 500_000.0)
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
struct TextConfig {
    #[serde(flatten)]
    common: CommonConfig,
    use_sliding_window: Option<bool>,
    max_window_layers: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
struct VisionConfig {
    #[serde(default = "defaults::depth")]
    depth: usize,
    #[serde(default = "defaults::embed_dim")]
    embed_dim: usize,
    /// The text model's width, which the merger projects to.
    #[serde(default = "defaults::hidden_size")]
    hidden_size: usize,
    #[serde(default = "defaults::hidden_act")]
    hidden_act: String,
    #[serde(default = "defaults::mlp_ratio")]
    mlp_ratio: f64,
    #[serde(default = "defaults::num_heads")]
    num_heads: usize,
    #[serde(default = "defaults::in_channels")]
    in_channels: usize,
    #[serde(default = "defaults::patch_size")]
    patch_size: usize,
    #[serde(default = "defaults::spatial_merge_size")]
    spatial_merge_size: usize,
    #[serde(default = "defaults::temporal_patch_size")]
    temporal_patch_size: usize,
    rope_parameters: Option<Value>,
}

/// Qwen2VLVisionConfig's defaults (the 7B model's tower).
mod defaults {
    pub fn depth() -> usize {
        32
    }
    pub fn embed_dim() -> usize {
        1280
    }
    pub fn hidden_size() -> usize {
        3584
    }
    pub fn hidden_act() -> String {
        "quick_gelu".into()
    }
    pub fn mlp_ratio() -> f64 {
        4.0
    }
    pub fn num_heads() -> usize {
        16
    }
    pub fn in_channels() -> usize {
        3
    }
    pub fn patch_size() -> usize {
        14
    }
    pub fn spatial_merge_size() -> usize {
        2
    }
    pub fn temporal_patch_size() -> usize {
        2
    }
}

pub(crate) struct VisionBlock {
    pub norm1: Norm,
    pub qkv: Linear,
    pub proj: Linear,
    pub norm2: Norm,
    pub mlp: ChannelMixer,
}

impl VisionBlock {
    /// `depth` blocks of LayerNorms (eps 1e-6) and a two-layer MLP whose layers `fc_names` names
    /// (Qwen2-VL's and Qwen3-VL's towers).
    pub(crate) fn layer_norm_blocks(
        v: &Scope,
        depth: usize,
        width: usize,
        mlp_width: usize,
        act: Activation,
        [fc1, fc2]: [&str; 2],
    ) -> Result<Vec<VisionBlock>> {
        let (e, eps) = (width, 1e-6);
        (0..depth)
            .map(|i| {
                let b = v.at(&format!("blocks.{i}"));
                Ok(VisionBlock {
                    norm1: Norm::Layer(b.layer_norm("norm1", e, eps, true)?),
                    qkv: b.linear("attn.qkv", e, 3 * e, true)?,
                    proj: b.linear("attn.proj", e, e, true)?,
                    norm2: Norm::Layer(b.layer_norm("norm2", e, eps, true)?),
                    mlp: ChannelMixer::Dense(DenseMlp {
                        fc1: b.linear(fc1, e, mlp_width, true)?,
                        fc2: b.linear(fc2, mlp_width, e, true)?,
                        act: act.into(),
                    }),
                })
            })
            .collect()
    }
}

/// Qwen2.5-VL's windowed attention: most blocks attend within square windows of merged tokens,
/// the blocks listed attend over the whole frame.
pub(crate) struct Windows {
    /// A window's side, in merged tokens.
    pub side: usize,
    pub full_attention_blocks: Vec<usize>,
}

/// Merges each `merge x merge` block of patches into one row of the text model's width.
pub(crate) struct Merger {
    pub norm: Norm,
    /// The norm runs over a merged row (Qwen3-VL's DeepStack mergers), else over each patch.
    pub norm_after_merge: bool,
    pub fc1: Linear,
    pub fc2: Linear,
}

impl Merger {
    fn forward(&self, x: &Tensor, unit: usize) -> Result<Tensor> {
        let merged_width = unit * x.last_dim();
        let merged = if self.norm_after_merge {
            self.norm.forward(&x.reshape(&[x.rows() / unit, merged_width])?)?
        } else {
            self.norm.forward(x)?.reshape(&[x.rows() / unit, merged_width])?
        };
        let hidden = ops::activation(&self.fc1.forward(&merged)?, Activation::Gelu)?;
        self.fc2.forward(&hidden)
    }

    fn weight_bytes(&self) -> usize {
        self.fc1.size_in_bytes() + self.fc2.size_in_bytes()
    }

    /// Qwen2-VL's and Qwen2.5-VL's `merger`: `norm` (`merger.ln_q`) over each patch, then the
    /// `merger.mlp.0` / `merger.mlp.2` MLP from `merge^2` patches of `width` to `out`.
    pub(crate) fn qwen2(v: &Scope, norm: Norm, width: usize, merge: usize, out: usize) -> Result<Merger> {
        let merged = width * merge * merge;
        Ok(Merger {
            norm,
            norm_after_merge: false,
            fc1: v.linear("merger.mlp.0", merged, merged, true)?,
            fc2: v.linear("merger.mlp.2", merged, out, true)?,
        })
    }
}

/// Qwen3-VL's learned absolute positions: a square grid of embeddings resampled (bilinear,
/// corners aligned) to each image's patch grid.
pub(crate) struct PositionGrid {
    /// `[side * side, width]`, row-major, f32 on the host: the resampling runs there.
    pub table: Vec<f32>,
    pub side: usize,
}

impl PositionGrid {
    /// transformers' `get_vision_interpolation_indices_and_weights` (bilinear, `align_corners`)
    /// and the weighted sum of the four taps, for patches at `positions` of an `h x w` grid, in
    /// f32 as torch computes them.
    fn embeddings(&self, positions: &[[usize; 2]], [h, w]: [usize; 2]) -> Vec<f32> {
        let width = self.table.len() / (self.side * self.side);
        let last = (self.side - 1) as f32;
        let taps = |index: usize, size: usize| {
            let src = index as f32 * last / (size.max(2) - 1) as f32;
            let floor = src.floor();
            let low = floor as usize;
            let weights = [(1.0 - (src - floor)).max(0.0), (1.0 - (src - floor - 1.0).abs()).max(0.0)];
            ([low.min(self.side - 1), (low + 1).min(self.side - 1)], weights)
        };
        let mut out = Vec::with_capacity(positions.len() * width);
        for &[row, col] in positions {
            let ((rows, row_weights), (cols, col_weights)) = (taps(row, h), taps(col, w));
            let start = out.len();
            out.resize(start + width, 0.0);
            for (r, rw) in rows.iter().zip(row_weights) {
                for (c, cw) in cols.iter().zip(col_weights) {
                    let weight = rw * cw;
                    let entry = &self.table[(r * self.side + c) * width..][..width];
                    for (o, &v) in out[start..].iter_mut().zip(entry) {
                        *o += v * weight;
                    }
                }
            }
        }
        out
    }
}

/// The vision tower, its mergers, and what the prompt side needs to know about it.
pub(crate) struct VisionTower {
    patch_embed: Linear,
    /// Learned absolute positions added to the patch embeddings (Qwen3-VL).
    pub positions: Option<PositionGrid>,
    blocks: Vec<VisionBlock>,
    attention: AttentionParams,
    /// 2-D rotary inverse frequencies (`head_dim / 4` of them, shared by rows and columns).
    rope_inv_freq: Vec<f32>,
    windows: Option<Windows>,
    merger: Merger,
    /// DeepStack (Qwen3-VL): after each listed block, its merger's output is a feature the
    /// decoder's early layers add.
    pub deepstack: Vec<(usize, Merger)>,
    patch_dim: usize,
    embed_dim: usize,
    merge: usize,
    /// Pixels along a patch's side.
    patch_size: usize,
    /// How a video's time steps become temporal positions; `None` for a model served without
    /// video input.
    pub video_time: Option<VideoTime>,
}

/// How a video's temporal patches become temporal rotary positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VideoTime {
    /// One position per temporal patch (Qwen2-VL).
    Steps,
    /// `tokens_per_second` positions per second of video (Qwen2.5-VL's `tokens_per_second`).
    Seconds { tokens_per_second: f32 },
    /// Time is told by text: each temporal patch follows its timestamp in the prompt, in a
    /// placeholder run of its own, and sits on the grid as a one-step video would (Qwen3-VL's
    /// `get_rope_index` splits each video's grid into its steps).
    Timestamps,
}

/// The tokens that hold a prompt's images and videos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholders {
    pub image: u32,
    pub video: Option<u32>,
}

/// A Qwen vision-language model: the text decoder with its MRoPE, and the vision tower.
pub struct QwenVl {
    decoder: Decoder,
    vision: VisionTower,
    placeholders: Placeholders,
    /// The decoder's, with the vision half's prompt facts.
    info: ModelInfo,
}

/// Where a checkpoint keeps the text model and the vision tower.
struct Layout {
    text: &'static str,
    visual: &'static str,
}

impl Layout {
    fn of(w: &Weights) -> Layout {
        if w.contains("model.language_model.embed_tokens.weight") {
            Layout { text: "model.language_model", visual: "model.visual" }
        } else {
            Layout { text: "model", visual: "visual" }
        }
    }
}

/// The text model's config: `text_config` (transformers 5) or the top-level keys (the Hub's
/// checkpoints), with the top-level `architectures` and `tie_word_embeddings`.
fn text_config(raw: &RawConfig) -> RawConfig {
    let mut text = raw.value.get("text_config").filter(|t| t.is_object()).cloned().unwrap_or_else(|| raw.value.clone());
    let flag = |v: &Value| v.get("tie_word_embeddings").and_then(Value::as_bool);
    // transformers ties by the top-level config's flag (the model class's), which a
    // `text_config` may not repeat.
    let tie = flag(&raw.value).or(flag(&text)).unwrap_or(false);
    if let Some(obj) = text.as_object_mut() {
        obj.insert("tie_word_embeddings".into(), tie.into());
        if let Some(v) = raw.value.get("architectures") {
            obj.insert("architectures".into(), v.clone());
        }
    }
    RawConfig { path: raw.path.clone(), value: text }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<QwenVl> {
    QwenVl::assemble(raw, w, TextModel::Qwen2, load_vision)
}

impl QwenVl {
    /// The text decoder (either checkpoint layout) and the tower that `load_vision` loads from
    /// the checkpoint's vision scope, given the family's `vision_config` and the text width.
    pub(crate) fn assemble<C: serde::de::DeserializeOwned>(
        raw: &RawConfig,
        w: &Weights,
        text: TextModel,
        load_vision: fn(&RawConfig, &C, &Scope, usize) -> Result<VisionTower>,
    ) -> Result<QwenVl> {
        let layout = Layout::of(w);
        let decoder = match text {
            TextModel::Qwen3_5(variant) => hybrid_text(raw, w, variant)?,
            _ => load_text(&text_config(raw), w, &layout, text)?,
        };
        let vision_value = raw.value.get("vision_config").cloned().unwrap_or(Value::Object(Default::default()));
        let cfg: C = serde_json::from_value(vision_value).map_err(|e| raw.error(format!("vision_config: {e}")))?;
        let image = raw.image_token_id(151655)?;
        let text_hidden = decoder.embed.table.shape()[1];
        let vision = load_vision(raw, &cfg, &w.at(layout.visual), text_hidden)?;
        let video = match vision.video_time {
            Some(_) => {
                let id = raw.value.get("video_token_id").and_then(Value::as_u64).unwrap_or(151656);
                Some(u32::try_from(id).map_err(|_| raw.error(format!("video_token_id {id} is too large")))?)
            }
            None => None,
        };
        let mut info = decoder.info().clone();
        info.vision = Some(VisionInfo {
            image_token_id: image,
            video_token_id: video,
            spatial_merge_size: vision.merge,
            patch_size: vision.patch_size,
            placeholder: "<|vision_start|><|image_pad|><|vision_end|>",
            video_placeholder: video.map(|_| "<|vision_start|><|video_pad|><|vision_end|>"),
            bidirectional: false,
            anyres: None,
            video_runs_per_step: vision.video_time == Some(VideoTime::Timestamps),
            row_breaks: false,
        });
        info.weight_bytes += vision.weight_bytes();
        Ok(QwenVl { decoder, vision, placeholders: Placeholders { image, video }, info })
    }
}

/// Qwen3.5's text model (`model.language_model.*`, the config's `text_config`) with its rotary
/// embedding turning the (temporal, height, width) positions as Qwen3-VL interleaves them.
fn hybrid_text(raw: &RawConfig, w: &Weights, variant: crate::families::qwen3_next::Variant) -> Result<Decoder> {
    use crate::families::qwen3_next;
    let mut decoder = qwen3_next::load(raw, w, variant, qwen3_next::Layout::ConditionalGeneration)?;
    let text = raw.text_config()?;
    let sections = RopeParameters::from_config(&text, 10_000.0)?.mrope_section.unwrap_or_else(|| vec![11, 11, 10]);
    decoder.ropes = std::mem::take(&mut decoder.ropes)
        .into_iter()
        .map(|rope| rope.with_interleaved_mrope_sections(&sections, &text))
        .collect::<Result<_>>()?;
    Ok(decoder)
}

fn load_text(raw: &RawConfig, w: &Weights, layout: &Layout, text: TextModel) -> Result<Decoder> {
    let cfg: TextConfig = raw.parse()?;
    let (defaults, theta) = text.defaults();
    let mut d = cfg.common.resolve(raw, defaults)?;
    if text == TextModel::Qwen2 {
        // Qwen2VLAttention sizes its heads by `hidden_size / num_attention_heads`, whatever `head_dim` says.
        d.head_dim = d.hidden / d.heads;
    }
    let sliding = cfg.use_sliding_window.unwrap_or(false);
    let qkv_bias = match text {
        TextModel::Qwen2 => true,
        TextModel::Qwen3 | TextModel::Qwen3Moe | TextModel::Qwen3_5(_) => d.attention_bias,
    };
    let layers = format!("{}.layers", layout.text);
    let blocks = if text == TextModel::Qwen3Moe {
        crate::families::mixtral::moe_blocks(raw, w, &d, MoeVariant::QWEN3_VL_MOE, &layers)?
    } else {
        let inter = d.intermediate(raw)?;
        d.blocks_at(w, &layers, |i, l| {
            let attn_scope = l.at("self_attn");
            let mut attn = d.attention(&attn_scope, qkv_bias, text == TextModel::Qwen3 && d.attention_bias)?;
            if text == TextModel::Qwen3 {
                attn.q_norm = Some(attn_scope.rms("q_norm", d.head_dim, d.eps)?);
                attn.k_norm = Some(attn_scope.rms("k_norm", d.head_dim, d.eps)?);
            }
            let slides = match d.sliding(raw, i)? {
                Some(s) => s,
                None => sliding && i >= cfg.max_window_layers.unwrap_or(80),
            };
            attn.params.sliding_window = d.sliding_window.filter(|_| slides && sliding);
            Ok(Block::pre_norm(
                d.rms(l, "input_layernorm")?,
                TokenMixer::Attention(SelfAttention::new(attn, Some(0))),
                d.rms(l, "post_attention_layernorm")?,
                ChannelMixer::Gated(l.gated_mlp("mlp", d.hidden, inter, d.act, false)?),
            ))
        })?
    };
    let mut params = RopeParameters::from_config(raw, theta)?;
    // The Hub's configs spell MRoPE as a rope type; transformers reads it as the default rope.
    if params.kind() == "mrope" {
        params.rope_type = None;
    }
    let rope = Rope::new(&params, d.head_dim, d.max_positions, raw)?;
    let rope = match text {
        TextModel::Qwen2 => {
            let sections = params.mrope_section.clone().unwrap_or_else(|| vec![16, 24, 24]);
            rope.with_mrope_sections(&sections, raw)?
        }
        TextModel::Qwen3 | TextModel::Qwen3Moe | TextModel::Qwen3_5(_) => {
            let sections = params.mrope_section.clone().unwrap_or_else(|| vec![24, 20, 20]);
            rope.with_interleaved_mrope_sections(&sections, raw)?
        }
    };
    let norm = Norm::Rms(d.rms(&w.at(layout.text), "norm")?);
    let embed = format!("{}.embed_tokens", layout.text);
    let names = Names { layers: &layers, embed: &embed, embed_dim: None, lm_head: "lm_head", lm_head_bias: false };
    d.finish_at(raw, w, names, blocks, Some(norm), vec![rope])
}

fn load_vision(raw: &RawConfig, cfg: &VisionConfig, v: &Scope, text_hidden: usize) -> Result<VisionTower> {
    let e = cfg.embed_dim;
    let mlp = (e as f64 * cfg.mlp_ratio) as usize;
    check_dims(
        raw,
        &[
            ("vision_config.depth", cfg.depth),
            ("vision_config.embed_dim", e),
            ("vision_config.num_heads", cfg.num_heads),
            ("vision_config.patch_size", cfg.patch_size),
            ("vision_config.temporal_patch_size", cfg.temporal_patch_size),
            ("vision_config.in_channels", cfg.in_channels),
            ("vision_config.spatial_merge_size", cfg.spatial_merge_size),
            ("vision MLP width", mlp),
        ],
    )?;
    if cfg.hidden_size != text_hidden {
        return Err(raw.error(format!(
            "vision_config.hidden_size {} differs from the text model's hidden size {text_hidden}",
            cfg.hidden_size
        )));
    }
    let act = activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?;
    let eps = 1e-6;
    let blocks = VisionBlock::layer_norm_blocks(v, cfg.depth, e, mlp, act, ["mlp.fc1", "mlp.fc2"])?;
    let shape = PatchShape {
        in_channels: cfg.in_channels,
        temporal: cfg.temporal_patch_size,
        side: cfg.patch_size,
        merge: cfg.spatial_merge_size,
        bias: false,
    };
    let merger =
        Merger::qwen2(v, Norm::Layer(v.layer_norm("merger.ln_q", e, eps, true)?), e, shape.merge, text_hidden)?;
    VisionTower::load(raw, v, shape, e, cfg.num_heads, cfg.rope_parameters.as_ref(), blocks, None, merger)
}

/// The vision tower's patch geometry, and whether its patch embedding has a bias.
pub(crate) struct PatchShape {
    pub in_channels: usize,
    pub temporal: usize,
    pub side: usize,
    pub merge: usize,
    pub bias: bool,
}

impl VisionTower {
    /// The patch embedding and rotary frequencies, around the family's `blocks` and `merger`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load(
        raw: &RawConfig,
        v: &Scope,
        shape: PatchShape,
        embed_dim: usize,
        heads: usize,
        rope_parameters: Option<&Value>,
        blocks: Vec<VisionBlock>,
        windows: Option<Windows>,
        merger: Merger,
    ) -> Result<VisionTower> {
        let e = embed_dim;
        let patch_dim = shape.in_channels * shape.temporal * shape.side * shape.side;
        check_dims(raw, &[("vision patch size", patch_dim), ("vision heads", heads)])?;
        if !e.is_multiple_of(heads) || !(e / heads).is_multiple_of(4) {
            return Err(raw.error(format!(
                "vision_config: width {e} over {heads} heads must give a head size that is a multiple of 4"
            )));
        }
        let head_dim = e / heads;
        let theta = rope_parameters.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64).unwrap_or(10000.0) as f32;
        let spatial = head_dim / 2;
        let rope_inv_freq = (0..spatial).step_by(2).map(|i| 1.0f32 / theta.powf(i as f32 / spatial as f32)).collect();
        let patch_weight = v
            .weights()
            .get(&v.name("patch_embed.proj.weight"), &[e, shape.in_channels, shape.temporal, shape.side, shape.side])?
            .reshape(&[e, patch_dim])?;
        let patch_bias = match shape.bias {
            true => Some(v.weights().get(&v.name("patch_embed.proj.bias"), &[e])?),
            false => None,
        };
        Ok(VisionTower {
            patch_embed: Linear::new(patch_weight, patch_bias),
            positions: None,
            blocks,
            attention: attention_params(heads, heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
            rope_inv_freq,
            windows,
            merger,
            deepstack: Vec::new(),
            patch_dim,
            embed_dim: e,
            merge: shape.merge,
            patch_size: shape.side,
            video_time: Some(VideoTime::Steps),
        })
    }

    fn weight_bytes(&self) -> usize {
        let linears: usize = self
            .blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.proj])
            .chain([&self.patch_embed])
            .map(Linear::size_in_bytes)
            .sum();
        let mergers: usize =
            std::iter::once(&self.merger).chain(self.deepstack.iter().map(|(_, m)| m)).map(Merger::weight_bytes).sum();
        let positions = self.positions.as_ref().map_or(0, |grid| grid.table.len() * 4);
        linears + mergers + positions + self.blocks.iter().map(|b| b.mlp.weight_bytes()).sum::<usize>()
    }

    /// Each patch's (row, column) on the grid, in the processor's order: 2x2 merge windows one
    /// after another, row-major within each (transformers' `get_vision_position_ids`).
    fn patch_positions(&self, [t, h, w]: [usize; 3]) -> Vec<[usize; 2]> {
        let m = self.merge;
        let mut out = Vec::with_capacity(t * h * w);
        for _ in 0..t {
            for bh in 0..h / m {
                for bw in 0..w / m {
                    for ih in 0..m {
                        for iw in 0..m {
                            out.push([bh * m + ih, bw * m + iw]);
                        }
                    }
                }
            }
        }
        out
    }

    /// cos/sin `[patches, head_dim / 2]`: the first quarter of the head's frequencies turn with
    /// the patch row, the second with its column.
    fn rope_tables(&self, positions: &[[usize; 2]]) -> (Vec<f32>, Vec<f32>) {
        let quarter = self.rope_inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(positions.len() * 2 * quarter), Vec::new());
        sin.reserve(cos.capacity());
        for &[row, col] in positions {
            for pos in [row, col] {
                for &f in &self.rope_inv_freq {
                    let angle = pos as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        (cos, sin)
    }

    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3], device: Device, dtype: DType) -> Result<Encoded> {
        let [t, h, w] = grid_thw;
        let patches = t * h * w;
        if patches == 0 || !h.is_multiple_of(self.merge) || !w.is_multiple_of(self.merge) {
            return Err(image_input_error(format!(
                "image grid {grid_thw:?} does not divide into {0}x{0} merge windows",
                self.merge
            )));
        }
        if pixel_values.len() != patches * self.patch_dim {
            return Err(image_input_error(format!(
                "{} pixel values for a {grid_thw:?} grid of {}-value patches",
                pixel_values.len(),
                self.patch_dim
            )));
        }
        let unit = self.merge * self.merge;
        // Windowed towers run on the patches regrouped window by window (each window's merged
        // tokens together), and put the merged tokens back in grid order at the end.
        let windows = self.windows.as_ref().map(|win| window_order(grid_thw, self.merge, win.side));
        let patch_order: Option<Vec<usize>> =
            windows.as_ref().map(|(units, _)| units.iter().flat_map(|&u| u * unit..(u + 1) * unit).collect());
        let pixels = pixel_input(pixel_values.to_vec(), &[patches, self.patch_dim], device, dtype)?;
        let mut x = self.patch_embed.forward(&pixels)?;
        let mut positions = self.patch_positions(grid_thw);
        if let Some(grid) = &self.positions {
            let table = Tensor::from_f32(grid.embeddings(&positions, [h, w]), &[patches, self.embed_dim])?;
            x = ops::add(&x, &table.to_dtype(x.dtype()).to_device(device)?)?;
        }
        if let Some(order) = &patch_order {
            x = ops::gather_rows(&x, order)?;
            positions = order.iter().map(|&p| positions[p]).collect();
        }
        let (cos, sin) = self.rope_tables(&positions);
        let half = self.attention.head_dim / 2;
        let cos = Tensor::from_f32(cos, &[patches, half])?.to_device(device)?;
        let sin = Tensor::from_f32(sin, &[patches, half])?.to_device(device)?;
        // Each frame attends within itself (a windowed block, within each window of it).
        let frames = vec![h * w; t];
        let e = self.embed_dim;
        let mut deepstack = Vec::with_capacity(self.deepstack.len());
        for (i, b) in self.blocks.iter().enumerate() {
            let segments = match (&self.windows, &windows) {
                (Some(win), Some((_, lengths))) if !win.full_attention_blocks.contains(&i) => lengths,
                _ => &frames,
            };
            let normed = b.norm1.forward(&x)?;
            let qkv = b.qkv.forward(&normed)?;
            let q = ops::narrow_cols(&qkv, 0, e)?;
            let k = ops::narrow_cols(&qkv, e, e)?;
            let value = ops::narrow_cols(&qkv, 2 * e, e)?;
            let q = ops::rope(&q, &cos, &sin, self.attention.head_dim, RopeStyle::Neox)?;
            let k = ops::rope(&k, &cos, &sin, self.attention.head_dim, RopeStyle::Neox)?;
            let attn = ops::attention_dense(&q, &k, &value, &self.attention, segments, false)?;
            x = ops::add(&x, &b.proj.forward(&attn)?)?;
            x = ops::add(&x, &b.mlp.forward(&b.norm2.forward(&x)?)?)?;
            if let Some((_, merger)) = self.deepstack.iter().find(|(block, _)| *block == i) {
                deepstack.push(merger.forward(&x, unit)?);
            }
        }
        let embeddings = self.merger.forward(&x, unit)?;
        let Some((units, _)) = windows else { return Ok(Encoded { embeddings, deepstack }) };
        let mut grid_order = vec![0; units.len()];
        for (position, &u) in units.iter().enumerate() {
            grid_order[u] = position;
        }
        let in_grid_order = |t: &Tensor| ops::gather_rows(t, &grid_order);
        Ok(Encoded {
            embeddings: in_grid_order(&embeddings)?,
            deepstack: deepstack.iter().map(in_grid_order).collect::<std::result::Result<_, _>>()?,
        })
    }
}

/// transformers' `get_vision_window_index` for one image: its merged tokens window by window
/// (windows of `side` x `side` merged tokens, row-major over the grid and within each window,
/// frame by frame; the last row and column of windows may be partial), and each window's
/// length in patches.
fn window_order([t, h, w]: [usize; 3], merge: usize, side: usize) -> (Vec<usize>, Vec<usize>) {
    let (rows, cols) = (h / merge, w / merge);
    let mut units = Vec::with_capacity(t * rows * cols);
    let mut lengths = Vec::new();
    for frame in 0..t {
        for r0 in (0..rows).step_by(side) {
            for c0 in (0..cols).step_by(side) {
                let before = units.len();
                for r in r0..(r0 + side).min(rows) {
                    units.extend((c0..(c0 + side).min(cols)).map(|c| (frame * rows + r) * cols + c));
                }
                lengths.push((units.len() - before) * merge * merge);
            }
        }
    }
    (units, lengths)
}

impl VisionEncoder for QwenVl {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let table = &self.decoder.embed.table;
        self.vision.encode(pixel_values, grid_thw, table.device(), table.dtype())
    }

    fn mrope_positions(&self, prompt: &[u32], visuals: &[VisualGrid]) -> Result<Option<(Vec<[usize; 3]>, i64)>> {
        let video_time = self.vision.video_time.unwrap_or(VideoTime::Steps);
        let positions = mrope_positions(prompt, self.placeholders, visuals, self.vision.merge, video_time)?;
        Ok(Some(positions))
    }
}

/// transformers' `get_rope_index` for a prompt whose images and videos are given in order: text
/// tokens count up on all three axes; an image's or video's tokens sit on its merged grid (rows and
/// columns offset from the start position, time steps from it too: one position a step, or for
/// [`VideoTime::Seconds`] a video's `step * tokens_per_second * seconds_per_grid`, truncated, in
/// f32 as torch computes it) and the text after it resumes past the grid's larger side. The n-th
/// image fills the n-th run of image placeholders, the n-th video the n-th run of video ones (for
/// [`VideoTime::Timestamps`], each of a video's steps the next run, as a one-step video).
/// Returns the positions and the decode offset (`max position + 1 - prompt length`).
pub fn mrope_positions(
    prompt: &[u32],
    placeholders: Placeholders,
    visuals: &[VisualGrid],
    merge: usize,
    video_time: VideoTime,
) -> Result<(Vec<[usize; 3]>, i64)> {
    let split: Vec<VisualGrid>;
    let visuals = match video_time {
        VideoTime::Timestamps => {
            split = visuals
                .iter()
                .flat_map(|v| match v.visual {
                    Visual::Video { .. } => {
                        let [t, h, w] = v.grid_thw;
                        vec![VisualGrid { grid_thw: [1, h, w], ..*v }; t]
                    }
                    Visual::Image => vec![*v],
                })
                .collect();
            &split
        }
        _ => visuals,
    };
    let is_video = |v: &&VisualGrid| matches!(v.visual, Visual::Video { .. });
    let (mut images, mut videos) = (visuals.iter().filter(|v| !is_video(v)), visuals.iter().filter(is_video));
    let mut out = Vec::with_capacity(prompt.len());
    let mut next = 0usize;
    let mut i = 0;
    while i < prompt.len() {
        let token = prompt[i];
        let (kind, item) = if token == placeholders.image {
            ("image", images.next())
        } else if Some(token) == placeholders.video {
            ("video", videos.next())
        } else {
            out.push([next; 3]);
            next += 1;
            i += 1;
            continue;
        };
        let item =
            item.ok_or_else(|| image_input_error(format!("more {kind} placeholder runs than the prompt has {kind}s")))?;
        let [t, h, w] = item.grid_thw;
        let (h, w) = (h / merge, w / merge);
        let tokens = t * h * w;
        if prompt.len() - i < tokens || prompt[i..i + tokens].iter().any(|&id| id != token) {
            return Err(image_input_error(format!(
                "an {kind} of {tokens} tokens has fewer placeholders at prompt position {i}"
            )));
        }
        let interval = match (item.visual, video_time) {
            (Visual::Video { seconds_per_grid }, VideoTime::Seconds { tokens_per_second }) => {
                Some(tokens_per_second * seconds_per_grid as f32)
            }
            _ => None,
        };
        for ti in 0..t {
            let step = interval.map_or(ti, |interval| (ti as f32 * interval) as usize);
            for hi in 0..h {
                for wi in 0..w {
                    out.push([next + step, next + hi, next + wi]);
                }
            }
        }
        next += h.max(w);
        i += tokens;
    }
    if images.next().is_some() || videos.next().is_some() {
        return Err(image_input_error(format!(
            "{} images and videos for fewer placeholder runs in the prompt",
            visuals.len()
        )));
    }
    let max = out.iter().flatten().copied().max().map_or(0, |m| m as i64 + 1);
    Ok((out, max - prompt.len() as i64))
}

impl CausalLM for QwenVl {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [ferrite_tensor::PagedKvLayer]) -> Result<Tensor> {
        self.decoder.forward(input, kv)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [ferrite_tensor::PagedKvLayer]) -> Result<Tensor> {
        self.decoder.hidden_states(input, kv)
    }

    fn forward_with_hidden(
        &self,
        input: &ForwardInput<'_>,
        kv: &mut [ferrite_tensor::PagedKvLayer],
        tap: &crate::model::HiddenTap,
    ) -> Result<(Tensor, Tensor)> {
        self.decoder.forward_with_hidden(input, kv, tap)
    }

    fn token_embedding(&self) -> Option<&crate::layers::Embedding> {
        self.decoder.token_embedding()
    }

    /// Qwen3.5's MTP head (real Qwen3.5 checkpoints are of this layout). It reads an image's
    /// placeholder tokens as text, which only shades its drafts there.
    fn mtp(&self) -> Option<&dyn crate::model::DraftHead> {
        self.decoder.mtp()
    }

    fn vision(&self) -> Option<&dyn VisionEncoder> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMG: u32 = 9;
    const VID: u32 = 8;
    const IDS: Placeholders = Placeholders { image: IMG, video: Some(VID) };

    fn image(grid_thw: [usize; 3]) -> VisualGrid {
        VisualGrid { visual: Visual::Image, grid_thw }
    }

    #[test]
    fn mrope_places_an_image_on_its_grid() {
        // 2 text tokens, a 1x4x6 patch grid (2x3 merged tokens), 2 text tokens.
        let img = IMG;
        let prompt = [1, 2, img, img, img, img, img, img, 3, 4];
        let (pos, delta) = mrope_positions(&prompt, IDS, &[image([1, 4, 6])], 2, VideoTime::Steps).unwrap();
        assert_eq!(&pos[..2], &[[0; 3], [1; 3]]);
        assert_eq!(&pos[2..8], &[[2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4]]);
        // Text resumes past the grid's larger side (3 merged columns).
        assert_eq!(&pos[8..], &[[5; 3], [6; 3]]);
        assert_eq!(delta, 7 - 10);
    }

    #[test]
    fn windows_group_merged_tokens_as_transformers_does() {
        // A 6x4 patch grid is 3x2 merged tokens; windows of 2x2 merged tokens: two full-width
        // windows of 2 rows, then a partial one of the last row.
        let (units, lengths) = window_order([1, 6, 4], 2, 2);
        assert_eq!(units, [0, 1, 2, 3, 4, 5]);
        assert_eq!(lengths, [16, 8]);
        // A 2x3 merged grid: the right column's windows are partial; frames follow one another.
        let (units, lengths) = window_order([2, 4, 6], 2, 2);
        assert_eq!(units, [0, 1, 3, 4, 2, 5, 6, 7, 9, 10, 8, 11]);
        assert_eq!(lengths, [16, 8, 16, 8]);
    }

    #[test]
    fn mrope_steps_a_video_through_time_per_patch_or_per_second() {
        // A video of 3 time steps of 1x2 merged tokens, after one text token, then an image of
        // 1x1 merged token after one more text token.
        let prompt = [1, VID, VID, VID, VID, VID, VID, 2, IMG, 3];
        let video = VisualGrid { visual: Visual::Video { seconds_per_grid: 2.0 / 24.0 }, grid_thw: [3, 2, 4] };
        // Listed image first: each kind fills its own placeholder runs in order.
        let visuals = [image([1, 2, 2]), video];
        let (pos, delta) = mrope_positions(&prompt, IDS, &visuals, 2, VideoTime::Steps).unwrap();
        assert_eq!(&pos[1..7], &[[1, 1, 1], [1, 1, 2], [2, 1, 1], [2, 1, 2], [3, 1, 1], [3, 1, 2]]);
        // Text resumes past the larger spatial side (2), not past the time steps.
        assert_eq!(&pos[7..], &[[3; 3], [4; 3], [5; 3]]);
        assert_eq!(delta, 6 - 10);
        // Qwen2.5-VL: 25 tokens a second, 1/12 s a step: steps at 0, 2.08, 4.17 -> 0, 2, 4.
        let seconds = VideoTime::Seconds { tokens_per_second: 25.0 };
        let (pos, delta) = mrope_positions(&prompt, IDS, &visuals, 2, seconds).unwrap();
        let times: Vec<usize> = pos[1..7].iter().map(|p| p[0]).collect();
        assert_eq!(times, [1, 1, 3, 3, 5, 5]);
        assert_eq!(delta, 6 - 10, "the latest time step (5) is below the text after it");
    }

    #[test]
    fn mrope_places_each_timestamped_video_step_as_a_one_step_video() {
        // Qwen3-VL: a 2-step video of 1x2 merged tokens a step, each step its own run between
        // timestamp text (here tokens 5, 6), then one text token.
        let prompt = [1, VID, VID, 5, 6, VID, VID, 2];
        let video = VisualGrid { visual: Visual::Video { seconds_per_grid: 2.0 / 24.0 }, grid_thw: [2, 2, 4] };
        let (pos, delta) = mrope_positions(&prompt, IDS, &[video], 2, VideoTime::Timestamps).unwrap();
        assert_eq!(pos, [[0; 3], [1, 1, 1], [1, 1, 2], [3; 3], [4; 3], [5, 5, 5], [5, 5, 6], [7; 3]]);
        assert_eq!(delta, 8 - 8);
        // The steps as items of their own (the engine's split) sit where the whole video does.
        let step = VisualGrid { grid_thw: [1, 2, 4], ..video };
        assert_eq!(mrope_positions(&prompt, IDS, &[step, step], 2, VideoTime::Timestamps).unwrap(), (pos, delta));
        // One run for both steps is the wrong layout.
        let joined = [1, VID, VID, VID, VID, 2];
        assert!(mrope_positions(&joined, IDS, &[video], 2, VideoTime::Timestamps).is_ok_and(|(p, _)| p[3] == [3; 3]));
    }

    #[test]
    fn mrope_refuses_placeholders_that_do_not_match_the_images() {
        let (img, steps) = (IMG, VideoTime::Steps);
        assert!(
            mrope_positions(&[1, img, img], IDS, &[image([1, 4, 4])], 2, steps).is_err(),
            "4 tokens, 2 placeholders"
        );
        assert!(mrope_positions(&[1, 2], IDS, &[image([1, 2, 2])], 2, steps).is_err(), "an image without placeholders");
        assert!(mrope_positions(&[img], IDS, &[], 2, steps).is_err(), "a placeholder without an image");
        let video = VisualGrid { visual: Visual::Video { seconds_per_grid: 1.0 }, grid_thw: [1, 2, 2] };
        assert!(mrope_positions(&[VID], IDS, &[image([1, 2, 2])], 2, steps).is_err(), "a video run, an image");
        assert!(mrope_positions(&[img], IDS, &[video], 2, steps).is_err(), "an image run, a video");
    }
}
