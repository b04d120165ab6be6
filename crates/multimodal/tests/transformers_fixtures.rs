//! The processors and the resize against what transformers 5.24 and torchvision compute, bit for
//! bit. The fixtures (tests/fixtures/, described in manifest.json) come from
//! scripts/gen_vl_processor_fixtures.py.

use std::path::{Path, PathBuf};

use ferrite_multimodal::resize::{resize_antialias, resize_bicubic_antialias, Filter};
use ferrite_multimodal::{
    ClipImageProcessor, Gemma3ImageProcessor, PixelPatches, Qwen2VlImageProcessor, Qwen2VlVideoProcessor,
};
use image::RgbImage;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest.json is JSON")
}

fn read(file: &Value) -> Vec<u8> {
    let path = fixtures().join(file.as_str().expect("file name"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn size(value: &Value) -> u32 {
    value.as_u64().expect("a size") as u32
}

/// The RGB pixels Pillow decoded for an image file of the manifest.
fn pillow_rgb(manifest: &Value, image_file: &str) -> RgbImage {
    let image = manifest["images"]
        .as_array()
        .expect("images")
        .iter()
        .find(|image| image["file"] == image_file)
        .unwrap_or_else(|| panic!("{image_file} is not in the manifest"));
    RgbImage::from_raw(size(&image["width"]), size(&image["height"]), read(&image["rgb"]))
        .expect("width * height * 3 bytes")
}

/// Panics unless `actual` and `expected` are the same f32 bit patterns, naming the first that is not
/// with `locate`'s description of its index.
fn assert_same_bits(case: &str, actual: &[f32], expected: &[f32], locate: impl Fn(usize) -> String) {
    assert_eq!(actual.len(), expected.len(), "{case}: number of values");
    let differing: Vec<usize> = (0..actual.len()).filter(|&i| actual[i].to_bits() != expected[i].to_bits()).collect();
    if let Some(&first) = differing.first() {
        panic!(
            "{case}: {} of {} values differ; the first at index {first} ({}): {} instead of {}",
            differing.len(),
            actual.len(),
            locate(first),
            actual[first],
            expected[first]
        );
    }
}

fn assert_same_bytes(case: &str, actual: &[u8], expected: &[u8]) {
    assert_eq!(actual.len(), expected.len(), "{case}: number of bytes");
    let differing: Vec<usize> = (0..actual.len()).filter(|&i| actual[i] != expected[i]).collect();
    if let Some(&first) = differing.first() {
        panic!(
            "{case}: {} of {} bytes differ; the first at index {first} (pixel {}, channel {}): {} instead of {}",
            differing.len(),
            actual.len(),
            first / 3,
            first % 3,
            actual[first],
            expected[first]
        );
    }
}

#[test]
fn processor_matches_transformers_torchvision_backend_bit_for_bit() {
    let manifest = manifest();
    let cases = manifest["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "the manifest lists every case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let processor = Qwen2VlImageProcessor::from_config(&case["config"]).expect("a valid config");
        let image = pillow_rgb(&manifest, case["image"].as_str().expect("image"));
        let patches = processor.preprocess(&image).unwrap_or_else(|e| panic!("{name}: {e}"));

        let grid: Vec<usize> =
            case["image_grid_thw"].as_array().expect("grid").iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(patches.grid_thw.to_vec(), grid, "{name}: image_grid_thw");
        let shape: Vec<usize> =
            case["shape"].as_array().expect("shape").iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!([patches.num_patches(), patches.patch_dim], [shape[0], shape[1]], "{name}: pixel_values shape");
        let tokens = processor.num_image_tokens(image.height() as usize, image.width() as usize).expect("tokens");
        assert_eq!(tokens * processor.merge_size * processor.merge_size, patches.num_patches(), "{name}: tokens");

        let expected = f32s(&read(&case["pixel_values"]));
        let row = patches.patch_dim;
        assert_same_bits(name, &patches.pixel_values, &expected, |i| format!("patch {}, column {}", i / row, i % row));
    }
}

#[test]
fn video_processor_matches_transformers_torchvision_backend_bit_for_bit() {
    let manifest = manifest();
    let cases = manifest["video_cases"].as_array().expect("video_cases");
    assert!(cases.len() >= 5, "the manifest lists every video case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let processor = Qwen2VlVideoProcessor::from_config(&case["config"]).expect("a valid config");
        let (width, height) = (size(&case["width"]), size(&case["height"]));
        let bytes = read(&case["frames"]);
        let frames: Vec<RgbImage> = bytes
            .chunks_exact((width * height * 3) as usize)
            .map(|frame| RgbImage::from_raw(width, height, frame.to_vec()).expect("a frame"))
            .collect();
        assert_eq!(frames.len() as u64, case["num_frames"].as_u64().unwrap(), "{name}: frames");
        let patches = processor.preprocess(&frames).unwrap_or_else(|e| panic!("{name}: {e}"));
        let grid: Vec<usize> =
            case["video_grid_thw"].as_array().expect("grid").iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(patches.grid_thw.to_vec(), grid, "{name}: video_grid_thw");
        let expected = f32s(&read(&case["pixel_values"]));
        let row = patches.patch_dim;
        assert_same_bits(name, &patches.pixel_values, &expected, |i| format!("patch {}, column {}", i / row, i % row));
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

/// The generator's FNV-1a 64 digest of `values` as little-endian bytes.
fn fnv1a64(values: &[f32]) -> String {
    let bytes = values.iter().flat_map(|value| value.to_le_bytes());
    let digest =
        bytes.fold(0xcbf2_9ce4_8422_2325_u64, |digest, byte| (digest ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3));
    format!("{digest:016x}")
}

/// The manifest's `key` cases (at least `at_least`) of a processor that hands the tower one
/// channel-first image: `process` (config, image) gives the output and the processor's output size,
/// which must match transformers' bit for bit, or, for a case too big to keep, by its digest.
fn check_whole_image_cases(
    key: &str,
    at_least: usize,
    process: impl Fn(&Value, &RgbImage) -> (PixelPatches, (usize, usize)),
) {
    let manifest = manifest();
    let cases = manifest[key].as_array().unwrap_or_else(|| panic!("{key}"));
    assert!(cases.len() >= at_least, "the manifest lists every {key} case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let image = pillow_rgb(&manifest, case["image"].as_str().expect("image"));
        let (output, (height, width)) = process(&case["config"], &image);

        let shape: Vec<usize> =
            case["shape"].as_array().expect("shape").iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(vec![3, height, width], shape, "{name}: output_size");
        assert_eq!(
            (output.patch_dim, output.grid_thw, output.num_patches()),
            (3 * height * width, [1, 1, 1], 1),
            "{name}"
        );
        if !case["pixel_values"].is_null() {
            let expected = f32s(&read(&case["pixel_values"]));
            let locate =
                |i: usize| format!("channel {}, y {}, x {}", i / (height * width), i / width % height, i % width);
            assert_same_bits(name, &output.pixel_values, &expected, locate);
        }
        assert_eq!(fnv1a64(&output.pixel_values), case["pixel_values_fnv1a64"].as_str().unwrap(), "{name}: digest");
    }
}

/// CLIP's; the LLaVA-1.5 case (336 x 336) is kept as a digest.
#[test]
fn clip_processor_matches_transformers_torchvision_backend_bit_for_bit() {
    check_whole_image_cases("clip_cases", 10, |config, image| {
        let processor = ClipImageProcessor::from_config(config).expect("a valid config");
        (processor.preprocess(image).expect("processed"), processor.output_size())
    });
}

/// Gemma 3's; the cases with its 896 x 896 are kept as digests.
#[test]
fn gemma3_processor_matches_transformers_torchvision_backend_bit_for_bit() {
    check_whole_image_cases("gemma3_cases", 12, |config, image| {
        let processor = Gemma3ImageProcessor::from_config(config).expect("a valid config");
        (processor.preprocess(image).expect("processed"), processor.output_size())
    });
}

/// Resizes each source of `resizes` (a manifest list) with `resize` and compares with torchvision's.
fn check_resizes(resizes: &Value, resize: impl Fn(&RgbImage, u32, u32) -> RgbImage) {
    for case in resizes.as_array().expect("resizes") {
        let (width, height) = (size(&case["width"]), size(&case["height"]));
        let source =
            RgbImage::from_raw(size(&case["source_width"]), size(&case["source_height"]), read(&case["source"]))
                .expect("source size");
        let name = format!("{}x{} to {width}x{height}", source.width(), source.height());
        let resized = resize(&source, width, height);
        assert_eq!(resized.dimensions(), (width, height), "{name}");
        assert_same_bytes(&name, resized.as_raw(), &read(&case["expected"]));
    }
}

#[test]
fn resize_matches_torchvision_bit_for_bit() {
    let manifest = manifest();
    assert!(manifest["resizes"].as_array().expect("resizes").len() >= 20, "the manifest lists every size");
    check_resizes(&manifest["resizes"], resize_bicubic_antialias);
    check_resizes(&manifest["resizes"], |image, width, height| resize_antialias(image, width, height, Filter::Bicubic));
}

#[test]
fn bilinear_resize_matches_torchvision_bit_for_bit() {
    let manifest = manifest();
    let resizes = &manifest["bilinear_resizes"];
    assert!(resizes.as_array().expect("bilinear_resizes").len() >= 25, "the manifest lists every size");
    check_resizes(resizes, |image, width, height| resize_antialias(image, width, height, Filter::Bilinear));
}
