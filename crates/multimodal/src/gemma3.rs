//! transformers' `Gemma3ImageProcessor` (torchvision backend), the image processor of Gemma 3's
//! SigLIP vision tower: resize every image to one fixed size (bilinear unless `resample` says
//! bicubic), rescale and normalize (mean and std 0.5 unless the config says otherwise). The
//! vision tower takes the whole image, channel-first.
//!
//! Pan-and-scan (`do_pan_and_scan: true`, [`Gemma3ImageProcessor::preprocess_with_crops`]): a wide
//! or tall image also becomes a few crops side by side along its long edge, each resized like the
//! image; Gemma 3's processor then writes the image as the whole image and its crops, one image
//! each. Gemma 3's checkpoints leave it off (null); a request turns it on with
//! `mm_processor_kwargs` ([`Gemma3ImageProcessor::with_overrides`]).

use std::borrow::Cow;
use std::path::Path;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    config_error, file_error, flag, image_processor_config, positive, present, resample_filter, size_value,
    Normalization, Size, CHANNELS, IMAGENET_STANDARD,
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
    /// The class has pan-and-scan (Gemma 3's).
    pan_and_scan: bool,
}

impl Class {
    const GEMMA3: Class = Class { filter: Filter::Bilinear, default_to_square: true, crops: false, pan_and_scan: true };
    const SIGLIP: Class = Class { filter: Filter::Bicubic, default_to_square: false, crops: true, pan_and_scan: false };
}

/// A configured `Gemma3ImageProcessor` (or `SiglipImageProcessor`, the same pipeline).
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3ImageProcessor {
    /// `(height, width)` every image is resized to.
    size: (usize, usize),
    filter: Filter,
    normalization: Normalization,
    /// Gemma 3's pan-and-scan settings; `None` for SigLIP's processor, which has none.
    pan_and_scan: Option<PanAndScan>,
}

/// The keys of pan-and-scan, which a request's `mm_processor_kwargs` may set.
const PAN_AND_SCAN_KEYS: [&str; 4] = [
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
];

/// Pan-and-scan's settings. Absent or null keys take `Gemma3Processor`'s defaults (its
/// `images_kwargs`: off, crops of at least 256 pixels, at most 4 of them, for an aspect ratio of
/// at least 1.2), which it passes to the image processor where the checkpoints' configs say null.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PanAndScan {
    enabled: bool,
    min_crop_size: usize,
    max_num_crops: usize,
    min_ratio_to_activate: f64,
}

impl PanAndScan {
    const DEFAULT: PanAndScan =
        PanAndScan { enabled: false, min_crop_size: 256, max_num_crops: 4, min_ratio_to_activate: 1.2 };

    /// These settings with the present (non-null) keys of `object` in their place.
    fn with(self, object: &Map<String, Value>) -> Result<PanAndScan, String> {
        let mut out = self;
        if let Some(value) = present(object, "do_pan_and_scan") {
            out.enabled =
                value.as_bool().ok_or_else(|| format!("`do_pan_and_scan` must be true or false, got {value}"))?;
        }
        if let Some(value) = present(object, "pan_and_scan_min_crop_size") {
            out.min_crop_size = positive(value, "pan_and_scan_min_crop_size")?;
        }
        if let Some(value) = present(object, "pan_and_scan_max_num_crops") {
            out.max_num_crops = positive(value, "pan_and_scan_max_num_crops")?;
        }
        if let Some(value) = present(object, "pan_and_scan_min_ratio_to_activate") {
            out.min_ratio_to_activate = value
                .as_f64()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("`pan_and_scan_min_ratio_to_activate` must be a number, got {value}"))?;
        }
        Ok(out)
    }

    /// transformers' `pan_and_scan_batched`: the crops `(x, y, width, height)` of a `width` x
    /// `height` image, in row-major order; none when it is off, when the image's aspect ratio is
    /// under the threshold, or when the crops would be smaller than the minimum. The last crop may
    /// be narrower (or shorter): the slices stop at the image's edge. The arithmetic is Python's,
    /// in f64.
    fn crops(&self, width: usize, height: usize) -> Vec<[usize; 4]> {
        if !self.enabled || width == 0 || height == 0 {
            return Vec::new();
        }
        let (w, h, min_crop) = (width as f64, height as f64, self.min_crop_size as f64);
        // The number of crops along the long edge: the aspect ratio rounded half up, no more than
        // fit crops of the minimum size, then clamped to [2, max_num_crops].
        let count = |long: f64, short: f64| -> usize {
            let by_ratio = (long / short + 0.5).floor() as usize;
            by_ratio.min((long / min_crop).floor() as usize).max(2).min(self.max_num_crops)
        };
        let (crops_w, crops_h) = if width >= height {
            if w / h < self.min_ratio_to_activate {
                return Vec::new();
            }
            (count(w, h), 1)
        } else {
            if h / w < self.min_ratio_to_activate {
                return Vec::new();
            }
            (1, count(h, w))
        };
        let crop_w = width.div_ceil(crops_w);
        let crop_h = height.div_ceil(crops_h);
        if crop_w.min(crop_h) < self.min_crop_size {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(crops_w * crops_h);
        for y in (0..crops_h).map(|k| k * crop_h) {
            for x in (0..crops_w).map(|k| k * crop_w) {
                // Python's slices stop at the edge. A start past it (a tiny minimum crop size on
                // a thin strip: 5 pixels in 4 crops of 2) is an empty crop, which transformers
                // cannot resize and `preprocess` refuses.
                out.push([x, y, crop_w.min(width.saturating_sub(x)), crop_h.min(height.saturating_sub(y))]);
            }
        }
        out
    }
}

impl Gemma3ImageProcessor {
    /// The processor a `preprocessor_config.json` describes, as transformers'
    /// `Gemma3ImageProcessor(**config)` builds it: absent or null keys take the class defaults
    /// (`size` 224 x 224, bilinear, mean and std 0.5), keys this processor does not use are ignored
    /// (its `_preprocess` neither center-crops nor pads); the pan-and-scan keys are read as
    /// [`Self::with_overrides`] reads them, null ones taking `Gemma3Processor`'s defaults (transformers'
    /// `Gemma3Processor` lets its own defaults win over the config's values; vLLM reads the config's
    /// where they are set, and so does this). Refused: `do_resize: false` (the
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
        let pan_and_scan = if class.pan_and_scan {
            Some(PanAndScan::DEFAULT.with(config).map_err(config_error)?)
        } else if flag(config, "do_pan_and_scan", false)? {
            return Err(config_error("`do_pan_and_scan: true` is Gemma 3's; SigLIP's processor has no pan-and-scan"));
        } else {
            None
        };
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
        Ok(Gemma3ImageProcessor { size, filter, normalization, pan_and_scan })
    }

    /// This processor with a request's `mm_processor_kwargs` (vLLM hands them to transformers'
    /// processor call): Gemma 3's takes the pan-and-scan keys, `do_pan_and_scan`,
    /// `pan_and_scan_min_crop_size`, `pan_and_scan_max_num_crops` and
    /// `pan_and_scan_min_ratio_to_activate` (a null keeps the setting); SigLIP's takes none.
    pub fn with_overrides(&self, kwargs: &Map<String, Value>) -> Result<Self, MultimodalError> {
        let Some(pan_and_scan) = self.pan_and_scan else {
            return Err(MultimodalError::Overrides("SigLIP's image processor takes no mm_processor_kwargs".into()));
        };
        if let Some(key) = kwargs.keys().find(|key| !PAN_AND_SCAN_KEYS.contains(&key.as_str())) {
            return Err(MultimodalError::Overrides(format!(
                "unknown key `{key}`: Gemma 3's image processor takes {}",
                PAN_AND_SCAN_KEYS.join(", ")
            )));
        }
        let pan_and_scan = pan_and_scan.with(kwargs).map_err(MultimodalError::Overrides)?;
        Ok(Gemma3ImageProcessor { pan_and_scan: Some(pan_and_scan), ..self.clone() })
    }

    /// Whether this is Gemma 3's processor, which takes pan-and-scan settings (SigLIP's takes none).
    pub fn has_pan_and_scan(&self) -> bool {
        self.pan_and_scan.is_some()
    }

    /// The pan-and-scan crops of a `width` x `height` image, each `(x, y, width, height)` in
    /// row-major order: transformers' `num_crops` is their count. None with pan-and-scan off.
    pub fn crops(&self, width: usize, height: usize) -> Vec<[usize; 4]> {
        self.pan_and_scan.map_or_else(Vec::new, |p| p.crops(width, height))
    }

    /// The image, then each of its pan-and-scan crops ([`Self::crops`]), each processed as
    /// [`Self::preprocess`] processes an image: transformers' `pixel_values` for one image with
    /// `do_pan_and_scan` (the whole image first, its crops after, as its processor writes them
    /// into the prompt), bit for bit. One image alone with pan-and-scan off or not activated.
    pub fn preprocess_with_crops(&self, image: &RgbImage) -> Result<Vec<PixelPatches>, MultimodalError> {
        let crops = self.crops(image.width() as usize, image.height() as usize);
        let mut out = Vec::with_capacity(1 + crops.len());
        out.push(self.preprocess(image)?);
        for [x, y, width, height] in crops {
            let crop = image::imageops::crop_imm(image, x as u32, y as u32, width as u32, height as u32).to_image();
            out.push(self.preprocess(&crop)?);
        }
        Ok(out)
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
