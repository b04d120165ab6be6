//! The processors and the resize against what transformers 5.24 and torchvision compute, bit for
//! bit. The fixtures (tests/fixtures/, described in manifest.json) come from
//! scripts/gen_vl_processor_fixtures.py.

use std::path::{Path, PathBuf};

use ferrite_multimodal::resize::{resize_antialias, resize_bicubic_antialias, Filter};
use ferrite_multimodal::{
    ClipImageProcessor, Gemma3ImageProcessor, PixelPatches, Qwen2VlImageProcessor, Qwen2VlVideoProcessor,
    Qwen3VlVideoProcessor,
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

#[test]
fn qwen3_video_processor_samples_times_and_patches_as_transformers() {
    let manifest = manifest();
    let cases = manifest["qwen3_video_cases"].as_array().expect("qwen3_video_cases");
    assert!(cases.len() >= 8, "the manifest lists every Qwen3-VL video case");
    let numbers = |value: &Value| -> Vec<usize> {
        value.as_array().expect("numbers").iter().map(|v| v.as_u64().unwrap() as usize).collect()
    };
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let processor = Qwen3VlVideoProcessor::from_config(&case["config"]).expect("a valid config");
        let (width, height) = (size(&case["width"]), size(&case["height"]));
        let frames: Vec<RgbImage> = read(&case["frames"])
            .chunks_exact((width * height * 3) as usize)
            .map(|frame| RgbImage::from_raw(width, height, frame.to_vec()).expect("a frame"))
            .collect();
        assert_eq!(frames.len() as u64, case["num_frames"].as_u64().unwrap(), "{name}: frames");
        let video = processor.preprocess(&frames).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(video.frame_indices, numbers(&case["frames_indices"]), "{name}: sampled frames");
        assert_eq!(video.patches.grid_thw.to_vec(), numbers(&case["video_grid_thw"]), "{name}: video_grid_thw");
        // serde_json's default float parsing may land one ulp off Python's repr; the texts are exact.
        let timestamps = case["timestamps"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap());
        assert!(video.timestamps.iter().zip(timestamps).all(|(a, b)| (a - b).abs() < 1e-12), "{name}: timestamps");
        assert_eq!(video.timestamps.len(), video.patches.grid_thw[0], "{name}: one timestamp a temporal patch");
        let texts: Vec<String> = video.timestamps.iter().map(|&t| Qwen3VlVideoProcessor::frame_text(t)).collect();
        assert_eq!(serde_json::json!(texts), case["timestamp_texts"], "{name}: timestamp texts");
        let expected = f32s(&read(&case["pixel_values"]));
        let row = video.patches.patch_dim;
        let values = &video.patches.pixel_values;
        assert_same_bits(name, values, &expected, |i| format!("patch {}, column {}", i / row, i % row));
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

/// Gemma 3's pan-and-scan: `num_crops` and the whole image then its crops, bit for bit, for wide,
/// tall and nearly square images, crops cut short at the edge, the crop count capped, and the
/// thresholds that leave an image uncropped.
#[test]
fn gemma3_pan_and_scan_matches_transformers_torchvision_backend_bit_for_bit() {
    let manifest = manifest();
    let cases = manifest["gemma3_pan_and_scan_cases"].as_array().expect("gemma3_pan_and_scan_cases");
    assert!(cases.len() >= 8, "the manifest lists every pan-and-scan case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let image = pillow_rgb(&manifest, case["image"].as_str().expect("image"));
        let processor = Gemma3ImageProcessor::from_config(&case["config"]).expect("a valid config");
        let crops = processor.crops(image.width() as usize, image.height() as usize);
        assert_eq!(crops.len() as u64, case["num_crops"].as_u64().unwrap(), "{name}: num_crops");
        let images = processor.preprocess_with_crops(&image).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(images.len(), 1 + crops.len(), "{name}: the image and its crops");
        let (height, width) = processor.output_size();
        let shape: Vec<usize> =
            case["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(shape, [images.len(), 3, height, width], "{name}: shape");
        let values: Vec<f32> = images.iter().flat_map(|image| image.pixel_values.iter().copied()).collect();
        let per_image = 3 * height * width;
        let locate = |i: usize| {
            let (k, i) = (i / per_image, i % per_image);
            format!("image {k}, channel {}, y {}, x {}", i / (height * width), i / width % height, i % width)
        };
        assert_same_bits(name, &values, &f32s(&read(&case["pixel_values"])), locate);
    }
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

/// LLaVA-NeXT's: the whole image and its tiles, bit for bit (the llava-v1.6 case by its digest),
/// and `image_sizes`.
#[test]
fn llava_next_processor_matches_transformers_torchvision_backend_bit_for_bit() {
    let manifest = manifest();
    let cases = manifest["llava_next_cases"].as_array().expect("llava_next_cases");
    assert!(cases.len() >= 9, "the manifest lists every LLaVA-NeXT case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let processor = ferrite_multimodal::LlavaNextImageProcessor::from_config(&case["config"]).expect("a config");
        let image = pillow_rgb(&manifest, case["image"].as_str().expect("image"));
        let output = processor.preprocess(&image).unwrap_or_else(|e| panic!("{name}: {e}"));

        let shape: Vec<usize> =
            case["shape"].as_array().expect("shape").iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let tile = processor.anyres().tile();
        assert_eq!(shape[1..], [3, tile, tile], "{name}: tile");
        let (rows, columns) = processor.anyres().tiles(image.height() as usize, image.width() as usize).unwrap();
        assert_eq!(1 + rows * columns, shape[0], "{name}: tiles");
        let sizes = &case["image_sizes"];
        assert_eq!(output.image_size, (size(&sizes[0]) as usize, size(&sizes[1]) as usize), "{name}: image_sizes");
        if !case["pixel_values"].is_null() {
            let expected = f32s(&read(&case["pixel_values"]));
            let per_tile = 3 * tile * tile;
            let locate = |i: usize| {
                let at = i % per_tile;
                format!(
                    "tile {}, channel {}, y {}, x {}",
                    i / per_tile,
                    at / (tile * tile),
                    at / tile % tile,
                    at % tile
                )
            };
            assert_same_bits(name, &output.pixel_values, &expected, locate);
        }
        assert_eq!(fnv1a64(&output.pixel_values), case["pixel_values_fnv1a64"].as_str().unwrap(), "{name}: digest");
    }
}

/// Pixtral's (Mistral 3's): the image at its processed size, bit for bit (the Mistral-Small-3.1 case
/// by its digest), and `image_sizes`.
#[test]
fn pixtral_processor_matches_transformers_torchvision_backend_bit_for_bit() {
    let manifest = manifest();
    let cases = manifest["pixtral_cases"].as_array().expect("pixtral_cases");
    assert!(cases.len() >= 9, "the manifest lists every Pixtral case");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let processor = ferrite_multimodal::PixtralImageProcessor::from_config(&case["config"]).expect("a config");
        let image = pillow_rgb(&manifest, case["image"].as_str().expect("image"));
        let output = processor.preprocess(&image).unwrap_or_else(|e| panic!("{name}: {e}"));
        let sizes = &case["image_sizes"];
        let (height, width) = (size(&sizes[0]) as usize, size(&sizes[1]) as usize);
        assert_eq!(output.size, (height, width), "{name}: image_sizes");
        if !case["pixel_values"].is_null() {
            let expected = f32s(&read(&case["pixel_values"]));
            let locate =
                |i: usize| format!("channel {}, y {}, x {}", i / (height * width), i / width % height, i % width);
            assert_same_bits(name, &output.pixel_values, &expected, locate);
        }
        assert_eq!(fnv1a64(&output.pixel_values), case["pixel_values_fnv1a64"].as_str().unwrap(), "{name}: digest");
    }
}

/// The size `PixtralImageProcessor` resizes an image to (which sets its rows of `[IMG]`), for many
/// sizes (thin ones, sizes a pixel off the longest edge or a patch) under three configs.
#[test]
fn pixtral_resized_sizes_match_transformers() {
    let manifest = manifest();
    let sizes = manifest["pixtral_sizes"].as_array().expect("pixtral_sizes");
    assert!(sizes.len() >= 60, "the manifest lists every size");
    for entry in sizes {
        let processor = ferrite_multimodal::PixtralImageProcessor::from_config(&entry["config"]).expect("a config");
        let (height, width) = (size(&entry["height"]) as usize, size(&entry["width"]) as usize);
        let want = (size(&entry["resized"][0]) as usize, size(&entry["resized"][1]) as usize);
        match processor.resized_size(height, width) {
            Ok(resized) => assert_eq!(resized, want, "{entry}"),
            // Past the aspect ratio transformers does not limit, or a side scaled to nothing (which
            // transformers' resize then fails on).
            Err(e) => assert!(height.max(width) > 200 * height.min(width) || want.0 * want.1 == 0, "{entry}: {e}"),
        }
    }
}

/// The image tokens `LlavaNextProcessor` expands `<image>` to, for many sizes (thin ones, sizes a
/// pixel off a pinpoint) under llava-v1.6's tiling and a small one.
#[test]
fn llava_next_image_tokens_match_transformers_processor() {
    let manifest = manifest();
    let counts = manifest["llava_next_tokens"].as_array().expect("llava_next_tokens");
    assert!(counts.len() >= 40, "the manifest lists every size");
    for entry in counts {
        let processor = ferrite_multimodal::LlavaNextImageProcessor::from_config(&entry["config"]).expect("a config");
        let (height, width) = (size(&entry["height"]) as usize, size(&entry["width"]) as usize);
        let patch = size(&entry["patch_size"]) as usize;
        let tokens = processor.anyres().image_tokens(height, width, patch).unwrap();
        assert_eq!(tokens as u64, entry["num_image_tokens"].as_u64().unwrap(), "{entry}");
    }
}
