//! transformers' `Gemma3ImageProcessor` (torchvision backend), the image processor of Gemma 3's
//! SigLIP vision tower: resize every image to one fixed size (bilinear unless `resample` says
//! bicubic), rescale and normalize (mean and std 0.5 unless the config says otherwise). The
//! vision tower takes the whole image, channel-first.
//!
//! Pan-and-scan (`do_pan_and_scan: true`, extra crops of a wide or tall image, each resized like the
//! image) is not implemented: configs that turn it on are refused. Gemma 3's checkpoints leave it
//! off (null).

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    config_error, file_error, flag, image_processor_config, present, resample_filter, size_value, Normalization, Size,
    CHANNELS, IMAGENET_STANDARD,
};
use crate::resize::{resize_rgb, Filter};
use crate::{MultimodalError, PixelPatches};

/// The class default `size`: 224 x 224.
const DEFAULT_SIDE: usize = 224;

/// The class defaults that tell the fixed-size processors apart.
#[derive(Debug, Clone, Copy)]
struct Class {
    filter: Filter,
    default_to_square: bool,
    /// The class's `_preprocess` center-crops when asked (SigLIP's base class); Gemma 3's never does.
    crops: bool,
}

impl Class {
    const GEMMA3: Class = Class { filter: Filter::Bilinear, default_to_square: true, crops: false };
    const SIGLIP: Class = Class { filter: Filter::Bicubic, default_to_square: false, crops: true };
}

/// A configured `Gemma3ImageProcessor` (or `SiglipImageProcessor`, the same pipeline).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3ImageProcessor {
    /// `(height, width)` every image is resized to.
    size: (usize, usize),
    filter: Filter,
    normalization: Normalization,
}

impl Gemma3ImageProcessor {
    /// The processor a `preprocessor_config.json` describes, as transformers'
    /// `Gemma3ImageProcessor(**config)` builds it: absent or null keys take the class defaults
    /// (`size` 224 x 224, bilinear, mean and std 0.5), keys this processor does not use are ignored
    /// (its `_preprocess` neither crops nor pads). Refused: pan-and-scan, `do_resize: false` (the
    /// output would be each image's own size, where the engine needs one to count the image's
    /// tokens), a `size` that is not one fixed size, and a `resample` other than bilinear or
    /// bicubic.
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        Self::from_class_config(json, Class::GEMMA3)
    }

    /// transformers' `SiglipImageProcessor` (the processor of SigLIP towers, LLaVA-interleave's
    /// among them): the same resize to one fixed size, rescale and normalize, with the class's
    /// defaults, bicubic and a number `size` read as a shortest edge (refused); its base class
    /// would center-crop with `do_center_crop: true`, which is refused too.
    pub fn from_siglip_config(json: &Value) -> Result<Self, MultimodalError> {
        Self::from_class_config(json, Class::SIGLIP)
    }

    fn from_class_config(json: &Value, class: Class) -> Result<Self, MultimodalError> {
        let config = json.as_object().ok_or_else(|| config_error("the preprocessor config must be a JSON object"))?;
        if flag(config, "do_pan_and_scan", false)? {
            return Err(config_error(
                "`do_pan_and_scan: true` is not supported: pan-and-scan crops are not implemented",
            ));
        }
        if !flag(config, "do_resize", true)? {
            return Err(config_error("`do_resize: false` is not supported: the output size would be each image's own"));
        }
        if class.crops && flag(config, "do_center_crop", false)? {
            return Err(config_error("`do_center_crop: true` is not supported for a fixed-size SigLIP processor"));
        }
        let size = config_size(config, class.default_to_square)?;
        let filter = resample_filter(config, class.filter)?;
        // The conversion makes RGB of other Pillow modes; `preprocess` takes RGB already (vLLM
        // converts every image to RGB before its processor sees it), so either value gives the
        // same output. The key is still checked, as transformers types it.
        flag(config, "do_convert_rgb", true)?;
        let normalization = Normalization::from_config(config, IMAGENET_STANDARD)?;
        Ok(Gemma3ImageProcessor { size, filter, normalization })
    }

    /// The processor of the model in `dir`, from where transformers' `from_pretrained` reads it:
    /// the `image_processor` object of `processor_config.json` when there is one, else
    /// `preprocessor_config.json`.
    pub fn from_model_dir(dir: &Path) -> Result<Self, MultimodalError> {
        let (path, config) = image_processor_config(dir)?;
        Self::from_config(&config).map_err(|error| file_error(&path, error))
    }

    /// `(height, width)` of every processed image: the config's `size`.
    pub fn output_size(&self) -> (usize, usize) {
        self.size
    }

    /// One RGB image as the vision tower takes it, `[3, height, width]` of [`Self::output_size`],
    /// bit for bit what transformers' torchvision backend makes of the same pixels: the antialiased
    /// resize to exactly that size (none when the image has it already), then the fused rescale
    /// and normalize.
    pub fn preprocess(&self, image: &RgbImage) -> Result<PixelPatches, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let (out_height, out_width) = self.size;
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
        Ok(PixelPatches { pixel_values, patch_dim: CHANNELS * out_height * out_width, grid_thw: [1, 1, 1] })
    }
}

/// `(height, width)` of the resize, after `Gemma3ImageProcessor.__init__`: a number `size` is a
/// square unless `default_to_square` (true for this class) is false, when it is a shortest edge.
fn config_size(config: &Map<String, Value>, default_to_square: bool) -> Result<(usize, usize), MultimodalError> {
    let Some(size) = present(config, "size") else {
        return Ok((DEFAULT_SIDE, DEFAULT_SIDE));
    };
    let fixed_only = || {
        config_error(format!(
            "`size` must be {{\"height\": h, \"width\": w}}, [h, w] or a number, got {size}: Gemma 3's vision tower \
             takes one fixed size"
        ))
    };
    match size_value(size, "size")? {
        Some(Size::HeightWidth(height, width)) => Ok((height, width)),
        Some(Size::Number(side)) if flag(config, "default_to_square", default_to_square)? => Ok((side, side)),
        Some(Size::Number(_)) => Err(config_error(format!(
            "`size` {size} with `default_to_square: false` is a shortest edge, which is not supported: Gemma 3's \
             vision tower takes one fixed size"
        ))),
        Some(Size::ShortestEdge(_)) | None => Err(fixed_only()),
    }
}
