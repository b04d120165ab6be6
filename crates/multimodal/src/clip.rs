//! transformers' `CLIPImageProcessor` (torchvision backend), the image processor of CLIP vision
//! towers and of the LLaVA-1.5 checkpoints built on them: resize (the short side to
//! `size.shortest_edge`, or to a fixed size), center-crop to `crop_size` (padding with black where
//! the image is smaller), rescale and normalize. The vision tower takes the whole image,
//! channel-first.

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    check_bicubic, config_error, file_error, flag, image_processor_config, present, size_value, Normalization, Size,
    CHANNELS, OPENAI_CLIP,
};
use crate::resize::{resize_rgb, Filter};
use crate::{MultimodalError, PixelPatches, MAX_ASPECT_RATIO};

/// The class defaults: `size` `{"shortest_edge": 224}`, `crop_size` 224 x 224.
const DEFAULT_SIDE: usize = 224;

/// The resize `size` asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Resize {
    /// The short side becomes this; the long side keeps the aspect ratio.
    ShortestEdge(usize),
    /// Exactly `(height, width)`.
    Exact(usize, usize),
}

/// A configured `CLIPImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipImageProcessor {
    /// `None` with `do_resize: false`.
    resize: Option<Resize>,
    /// `(height, width)` of every output: `crop_size`, or without the crop the fixed resize, which
    /// a crop of its own size leaves as it is.
    output: (usize, usize),
    normalization: Normalization,
}

impl ClipImageProcessor {
    /// The processor a `preprocessor_config.json` describes, as transformers'
    /// `CLIPImageProcessor(**config)` builds it: absent or null keys take the class defaults,
    /// keys this processor does not use are ignored. Configs whose output size would follow each
    /// image's (`do_center_crop: false` without a fixed `size`) are refused: the engine needs one
    /// size to count the image's tokens.
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config = json.as_object().ok_or_else(|| config_error("the preprocessor config must be a JSON object"))?;
        let resize = if flag(config, "do_resize", true)? {
            check_bicubic(config)?;
            Some(config_resize(config)?)
        } else {
            None
        };
        let output = config_output(config, resize)?;
        // The conversion makes RGB of other Pillow modes; `preprocess` takes RGB already (vLLM
        // converts every image to RGB before its processor sees it), so either value gives the
        // same output. The key is still checked, as transformers types it.
        flag(config, "do_convert_rgb", true)?;
        // Without a `pad_size` the backend pads a batch to its largest image, and every output
        // here has the one output size already.
        if flag(config, "do_pad", false)? && present(config, "pad_size").is_some() {
            return Err(config_error("`do_pad: true` with a `pad_size` is not supported"));
        }
        Ok(ClipImageProcessor { resize, output, normalization: Normalization::from_config(config, OPENAI_CLIP)? })
    }

    /// The processor of the model in `dir`, from where transformers' `from_pretrained` reads it:
    /// the `image_processor` object of `processor_config.json` when there is one, else
    /// `preprocessor_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let (path, config) = image_processor_config(dir)?;
        Self::from_config(&config).map_err(|error| file_error(&path, error))
    }

    /// `(height, width)` of every processed image: `crop_size`, or the fixed `size` when the
    /// config does not crop.
    pub fn output_size(&self) -> (usize, usize) {
        self.output
    }

    /// The `(height, width)` an image of `height` x `width` is resized to, before the crop. With
    /// `shortest_edge` S it is transformers' `get_resize_output_image_size(default_to_square=False)`:
    /// the short side (the width when both are equal) becomes S, the long side
    /// `int(S * long / short)`, Python's float division truncated. Python divides the exact
    /// integer `S * long` where this divides its f64: the two agree while it is below 2^53.
    /// transformers sets no limit on the aspect ratio; this refuses more than 200, as Qwen2-VL
    /// does, since the resize of a thin strip would otherwise run to gigabytes before the crop.
    pub fn resized_size(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        match self.resize {
            None => Ok((height, width)),
            Some(Resize::Exact(height, width)) => Ok((height, width)),
            Some(Resize::ShortestEdge(side)) => {
                let (short, long) = if width <= height { (width, height) } else { (height, width) };
                let ratio = long as f64 / short as f64;
                if ratio > MAX_ASPECT_RATIO {
                    return Err(MultimodalError::AspectRatio { width, height, ratio });
                }
                let new_long = ((side as u128 * long as u128) as f64 / short as f64) as usize;
                Ok(if width <= height { (new_long, side) } else { (side, new_long) })
            }
        }
    }

    /// One RGB image as the vision tower takes it, `[3, height, width]` of [`Self::output_size`],
    /// bit for bit what transformers' torchvision backend makes of the same pixels.
    pub fn preprocess(&self, image: &RgbImage) -> Result<PixelPatches, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        let (resized_height, resized_width) = self.resized_size(height, width)?;
        let pixels = if (resized_height, resized_width) == (height, width) {
            Cow::Borrowed(image.as_raw().as_slice())
        } else {
            Cow::Owned(resize_rgb(image.as_raw(), width, height, resized_width, resized_height, Filter::Bicubic))
        };
        let (out_height, out_width) = self.output;
        let top = crop_offset(resized_height, out_height);
        let left = crop_offset(resized_width, out_width);
        let mut pixel_values = Vec::with_capacity(CHANNELS * out_height * out_width);
        for (channel, table) in self.normalization.value_table().iter().enumerate() {
            // The padding is uint8 zeros, normalized like the pixels.
            let padding = table[0];
            for y in 0..out_height {
                let source_y = y.checked_add_signed(top).filter(|&y| y < resized_height);
                pixel_values.extend((0..out_width).map(|x| {
                    match (source_y, x.checked_add_signed(left).filter(|&x| x < resized_width)) {
                        (Some(y), Some(x)) => table[usize::from(pixels[(y * resized_width + x) * CHANNELS + channel])],
                        _ => padding,
                    }
                }));
            }
        }
        Ok(PixelPatches { pixel_values, patch_dim: CHANNELS * out_height * out_width, grid_thw: [1, 1, 1] })
    }
}

/// Where the crop of `crop` pixels starts along an axis of `size`, negative into the padding. The
/// backend's `center_crop` starts at `int((size - crop) / 2.0)` (truncated, not rounded as
/// torchvision's own `center_crop` does) and, when the crop is the longer, first pads
/// `(crop - size) // 2` zeros before the image and the rest after: both are `(size - crop) / 2`
/// rounded toward zero.
fn crop_offset(size: usize, crop: usize) -> isize {
    (size as isize - crop as isize) / 2
}

/// The resize of a config, after `CLIPImageProcessor.__init__`: KOSMOS-2's `use_square_size`
/// replaces `size` with a square of the class default side; a number `size` is the shortest edge
/// unless `default_to_square`.
fn config_resize(config: &Map<String, Value>) -> Result<Resize, MultimodalError> {
    if flag(config, "use_square_size", false)? {
        return Ok(Resize::Exact(DEFAULT_SIDE, DEFAULT_SIDE));
    }
    let Some(size) = present(config, "size") else {
        return Ok(Resize::ShortestEdge(DEFAULT_SIDE));
    };
    match size_value(size, "size")? {
        Some(Size::Number(side)) if flag(config, "default_to_square", false)? => Ok(Resize::Exact(side, side)),
        Some(Size::Number(side) | Size::ShortestEdge(side)) => Ok(Resize::ShortestEdge(side)),
        Some(Size::HeightWidth(height, width)) => Ok(Resize::Exact(height, width)),
        None => Err(config_error(format!(
            "`size` must be {{\"shortest_edge\": s}}, {{\"height\": h, \"width\": w}}, [h, w] or a number, got {size}"
        ))),
    }
}

/// `(height, width)` of the outputs: `crop_size`, or without the crop a fixed `size`.
fn config_output(config: &Map<String, Value>, resize: Option<Resize>) -> Result<(usize, usize), MultimodalError> {
    if !flag(config, "do_center_crop", true)? {
        return match resize {
            Some(Resize::Exact(height, width)) => Ok((height, width)),
            Some(Resize::ShortestEdge(_)) => Err(config_error(
                "`do_center_crop: false` is not supported with `size.shortest_edge`: the output size would follow \
                 each image's aspect ratio",
            )),
            None => Err(config_error(
                "`do_resize: false` with `do_center_crop: false` is not supported: the output size would be each \
                 image's own",
            )),
        };
    }
    let Some(crop_size) = present(config, "crop_size") else {
        return Ok((DEFAULT_SIDE, DEFAULT_SIDE));
    };
    match size_value(crop_size, "crop_size")? {
        Some(Size::Number(side)) => Ok((side, side)),
        Some(Size::HeightWidth(height, width)) => Ok((height, width)),
        Some(Size::ShortestEdge(_)) | None => Err(config_error(format!(
            "`crop_size` must be {{\"height\": h, \"width\": w}}, [h, w] or a number, got {crop_size}"
        ))),
    }
}
