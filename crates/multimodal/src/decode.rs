//! Encoded image bytes to the RGB8 pixels transformers would process: vLLM opens images with
//! Pillow, and transformers' `convert_to_rgb` turns whatever mode Pillow opened into RGB.

use std::io::Cursor;

use image::{DynamicImage, ImageReader, Limits, RgbImage};

use crate::MultimodalError;

/// Decodes a PNG, JPEG, WebP, GIF (first frame) or BMP image into RGB8, refusing one whose
/// `width * height` is more than `max_pixels` before any pixel data is decoded.
///
/// The conversion to RGB is transformers' `convert_to_rgb` on the image Pillow opens: an image with
/// transparency (an alpha channel, or a palette / gray / RGB image with a `tRNS` chunk or a GIF
/// transparent index, which the decoder expands to an alpha channel) is composited over opaque
/// white with Pillow's `alpha_composite`; any other is `Image.convert("RGB")` (gray replicated).
/// 16-bit samples are reduced as Pillow reads them (see [`to_rgb`]).
///
/// JPEG pixels can differ from Pillow's by a few levels: the `image` crate's decoder (zune-jpeg)
/// and libjpeg-turbo round the inverse DCT and chroma upsampling differently. EXIF orientation is
/// not applied, as neither Pillow's `Image.open` nor transformers apply it to an opened image.
pub fn decode_image(bytes: &[u8], max_pixels: u64) -> Result<RgbImage, MultimodalError> {
    let reader = || {
        let reader = ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(decode_error)?;
        match reader.format() {
            Some(_) => Ok(reader),
            None => Err(MultimodalError::Decode("not a PNG, JPEG, WebP, GIF or BMP image".into())),
        }
    };
    let (width, height) = reader()?.into_dimensions().map_err(decode_error)?;
    if u64::from(width) * u64::from(height) > max_pixels {
        return Err(MultimodalError::TooManyPixels { width: width.into(), height: height.into(), max_pixels });
    }
    let mut reader = reader()?;
    // The pixel budget above is the guard; the crate's default 512 MiB allocation cap would refuse
    // images inside it (178956970 RGB pixels, Pillow's bomb limit, are 537 MB).
    let mut limits = Limits::no_limits();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    reader.limits(limits);
    Ok(to_rgb(reader.decode().map_err(decode_error)?))
}

fn decode_error(error: impl std::fmt::Display) -> MultimodalError {
    MultimodalError::Decode(error.to_string())
}

/// Pillow's `alpha_composite` of `value` with alpha `alpha` over an opaque white pixel. Pillow
/// computes `coef1 = a * 255 * 255 * 128 / outa255` with `outa255 = a * 255 + 255 * (255 - a)
/// = 255 * 255`, so `coef1 = a * 128`, `coef2 = (255 - a) * 128`, and the result
/// `SHIFTFORDIV255(c * coef1 + 255 * coef2 + (128 << 7)) >> 7` is this rounded division by 255.
fn over_white(value: u8, alpha: u8) -> u8 {
    let alpha = u32::from(alpha);
    let sum = u32::from(value) * alpha + 255 * (255 - alpha) + 128;
    (((sum >> 8) + sum) >> 8) as u8
}

fn composite([r, g, b, a]: [u8; 4]) -> [u8; 3] {
    [r, g, b].map(|c| over_white(c, a))
}

fn composite_gray([value, alpha]: [u8; 2]) -> [u8; 3] {
    [over_white(value, alpha); 3]
}

/// 16-bit samples as Pillow reads a 16-bit PNG: RGB, RGBA and gray+alpha keep the high byte.
fn high_byte(sample: u16) -> u8 {
    (sample >> 8) as u8
}

/// The RGB image transformers' `convert_to_rgb` makes of the image Pillow opens for `image`.
/// 16-bit gray is the odd one: Pillow opens it as mode `I;16`, whose conversion to RGB clips
/// values above 255 instead of scaling them.
fn to_rgb(image: DynamicImage) -> RgbImage {
    let (width, height) = (image.width(), image.height());
    let rgb = |pixels: Vec<u8>| RgbImage::from_raw(width, height, pixels).expect("3 bytes per pixel");
    match image {
        DynamicImage::ImageRgb8(image) => image,
        DynamicImage::ImageRgba8(image) => rgb(image.pixels().flat_map(|p| composite(p.0)).collect()),
        DynamicImage::ImageLuma8(image) => rgb(image.pixels().flat_map(|p| [p.0[0]; 3]).collect()),
        DynamicImage::ImageLumaA8(image) => rgb(image.pixels().flat_map(|p| composite_gray(p.0)).collect()),
        DynamicImage::ImageRgb16(image) => rgb(image.pixels().flat_map(|p| p.0.map(high_byte)).collect()),
        DynamicImage::ImageRgba16(image) => rgb(image.pixels().flat_map(|p| composite(p.0.map(high_byte))).collect()),
        DynamicImage::ImageLuma16(image) => rgb(image.pixels().flat_map(|p| [p.0[0].min(255) as u8; 3]).collect()),
        DynamicImage::ImageLumaA16(image) => {
            rgb(image.pixels().flat_map(|p| composite_gray(p.0.map(high_byte))).collect())
        }
        // Float images (HDR, EXR, TIFF) come only from decoders this crate does not enable;
        // `DynamicImage` is non-exhaustive, so they still need an arm.
        other => rgb(other.to_rgba8().pixels().flat_map(|p| composite(p.0)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::over_white;

    /// The shortcut in `over_white` against Pillow's `ImagingAlphaComposite` integer arithmetic
    /// spelled out in full, for a white opaque destination and every source value and alpha.
    #[test]
    fn over_white_is_pillows_alpha_composite() {
        const PRECISION_BITS: u32 = 7;
        let shift_for_div255 = |a: u32| ((a >> 8) + a) >> 8;
        for alpha in 0..=255u32 {
            for value in 0..=255u32 {
                let expected = if alpha == 0 {
                    255
                } else {
                    let (dst, dst_alpha) = (255u32, 255u32);
                    let blend = dst_alpha * (255 - alpha);
                    let outa255 = alpha * 255 + blend;
                    let coef1 = alpha * 255 * 255 * (1 << PRECISION_BITS) / outa255;
                    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
                    let tmp = value * coef1 + dst * coef2;
                    shift_for_div255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS
                };
                assert_eq!(u32::from(over_white(value as u8, alpha as u8)), expected, "value {value} alpha {alpha}");
            }
        }
    }
}
