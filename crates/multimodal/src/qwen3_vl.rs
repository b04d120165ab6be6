//! transformers' `Qwen3VLVideoProcessor` (torchvision backend), the video processor of Qwen3-VL,
//! Qwen3-VL-MoE and Qwen3.5, for a video given as its frames: frames sampled at `fps` a second
//! of the 24 fps transformers assumes for frames without metadata (or `num_frames` of them), the
//! clip resized to whole merge windows within a pixel budget counted over all its frames, then
//! rescaled, normalized and cut into patches as Qwen2-VL's. Each temporal patch gets a timestamp,
//! the mean time of its frames, which Qwen3-VL's processor writes into the prompt before the
//! patch's placeholders ([`Qwen3VlVideoProcessor::frame_text`]).

use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    check_bicubic, config_error, file_error, flag, positive, positive_or, present, video_processor_config,
    Normalization, IMAGENET_STANDARD,
};
use crate::qwen2_vl::{clip_size, pixel_range, Patcher};
use crate::{MultimodalError, PixelPatches, FRAME_LIST_FPS, MAX_ASPECT_RATIO};

/// `Qwen3VLVideoProcessor.size`: 128 to 768 merged tokens of 32 * 32 pixels, over all frames.
const DEFAULT_PIXEL_RANGE: (usize, usize) = (128 * 32 * 32, 32 * 32 * 768);

/// The `mm_processor_kwargs` keys only a video processor reads; transformers' processor hands
/// them to its video processor alone, so the image processor never sees them.
pub const VIDEO_ONLY_KWARGS: [&str; 3] = ["fps", "num_frames", "do_sample_frames"];

/// A configured `Qwen3VLVideoProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3VlVideoProcessor {
    pub patch_size: usize,
    /// Frames in a patch; a clip is padded to a multiple of it by repeating its last frame.
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    /// Fewest pixels of all the sampled frames together (`size.shortest_edge`).
    pub min_pixels: usize,
    /// Most pixels of all the sampled frames together (`size.longest_edge`).
    pub max_pixels: usize,
    /// Whether frames are sampled from the ones given (`do_sample_frames`).
    pub do_sample_frames: bool,
    /// Frames sampled a second of video (`fps`); exclusive with `num_frames`.
    pub fps: Option<f64>,
    /// Frames sampled from a video (`num_frames`); exclusive with `fps`.
    pub num_frames: Option<usize>,
    /// Bounds of the frames `fps` samples (`min_frames`, `max_frames`).
    pub min_frames: usize,
    pub max_frames: usize,
    /// `cap_pixels_per_frame`: each frame gets at most `max_video_tokens` merged tokens' pixels
    /// and an even share of `max_pixels`, floored at 1.05 * `min_pixels` (qwen-vl-utils' budget).
    pub cap_pixels_per_frame: bool,
    pub max_video_tokens: usize,
    normalization: Normalization,
}

/// A video as [`Qwen3VlVideoProcessor::preprocess`] makes it: its patches, the indices of the
/// frames it sampled, and the seconds of each temporal patch.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3VlVideo {
    pub patches: PixelPatches,
    pub frame_indices: Vec<usize>,
    pub timestamps: Vec<f64>,
}

impl Qwen3VlVideoProcessor {
    /// The processor a video processor config describes, as `Qwen3VLVideoProcessor(**config)`
    /// builds it: absent or null keys take the class defaults (legacy `min_pixels` /
    /// `max_pixels`, which this class does not read, are ignored as transformers ignores them).
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config =
            json.as_object().ok_or_else(|| config_error("the video processor config must be a JSON object"))?;
        if !flag(config, "do_resize", true)? {
            return Err(config_error("`do_resize: false` is not supported: the patch grid needs the resize"));
        }
        check_bicubic(config)?;
        let (min_pixels, max_pixels) = match present(config, "size") {
            None => DEFAULT_PIXEL_RANGE,
            Some(Value::Object(size)) => pixel_range(size, false).map_err(MultimodalError::Config)?,
            Some(other) => return Err(config_error(format!("`size` must be an object, got {other}"))),
        };
        let processor = Qwen3VlVideoProcessor {
            patch_size: positive_or(config, "patch_size", 16)?,
            temporal_patch_size: positive_or(config, "temporal_patch_size", 2)?,
            merge_size: positive_or(config, "merge_size", 2)?,
            min_pixels,
            max_pixels,
            do_sample_frames: flag(config, "do_sample_frames", true)?,
            fps: match config.get("fps") {
                // The class default; a null in the file is an explicit None.
                None => Some(2.0),
                Some(value) => fps(value).map_err(MultimodalError::Config)?,
            },
            num_frames: present(config, "num_frames")
                .map(|value| positive(value, "num_frames"))
                .transpose()
                .map_err(MultimodalError::Config)?,
            min_frames: positive_or(config, "min_frames", 4)?,
            max_frames: positive_or(config, "max_frames", 768)?,
            cap_pixels_per_frame: flag(config, "cap_pixels_per_frame", false)?,
            max_video_tokens: positive_or(config, "max_video_tokens", 768)?,
            normalization: Normalization::from_config(config, IMAGENET_STANDARD)?,
        };
        Ok(processor)
    }

    /// The video processor of the model in `dir`, from where transformers reads it
    /// ([`video_processor_config`](crate::video_processor_config)).
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let (path, config) = video_processor_config(dir)?;
        Self::from_config(&config).map_err(|error| file_error(&path, error))
    }

    /// This processor with a request's `mm_processor_kwargs`, as a processor call hands them to
    /// its video processor: `size` (both edges) replaces the pixel budget; `fps`, `num_frames`
    /// (null unsets either) and `do_sample_frames` replace the sampling. `min_pixels` and
    /// `max_pixels` are the image processor's, which the video processor does not read. Any
    /// other key is refused.
    pub fn with_overrides(&self, kwargs: &Map<String, Value>) -> Result<Self, MultimodalError> {
        let mut out = self.clone();
        let invalid = MultimodalError::Overrides;
        for (key, value) in kwargs {
            match key.as_str() {
                "size" => {
                    let size =
                        value.as_object().ok_or_else(|| invalid(format!("`size` must be an object, got {value}")))?;
                    (out.min_pixels, out.max_pixels) = pixel_range(size, false).map_err(invalid)?;
                }
                "fps" => out.fps = fps(value).map_err(invalid)?,
                "num_frames" => {
                    out.num_frames = match value {
                        Value::Null => None,
                        value => Some(positive(value, "num_frames").map_err(invalid)?),
                    }
                }
                "do_sample_frames" => {
                    out.do_sample_frames = value
                        .as_bool()
                        .ok_or_else(|| invalid(format!("`do_sample_frames` must be true or false, got {value}")))?
                }
                "min_pixels" | "max_pixels" => {}
                _ => {
                    return Err(invalid(format!(
                        "unknown key `{key}`: the Qwen3-VL video processor takes size, fps, num_frames and \
                         do_sample_frames (and the image processor min_pixels and max_pixels)"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// The indices of the frames a video of `total` frames is cut down to: transformers'
    /// `Qwen3VLVideoProcessor.sample_frames` for a video without metadata (24 fps), or every frame
    /// when `do_sample_frames` is off.
    pub fn sample_frames(&self, total: usize) -> Result<Vec<usize>, MultimodalError> {
        if total == 0 {
            return Err(MultimodalError::EmptyVideo);
        }
        if !self.do_sample_frames {
            return Ok((0..total).collect());
        }
        let count = match (self.num_frames, self.fps) {
            (Some(_), Some(_)) => {
                return Err(MultimodalError::Overrides(
                    "`num_frames` and `fps` are mutually exclusive: pass `fps: null` with `num_frames`".into(),
                ))
            }
            (Some(count), None) => count,
            // int(total / fps_of_video * fps), then within [min_frames, max_frames] and the frames there are.
            (None, Some(fps)) => {
                let count = (total as f64 / FRAME_LIST_FPS * fps) as usize;
                count.max(self.min_frames).min(self.max_frames).min(total)
            }
            (None, None) => total.max(self.min_frames).min(self.max_frames),
        };
        Ok(linspace_rounded(total - 1, count))
    }

    /// The `(height, width)` every frame of a clip of `frames` sampled frames of `height` x
    /// `width` is resized to: transformers' Qwen3-VL `smart_resize`, whose budget counts the
    /// pixels of all frames (padded to whole temporal patches), with the per-frame cap applied.
    pub fn smart_resize(&self, frames: usize, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        let factor = self.patch_size * self.merge_size;
        let temporal = self.temporal_patch_size;
        if frames < temporal {
            return Err(MultimodalError::TooFewFrames { frames, needed: temporal });
        }
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let mut max_pixels = self.max_pixels;
        if self.cap_pixels_per_frame {
            let frame_cap = self.max_video_tokens.saturating_mul(factor * factor);
            // int(shortest_edge * 1.05), in f64 as Python computes it.
            let floor = (self.min_pixels as f64 * 1.05) as usize;
            max_pixels = frame_cap.min(self.max_pixels / frames).max(floor).saturating_mul(frames);
        }
        // A side shorter than a merge window is first scaled up (both sides, truncated) to reach it.
        let (mut height, mut width) = (height, width);
        if height < factor || width < factor {
            let scale = (factor as f64 / height as f64).max(factor as f64 / width as f64);
            (height, width) = ((height as f64 * scale) as usize, (width as f64 * scale) as usize);
        }
        let ratio = height.max(width) as f64 / height.min(width) as f64;
        if ratio > MAX_ASPECT_RATIO {
            return Err(MultimodalError::AspectRatio { width, height, ratio });
        }
        let (h, w, f) = (height as f64, width as f64, factor as f64);
        let to_factor = |sides: f64| (sides as usize).saturating_mul(factor);
        let (mut h_bar, mut w_bar) = (to_factor((h / f).round_ties_even()), to_factor((w / f).round_ties_even()));
        let t_bar = ((frames as f64 / temporal as f64).round_ties_even() as usize) * temporal;
        let volume = t_bar as u128 * h_bar as u128 * w_bar as u128;
        let pixels = frames as u128 * height as u128 * width as u128;
        if volume > max_pixels as u128 {
            let beta = (pixels as f64 / max_pixels as f64).sqrt();
            h_bar = factor.max(to_factor((h / beta / f).floor()));
            w_bar = factor.max(to_factor((w / beta / f).floor()));
        } else if volume < self.min_pixels as u128 {
            let beta = (self.min_pixels as f64 / pixels as f64).sqrt();
            h_bar = to_factor((h * beta / f).ceil());
            w_bar = to_factor((w * beta / f).ceil());
        }
        Ok((h_bar, w_bar))
    }

    /// A video's RGB frames (all of one size) sampled, resized, padded to whole temporal patches
    /// and cut into patches, bit for bit as transformers' torchvision backend does it, with the
    /// timestamps of its temporal patches.
    pub fn preprocess(&self, frames: &[RgbImage]) -> Result<Qwen3VlVideo, MultimodalError> {
        let (height, width) = clip_size(frames)?;
        let frame_indices = self.sample_frames(frames.len())?;
        let out = self.smart_resize(frame_indices.len(), height, width)?;
        let patcher = Patcher {
            patch: self.patch_size,
            temporal: self.temporal_patch_size,
            merge: self.merge_size,
            normalization: &self.normalization,
        };
        let sampled: Vec<&RgbImage> = frame_indices.iter().map(|&k| &frames[k]).collect();
        let patches = patcher.patchify_clip(&sampled, (height, width), out)?;
        let timestamps = self.timestamps(&frame_indices);
        Ok(Qwen3VlVideo { patches, frame_indices, timestamps })
    }

    /// Qwen3-VL's processor's `_calculate_timestamps` at 24 fps: the sampled indices padded with
    /// the last to whole temporal patches, each patch the mean of its first and last frame's
    /// seconds.
    pub fn timestamps(&self, frame_indices: &[usize]) -> Vec<f64> {
        let merge = self.temporal_patch_size;
        let last = frame_indices.last().copied().unwrap_or(0);
        let mut seconds: Vec<f64> = frame_indices.iter().map(|&k| k as f64 / FRAME_LIST_FPS).collect();
        seconds.resize(frame_indices.len().next_multiple_of(merge), last as f64 / FRAME_LIST_FPS);
        seconds.chunks_exact(merge).map(|patch| (patch[0] + patch[merge - 1]) / 2.0).collect()
    }

    /// The text Qwen3-VL's processor writes before a temporal patch's placeholders: its seconds
    /// with one decimal (Python's `:.1f`, which rounds the exact binary value as Rust does).
    pub fn frame_text(seconds: f64) -> String {
        format!("<{seconds:.1} seconds>")
    }
}

/// An `fps` value: a positive number, or null for none.
fn fps(value: &Value) -> Result<Option<f64>, String> {
    match value {
        Value::Null => Ok(None),
        value => match value.as_f64().filter(|v| v.is_finite() && *v > 0.0) {
            Some(fps) => Ok(Some(fps)),
            None => Err(format!("`fps` must be a positive number, got {value}")),
        },
    }
}

/// `np.linspace(0, stop, count).round().astype(int)`: `i * (stop / (count - 1))`, the last exactly
/// `stop`, rounded half to even.
fn linspace_rounded(stop: usize, count: usize) -> Vec<usize> {
    if count == 1 {
        return vec![0];
    }
    let step = stop as f64 / (count - 1) as f64;
    (0..count)
        .map(|i| match i + 1 == count {
            true => stop,
            // numpy divides first where the step is 0 (one frame), which gives the same 0s.
            false => (i as f64 * step).round_ties_even() as usize,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_rounds_as_numpy() {
        // np.linspace(0, 4, 4) = [0, 1.33, 2.67, 4]; np.linspace(0, 9, 4) = [0, 3, 6, 9];
        // np.linspace(0, 1, 6) = [0, .2, .4, .6, .8, 1]; .5 rounds to even.
        assert_eq!(linspace_rounded(4, 4), [0, 1, 3, 4]);
        assert_eq!(linspace_rounded(9, 4), [0, 3, 6, 9]);
        assert_eq!(linspace_rounded(1, 6), [0, 0, 0, 1, 1, 1]);
        assert_eq!(linspace_rounded(5, 3), [0, 2, 5]);
        assert_eq!(linspace_rounded(0, 3), [0, 0, 0]);
    }

    #[test]
    fn class_defaults_overrides_and_refusals() {
        let p = Qwen3VlVideoProcessor::from_config(&serde_json::json!({"min_pixels": 1, "max_pixels": 2})).unwrap();
        // The legacy keys are not this class's: the budget stays the class default.
        assert_eq!((p.min_pixels, p.max_pixels), DEFAULT_PIXEL_RANGE);
        assert_eq!((p.patch_size, p.fps, p.num_frames, p.do_sample_frames), (16, Some(2.0), None, true));
        // fps 2 of an assumed 24: 48 frames sample 4, 120 sample 10.
        assert_eq!(p.sample_frames(48).unwrap(), [0, 16, 31, 47]);
        assert_eq!(p.sample_frames(120).unwrap().len(), 10);

        let kwargs = |json: serde_json::Value| json.as_object().unwrap().clone();
        let both = p.with_overrides(&kwargs(serde_json::json!({"num_frames": 3}))).unwrap();
        let e = both.sample_frames(10).unwrap_err().to_string();
        assert!(e.contains("mutually exclusive"), "{e}");
        let three = p.with_overrides(&kwargs(serde_json::json!({"num_frames": 3, "fps": null}))).unwrap();
        assert_eq!(three.sample_frames(10).unwrap(), [0, 4, 9]);
        let all = p.with_overrides(&kwargs(serde_json::json!({"do_sample_frames": false, "max_pixels": 9}))).unwrap();
        assert_eq!(all.sample_frames(3).unwrap(), [0, 1, 2]);
        for bad in [
            serde_json::json!({"fps": 0}),
            serde_json::json!({"fps": "2"}),
            serde_json::json!({"num_frames": -1}),
            serde_json::json!({"size": {"shortest_edge": 4}}),
            serde_json::json!({"do_sample_frames": 1}),
            serde_json::json!({"do_pan_and_scan": true}),
        ] {
            assert!(p.with_overrides(&kwargs(bad.clone())).is_err(), "{bad}");
        }

        // One frame cannot fill a temporal patch: transformers raises, the request is refused.
        let one = RgbImage::new(40, 40);
        let e = p.preprocess(std::slice::from_ref(&one)).unwrap_err().to_string();
        assert!(e.contains("1 frames (after sampling) is too short: it needs at least 2"), "{e}");
        assert!(matches!(p.preprocess(&[]), Err(MultimodalError::EmptyVideo)));
        let e = p.preprocess(&[RgbImage::new(1, 400), RgbImage::new(1, 400)]).unwrap_err();
        assert!(matches!(e, MultimodalError::AspectRatio { .. }), "{e}");
        // A budget that would resize two small frames to gigapixels is refused before any resize.
        let huge = serde_json::json!({"size": {"shortest_edge": 1u64 << 40, "longest_edge": 1u64 << 41}});
        let e = p.with_overrides(&kwargs(huge)).unwrap().preprocess(&[one.clone(), one]).unwrap_err().to_string();
        assert!(e.contains("more than the 178956970 allowed"), "{e}");
    }
}
