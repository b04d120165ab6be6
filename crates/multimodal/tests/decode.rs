//! `decode_image` against the RGB pixels Pillow decodes and transformers' `convert_to_rgb` makes
//! (tests/fixtures/images/*.rgb, written by scripts/gen_vl_processor_fixtures.py), and its refusals.

use std::path::{Path, PathBuf};

use ferrite_multimodal::{decode_image, MultimodalError};
use serde_json::Value;

/// Pillow's default decompression-bomb threshold, the budget vLLM's Pillow decode has.
const PIL_MAX_IMAGE_PIXELS: u64 = 178_956_970;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read(file: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn images() -> Vec<Value> {
    let manifest: Value = serde_json::from_slice(&read("manifest.json")).expect("manifest.json is JSON");
    manifest["images"].as_array().expect("images").clone()
}

#[test]
fn lossless_images_decode_to_pillows_rgb_exactly() {
    let images = images();
    let lossless: Vec<&Value> = images.iter().filter(|image| image["lossless"] == true).collect();
    // PNG RGB, RGBA, LA, palette + tRNS, 16-bit RGB / RGBA / gray; WebP; GIF; BMP.
    assert!(lossless.len() >= 10);
    for image in lossless {
        let file = image["file"].as_str().unwrap();
        let decoded = decode_image(&read(file), PIL_MAX_IMAGE_PIXELS).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            (u64::from(decoded.width()), u64::from(decoded.height())),
            (image["width"].as_u64().unwrap(), image["height"].as_u64().unwrap()),
            "{file}"
        );
        let expected = read(image["rgb"].as_str().unwrap());
        if let Some(i) = (0..expected.len()).find(|&i| decoded.as_raw()[i] != expected[i]) {
            panic!(
                "{file} (Pillow mode {}): byte {i} is {} instead of {}",
                image["pil_mode"],
                decoded.as_raw()[i],
                expected[i]
            );
        }
    }
}

/// zune-jpeg (the `image` crate's JPEG decoder) and libjpeg-turbo (Pillow's) round the inverse DCT
/// and the upsampling of the 4:2:0 chroma differently, so JPEG pixels are close, not equal: on
/// this quality-90 photo-like image they measured a largest difference of 4 levels and a mean of
/// 0.37. The bounds leave room for decoder updates while still catching real mistakes (swapped
/// channels, chroma not upsampled, a wrong YCbCr matrix), which move the mean by tens of levels.
#[test]
fn jpeg_decodes_within_a_few_levels_of_pillows_rgb() {
    let image = images().into_iter().find(|image| image["file"] == "images/photo.jpg").expect("photo.jpg");
    let decoded = decode_image(&read("images/photo.jpg"), PIL_MAX_IMAGE_PIXELS).expect("decodes");
    assert_eq!((decoded.width(), decoded.height()), (160, 96));
    let expected = read(image["rgb"].as_str().unwrap());
    let diffs: Vec<u8> = decoded.as_raw().iter().zip(&expected).map(|(a, b)| a.abs_diff(*b)).collect();
    let max = diffs.iter().copied().max().unwrap_or(0);
    let mean = diffs.iter().map(|&d| f64::from(d)).sum::<f64>() / diffs.len() as f64;
    assert!(max <= 8 && mean <= 1.0, "JPEG differs from Pillow's decode by up to {max} levels, {mean} on average");
}

/// The CRC-32 a PNG chunk ends with (ISO 3309, as zlib computes it).
fn crc32(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |crc, &byte| {
        (0..8).fold(crc ^ u32::from(byte), |crc, _| if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 })
    })
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut body = kind.to_vec();
    body.extend(data);
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend(&body);
    chunk.extend(crc32(&body).to_be_bytes());
    chunk
}

/// A well-formed PNG of an 8-bit RGB image of the given size whose pixel data is an empty zlib
/// stream: its header is all there is to read.
fn png_without_pixels(width: u32, height: u32) -> Vec<u8> {
    let mut header = width.to_be_bytes().to_vec();
    header.extend(height.to_be_bytes());
    header.extend([8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &header));
    png.extend(png_chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]));
    png.extend(png_chunk(b"IEND", &[]));
    png
}

#[test]
fn oversized_image_is_refused_from_its_header_alone() {
    // 10^10 pixels would need 30 GB; the refusal comes from the header, before any allocation for them.
    let error = decode_image(&png_without_pixels(100_000, 100_000), PIL_MAX_IMAGE_PIXELS).unwrap_err();
    assert!(matches!(error, MultimodalError::TooManyPixels { width: 100_000, height: 100_000, .. }), "{error:?}");
    assert_eq!(error.to_string(), "image is 100000x100000 pixels, more than the 178956970 allowed");
    // The same header within budget gets past the check and fails on the missing pixel data.
    let error = decode_image(&png_without_pixels(100, 100), PIL_MAX_IMAGE_PIXELS).unwrap_err();
    assert!(matches!(error, MultimodalError::Decode(_)), "{error:?}");
}

#[test]
fn pixel_budget_is_width_times_height() {
    let png = read("images/gradient.png"); // 53x37 = 1961 pixels
    assert!(decode_image(&png, 1961).is_ok());
    let error = decode_image(&png, 1960).unwrap_err();
    assert_eq!(error.to_string(), "image is 53x37 pixels, more than the 1960 allowed");
}

#[test]
fn undecodable_bytes_are_refused_with_the_reason() {
    let error = decode_image(b"this is not an image at all", PIL_MAX_IMAGE_PIXELS).unwrap_err();
    assert_eq!(error.to_string(), "cannot decode image: not a PNG, JPEG, WebP, GIF or BMP image");
    let error = decode_image(b"", PIL_MAX_IMAGE_PIXELS).unwrap_err();
    assert!(matches!(error, MultimodalError::Decode(_)), "{error:?}");

    let png = read("images/gradient.png");
    let error = decode_image(&png[..png.len() / 2], PIL_MAX_IMAGE_PIXELS).unwrap_err();
    assert!(error.to_string().starts_with("cannot decode image: "), "{error}");
    assert!(matches!(error, MultimodalError::Decode(_)), "{error:?}");

    let jpeg = read("images/photo.jpg");
    let mut corrupt = jpeg[..600].to_vec();
    corrupt.extend(std::iter::repeat_n(0xFF, 64));
    assert!(matches!(decode_image(&corrupt, PIL_MAX_IMAGE_PIXELS), Err(MultimodalError::Decode(_))));
}
