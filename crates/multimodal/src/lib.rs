//! Image inputs for vision-language models, as vLLM prepares them: an encoded image (PNG, JPEG,
//! WebP, GIF, BMP) becomes RGB pixels the way Pillow and transformers' `convert_to_rgb` make them
//! ([`decode_image`]), and an image processor turns those pixels into the flat patches and grid the
//! vision encoder takes ([`Qwen2VlImageProcessor`], transformers' `Qwen2VLImageProcessor`).
//!
//! The processor's output is bit-exact with transformers 5.24's torchvision backend, the one vLLM
//! runs: the same uint8 bicubic antialiased resize ([`resize`]), the same f32 arithmetic in the
//! same order, the same patch layout. The tests in `tests/` check it against fixtures that
//! `scripts/gen_vl_processor_fixtures.py` writes with transformers itself.

mod decode;
mod qwen2_vl;
pub mod resize;

pub use decode::decode_image;
pub use qwen2_vl::Qwen2VlImageProcessor;

use std::path::PathBuf;

/// One image after processing: the rows the vision encoder embeds, one per patch.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelPatches {
    /// `[num_patches, patch_dim]`, row-major.
    pub pixel_values: Vec<f32>,
    /// `channels * temporal_patch_size * patch_size * patch_size`.
    pub patch_dim: usize,
    /// `(t, h, w)` in patches, as transformers' `image_grid_thw`.
    pub grid_thw: [usize; 3],
}

impl PixelPatches {
    pub fn num_patches(&self) -> usize {
        self.grid_thw.iter().product()
    }
}

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
    #[error("invalid image processor config: {0}")]
    Config(String),
    #[error("{}: {message}", path.display())]
    ConfigFile { path: PathBuf, message: String },
    #[error("invalid mm_processor_kwargs: {0}")]
    Overrides(String),
}
