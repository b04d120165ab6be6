//! `Qwen2VlImageProcessor`'s configuration, request overrides and `smart_resize`, against what
//! transformers 5.24's `Qwen2VLImageProcessor` does with the same inputs.

use ferrite_multimodal::{MultimodalError, Qwen2VlImageProcessor};
use serde_json::{json, Map, Value};

fn processor(config: Value) -> Qwen2VlImageProcessor {
    Qwen2VlImageProcessor::from_config(&config).unwrap_or_else(|e| panic!("{config}: {e}"))
}

fn config_error(config: Value) -> String {
    match Qwen2VlImageProcessor::from_config(&config) {
        Ok(processor) => panic!("{config} was accepted: {processor:?}"),
        Err(error) => error.to_string(),
    }
}

fn kwargs(value: Value) -> Map<String, Value> {
    value.as_object().expect("an object").clone()
}

fn budget(processor: &Qwen2VlImageProcessor) -> (usize, usize) {
    (processor.min_pixels, processor.max_pixels)
}

#[test]
fn smart_resize_matches_transformers() {
    // (height, width, patch_size, min_pixels, max_pixels) -> transformers' smart_resize with
    // factor = 2 * patch_size.
    let cases = [
        ((70, 70, 14, 3136, 1003520), (56, 56)), // 2.5 rounds to 2 (half to even), not 3
        ((98, 126, 14, 3136, 1003520), (112, 112)), // 3.5 rounds up to 4, 4.5 down to 4
        ((42, 100, 14, 3136, 1003520), (56, 112)), // 1.5 rounds up to 2
        ((14, 14, 14, 3136, 1003520), (56, 56)), // rounds to 0x0: scaled up to min_pixels
        ((1, 200, 14, 3136, 1003520), (28, 812)), // aspect ratio 200 is still allowed
        ((200, 1, 14, 3136, 1003520), (812, 28)),
        ((10, 2000, 14, 3136, 1003520), (28, 812)),
        ((1080, 1920, 14, 3136, 1003520), (728, 1316)), // over max_pixels: scaled down
        ((4000, 3000, 14, 3136, 12845056), (4004, 2996)),
        ((100000, 1000, 14, 3136, 1003520), (9996, 84)),
        ((37, 53, 14, 1568, 4704), (28, 56)),
        ((96, 160, 14, 1568, 4704), (28, 84)),
        ((12, 20, 14, 1568, 4704), (56, 56)),
        ((30, 100, 14, 3136, 12845056), (28, 112)),
        ((2048, 2048, 16, 65536, 16777216), (2048, 2048)),
    ];
    for ((height, width, patch_size, min_pixels, max_pixels), expected) in cases {
        let processor =
            processor(json!({"patch_size": patch_size, "min_pixels": min_pixels, "max_pixels": max_pixels}));
        assert_eq!(processor.smart_resize(height, width).unwrap(), expected, "{height}x{width} (h x w)");
    }
}

#[test]
fn smart_resize_refuses_extreme_aspect_ratios_and_empty_images() {
    let processor = processor(json!({}));
    for (height, width) in [(1, 201), (201, 1), (10, 2001)] {
        let error = processor.smart_resize(height, width).unwrap_err();
        assert!(matches!(error, MultimodalError::AspectRatio { .. }), "{height}x{width}: {error:?}");
    }
    assert_eq!(
        processor.smart_resize(1, 201).unwrap_err().to_string(),
        "image is 201x1 pixels, an aspect ratio of 201: more than the 200 allowed"
    );
    assert_eq!(
        processor.smart_resize(0, 5).unwrap_err().to_string(),
        "image is 5x0 pixels: it has no pixels to process"
    );
    assert!(matches!(processor.num_image_tokens(1, 201), Err(MultimodalError::AspectRatio { .. })));
}

#[test]
fn num_image_tokens_matches_transformers() {
    // `get_number_of_image_patches(h, w) // merge_size**2` with the class defaults.
    let processor = processor(json!({}));
    assert_eq!(processor.num_image_tokens(1080, 1920).unwrap(), 1222);
    assert_eq!(processor.num_image_tokens(70, 70).unwrap(), 4);
    assert_eq!(processor.num_image_tokens(12, 20).unwrap(), 6);
}

#[test]
fn defaults_are_the_transformers_class_defaults() {
    let processor =
        processor(json!({"image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor"}));
    assert_eq!((processor.patch_size, processor.temporal_patch_size, processor.merge_size), (14, 2, 2));
    assert_eq!(budget(&processor), (56 * 56, 28 * 28 * 1280));
    // Nulls count as absent, as transformers' `is not None` checks treat them.
    assert_eq!(processor, self::processor(json!({"min_pixels": null, "size": null, "image_mean": null})));
}

#[test]
fn pixel_budget_comes_from_size_or_legacy_keys_as_in_transformers_init() {
    // (config, (shortest_edge, longest_edge)) as `Qwen2VLImageProcessor(**config).size` has them.
    let cases = [
        (json!({"min_pixels": 100, "max_pixels": 2000}), (100, 2000)),
        (json!({"size": {"shortest_edge": 100, "longest_edge": 2000}}), (100, 2000)),
        (json!({"size": {"shortest_edge": 100, "longest_edge": 2000}, "min_pixels": 5}), (5, 2000)),
        (json!({"size": {"min_pixels": 100, "max_pixels": 2000}, "min_pixels": 7, "max_pixels": 9}), (7, 9)),
        (json!({"size": {"shortest_edge": 100}, "max_pixels": 2000}), (100, 2000)),
        (json!({"max_pixels": 2000}), (3136, 2000)),
    ];
    for (config, expected) in cases {
        assert_eq!(budget(&processor(config.clone())), expected, "{config}");
    }
}

#[test]
fn invalid_configs_are_refused_naming_the_key() {
    let cases = [
        // transformers accepts these two but its resize fails on them.
        (json!({"size": {"min_pixels": 100, "max_pixels": 2000}}), "`size` must have the keys shortest_edge and longest_edge and no other, got [\"min_pixels\", \"max_pixels\"]"),
        (json!({"size": {"shortest_edge": 100}}), "`size` must have the keys shortest_edge and longest_edge and no other, got [\"shortest_edge\"]"),
        (json!({"size": {"shortest_edge": 100, "longest_edge": 2000, "height": 5}}), "`size` must have the keys shortest_edge and longest_edge and no other, got [\"shortest_edge\", \"longest_edge\", \"height\"]"),
        (json!({"size": {"shortest_edge": 0, "longest_edge": 2000}}), "`size.shortest_edge` must be a positive integer, got 0"),
        (json!({"min_pixels": "3136"}), "`min_pixels` must be a positive integer, got \"3136\""),
        (json!({"patch_size": 0}), "`patch_size` must be a positive integer, got 0"),
        (json!({"merge_size": 2.5}), "`merge_size` must be a positive integer, got 2.5"),
        (json!({"do_resize": false}), "`do_resize: false` is not supported: the patch grid needs the resize"),
        (json!({"resample": 2}), "`resample` 2 is not supported, only 3 (bicubic)"),
        (json!({"image_mean": [0.5, 0.5]}), "`image_mean` must be a number or 3 numbers, got [0.5,0.5]"),
        (json!({"image_std": [0.5, 0.0, 0.5]}), "`image_std` must not contain 0"),
        (json!({"rescale_factor": 0}), "`rescale_factor` must be a positive number, got 0"),
        (json!({"do_normalize": "yes"}), "`do_normalize` must be true or false, got \"yes\""),
        (json!([1, 2]), "the preprocessor config must be a JSON object"),
    ];
    for (config, message) in cases {
        assert_eq!(config_error(config.clone()), format!("invalid image processor config: {message}"), "{config}");
    }
    // A single number stands for every channel, as in transformers.
    assert_eq!(
        processor(json!({"image_mean": 0.5, "image_std": 0.5})),
        processor(json!({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}))
    );
}

#[test]
fn model_dir_config_is_read_and_its_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("ferrite-multimodal-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("preprocessor_config.json");

    let error = Qwen2VlImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: cannot read it: ", file.display())), "{error}");

    std::fs::write(&file, r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14"#).unwrap();
    let error = Qwen2VlImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: not valid JSON: ", file.display())), "{error}");

    std::fs::write(&file, r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": -1}"#).unwrap();
    let error = Qwen2VlImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("{}: invalid image processor config: `patch_size` must be a positive integer, got -1", file.display())
    );

    std::fs::write(&file, r#"{"min_pixels": 3136, "max_pixels": 12845056, "merge_size": 2}"#).unwrap();
    let processor = Qwen2VlImageProcessor::from_model_dir(&dir).unwrap();
    assert_eq!(budget(&processor), (3136, 12845056));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn overrides_apply_as_transformers_applies_processor_call_kwargs() {
    let base = processor(json!({"min_pixels": 3136, "max_pixels": 50176}));
    let cases = [
        (json!({}), (3136, 50176)),
        (json!({"min_pixels": 12544}), (12544, 50176)),
        (json!({"max_pixels": 3136}), (3136, 3136)),
        (json!({"min_pixels": null}), (3136, 50176)),
        (json!({"size": {"shortest_edge": 12544, "longest_edge": 12544}}), (12544, 12544)),
        // min_pixels / max_pixels complete a partial `size` ...
        (json!({"size": {"shortest_edge": 12544}, "max_pixels": 12544}), (12544, 12544)),
        // ... and override its edges.
        (json!({"size": {"shortest_edge": 784, "longest_edge": 784}, "min_pixels": 100}), (100, 784)),
    ];
    for (overrides, expected) in cases {
        let processor = base.with_overrides(&kwargs(overrides.clone())).unwrap_or_else(|e| panic!("{overrides}: {e}"));
        assert_eq!(budget(&processor), expected, "{overrides}");
        assert_eq!((processor.patch_size, processor.merge_size), (14, 2));
    }
    // The budget moves the resize of a 100x70 (h x w) image as transformers'
    // `processor(image, min_pixels=...)["image_grid_thw"]` has it: 8x4 patches, 10x8, 4x2.
    let tokens = |overrides: Value| base.with_overrides(&kwargs(overrides)).unwrap().num_image_tokens(100, 70).unwrap();
    assert_eq!(tokens(json!({})), 8 * 4 / 4);
    assert_eq!(tokens(json!({"min_pixels": 12544})), 10 * 8 / 4);
    assert_eq!(tokens(json!({"max_pixels": 3136})), 4 * 2 / 4);
}

#[test]
fn invalid_overrides_are_refused_naming_the_key() {
    let base = processor(json!({}));
    let cases = [
        (json!({"patch_size": 16}), "unknown key `patch_size`: the Qwen2-VL image processor takes min_pixels, max_pixels and size"),
        (json!({"min_pixels": 1, "max_pixels": 2, "fps": 2}), "unknown key `fps`: the Qwen2-VL image processor takes min_pixels, max_pixels and size"),
        (json!({"size": {"shortest_edge": 12544}}), "`size` must have the keys shortest_edge and longest_edge and no other, got [\"shortest_edge\"]"),
        (json!({"size": {"min_pixels": 1, "max_pixels": 2}}), "`size` must have the keys shortest_edge and longest_edge and no other, got [\"min_pixels\", \"max_pixels\"]"),
        (json!({"size": 3136}), "`size` must be an object, got 3136"),
        (json!({"min_pixels": -5}), "`min_pixels` must be a positive integer, got -5"),
        (json!({"max_pixels": 0}), "`max_pixels` must be a positive integer, got 0"),
    ];
    for (overrides, message) in cases {
        let error = base.with_overrides(&kwargs(overrides.clone())).unwrap_err();
        assert_eq!(error.to_string(), format!("invalid mm_processor_kwargs: {message}"), "{overrides}");
    }
}

#[test]
fn a_request_cannot_ask_for_a_resize_past_the_pixel_limit() {
    // min_pixels scales a small picture up to it: 10^10 pixels would be 30 GB of RGB.
    let huge = kwargs(json!({"min_pixels": 10_000_000_000u64, "max_pixels": 20_000_000_000u64}));
    let image = processor(json!({})).with_overrides(&huge).unwrap();
    let error = image.preprocess(&image::RgbImage::new(28, 28)).unwrap_err();
    assert!(matches!(error, MultimodalError::TooManyResizedPixels { .. }), "{error}");
    let video =
        ferrite_multimodal::Qwen2VlVideoProcessor::from_config(&json!({})).unwrap().with_overrides(&huge).unwrap();
    let error = video.preprocess(&[image::RgbImage::new(28, 28)]).unwrap_err();
    assert!(matches!(error, MultimodalError::TooManyVideoPixels { frames: 2, .. }), "{error}");
    // Within the limit the same overrides resize as asked.
    let fine = kwargs(json!({"min_pixels": 112 * 112}));
    let patches =
        processor(json!({})).with_overrides(&fine).unwrap().preprocess(&image::RgbImage::new(28, 28)).unwrap();
    assert_eq!(patches.grid_thw, [1, 8, 8]);
}

#[test]
fn video_processor_defaults_lookup_and_refusals_follow_transformers() {
    use ferrite_multimodal::Qwen2VlVideoProcessor;
    let video = Qwen2VlVideoProcessor::from_config(&json!({})).unwrap();
    assert_eq!((video.min_pixels, video.max_pixels), (128 * 28 * 28, 28 * 28 * 768), "the class default size");
    assert_eq!((video.cap_pixels_per_frame, video.max_video_tokens), (false, 128_000));
    assert_eq!(video.seconds_per_grid(), 2.0 / 24.0, "frame lists are taken at transformers' 24 fps");
    let error = Qwen2VlVideoProcessor::from_config(&json!({"do_sample_frames": true})).unwrap_err().to_string();
    assert!(error.contains("do_sample_frames"), "{error}");

    let frames = [image::RgbImage::new(56, 28), image::RgbImage::new(28, 56)];
    let error = video.preprocess(&frames).unwrap_err();
    assert!(matches!(error, MultimodalError::FrameSize { index: 1, .. }), "{error}");
    assert!(matches!(video.preprocess(&[]).unwrap_err(), MultimodalError::EmptyVideo));

    // transformers' order: processor_config.json's `video_processor`, then
    // video_preprocessor_config.json, then the image processor's preprocessor_config.json.
    let dir = std::env::temp_dir().join(format!("ferrite-multimodal-video-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, value: Value| std::fs::write(dir.join(name), value.to_string()).unwrap();
    write("preprocessor_config.json", json!({"min_pixels": 3136, "max_pixels": 6272}));
    let budget = |p: Qwen2VlVideoProcessor| (p.min_pixels, p.max_pixels);
    assert_eq!(budget(Qwen2VlVideoProcessor::from_model_dir(&dir).unwrap()), (3136, 6272));
    write("video_preprocessor_config.json", json!({"min_pixels": 784, "max_pixels": 1568}));
    assert_eq!(budget(Qwen2VlVideoProcessor::from_model_dir(&dir).unwrap()), (784, 1568));
    write("processor_config.json", json!({"video_processor": {"size": {"shortest_edge": 1, "longest_edge": 2}}}));
    assert_eq!(budget(Qwen2VlVideoProcessor::from_model_dir(&dir).unwrap()), (1, 2));
    std::fs::remove_dir_all(&dir).unwrap();
}
