//! The processor and the resize against what transformers 5.24 and torchvision compute, bit for
//! bit. The fixtures (tests/fixtures/, described in manifest.json) come from
//! scripts/gen_vl_processor_fixtures.py.

use std::path::{Path, PathBuf};

use ferrite_multimodal::resize::resize_bicubic_antialias;
use ferrite_multimodal::Qwen2VlImageProcessor;
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

/// Panics unless `actual` and `expected` are the same f32 bit patterns, naming the first that is not.
fn assert_same_bits(case: &str, actual: &[f32], expected: &[f32], row: usize) {
    assert_eq!(actual.len(), expected.len(), "{case}: number of values");
    let differing: Vec<usize> = (0..actual.len()).filter(|&i| actual[i].to_bits() != expected[i].to_bits()).collect();
    if let Some(&first) = differing.first() {
        panic!(
            "{case}: {} of {} values differ; the first at index {first} (patch {}, column {}): {} instead of {}",
            differing.len(),
            actual.len(),
            first / row,
            first % row,
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

        let expected: Vec<f32> =
            read(&case["pixel_values"]).chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_same_bits(name, &patches.pixel_values, &expected, patches.patch_dim);
    }
}

#[test]
fn resize_matches_torchvision_bit_for_bit() {
    let manifest = manifest();
    let resizes = manifest["resizes"].as_array().expect("resizes");
    assert!(resizes.len() >= 20, "the manifest lists every size");
    for resize in resizes {
        let (width, height) = (size(&resize["width"]), size(&resize["height"]));
        let source =
            RgbImage::from_raw(size(&resize["source_width"]), size(&resize["source_height"]), read(&resize["source"]))
                .expect("source size");
        let name = format!("{}x{} to {width}x{height}", source.width(), source.height());
        let resized = resize_bicubic_antialias(&source, width, height);
        assert_eq!(resized.dimensions(), (width, height), "{name}");
        assert_same_bytes(&name, resized.as_raw(), &read(&resize["expected"]));
    }
}
