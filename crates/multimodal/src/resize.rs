//! Antialiased bicubic and bilinear resize of RGB8 images, bit-exact with torchvision's
//! `resize(image, size, interpolation=BICUBIC or BILINEAR, antialias=True)` on a uint8 CPU tensor,
//! the resize transformers' torchvision image processors (and so vLLM) run.
//!
//! Torchvision hands the uint8 tensor straight to torch's `_upsample_bicubic2d_aa` or
//! `_upsample_bilinear2d_aa` kernel (`aten/src/ATen/native/cpu/UpSampleKernel.cpp`,
//! `UpSampleKernelAVXAntialias.h`), a port of Pillow-SIMD's `ImagingResample` that both filters
//! share (`upsample_avx_bilinear_bicubic_uint8`):
//! - separable: a horizontal pass first (skipped when the width does not change) whose output is
//!   rounded to uint8, then a vertical pass over that (skipped when the height does not change);
//! - per output pixel, a window of input pixels and the filter ([`Filter`]: Keys' cubic with
//!   a = -0.5, or the triangle `max(0, 1 - |x|)`) stretched by the downscale factor
//!   (antialiasing), weights computed in f64 and normalized to sum to 1;
//! - the weights of one axis turned into int16 fixed point, with as many fraction bits (at most
//!   22) as the largest weight of that axis leaves room for in 15 bits;
//! - each output `clamp((2^(bits-1) + sum(weight * pixel)) >> bits, 0, 255)` in int32.
//!
//! The fixtures come from torch's AVX2 kernel. For bilinear, torchvision takes the uint8 path only
//! where torch's CPU capability is AVX2 or AVX-512, or on aarch64 (`_do_native_uint8_resize_on_cpu`);
//! elsewhere (and under `ATEN_CPU_CAPABILITY=default`) it resizes an f32 copy and rounds, which
//! lands one level away on many pixels. Bicubic always takes the uint8 path. (torch's generic
//! uint8 loops, which run where the AVX2 kernel is not built in, agree with it too, except for
//! outputs one pixel wide.)
//!
//! Written by hand because bit-exactness needs torch's exact sequence (its int16 precision rule,
//! pass order and rounding), which the `image` crate's resize (f32 weights and sums) does not
//! follow and no resize crate promises to keep; one uint8 level off moves the normalized value by
//! ~0.015, far past f32 bit-exactness. Pillow's own resize (the PIL backend) differs too: 22
//! fraction bits for every weight, and Pillow 13 picks the order of the passes from the sizes (the
//! vertical one first whenever the width grows and the height shrinks, among others), which rounds
//! a different intermediate image; it lands up to 4 levels away from torchvision on the bicubic
//! fixtures, 1 on the bilinear ones.

use image::RgbImage;
use rayon::prelude::*;

/// The interpolation of a resize: transformers' `resample` (Pillow's filter codes), which the
/// torchvision backend turns into torchvision's `InterpolationMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// `resample` 2, `PILImageResampling.BILINEAR`: the triangle filter, torch's
    /// `HelperInterpLinear` (`interp_size` 2).
    Bilinear,
    /// `resample` 3, `PILImageResampling.BICUBIC`: Keys' cubic, torch's `HelperInterpCubic`
    /// (`interp_size` 4).
    Bicubic,
}

impl Filter {
    /// The filter of a `resample` code, `None` for the filters not implemented here (nearest, box,
    /// hamming, lanczos).
    pub fn from_resample(code: u64) -> Option<Self> {
        match code {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    /// Half of torch's `interp_size`: how far the filter reaches, in input pixels, before it is
    /// stretched for a downscale.
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    /// torch's `aa_filter` of the mode.
    fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Bilinear => triangle(x),
            Filter::Bicubic => keys_cubic(x),
        }
    }
}

/// torch's `HelperInterpLinear::aa_filter` (Pillow's `bilinear_filter`).
fn triangle(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Keys' cubic convolution kernel with a = -0.5, written as torch's `cubic_convolution1` /
/// `cubic_convolution2` evaluate it (Pillow's `bicubic_filter` factors the outer piece differently).
fn keys_cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// The fixed-point filter of one axis: for output `i`, input pixels `starts[i]..starts[i] + lens[i]`
/// weighted by `weights[i * taps..][..lens[i]]`, the sum shifted right by `precision`.
struct AxisFilter {
    starts: Vec<usize>,
    lens: Vec<usize>,
    weights: Vec<i16>,
    taps: usize,
    precision: u32,
}

impl AxisFilter {
    /// torch's `_compute_index_ranges_int16_weights` with antialias on and align_corners off.
    fn new(in_size: usize, out_size: usize, filter: Filter) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let support = filter.support();
        let (support, inv_scale) = if scale >= 1.0 { (support * scale, 1.0 / scale) } else { (support, 1.0) };
        let taps = support.ceil() as usize * 2 + 1;
        let mut starts = Vec::with_capacity(out_size);
        let mut lens = Vec::with_capacity(out_size);
        let mut float_weights = vec![0.0f64; out_size * taps];
        let mut max_weight = 0.0f64;
        for (i, row) in float_weights.chunks_exact_mut(taps).enumerate() {
            let center = scale * (i as f64 + 0.5);
            // `as i64` truncates toward zero like the C++ `static_cast<int64_t>`.
            let start = ((center - support + 0.5) as i64).max(0);
            let end = ((center + support + 0.5) as i64).min(in_size as i64);
            let len = (end - start).clamp(0, taps as i64) as usize;
            let mut total = 0.0;
            for (j, weight) in row[..len].iter_mut().enumerate() {
                *weight = filter.weight(((j as i64 + start) as f64 - center + 0.5) * inv_scale);
                total += *weight;
            }
            if total != 0.0 {
                for weight in &mut row[..len] {
                    *weight /= total;
                    max_weight = max_weight.max(*weight);
                }
            }
            starts.push(start as usize);
            lens.push(len);
        }
        let mut precision = 0;
        while precision < 22 && ((0.5 + max_weight * f64::from(1u32 << (precision + 1))) as i32) < (1 << 15) {
            precision += 1;
        }
        let unit = f64::from(1u32 << precision);
        let weights = float_weights
            .iter()
            .map(|&w| {
                let v = w * unit;
                (if v < 0.0 { -0.5 + v } else { 0.5 + v }) as i32 as i16
            })
            .collect();
        AxisFilter { starts, lens, weights, taps, precision }
    }

    fn window(&self, i: usize) -> (usize, &[i16]) {
        (self.starts[i], &self.weights[i * self.taps..][..self.lens[i]])
    }

    /// The rounding offset every sum starts from.
    fn half(&self) -> i32 {
        1 << (self.precision - 1)
    }

    fn to_u8(&self, sum: i32) -> u8 {
        (sum >> self.precision).clamp(0, 255) as u8
    }
}

/// Resizes interleaved RGB8 `pixels` of `width` x `height` to `out_width` x `out_height` with
/// `filter`. Every size must be non-zero.
pub(crate) fn resize_rgb(
    pixels: &[u8],
    width: usize,
    height: usize,
    out_width: usize,
    out_height: usize,
    filter: Filter,
) -> Vec<u8> {
    // An `RgbImage`'s buffer may run past its last row.
    let mut current = std::borrow::Cow::Borrowed(&pixels[..width * height * 3]);
    if out_width != width {
        current = horizontal(&current, width, height, &AxisFilter::new(width, out_width, filter)).into();
    }
    if out_height != height {
        current = vertical(&current, out_width, &AxisFilter::new(height, out_height, filter)).into();
    }
    current.into_owned()
}

// Rows are independent and the sums integers: computed in parallel, the bytes are the same.
fn horizontal(pixels: &[u8], width: usize, height: usize, filter: &AxisFilter) -> Vec<u8> {
    let out_width = filter.starts.len();
    let mut out = vec![0u8; out_width * height * 3];
    out.par_chunks_exact_mut(out_width * 3).zip(pixels.par_chunks_exact(width * 3)).for_each(|(out_row, row)| {
        for (x, out_pixel) in out_row.chunks_exact_mut(3).enumerate() {
            let (start, weights) = filter.window(x);
            let mut sums = [filter.half(); 3];
            for (pixel, &weight) in row[start * 3..].chunks_exact(3).zip(weights) {
                for (sum, &value) in sums.iter_mut().zip(pixel) {
                    // Wrapping, as torch's int32 SIMD adds; the sums stay far from 2^31 anyway.
                    *sum = sum.wrapping_add(i32::from(value) * i32::from(weight));
                }
            }
            for (byte, sum) in out_pixel.iter_mut().zip(sums) {
                *byte = filter.to_u8(sum);
            }
        }
    });
    out
}

fn vertical(pixels: &[u8], width: usize, filter: &AxisFilter) -> Vec<u8> {
    let row_len = width * 3;
    let out_height = filter.starts.len();
    let mut out = vec![0u8; row_len * out_height];
    out.par_chunks_exact_mut(row_len).enumerate().for_each(|(y, out_row)| {
        let (start, weights) = filter.window(y);
        let mut sums = vec![filter.half(); row_len];
        for (row, &weight) in pixels[start * row_len..].chunks_exact(row_len).zip(weights) {
            for (sum, &value) in sums.iter_mut().zip(row) {
                *sum = sum.wrapping_add(i32::from(value) * i32::from(weight));
            }
        }
        for (byte, &sum) in out_row.iter_mut().zip(&sums) {
            *byte = filter.to_u8(sum);
        }
    });
    out
}

/// Resizes `image` to `width` x `height` as torchvision's antialiased resize with `filter` does on a
/// uint8 tensor (see the module documentation).
///
/// # Panics
/// If `image` or the target size is empty: torch refuses those too.
pub fn resize_antialias(image: &RgbImage, width: u32, height: u32, filter: Filter) -> RgbImage {
    assert!(image.width() > 0 && image.height() > 0, "cannot resize an empty image");
    assert!(width > 0 && height > 0, "cannot resize to an empty image");
    let (in_width, in_height) = (image.width() as usize, image.height() as usize);
    let pixels = resize_rgb(image.as_raw(), in_width, in_height, width as usize, height as usize, filter);
    RgbImage::from_raw(width, height, pixels).expect("the resize makes width * height RGB pixels")
}

/// [`resize_antialias`] with [`Filter::Bicubic`].
///
/// # Panics
/// If `image` or the target size is empty.
pub fn resize_bicubic_antialias(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    resize_antialias(image, width, height, Filter::Bicubic)
}
