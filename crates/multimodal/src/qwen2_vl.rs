//! transformers' `Qwen2VLImageProcessor` (torchvision backend), the image processor of Qwen2-VL,
//! Qwen2.5-VL and the other models whose `preprocessor_config.json` names it: resize to a multiple
//! of `patch_size * merge_size` within a pixel budget, rescale and normalize, and cut into patches
//! ordered so that each `merge_size x merge_size` block of patches is contiguous.

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::resize::resize_rgb;
use crate::{MultimodalError, PixelPatches};

/// transformers' `OPENAI_CLIP_MEAN` and `OPENAI_CLIP_STD`, the class defaults.
const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// The class default `size`: `shortest_edge` 56 * 56, `longest_edge` 28 * 28 * 1280 pixels.
const DEFAULT_MIN_PIXELS: usize = 56 * 56;
const DEFAULT_MAX_PIXELS: usize = 28 * 28 * 1280;
/// `PILImageResampling.BICUBIC`, the class default and the only filter implemented here.
const BICUBIC: u64 = 3;
const CHANNELS: usize = 3;
/// `smart_resize` refuses images longer than this many times their width, or wider.
const MAX_ASPECT_RATIO: f64 = 200.0;

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
    do_rescale: bool,
    rescale_factor: f64,
    do_normalize: bool,
    image_mean: [f32; 3],
    image_std: [f32; 3],
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
        if let Some(resample) = present(config, "resample") {
            if resample.as_u64() != Some(BICUBIC) {
                return Err(config_error(format!("`resample` {resample} is not supported, only 3 (bicubic)")));
            }
        }
        let (min_pixels, max_pixels) = config_pixel_range(config).map_err(MultimodalError::Config)?;
        let do_rescale = flag(config, "do_rescale", true)?;
        let do_normalize = flag(config, "do_normalize", true)?;
        let rescale_factor = match present(config, "rescale_factor") {
            None => 1.0 / 255.0,
            Some(value) => value
                .as_f64()
                .filter(|factor| factor.is_finite() && *factor > 0.0)
                .ok_or_else(|| config_error(format!("`rescale_factor` must be a positive number, got {value}")))?,
        };
        let image_mean = per_channel(config, "image_mean", OPENAI_CLIP_MEAN)?;
        let image_std = per_channel(config, "image_std", OPENAI_CLIP_STD)?;
        if do_normalize && image_std.contains(&0.0) {
            return Err(config_error("`image_std` must not contain 0"));
        }
        Ok(Qwen2VlImageProcessor {
            patch_size: positive_or(config, "patch_size", 14)?,
            temporal_patch_size: positive_or(config, "temporal_patch_size", 2)?,
            merge_size: positive_or(config, "merge_size", 2)?,
            min_pixels,
            max_pixels,
            do_rescale,
            rescale_factor,
            do_normalize,
            image_mean,
            image_std,
        })
    }

    /// The processor of the model in `dir`, from its `preprocessor_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let path = dir.join("preprocessor_config.json");
        let file_error = |message: String| MultimodalError::ConfigFile { path: path.clone(), message };
        let text = std::fs::read_to_string(&path).map_err(|error| file_error(format!("cannot read it: {error}")))?;
        let json: Value =
            serde_json::from_str(&text).map_err(|error| file_error(format!("not valid JSON: {error}")))?;
        Self::from_config(&json).map_err(|error| file_error(error.to_string()))
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
        let values = self.value_table();
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

    /// Each channel's output for each uint8 value, in the torchvision backend's f32 arithmetic.
    /// With rescale and normalize both on, `rescale_and_normalize` fuses them: mean and std become
    /// f32 tensors times `1 / rescale_factor` (a Python float, which torch casts to f32), and a
    /// value is `(f32(v) - mean) / std`. Normalize alone uses the plain f32 mean and std; rescale
    /// alone is `f32(v) * f32(rescale_factor)`.
    fn value_table(&self) -> [[f32; 256]; CHANNELS] {
        let scale = self.rescale_factor as f32;
        let inverse = (1.0 / self.rescale_factor) as f32;
        std::array::from_fn(|channel| {
            let (mean, std) = if self.do_rescale {
                (self.image_mean[channel] * inverse, self.image_std[channel] * inverse)
            } else {
                (self.image_mean[channel], self.image_std[channel])
            };
            std::array::from_fn(|value| {
                let value = value as f32;
                match (self.do_rescale, self.do_normalize) {
                    (_, true) => (value - mean) / std,
                    (true, false) => value * scale,
                    (false, false) => value,
                }
            })
        })
    }
}

fn config_error(message: impl Into<String>) -> MultimodalError {
    MultimodalError::Config(message.into())
}

/// `key`'s value unless absent or null: transformers treats a null like a missing key.
fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

fn flag(config: &Map<String, Value>, key: &str, default: bool) -> Result<bool, MultimodalError> {
    match present(config, key) {
        None => Ok(default),
        Some(value) => {
            value.as_bool().ok_or_else(|| config_error(format!("`{key}` must be true or false, got {value}")))
        }
    }
}

fn positive(value: &Value, name: &str) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("`{name}` must be a positive integer, got {value}"))
}

/// The positive integer at `key`, or `default` when absent.
fn positive_or(config: &Map<String, Value>, key: &str, default: usize) -> Result<usize, MultimodalError> {
    present(config, key).map_or(Ok(default), |value| positive(value, key).map_err(MultimodalError::Config))
}

/// `image_mean` / `image_std`: one number for every channel or one per channel, stored as the f32
/// that torch and numpy make of the Python floats.
fn per_channel(config: &Map<String, Value>, key: &str, default: [f64; 3]) -> Result<[f32; 3], MultimodalError> {
    let number = |value: &Value| value.as_f64().filter(|v| v.is_finite());
    let values = match present(config, key) {
        None => Some(default),
        Some(Value::Array(items)) if items.len() == CHANNELS => {
            items.iter().map(number).collect::<Option<Vec<f64>>>().map(|v| [v[0], v[1], v[2]])
        }
        Some(value) => number(value).map(|v| [v; 3]),
    };
    values
        .map(|values| values.map(|v| v as f32))
        .ok_or_else(|| config_error(format!("`{key}` must be a number or 3 numbers, got {}", config[key])))
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
