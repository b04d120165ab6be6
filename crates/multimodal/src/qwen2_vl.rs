//! transformers' `Qwen2VLImageProcessor` (torchvision backend), the image processor of Qwen2-VL,
//! Qwen2.5-VL and the other models whose `preprocessor_config.json` names it: resize to a multiple
//! of `patch_size * merge_size` within a pixel budget, rescale and normalize, and cut into patches
//! ordered so that each `merge_size x merge_size` block of patches is contiguous.

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    check_bicubic, config_error, file_error, flag, image_processor_config, positive, positive_or, present,
    Normalization, CHANNELS,
};
use crate::resize::resize_rgb;
use crate::{MultimodalError, PixelPatches, MAX_ASPECT_RATIO};

/// The class default `size`: `shortest_edge` 56 * 56, `longest_edge` 28 * 28 * 1280 pixels.
const DEFAULT_MIN_PIXELS: usize = 56 * 56;
const DEFAULT_MAX_PIXELS: usize = 28 * 28 * 1280;

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
        let (min_pixels, max_pixels) = config_pixel_range(config).map_err(MultimodalError::Config)?;
        let normalization = Normalization::from_config(config)?;
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
    /// `smart_resize` with `factor = patch_size * merge_size`. Both come out multiples of the factor
    /// (the nearest, Python's `round` rounding halves to even), then scaled down or up, keeping the
    /// aspect ratio, when their product leaves `[min_pixels, max_pixels]`. Python divides the exact
    /// integer `height * width` where this divides its f64: the two agree while it is below 2^53.
    pub fn smart_resize(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let ratio = height.max(width) as f64 / height.min(width) as f64;
        if ratio > MAX_ASPECT_RATIO {
            return Err(MultimodalError::AspectRatio { width, height, ratio });
        }
        let factor = self.patch_size * self.merge_size;
        let to_factor = |sides: f64| (sides as usize).saturating_mul(factor);
        let (h, w, f) = (height as f64, width as f64, factor as f64);
        let (mut h_bar, mut w_bar) = (to_factor((h / f).round_ties_even()), to_factor((w / f).round_ties_even()));
        let area = h_bar as u128 * w_bar as u128;
        let pixels = height as u128 * width as u128;
        if area > self.max_pixels as u128 {
            let beta = (pixels as f64 / self.max_pixels as f64).sqrt();
            h_bar = factor.max(to_factor((h / beta / f).floor()));
            w_bar = factor.max(to_factor((w / beta / f).floor()));
        } else if area < self.min_pixels as u128 {
            let beta = (self.min_pixels as f64 / pixels as f64).sqrt();
            h_bar = to_factor((h * beta / f).ceil());
            w_bar = to_factor((w * beta / f).ceil());
        }
        Ok((h_bar, w_bar))
    }

    /// The patches of one RGB image, bit for bit those of transformers' torchvision backend given the
    /// same pixels.
    pub fn preprocess(&self, image: &RgbImage) -> Result<PixelPatches, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        let (out_height, out_width) = self.smart_resize(height, width)?;
        let pixels = if (out_height, out_width) == (height, width) {
            Cow::Borrowed(image.as_raw().as_slice())
        } else {
            Cow::Owned(resize_rgb(image.as_raw(), width, height, out_width, out_height))
        };
        let values = self.normalization.value_table();
        let (patch, merge) = (self.patch_size, self.merge_size);
        let (grid_h, grid_w) = (out_height / patch, out_width / patch);
        let patch_dim = CHANNELS * self.temporal_patch_size * patch * patch;
        // transformers' `patchify`: patches in row-major order of merge blocks, row-major inside a
        // block; a patch's values channel by channel, the frame repeated `temporal_patch_size`
        // times per channel, each frame row-major.
        let patch_origins = (0..grid_h / merge).flat_map(move |block_y| {
            (0..grid_w / merge).flat_map(move |block_x| {
                (0..merge).flat_map(move |y| {
                    (0..merge).map(move |x| ((block_y * merge + y) * patch, (block_x * merge + x) * patch))
                })
            })
        });
        let mut pixel_values = Vec::with_capacity(grid_h * grid_w * patch_dim);
        for (top, left) in patch_origins {
            for (channel, table) in values.iter().enumerate() {
                for _ in 0..self.temporal_patch_size {
                    for y in top..top + patch {
                        let row = &pixels[(y * out_width + left) * CHANNELS..][..patch * CHANNELS];
                        pixel_values.extend(row[channel..].iter().step_by(CHANNELS).map(|&v| table[usize::from(v)]));
                    }
                }
            }
        }
        Ok(PixelPatches { pixel_values, patch_dim, grid_thw: [1, grid_h, grid_w] })
    }

    /// The placeholder tokens an image of `height` x `width` becomes in the prompt:
    /// `grid_t * grid_h * grid_w / merge_size^2`.
    pub fn num_image_tokens(&self, height: usize, width: usize) -> Result<usize, MultimodalError> {
        let (out_height, out_width) = self.smart_resize(height, width)?;
        Ok((out_height / self.patch_size) * (out_width / self.patch_size) / (self.merge_size * self.merge_size))
    }
}

/// The pixel budget of a config, as `Qwen2VLImageProcessor.__init__` resolves it: `size` (the class
/// default when absent), whose `shortest_edge` / `longest_edge` the legacy top-level `min_pixels` /
/// `max_pixels` replace, dropping `size`'s own `min_pixels` / `max_pixels` keys.
fn config_pixel_range(config: &Map<String, Value>) -> Result<(usize, usize), String> {
    let mut size = match present(config, "size") {
        None => Map::from_iter([
            ("shortest_edge".to_string(), Value::from(DEFAULT_MIN_PIXELS)),
            ("longest_edge".to_string(), Value::from(DEFAULT_MAX_PIXELS)),
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
fn pixel_range(size: &Map<String, Value>, other_keys_allowed: bool) -> Result<(usize, usize), String> {
    let has_edges = size.contains_key("shortest_edge") && size.contains_key("longest_edge");
    if !has_edges || (!other_keys_allowed && size.len() != 2) {
        let keys: Vec<&String> = size.keys().collect();
        let only = if other_keys_allowed { "" } else { " and no other" };
        return Err(format!("`size` must have the keys shortest_edge and longest_edge{only}, got {keys:?}"));
    }
    Ok((positive(&size["shortest_edge"], "size.shortest_edge")?, positive(&size["longest_edge"], "size.longest_edge")?))
}
