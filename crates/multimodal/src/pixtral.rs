//! transformers' `PixtralImageProcessor` (torchvision backend), the image processor of Pixtral and
//! Mistral 3: the image keeps its aspect ratio and its own size, scaled down to fit `size`
//! (`longest_edge`) when it is larger, each side then rounded up to whole patches (so a small
//! image is enlarged a little), resized once to that, rescaled and normalized (CLIP's mean and std
//! unless the config says otherwise). The tower takes it channel-first at that size.
//!
//! `PixtralProcessor` hands its image processor a patch of its own, `patch_size *
//! spatial_merge_size` from `processor_config.json`, whatever the image processor's config says:
//! see [`PixtralImageProcessor::with_patch_size`].

use std::borrow::Cow;

use image::RgbImage;
use serde_json::Value;

use crate::config::{
    config_error, flag, positive, present, resample_filter, size_value, Normalization, Size, CHANNELS, OPENAI_CLIP,
};
use crate::resize::{resize_rgb, Filter};
use crate::{MultimodalError, MAX_ASPECT_RATIO};

/// The class defaults: `size` `{"longest_edge": 1024}`, `patch_size` 16 x 16.
const DEFAULT_LONGEST_EDGE: usize = 1024;
const DEFAULT_PATCH: usize = 16;

/// One image as Pixtral's tower takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PixtralPixels {
    /// `[3, height, width]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `(height, width)` in pixels, whole patches (transformers' `image_sizes`).
    pub size: (usize, usize),
}

/// A configured `PixtralImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct PixtralImageProcessor {
    /// `(height, width)` an image is scaled down to fit.
    max_size: (usize, usize),
    /// `(height, width)` of a patch, which the output's sides are multiples of.
    patch: (usize, usize),
    filter: Filter,
    normalization: Normalization,
}

impl PixtralImageProcessor {
    /// The processor a `preprocessor_config.json` (or `processor_config.json`'s `image_processor`)
    /// describes, as transformers' `PixtralImageProcessor(**config)` builds it: absent or null keys
    /// take the class defaults, keys this processor does not use are ignored (`do_pad` pads a
    /// batch to its largest image, and each image here is its own). `do_resize: false` and a center
    /// crop are refused: the image would not be whole patches.
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config = json.as_object().ok_or_else(|| config_error("the preprocessor config must be a JSON object"))?;
        if !flag(config, "do_resize", true)? || flag(config, "do_center_crop", false)? {
            return Err(config_error(
                "`do_resize: false` and `do_center_crop: true` are not supported: Pixtral's tower takes an image \
                 resized to whole patches",
            ));
        }
        let max_size = match present(config, "size") {
            None => (DEFAULT_LONGEST_EDGE, DEFAULT_LONGEST_EDGE),
            Some(value) => match (value, size_value(value, "size")?) {
                (_, Some(Size::HeightWidth(height, width))) => (height, width),
                (Value::Object(dict), _) if dict.len() == 1 && dict.contains_key("longest_edge") => {
                    let side = positive(&dict["longest_edge"], "size.longest_edge").map_err(MultimodalError::Config)?;
                    (side, side)
                }
                _ => {
                    return Err(config_error(format!(
                        "`size` must be {{\"longest_edge\": n}} or {{\"height\": h, \"width\": w}}, got {value}"
                    )))
                }
            },
        };
        let patch = match present(config, "patch_size") {
            None => (DEFAULT_PATCH, DEFAULT_PATCH),
            Some(value) => match size_value(value, "patch_size")? {
                Some(Size::Number(side)) => (side, side),
                Some(Size::HeightWidth(height, width)) => (height, width),
                _ => {
                    return Err(config_error(format!(
                        "`patch_size` must be {{\"height\": h, \"width\": w}} or a number, got {value}"
                    )))
                }
            },
        };
        // The conversion makes RGB of other Pillow modes; `preprocess` takes RGB already (vLLM
        // converts every image to RGB before its processor sees it). Still checked, as
        // transformers types it.
        flag(config, "do_convert_rgb", true)?;
        flag(config, "do_pad", true)?;
        Ok(PixtralImageProcessor {
            max_size,
            patch,
            filter: resample_filter(config, Filter::Bicubic)?,
            normalization: Normalization::from_config(config, OPENAI_CLIP)?,
        })
    }

    /// The processor with square patches of `side` pixels: what `PixtralProcessor` passes it,
    /// its `patch_size * spatial_merge_size`, so that every image is whole merged patches.
    pub fn with_patch_size(mut self, side: usize) -> Self {
        self.patch = (side, side);
        self
    }

    /// `(height, width)` of a patch.
    pub fn patch_size(&self) -> (usize, usize) {
        self.patch
    }

    /// transformers' `get_resize_output_image_size`: `(height, width)` of an image of `height` x
    /// `width` once processed. An image larger than `size` is scaled by the larger of its sides'
    /// ratios to it (each side floored), then each side is rounded up to whole patches; in
    /// Python's float arithmetic. transformers sets no limit on the aspect ratio; this refuses more
    /// than 200, as the other processors do.
    pub fn resized_size(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let ratio = height.max(width) as f64 / height.min(width) as f64;
        if ratio > MAX_ASPECT_RATIO {
            return Err(MultimodalError::AspectRatio { width, height, ratio });
        }
        let scale = f64::max(height as f64 / self.max_size.0 as f64, width as f64 / self.max_size.1 as f64);
        let (height, width) = if scale > 1.0 {
            ((height as f64 / scale).floor() as usize, (width as f64 / scale).floor() as usize)
        } else {
            (height, width)
        };
        // A side scaled to nothing would make an empty image, which torch cannot resize to.
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let (patch_height, patch_width) = self.patch;
        Ok((height.div_ceil(patch_height) * patch_height, width.div_ceil(patch_width) * patch_width))
    }

    /// One RGB image as the tower takes it, bit for bit what transformers' torchvision backend
    /// makes of the same pixels (without the padding to a batch's largest image).
    pub fn preprocess(&self, image: &RgbImage) -> Result<PixtralPixels, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        let (out_height, out_width) = self.resized_size(height, width)?;
        // An `RgbImage`'s buffer may run past its last row.
        let pixels = if (out_height, out_width) == (height, width) {
            Cow::Borrowed(&image.as_raw()[..height * width * CHANNELS])
        } else {
            Cow::Owned(resize_rgb(image.as_raw(), width, height, out_width, out_height, self.filter))
        };
        let mut pixel_values = Vec::with_capacity(CHANNELS * out_height * out_width);
        for (channel, table) in self.normalization.value_table().iter().enumerate() {
            pixel_values.extend(pixels.chunks_exact(CHANNELS).map(|pixel| table[usize::from(pixel[channel])]));
        }
        Ok(PixtralPixels { pixel_values, size: (out_height, out_width) })
    }
}
