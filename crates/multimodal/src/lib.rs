//! Image and video inputs for vision-language models, as vLLM prepares them: an encoded image (PNG,
//! JPEG, WebP, GIF, BMP) becomes RGB pixels the way Pillow and transformers' `convert_to_rgb` make
//! them ([`decode_image`]; a video's frames each the same way), and a processor turns those pixels
//! into what the vision encoder takes: flat patches and their grid ([`Qwen2VlImageProcessor`] and
//! [`Qwen2VlVideoProcessor`], transformers' `Qwen2VLImageProcessor` and `Qwen2VLVideoProcessor`;
//! [`Qwen3VlVideoProcessor`], `Qwen3VLVideoProcessor`, which also samples frames and times them) or
//! one fixed-size channel-first image ([`ClipImageProcessor`], transformers' `CLIPImageProcessor`,
//! the processor of LLaVA-1.5; [`Gemma3ImageProcessor`], transformers' `Gemma3ImageProcessor`, the
//! processor of Gemma 3, with its pan-and-scan crops as images of their own) or tiles of it
//! ([`LlavaNextImageProcessor`], transformers' `LlavaNextImageProcessor`: the whole image and the
//! tiles of its best-fitting grid pinpoint, [`AnyRes`]) or the image at its own size in whole
//! patches ([`PixtralImageProcessor`], transformers' `PixtralImageProcessor`, Mistral 3's).
//!
//! The processors' output is bit-exact with transformers 5.24's torchvision backend, the one vLLM
//! runs: the same uint8 bicubic or bilinear antialiased resize ([`resize`]), the same crop and
//! padding, the same f32 arithmetic in the same order, the same layout. The tests in `tests/` check
//! it against fixtures that `scripts/gen_vl_processor_fixtures.py` writes with transformers itself.

mod clip;
mod config;
mod decode;
mod gemma3;
mod llava_next;
mod pixtral;
mod qwen2_vl;
mod qwen3_vl;
pub mod resize;

pub use clip::ClipImageProcessor;
pub use config::{image_processor_config, video_processor_config};
pub use decode::decode_image;
pub use gemma3::Gemma3ImageProcessor;
/// The decoded RGB image every processor takes.
pub use image::RgbImage;
pub use llava_next::{AnyRes, AnyResPixels, LlavaNextImageProcessor};
pub use pixtral::{PixtralImageProcessor, PixtralPixels};
pub use qwen2_vl::{Qwen2VlImageProcessor, Qwen2VlVideoProcessor, FRAME_LIST_FPS};
pub use qwen3_vl::{Qwen3VlVideo, Qwen3VlVideoProcessor, VIDEO_ONLY_KWARGS};

use std::path::PathBuf;

/// One image after processing: the rows the vision encoder embeds, one per patch. A processor
/// whose encoder cuts the patches itself ([`ClipImageProcessor`], [`Gemma3ImageProcessor`]) hands
/// over the whole image as one row: `[channels, height, width]`, a `grid_thw` of `[1, 1, 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelPatches {
    /// `[num_patches, patch_dim]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `channels * temporal_patch_size * patch_size * patch_size`, or `channels * height * width`
    /// for a whole image.
    pub patch_dim: usize,
    /// `(t, h, w)` in patches, as transformers' `image_grid_thw`.
    pub grid_thw: [usize; 3],
}

impl PixelPatches {
    pub fn num_patches(&self) -> usize {
        self.grid_thw.iter().product()
    }
}

/// The most pixels an image, or a clip's frames together, are resized to: Pillow's
/// decompression-bomb limit, the budget decoded pixels share too. A request's `min_pixels` or
/// `size` could otherwise ask for a resize of a small picture to any size at all.
pub(crate) const MAX_RESIZED_PIXELS: u64 = 178_956_970;

/// The longest side an image may have, in multiples of its shortest: Qwen2-VL's `smart_resize`
/// refuses longer, and without a limit a resize to a fixed shortest edge turns a thin strip of a few
/// kilobytes into gigabytes.
pub(crate) const MAX_ASPECT_RATIO: f64 = 200.0;

/// What can go wrong between an image's bytes and its patches. The messages reach API users as
/// 400 errors, so each says what is wrong with their input or with the model's config.
#[derive(Debug, thiserror::Error)]
pub enum MultimodalError {
    #[error("cannot decode image: {0}")]
    Decode(String),
    #[error("image is {width}x{height} pixels, more than the {max_pixels} allowed")]
    TooManyPixels { width: u64, height: u64, max_pixels: u64 },
    #[error("image is {width}x{height} pixels: it has no pixels to process")]
    EmptyImage { width: usize, height: usize },
    #[error("image is {width}x{height} pixels, an aspect ratio of {ratio}: more than the 200 allowed")]
    AspectRatio { width: usize, height: usize, ratio: f64 },
    #[error("a video needs at least one frame")]
    EmptyVideo,
    #[error("a video of {frames} frames (after sampling) is too short: it needs at least {needed}")]
    TooFewFrames { frames: usize, needed: usize },
    #[error("an image resized to {width}x{height} pixels is more than the {max_pixels} allowed")]
    TooManyResizedPixels { width: usize, height: usize, max_pixels: u64 },
    #[error("a video resized to {frames} frames of {width}x{height} pixels is more than the {max_pixels} allowed")]
    TooManyVideoPixels { frames: usize, width: usize, height: usize, max_pixels: u64 },
    #[error("video frame {index} is {}x{} pixels where frame 0 is {}x{}: a video's frames must be one size", size.0, size.1, first.0, first.1)]
    FrameSize { index: usize, size: (u32, u32), first: (u32, u32) },
    #[error("invalid image processor config: {0}")]
    Config(String),
    #[error("{}: {message}", path.display())]
    ConfigFile { path: PathBuf, message: String },
    #[error("invalid mm_processor_kwargs: {0}")]
    Overrides(String),
}
