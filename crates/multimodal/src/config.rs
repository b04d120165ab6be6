//! Reading the JSON of an image processor config the way transformers' `ImagesKwargs` take it, and
//! the rescale and normalize steps every torchvision-backend processor shares.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::resize::Filter;
use crate::MultimodalError;

/// A processor class's default `image_mean` and `image_std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MeanStd {
    pub(crate) mean: [f64; 3],
    pub(crate) std: [f64; 3],
}

/// transformers' `OPENAI_CLIP_MEAN` and `OPENAI_CLIP_STD`, the class defaults of CLIP-derived
/// processors (CLIP, Qwen2-VL).
pub(crate) const OPENAI_CLIP: MeanStd =
    MeanStd { mean: [0.48145466, 0.4578275, 0.40821073], std: [0.26862954, 0.26130258, 0.27577711] };
/// transformers' `IMAGENET_STANDARD_MEAN` and `IMAGENET_STANDARD_STD`, the class defaults of
/// SigLIP-derived processors (Gemma 3).
pub(crate) const IMAGENET_STANDARD: MeanStd = MeanStd { mean: [0.5; 3], std: [0.5; 3] };
/// `PILImageResampling.BICUBIC`, the only filter the CLIP and Qwen2-VL processors take.
const BICUBIC: u64 = 3;
pub(crate) const CHANNELS: usize = 3;

pub(crate) fn config_error(message: impl Into<String>) -> MultimodalError {
    MultimodalError::Config(message.into())
}

/// `error` as raised while loading `path`.
pub(crate) fn file_error(path: &Path, error: impl ToString) -> MultimodalError {
    MultimodalError::ConfigFile { path: path.to_path_buf(), message: error.to_string() }
}

/// The JSON in the file at `path`.
pub(crate) fn read_json(path: &Path) -> Result<Value, MultimodalError> {
    let text = std::fs::read_to_string(path).map_err(|error| file_error(path, format!("cannot read it: {error}")))?;
    serde_json::from_str(&text).map_err(|error| file_error(path, format!("not valid JSON: {error}")))
}

/// A model's image processor config from where transformers' `from_pretrained` reads it: the
/// `image_processor` object of `processor_config.json` when there is one (not null), else
/// `preprocessor_config.json`. Returns the file it came from, which errors about it name.
pub fn image_processor_config(dir: &Path) -> Result<(PathBuf, Value), MultimodalError> {
    let processor_path = dir.join("processor_config.json");
    if processor_path.is_file() {
        if let Some(config) = read_json(&processor_path)?.get("image_processor").filter(|v| !v.is_null()) {
            return Ok((processor_path, config.clone()));
        }
    }
    let path = dir.join("preprocessor_config.json");
    let config = read_json(&path)?;
    Ok((path, config))
}

/// A model's video processor config from where transformers' `BaseVideoProcessor.from_pretrained`
/// reads it: the `video_processor` object of `processor_config.json`, else
/// `video_preprocessor_config.json`, else the image processor's `preprocessor_config.json` (older
/// checkpoints, whose video processor takes the image processor's settings).
pub fn video_processor_config(dir: &Path) -> Result<(PathBuf, Value), MultimodalError> {
    let processor_path = dir.join("processor_config.json");
    if processor_path.is_file() {
        if let Some(config) = read_json(&processor_path)?.get("video_processor") {
            return Ok((processor_path, config.clone()));
        }
    }
    let video_path = dir.join("video_preprocessor_config.json");
    let path = if video_path.is_file() { video_path } else { dir.join("preprocessor_config.json") };
    let config = read_json(&path)?;
    Ok((path, config))
}

/// `key`'s value unless absent or null: transformers treats a null like a missing key.
pub(crate) fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

pub(crate) fn flag(config: &Map<String, Value>, key: &str, default: bool) -> Result<bool, MultimodalError> {
    match present(config, key) {
        None => Ok(default),
        Some(value) => {
            value.as_bool().ok_or_else(|| config_error(format!("`{key}` must be true or false, got {value}")))
        }
    }
}

pub(crate) fn positive(value: &Value, name: &str) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("`{name}` must be a positive integer, got {value}"))
}

/// The positive integer at `key`, or `default` when absent.
pub(crate) fn positive_or(config: &Map<String, Value>, key: &str, default: usize) -> Result<usize, MultimodalError> {
    present(config, key).map_or(Ok(default), |value| positive(value, key).map_err(MultimodalError::Config))
}

/// Refuses a `resample` other than bicubic.
pub(crate) fn check_bicubic(config: &Map<String, Value>) -> Result<(), MultimodalError> {
    match present(config, "resample") {
        Some(resample) if resample.as_u64() != Some(BICUBIC) => {
            Err(config_error(format!("`resample` {resample} is not supported, only 3 (bicubic)")))
        }
        _ => Ok(()),
    }
}

/// The filter `resample` names, `default` when absent or null: 2 (bilinear) or 3 (bicubic), the
/// two [`Filter`]s implemented.
pub(crate) fn resample_filter(config: &Map<String, Value>, default: Filter) -> Result<Filter, MultimodalError> {
    match present(config, "resample") {
        None => Ok(default),
        Some(resample) => resample.as_u64().and_then(Filter::from_resample).ok_or_else(|| {
            config_error(format!("`resample` {resample} is not supported, only 2 (bilinear) or 3 (bicubic)"))
        }),
    }
}

/// The shapes of a `size` or `crop_size` that transformers' `get_size_dict` reads and the
/// processors' resizes and crops take.
pub(crate) enum Size {
    Number(usize),
    ShortestEdge(usize),
    HeightWidth(usize, usize),
}

/// `value` as a [`Size`], `None` when it has none of those shapes (transformers knows other size
/// dicts, which the resizes and crops here refuse). Sides must be positive integers.
pub(crate) fn size_value(value: &Value, key: &str) -> Result<Option<Size>, MultimodalError> {
    let side = |value: &Value, name: String| positive(value, &name).map_err(MultimodalError::Config);
    let is_exactly = |dict: &Map<String, Value>, keys: &[&str]| {
        dict.len() == keys.len() && keys.iter().all(|key| dict.contains_key(*key))
    };
    Ok(Some(match value {
        Value::Number(_) => Size::Number(side(value, key.to_string())?),
        Value::Array(items) if items.len() == 2 => {
            Size::HeightWidth(side(&items[0], format!("{key}[0]"))?, side(&items[1], format!("{key}[1]"))?)
        }
        Value::Object(dict) if is_exactly(dict, &["shortest_edge"]) => {
            Size::ShortestEdge(side(&dict["shortest_edge"], format!("{key}.shortest_edge"))?)
        }
        Value::Object(dict) if is_exactly(dict, &["height", "width"]) => Size::HeightWidth(
            side(&dict["height"], format!("{key}.height"))?,
            side(&dict["width"], format!("{key}.width"))?,
        ),
        _ => return Ok(None),
    }))
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

/// The `do_rescale` / `rescale_factor` / `do_normalize` / `image_mean` / `image_std` of a config,
/// applied as the torchvision backend's `rescale_and_normalize` applies them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Normalization {
    do_rescale: bool,
    rescale_factor: f64,
    do_normalize: bool,
    image_mean: [f32; 3],
    image_std: [f32; 3],
}

impl Normalization {
    /// Absent or null keys take the defaults: rescale by 1/255 (every processor here) and
    /// normalize with the processor class's mean and std, `defaults`.
    pub(crate) fn from_config(config: &Map<String, Value>, defaults: MeanStd) -> Result<Self, MultimodalError> {
        let do_rescale = flag(config, "do_rescale", true)?;
        let do_normalize = flag(config, "do_normalize", true)?;
        let rescale_factor = match present(config, "rescale_factor") {
            None => 1.0 / 255.0,
            Some(value) => value
                .as_f64()
                .filter(|factor| factor.is_finite() && *factor > 0.0)
                .ok_or_else(|| config_error(format!("`rescale_factor` must be a positive number, got {value}")))?,
        };
        let image_mean = per_channel(config, "image_mean", defaults.mean)?;
        let image_std = per_channel(config, "image_std", defaults.std)?;
        if do_normalize && image_std.contains(&0.0) {
            return Err(config_error("`image_std` must not contain 0"));
        }
        Ok(Normalization { do_rescale, rescale_factor, do_normalize, image_mean, image_std })
    }

    /// Each channel's output for each uint8 value, in the torchvision backend's f32 arithmetic.
    /// With rescale and normalize both on, `rescale_and_normalize` fuses them: mean and std become
    /// f32 tensors times `1 / rescale_factor` (a Python float, which torch casts to f32), and a
    /// value is `(f32(v) - mean) / std`. Normalize alone uses the plain f32 mean and std; rescale
    /// alone is `f32(v) * f32(rescale_factor)`.
    pub(crate) fn value_table(&self) -> [[f32; 256]; CHANNELS] {
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
