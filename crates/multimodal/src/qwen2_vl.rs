//! transformers' `Qwen2VLImageProcessor` and `Qwen2VLVideoProcessor` (torchvision backend), the
//! processors of Qwen2-VL, Qwen2.5-VL and the other models whose configs name them: resize to a
//! multiple of `patch_size * merge_size` within a pixel budget, rescale and normalize, and cut into
//! patches of `temporal_patch_size` frames ordered so that each `merge_size x merge_size` block of
//! patches is contiguous. A still image is a clip of that many copies of itself.

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    check_bicubic, config_error, file_error, flag, image_processor_config, positive, positive_or, present,
    video_processor_config, Normalization, CHANNELS, OPENAI_CLIP,
};
use crate::resize::{resize_rgb, Filter};
use crate::{MultimodalError, PixelPatches, MAX_ASPECT_RATIO, MAX_RESIZED_PIXELS};

/// `Qwen2VLImageProcessor`'s class default `size`: `shortest_edge` 56 * 56, `longest_edge`
/// 28 * 28 * 1280 pixels.
const DEFAULT_PIXEL_RANGE: (usize, usize) = (56 * 56, 28 * 28 * 1280);
/// `Qwen2VLVideoProcessor`'s: 128 to 768 merged tokens of 28 * 28 pixels a frame.
const DEFAULT_VIDEO_PIXEL_RANGE: (usize, usize) = (128 * 28 * 28, 28 * 28 * 768);
/// `Qwen2VLVideoProcessor.max_video_tokens`' class default.
const DEFAULT_MAX_VIDEO_TOKENS: usize = 128_000;
/// The frame rate transformers assumes for a video given as frames without metadata
/// (`VideoMetadata.sampled_fps`): what Qwen2.5-VL's temporal positions are counted in.
pub const FRAME_LIST_FPS: f64 = 24.0;

/// A configured `Qwen2VLImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlImageProcessor {
    /// Side of a square patch, in pixels.
    pub patch_size: usize,
    /// Frames in a patch; a still image is repeated to fill them.
    pub temporal_patch_size: usize,
    /// Side, in patches, of the square block the model merges into one token.
    pub merge_size: usize,
    /// Fewest pixels an image is resized to (`size.shortest_edge`, legacy `min_pixels`).
    pub min_pixels: usize,
    /// Most pixels an image is resized to (`size.longest_edge`, legacy `max_pixels`).
    pub max_pixels: usize,
    normalization: Normalization,
}

impl Qwen2VlImageProcessor {
    /// The processor a `preprocessor_config.json` describes, as transformers'
    /// `Qwen2VLImageProcessor(**config)` builds it: absent or null keys take the class defaults,
    /// keys this processor does not use are ignored.
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config = json.as_object().ok_or_else(|| config_error("the preprocessor config must be a JSON object"))?;
        if !flag(config, "do_resize", true)? {
            return Err(config_error("`do_resize: false` is not supported: the patch grid needs the resize"));
        }
        check_bicubic(config)?;
        let (min_pixels, max_pixels) =
            config_pixel_range(config, DEFAULT_PIXEL_RANGE).map_err(MultimodalError::Config)?;
        let normalization = Normalization::from_config(config, OPENAI_CLIP)?;
        Ok(Qwen2VlImageProcessor {
            patch_size: positive_or(config, "patch_size", 14)?,
            temporal_patch_size: positive_or(config, "temporal_patch_size", 2)?,
            merge_size: positive_or(config, "merge_size", 2)?,
            min_pixels,
            max_pixels,
            normalization,
        })
    }

    /// The processor of the model in `dir`, from where transformers reads it
    /// ([`image_processor_config`](crate::image_processor_config)).
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let (path, config) = image_processor_config(dir)?;
        Self::from_config(&config).map_err(|error| file_error(&path, error))
    }

    /// This processor with a request's `mm_processor_kwargs` applied, as transformers applies them
    /// to a processor call: `size` replaces the configured pixel budget, then `min_pixels` /
    /// `max_pixels` set its `shortest_edge` / `longest_edge`, and both edges must be there (a
    /// `size` alone must have exactly those two keys). Any other key is refused.
    pub fn with_overrides(&self, kwargs: &Map<String, Value>) -> Result<Self, MultimodalError> {
        if let Some(key) = kwargs.keys().find(|key| !matches!(key.as_str(), "min_pixels" | "max_pixels" | "size")) {
            return Err(MultimodalError::Overrides(format!(
                "unknown key `{key}`: the Qwen2-VL image processor takes min_pixels, max_pixels and size"
            )));
        }
        let (min_pixels, max_pixels) =
            override_pixel_range(kwargs, self.min_pixels, self.max_pixels).map_err(MultimodalError::Overrides)?;
        Ok(Qwen2VlImageProcessor { min_pixels, max_pixels, ..self.clone() })
    }

    /// The `(height, width)` an image of `height` x `width` is resized to: transformers'
    /// `smart_resize` with `factor = patch_size * merge_size`.
    pub fn smart_resize(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
    }

    /// The patches of one RGB image, bit for bit those of transformers' torchvision backend given the
    /// same pixels.
    pub fn preprocess(&self, image: &RgbImage) -> Result<PixelPatches, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        let (out_height, out_width) = self.smart_resize(height, width)?;
        if (out_height as u64).saturating_mul(out_width as u64) > MAX_RESIZED_PIXELS {
            return Err(MultimodalError::TooManyResizedPixels {
                width: out_width,
                height: out_height,
                max_pixels: MAX_RESIZED_PIXELS,
            });
        }
        let pixels = if (out_height, out_width) == (height, width) {
            Cow::Borrowed(image.as_raw().as_slice())
        } else {
            Cow::Owned(resize_rgb(image.as_raw(), width, height, out_width, out_height, Filter::Bicubic))
        };
        // A still image is a clip of `temporal_patch_size` copies of itself.
        let frames = vec![&*pixels; self.temporal_patch_size];
        Ok(self.patches().patchify(&frames, out_height, out_width))
    }

    fn patches(&self) -> Patcher<'_> {
        Patcher {
            patch: self.patch_size,
            temporal: self.temporal_patch_size,
            merge: self.merge_size,
            normalization: &self.normalization,
        }
    }

    /// The placeholder tokens an image of `height` x `width` becomes in the prompt:
    /// `grid_t * grid_h * grid_w / merge_size^2`.
    pub fn num_image_tokens(&self, height: usize, width: usize) -> Result<usize, MultimodalError> {
        let (out_height, out_width) = self.smart_resize(height, width)?;
        Ok((out_height / self.patch_size) * (out_width / self.patch_size) / (self.merge_size * self.merge_size))
    }
}

/// transformers' `smart_resize`: `height` x `width` resized to multiples of `factor` (the nearest,
/// Python's `round` rounding halves to even), then scaled down or up, keeping the aspect ratio,
/// when their product leaves `[min_pixels, max_pixels]`. Python divides the exact integer
/// `height * width` where this divides its f64: the two agree while it is below 2^53.
fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize), MultimodalError> {
    if height == 0 || width == 0 {
        return Err(MultimodalError::EmptyImage { width, height });
    }
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if ratio > MAX_ASPECT_RATIO {
        return Err(MultimodalError::AspectRatio { width, height, ratio });
    }
    let to_factor = |sides: f64| (sides as usize).saturating_mul(factor);
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let (mut h_bar, mut w_bar) = (to_factor((h / f).round_ties_even()), to_factor((w / f).round_ties_even()));
    let area = h_bar as u128 * w_bar as u128;
    let pixels = height as u128 * width as u128;
    if area > max_pixels as u128 {
        let beta = (pixels as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max(to_factor((h / beta / f).floor()));
        w_bar = factor.max(to_factor((w / beta / f).floor()));
    } else if area < min_pixels as u128 {
        let beta = (min_pixels as f64 / pixels as f64).sqrt();
        h_bar = to_factor((h * beta / f).ceil());
        w_bar = to_factor((w * beta / f).ceil());
    }
    Ok((h_bar, w_bar))
}

/// How the Qwen processors cut resized frames into the encoder's patch rows (Qwen3-VL's video
/// processor lays them out as Qwen2-VL's do).
pub(crate) struct Patcher<'a> {
    pub(crate) patch: usize,
    pub(crate) temporal: usize,
    pub(crate) merge: usize,
    pub(crate) normalization: &'a Normalization,
}

/// The size (height, width) every frame of a video has, or an error naming the first that differs.
pub(crate) fn clip_size(frames: &[RgbImage]) -> Result<(usize, usize), MultimodalError> {
    let first = frames.first().ok_or(MultimodalError::EmptyVideo)?;
    let (width, height) = first.dimensions();
    if let Some((index, frame)) = frames.iter().enumerate().find(|(_, f)| f.dimensions() != (width, height)) {
        return Err(MultimodalError::FrameSize { index, size: frame.dimensions(), first: (width, height) });
    }
    Ok((height as usize, width as usize))
}

impl Patcher<'_> {
    /// A video's `frames` (each `size`, height by width) resized to `out` (bicubic, as the Qwen
    /// video processors' torchvision backend), padded with the last to whole temporal patches
    /// and patchified; a clip of more than `MAX_RESIZED_PIXELS` resized pixels is refused.
    pub(crate) fn patchify_clip(
        &self,
        frames: &[&RgbImage],
        (height, width): (usize, usize),
        (out_height, out_width): (usize, usize),
    ) -> Result<PixelPatches, MultimodalError> {
        let padded = frames.len().next_multiple_of(self.temporal);
        if (padded as u64).saturating_mul(out_height as u64).saturating_mul(out_width as u64) > MAX_RESIZED_PIXELS {
            return Err(MultimodalError::TooManyVideoPixels {
                frames: padded,
                width: out_width,
                height: out_height,
                max_pixels: MAX_RESIZED_PIXELS,
            });
        }
        let resized: Vec<Cow<'_, [u8]>> = frames
            .iter()
            .map(|frame| match (out_height, out_width) == (height, width) {
                true => Cow::Borrowed(frame.as_raw().as_slice()),
                false => Cow::Owned(resize_rgb(frame.as_raw(), width, height, out_width, out_height, Filter::Bicubic)),
            })
            .collect();
        let mut clip: Vec<&[u8]> = resized.iter().map(|frame| &**frame).collect();
        clip.resize(padded, clip[clip.len() - 1]);
        Ok(self.patchify(&clip, out_height, out_width))
    }

    /// transformers' `patchify` of RGB8 frames, each `height` x `width` (both whole merge
    /// windows), `temporal` frames to a patch: patches time step by time step, in row-major
    /// order of merge blocks and row-major inside a block; a patch's values channel by channel,
    /// then frame by frame, each frame's rows in order.
    pub(crate) fn patchify(&self, frames: &[&[u8]], height: usize, width: usize) -> PixelPatches {
        let (patch, merge) = (self.patch, self.merge);
        let values = self.normalization.value_table();
        let (grid_t, grid_h, grid_w) = (frames.len() / self.temporal, height / patch, width / patch);
        let patch_dim = CHANNELS * self.temporal * patch * patch;
        let patch_origins = (0..grid_h / merge).flat_map(move |block_y| {
            (0..grid_w / merge).flat_map(move |block_x| {
                (0..merge).flat_map(move |y| {
                    (0..merge).map(move |x| ((block_y * merge + y) * patch, (block_x * merge + x) * patch))
                })
            })
        });
        let patch_origins: Vec<(usize, usize)> = patch_origins.collect();
        let mut pixel_values = Vec::with_capacity(grid_t * grid_h * grid_w * patch_dim);
        for step in frames.chunks_exact(self.temporal) {
            for &(top, left) in &patch_origins {
                for (channel, table) in values.iter().enumerate() {
                    for frame in step {
                        for y in top..top + patch {
                            let row = &frame[(y * width + left) * CHANNELS..][..patch * CHANNELS];
                            pixel_values
                                .extend(row[channel..].iter().step_by(CHANNELS).map(|&v| table[usize::from(v)]));
                        }
                    }
                }
            }
        }
        PixelPatches { pixel_values, patch_dim, grid_thw: [grid_t, grid_h, grid_w] }
    }
}

/// A configured `Qwen2VLVideoProcessor`, for videos given as their frames (all of them are
/// processed: the processor's `do_sample_frames` sampling needs the video's frame rate).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlVideoProcessor {
    pub patch_size: usize,
    /// Frames in a patch; a clip is padded to a multiple of it by repeating its last frame.
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// Fewest pixels a frame is resized to.
    pub min_pixels: usize,
    /// Most pixels a frame is resized to.
    pub max_pixels: usize,
    /// `cap_pixels_per_frame`: each frame also gets at most an even share of
    /// `max_video_tokens`' pixels (qwen-vl-utils' total budget).
    pub cap_pixels_per_frame: bool,
    pub max_video_tokens: usize,
    normalization: Normalization,
}

impl Qwen2VlVideoProcessor {
    /// The processor a video processor config describes, as `Qwen2VLVideoProcessor(**config)`
    /// builds it (an image processor config, which older checkpoints have instead, reads the
    /// same way).
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config =
            json.as_object().ok_or_else(|| config_error("the video processor config must be a JSON object"))?;
        if !flag(config, "do_resize", true)? {
            return Err(config_error("`do_resize: false` is not supported: the patch grid needs the resize"));
        }
        if flag(config, "do_sample_frames", false)? {
            return Err(config_error(
                "`do_sample_frames: true` is not supported: videos arrive as frames, without the frame rate that \
                 sampling needs",
            ));
        }
        check_bicubic(config)?;
        let (min_pixels, max_pixels) =
            config_pixel_range(config, DEFAULT_VIDEO_PIXEL_RANGE).map_err(MultimodalError::Config)?;
        Ok(Qwen2VlVideoProcessor {
            patch_size: positive_or(config, "patch_size", 14)?,
            temporal_patch_size: positive_or(config, "temporal_patch_size", 2)?,
            merge_size: positive_or(config, "merge_size", 2)?,
            min_pixels,
            max_pixels,
            cap_pixels_per_frame: flag(config, "cap_pixels_per_frame", false)?,
            max_video_tokens: positive_or(config, "max_video_tokens", DEFAULT_MAX_VIDEO_TOKENS)?,
            normalization: Normalization::from_config(config, OPENAI_CLIP)?,
        })
    }

    /// The video processor of the model in `dir`, from where transformers reads it
    /// ([`video_processor_config`](crate::video_processor_config)).
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let (path, config) = video_processor_config(dir)?;
        Self::from_config(&config).map_err(|error| file_error(&path, error))
    }

    /// This processor with a request's `mm_processor_kwargs`, which a processor call hands to
    /// both its image and video processors: the same keys as
    /// [`Qwen2VlImageProcessor::with_overrides`].
    pub fn with_overrides(&self, kwargs: &Map<String, Value>) -> Result<Self, MultimodalError> {
        if let Some(key) = kwargs.keys().find(|key| !matches!(key.as_str(), "min_pixels" | "max_pixels" | "size")) {
            return Err(MultimodalError::Overrides(format!(
                "unknown key `{key}`: the Qwen2-VL video processor takes min_pixels, max_pixels and size"
            )));
        }
        let (min_pixels, max_pixels) =
            override_pixel_range(kwargs, self.min_pixels, self.max_pixels).map_err(MultimodalError::Overrides)?;
        Ok(Qwen2VlVideoProcessor { min_pixels, max_pixels, ..self.clone() })
    }

    /// The `(height, width)` every frame of a `frames`-frame video of `height` x `width` is
    /// resized to.
    pub fn smart_resize(&self, frames: usize, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        let factor = self.patch_size * self.merge_size;
        let mut max_pixels = self.max_pixels;
        if self.cap_pixels_per_frame {
            // transformers' int(max_video_tokens * factor^2 * 0.9), in f64 as Python computes it.
            let total = (self.max_video_tokens as f64 * (factor * factor) as f64 * 0.9) as usize;
            let share = total.saturating_mul(self.temporal_patch_size) / frames.max(1);
            max_pixels = max_pixels.min(share).max((self.min_pixels as f64 * 1.05) as usize);
        }
        smart_resize(height, width, factor, self.min_pixels, max_pixels)
    }

    /// The patches of a video's RGB frames (all of one size), bit for bit those of transformers'
    /// torchvision backend given the same frames.
    pub fn preprocess(&self, frames: &[RgbImage]) -> Result<PixelPatches, MultimodalError> {
        let (height, width) = clip_size(frames)?;
        let out = self.smart_resize(frames.len(), height, width)?;
        let patcher = Patcher {
            patch: self.patch_size,
            temporal: self.temporal_patch_size,
            merge: self.merge_size,
            normalization: &self.normalization,
        };
        patcher.patchify_clip(&frames.iter().collect::<Vec<_>>(), (height, width), out)
    }

    /// The seconds one temporal patch spans, for a video given as frames (`second_per_grid_ts`
    /// of transformers' Qwen2.5-VL processor: `temporal_patch_size / fps`).
    pub fn seconds_per_grid(&self) -> f64 {
        self.temporal_patch_size as f64 / FRAME_LIST_FPS
    }
}

/// The pixel budget of a config, as `Qwen2VLImageProcessor.__init__` and
/// `Qwen2VLVideoProcessor.__init__` resolve it: `size` (the class default when absent), whose `shortest_edge` / `longest_edge` the legacy top-level `min_pixels` /
/// `max_pixels` replace, dropping `size`'s own `min_pixels` / `max_pixels` keys.
fn config_pixel_range(config: &Map<String, Value>, (min, max): (usize, usize)) -> Result<(usize, usize), String> {
    let mut size = match present(config, "size") {
        None => Map::from_iter([
            ("shortest_edge".to_string(), Value::from(min)),
            ("longest_edge".to_string(), Value::from(max)),
        ]),
        Some(Value::Object(size)) => size.clone(),
        Some(other) => return Err(format!("`size` must be an object, got {other}")),
    };
    for (key, edge) in [("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")] {
        if let Some(value) = present(config, key) {
            size.insert(edge.to_string(), Value::from(positive(value, key)?));
            size.remove(key);
        }
    }
    pixel_range(&size, false)
}

/// The pixel budget of a processor call: its `size` (or the configured budget), with `min_pixels`
/// / `max_pixels` setting `shortest_edge` / `longest_edge`.
fn override_pixel_range(
    kwargs: &Map<String, Value>,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize), String> {
    let mut size = match kwargs.get("size") {
        None => Map::from_iter([
            ("shortest_edge".to_string(), Value::from(min_pixels)),
            ("longest_edge".to_string(), Value::from(max_pixels)),
        ]),
        Some(Value::Object(size)) => size.clone(),
        Some(other) => return Err(format!("`size` must be an object, got {other}")),
    };
    // transformers builds a `SizeDict` from merged keys, which skips the key-set check a plain
    // `size` dict gets: the resize only needs the two edges.
    let mut merged = false;
    for (key, edge) in [("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")] {
        if let Some(value) = present(kwargs, key) {
            size.insert(edge.to_string(), Value::from(positive(value, key)?));
            merged = true;
        }
    }
    pixel_range(&size, merged)
}

/// `(shortest_edge, longest_edge)` of a size dict. transformers accepts a `size` only with one of
/// its valid key sets, and the resize then needs both edges: together that is exactly these two
/// keys, unless `other_keys_allowed` (a merged `SizeDict`, which skips the key-set check).
pub(crate) fn pixel_range(size: &Map<String, Value>, other_keys_allowed: bool) -> Result<(usize, usize), String> {
    let has_edges = size.contains_key("shortest_edge") && size.contains_key("longest_edge");
    if !has_edges || (!other_keys_allowed && size.len() != 2) {
        let keys: Vec<&String> = size.keys().collect();
        let only = if other_keys_allowed { "" } else { " and no other" };
        return Err(format!("`size` must have the keys shortest_edge and longest_edge{only}, got {keys:?}"));
    }
    Ok((positive(&size["shortest_edge"], "size.shortest_edge")?, positive(&size["longest_edge"], "size.longest_edge")?))
}
