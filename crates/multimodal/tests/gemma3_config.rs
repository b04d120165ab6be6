//! `Gemma3ImageProcessor`'s configuration, against what transformers 5.24's
//! `Gemma3ImageProcessor` does with the same config, and its refusals.

use ferrite_multimodal::{Gemma3ImageProcessor, MultimodalError};
use image::RgbImage;
use serde_json::{json, Value};

fn processor(config: Value) -> Gemma3ImageProcessor {
    Gemma3ImageProcessor::from_config(&config).unwrap_or_else(|e| panic!("{config}: {e}"))
}

fn config_error(config: Value) -> String {
    match Gemma3ImageProcessor::from_config(&config) {
        Ok(processor) => panic!("{config} was accepted: {processor:?}"),
        Err(error) => error.to_string(),
    }
}

/// google/gemma-3-4b-it's preprocessor_config.json.
fn gemma_3() -> Value {
    json!({
        "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null, "do_rescale": true,
        "do_resize": true, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": null,
        "pan_and_scan_min_crop_size": null, "pan_and_scan_min_ratio_to_activate": null,
        "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896}
    })
}

#[test]
fn gemma_3_config_loads_to_896_by_896() {
    let processor = processor(gemma_3());
    assert_eq!(processor.output_size(), (896, 896));
    // The same as its size alone: everything else it says is the class default.
    assert_eq!(processor, self::processor(json!({"size": {"height": 896, "width": 896}})));
    let output = processor.preprocess(&RgbImage::from_pixel(3, 2, image::Rgb([0, 128, 255]))).unwrap();
    assert_eq!(
        (output.pixel_values.len(), output.patch_dim, output.grid_thw),
        (3 * 896 * 896, 3 * 896 * 896, [1, 1, 1])
    );
    // What transformers makes of these pixels: (v - 127.5) / 127.5 in f32, channel after channel.
    let per_channel = 896 * 896;
    assert!(output.pixel_values[..per_channel].iter().all(|&v| v == -1.0));
    assert!(output.pixel_values[per_channel..2 * per_channel].iter().all(|&v| v == 0.003921569));
    assert!(output.pixel_values[2 * per_channel..].iter().all(|&v| v == 1.0));
}

#[test]
fn defaults_and_nulls_are_the_transformers_class_defaults() {
    let explicit = processor(json!({
        "size": {"height": 224, "width": 224}, "resample": 2, "do_resize": true, "do_rescale": true,
        "rescale_factor": 0.00392156862745098, "do_normalize": true, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": true, "do_pan_and_scan": false,
    }));
    assert_eq!(processor(json!({})), explicit);
    assert_eq!(processor(json!({})).output_size(), (224, 224));
    assert_eq!(
        processor(
            json!({"size": null, "resample": null, "image_mean": null, "image_std": null, "do_pan_and_scan": null})
        ),
        explicit
    );
    // Pan-and-scan's settings only matter with it on; crop and pad keys to processors that use them.
    assert_eq!(
        processor(json!({"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                         "pan_and_scan_min_ratio_to_activate": 1.2, "do_center_crop": true,
                         "crop_size": {"height": 10, "width": 10}, "do_pad": true, "do_convert_rgb": false})),
        explicit
    );
    // Not CLIP's defaults: mean and std 0.5, bilinear.
    assert_ne!(processor(json!({"image_mean": [0.48145466, 0.4578275, 0.40821073]})), explicit);
    assert_ne!(processor(json!({"image_std": [0.26862954, 0.26130258, 0.27577711]})), explicit);
    assert_ne!(processor(json!({"resample": 3})), explicit);
    assert_eq!(processor(json!({"resample": 3})), processor(json!({"resample": 3, "image_mean": 0.5})));
}

#[test]
fn fixed_sizes_match_transformers() {
    // (config, output (height, width)), as transformers' `get_size_dict` reads `size` for this class.
    let cases = [
        (json!({"size": {"height": 30, "width": 44}}), (30, 44)),
        (json!({"size": [30, 44]}), (30, 44)),
        (json!({"size": 40}), (40, 40)),
        (json!({"size": 40, "default_to_square": true}), (40, 40)),
        (json!({"size": {"width": 44, "height": 30}}), (30, 44)),
    ];
    for (config, output) in cases {
        let processor = processor(config.clone());
        assert_eq!(processor.output_size(), output, "{config}");
        for (width, height) in [(53, 37), (1, 200), (1920, 1080)] {
            let patches = processor.preprocess(&RgbImage::new(width, height)).unwrap();
            assert_eq!(patches.pixel_values.len(), 3 * output.0 * output.1, "{config}: {width}x{height}");
        }
    }
}

#[test]
fn invalid_or_unsupported_configs_are_refused_naming_the_key() {
    let size = "`size` must be {\"height\": h, \"width\": w}, [h, w] or a number, got";
    let fixed = "Gemma 3's vision tower takes one fixed size";
    let cases = [
        (json!({"do_pan_and_scan": "yes"}), "`do_pan_and_scan` must be true or false, got \"yes\"".to_string()),
        (
            json!({"pan_and_scan_min_crop_size": 0}),
            "`pan_and_scan_min_crop_size` must be a positive integer, got 0".to_string(),
        ),
        (
            json!({"pan_and_scan_max_num_crops": 2.5}),
            "`pan_and_scan_max_num_crops` must be a positive integer, got 2.5".to_string(),
        ),
        (
            json!({"pan_and_scan_min_ratio_to_activate": "1.2"}),
            "`pan_and_scan_min_ratio_to_activate` must be a number, got \"1.2\"".to_string(),
        ),
        (json!({"resample": 0}), "`resample` 0 is not supported, only 2 (bilinear) or 3 (bicubic)".to_string()),
        (json!({"resample": 1}), "`resample` 1 is not supported, only 2 (bilinear) or 3 (bicubic)".to_string()),
        (json!({"resample": 4}), "`resample` 4 is not supported, only 2 (bilinear) or 3 (bicubic)".to_string()),
        (json!({"resample": 5}), "`resample` 5 is not supported, only 2 (bilinear) or 3 (bicubic)".to_string()),
        (
            json!({"resample": "bilinear"}),
            "`resample` \"bilinear\" is not supported, only 2 (bilinear) or 3 (bicubic)".to_string(),
        ),
        (
            json!({"do_resize": false}),
            "`do_resize: false` is not supported: the output size would be each image's own".to_string(),
        ),
        (json!({"size": {"shortest_edge": 896}}), format!("{size} {{\"shortest_edge\":896}}: {fixed}")),
        (
            json!({"size": {"shortest_edge": 30, "longest_edge": 40}}),
            format!("{size} {{\"shortest_edge\":30,\"longest_edge\":40}}: {fixed}"),
        ),
        (
            json!({"size": {"max_height": 40, "max_width": 50}}),
            format!("{size} {{\"max_height\":40,\"max_width\":50}}: {fixed}"),
        ),
        (json!({"size": [40]}), format!("{size} [40]: {fixed}")),
        (json!({"size": "896"}), format!("{size} \"896\": {fixed}")),
        (
            json!({"size": 40, "default_to_square": false}),
            format!("`size` 40 with `default_to_square: false` is a shortest edge, which is not supported: {fixed}"),
        ),
        (json!({"size": 0}), "`size` must be a positive integer, got 0".to_string()),
        (json!({"size": {"height": 0, "width": 5}}), "`size.height` must be a positive integer, got 0".to_string()),
        (json!({"size": [30, 2.5]}), "`size[1]` must be a positive integer, got 2.5".to_string()),
        (
            json!({"size": 40, "default_to_square": "no"}),
            "`default_to_square` must be true or false, got \"no\"".to_string(),
        ),
        (json!({"do_convert_rgb": "yes"}), "`do_convert_rgb` must be true or false, got \"yes\"".to_string()),
        (json!({"image_std": [0.5, 0.0, 0.5]}), "`image_std` must not contain 0".to_string()),
        (json!({"image_mean": [0.5, 0.5]}), "`image_mean` must be a number or 3 numbers, got [0.5,0.5]".to_string()),
        (json!({"rescale_factor": 0}), "`rescale_factor` must be a positive number, got 0".to_string()),
        (json!("Gemma3ImageProcessor"), "the preprocessor config must be a JSON object".to_string()),
    ];
    for (config, message) in cases {
        assert_eq!(config_error(config.clone()), format!("invalid image processor config: {message}"), "{config}");
    }
}

#[test]
fn empty_images_are_refused() {
    let processor = processor(gemma_3());
    for (width, height) in [(0, 5), (4, 0), (0, 0)] {
        let error = processor.preprocess(&RgbImage::new(width, height)).unwrap_err();
        assert!(matches!(error, MultimodalError::EmptyImage { .. }), "{width}x{height}: {error}");
        assert_eq!(error.to_string(), format!("image is {width}x{height} pixels: it has no pixels to process"));
    }
}

#[test]
fn model_dir_config_comes_from_processor_config_first_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("ferrite-multimodal-gemma3-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let preprocessor = dir.join("preprocessor_config.json");
    let processor_file = dir.join("processor_config.json");

    let error = Gemma3ImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: cannot read it: ", preprocessor.display())), "{error}");

    std::fs::write(&preprocessor, gemma_3().to_string()).unwrap();
    let loaded = Gemma3ImageProcessor::from_model_dir(&dir).unwrap();
    assert_eq!(loaded, processor(gemma_3()));
    assert_eq!(loaded.output_size(), (896, 896));

    // A processor_config.json without an image processor (or a null one) leaves the choice to
    // preprocessor_config.json ...
    for processor_config in [json!({"image_seq_length": 256}), json!({"image_processor": null})] {
        std::fs::write(&processor_file, processor_config.to_string()).unwrap();
        assert_eq!(Gemma3ImageProcessor::from_model_dir(&dir).unwrap().output_size(), (896, 896), "{processor_config}");
    }
    // ... and one with an image processor takes precedence.
    std::fs::write(&processor_file, json!({"image_processor": {"size": [448, 336]}}).to_string()).unwrap();
    assert_eq!(Gemma3ImageProcessor::from_model_dir(&dir).unwrap().output_size(), (448, 336));

    // Pan-and-scan from the config: 1000x300 (ratio 3.3) in 3 crops of 334 (the last 332) by 300.
    std::fs::write(&processor_file, json!({"image_processor": {"do_pan_and_scan": true}}).to_string()).unwrap();
    let crops = Gemma3ImageProcessor::from_model_dir(&dir).unwrap().crops(1000, 300);
    assert_eq!(crops, [[0, 0, 334, 300], [334, 0, 334, 300], [668, 0, 332, 300]]);
    std::fs::write(&processor_file, json!({"image_processor": {"pan_and_scan_max_num_crops": -1}}).to_string())
        .unwrap();
    let error = Gemma3ImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    let expected = "invalid image processor config: `pan_and_scan_max_num_crops` must be a positive integer, got -1";
    assert_eq!(error, format!("{}: {expected}", processor_file.display()));

    std::fs::remove_file(&processor_file).unwrap();
    std::fs::write(&preprocessor, json!({"resample": 0}).to_string()).unwrap();
    let error = Gemma3ImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    let expected = "invalid image processor config: `resample` 0 is not supported, only 2 (bilinear) or 3 (bicubic)";
    assert_eq!(error, format!("{}: {expected}", preprocessor.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `SiglipImageProcessor` runs the same pipeline with its own class defaults: bicubic, and a
/// number `size` read as a shortest edge (refused here, as is a center crop).
#[test]
fn siglip_defaults_are_bicubic_and_refuse_what_is_not_one_fixed_size() {
    let siglip = |config: Value| Gemma3ImageProcessor::from_siglip_config(&config);
    // Gemma 3's pipeline with the same settings (less its pan-and-scan): the same output.
    let same = |a: Gemma3ImageProcessor, b: Gemma3ImageProcessor| {
        let image = RgbImage::from_fn(37, 23, |x, y| image::Rgb([x as u8 * 7, y as u8 * 11, (x + y) as u8]));
        assert_eq!(a.output_size(), b.output_size());
        assert_eq!(a.preprocess(&image).unwrap(), b.preprocess(&image).unwrap());
        assert!(!a.has_pan_and_scan() && b.has_pan_and_scan());
    };
    same(siglip(json!({})).unwrap(), processor(json!({"resample": 3})));
    same(
        siglip(json!({"size": {"height": 384, "width": 384}, "resample": 2})).unwrap(),
        processor(json!({"size": {"height": 384, "width": 384}})),
    );
    assert_eq!(siglip(json!({"size": 384, "default_to_square": true})).unwrap().output_size(), (384, 384));
    let refused = |config: Value| siglip(config).unwrap_err().to_string();
    assert!(refused(json!({"size": 384})).contains("shortest edge"));
    assert!(refused(json!({"do_center_crop": true})).contains("do_center_crop"));
}

/// transformers' `pan_and_scan_batched` on sizes the fixtures do not have: Gemma 3's own defaults
/// (crops of at least 256 pixels, at most 4, from an aspect ratio of 1.2), a request's overrides,
/// and their refusals.
#[test]
fn pan_and_scan_crops_follow_transformers_and_requests_may_turn_it_on() {
    let off = processor(gemma_3());
    assert!(off.crops(1920, 1080).is_empty(), "off unless asked");
    let kwargs = |value: Value| value.as_object().unwrap().clone();
    let on = off.with_overrides(&kwargs(json!({"do_pan_and_scan": true}))).unwrap();
    // (width, height, crops (x, y, width, height)).
    let cases: [(usize, usize, Vec<[usize; 4]>); 7] = [
        // 1.78 rounds to 2 crops of 960x1080.
        (1920, 1080, vec![[0, 0, 960, 1080], [960, 0, 960, 1080]]),
        // Under the 1.2 ratio: none.
        (1100, 1000, vec![]),
        // 5.0 is capped at 4 crops, 375 wide.
        (1500, 300, vec![[0, 0, 375, 300], [375, 0, 375, 300], [750, 0, 375, 300], [1125, 0, 375, 300]]),
        // Tall: rows.
        (300, 700, vec![[0, 0, 300, 350], [0, 350, 300, 350]]),
        // Crops under 256 pixels: none.
        (600, 200, vec![]),
        // 1.2 exactly activates; 1.2 + 0.5 floors to 1, raised to 2 crops of 300.
        (600, 500, vec![[0, 0, 300, 500], [300, 0, 300, 500]]),
        // 2.5 rounds half up to 3; the last crop is cut at the edge.
        (1001, 400, vec![[0, 0, 334, 400], [334, 0, 334, 400], [668, 0, 333, 400]]),
    ];
    for (width, height, crops) in cases {
        assert_eq!(on.crops(width, height), crops, "{width}x{height}");
    }
    let tuned = on
        .with_overrides(&kwargs(json!({"pan_and_scan_min_crop_size": 100, "pan_and_scan_max_num_crops": 2,
                                       "pan_and_scan_min_ratio_to_activate": null})))
        .unwrap();
    assert_eq!(tuned.crops(1500, 300).len(), 2);
    assert_eq!(tuned.crops(600, 200), [[0, 0, 300, 200], [300, 0, 300, 200]]);
    assert!(tuned.with_overrides(&kwargs(json!({"do_pan_and_scan": false}))).unwrap().crops(600, 200).is_empty());

    let images = on.preprocess_with_crops(&RgbImage::new(1500, 300)).unwrap();
    assert_eq!(images.len(), 5);
    assert!(images.iter().all(|image| image.pixel_values.len() == 3 * 896 * 896));

    for (value, message) in [
        (json!({"do_pan_and_scan": 1}), "`do_pan_and_scan` must be true or false, got 1"),
        (json!({"pan_and_scan_min_crop_size": -5}), "`pan_and_scan_min_crop_size` must be a positive integer, got -5"),
        (json!({"pan_and_scan_max_num_crops": 0}), "`pan_and_scan_max_num_crops` must be a positive integer, got 0"),
        (json!({"pan_and_scan_min_ratio_to_activate": []}), "`pan_and_scan_min_ratio_to_activate` must be a number"),
        (json!({"size": 448}), "unknown key `size`: Gemma 3's image processor takes do_pan_and_scan, "),
    ] {
        let error = on.with_overrides(&kwargs(value.clone())).unwrap_err().to_string();
        assert!(error.starts_with(&format!("invalid mm_processor_kwargs: {message}")), "{value}: {error}");
    }
    let siglip = Gemma3ImageProcessor::from_siglip_config(&json!({})).unwrap();
    assert!(siglip.with_overrides(&kwargs(json!({"do_pan_and_scan": true}))).is_err());
    assert!(Gemma3ImageProcessor::from_siglip_config(&json!({"do_pan_and_scan": true})).is_err());
}
