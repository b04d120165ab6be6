//! `ClipImageProcessor`'s configuration and resize sizes, against what transformers 5.24's
//! `CLIPImageProcessor` does with the same config, and its refusals.

use ferrite_multimodal::{ClipImageProcessor, MultimodalError};
use image::RgbImage;
use serde_json::{json, Value};

fn processor(config: Value) -> ClipImageProcessor {
    ClipImageProcessor::from_config(&config).unwrap_or_else(|e| panic!("{config}: {e}"))
}

fn config_error(config: Value) -> String {
    match ClipImageProcessor::from_config(&config) {
        Ok(processor) => panic!("{config} was accepted: {processor:?}"),
        Err(error) => error.to_string(),
    }
}

/// llava-hf/llava-1.5-7b-hf's preprocessor_config.json.
fn llava_1_5() -> Value {
    json!({
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": true, "do_convert_rgb": true,
        "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}
    })
}

#[test]
fn shortest_edge_resize_sizes_match_transformers() {
    // The class default, LLaVA-1.5's config and a number `size` (openai/clip-vit-large-patch14-336's
    // layout), which means the shortest edge.
    let processors = [processor(json!({})), processor(llava_1_5()), processor(json!({"size": 40, "crop_size": 40}))];
    // Image sizes (height, width) and what transformers resizes them to with each processor.
    let resizes = [
        ((37, 53), [(224, 320), (336, 481), (40, 57)]),
        ((53, 37), [(320, 224), (481, 336), (57, 40)]),
        ((100, 100), [(224, 224), (336, 336), (40, 40)]),
        ((1, 200), [(224, 44800), (336, 67200), (40, 8000)]), // an aspect ratio of 200 is still allowed
        ((1080, 1920), [(224, 398), (336, 597), (40, 71)]),
        ((480, 640), [(224, 298), (336, 448), (40, 53)]),
        ((640, 480), [(298, 224), (448, 336), (53, 40)]),
        ((3, 7), [(224, 522), (336, 784), (40, 93)]),
    ];
    for ((height, width), expected) in resizes {
        for (processor, expected) in processors.iter().zip(expected) {
            assert_eq!(
                processor.resized_size(height, width).unwrap(),
                expected,
                "{height}x{width} (h x w): {processor:?}"
            );
        }
    }
    assert_eq!(processors.map(|processor| processor.output_size()), [(224, 224), (336, 336), (40, 40)]);
}

#[test]
fn fixed_sizes_match_transformers() {
    // (config, resized size of any image, output size)
    let cases = [
        (json!({"size": 40, "default_to_square": true}), (40, 40), (224, 224)),
        (json!({"size": [30, 44], "crop_size": [33, 47]}), (30, 44), (33, 47)),
        (json!({"size": {"height": 30, "width": 44}, "do_center_crop": false}), (30, 44), (30, 44)),
        // KOSMOS-2's flag: a square of the class default side, whatever `size` says.
        (json!({"use_square_size": true, "size": {"shortest_edge": 336}}), (224, 224), (224, 224)),
    ];
    for (config, resized, output) in cases {
        let processor = processor(config.clone());
        for (height, width) in [(37, 53), (1, 200), (1080, 1920)] {
            assert_eq!(processor.resized_size(height, width).unwrap(), resized, "{config}: {height}x{width}");
        }
        assert_eq!(processor.output_size(), output, "{config}");
    }
    let unresized = processor(json!({"do_resize": false, "crop_size": {"height": 9, "width": 5}}));
    assert_eq!(unresized.resized_size(37, 53).unwrap(), (37, 53));
    assert_eq!(unresized.output_size(), (9, 5));
}

#[test]
fn defaults_and_nulls_are_the_transformers_class_defaults() {
    let explicit = processor(json!({
        "size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}, "do_resize": true,
        "do_center_crop": true, "do_rescale": true, "rescale_factor": 0.00392156862745098, "do_normalize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": true, "resample": 3,
    }));
    assert_eq!(processor(json!({})), explicit);
    // The input is RGB already, and without a `pad_size` every output has the one size: neither
    // changes anything.
    assert_eq!(processor(json!({"do_convert_rgb": false, "do_pad": true})), explicit);
    assert_eq!(processor(json!({"size": null, "crop_size": null, "image_mean": null, "resample": null})), explicit);
    // The resample filter only matters to a resize.
    assert_eq!(processor(json!({"do_resize": false, "resample": 2})).output_size(), (224, 224));
}

#[test]
fn invalid_or_unsupported_configs_are_refused_naming_the_key() {
    let size = "`size` must be {\"shortest_edge\": s}, {\"height\": h, \"width\": w}, [h, w] or a number, got";
    let crop_size = "`crop_size` must be {\"height\": h, \"width\": w}, [h, w] or a number, got";
    let cases = [
        (json!({"resample": 2}), "`resample` 2 is not supported, only 3 (bicubic)".to_string()),
        // transformers takes these two size dicts, but not for CLIP's checkpoints.
        (json!({"size": {"shortest_edge": 30, "longest_edge": 40}}), format!("{size} {{\"shortest_edge\":30,\"longest_edge\":40}}")),
        (json!({"size": {"max_height": 40, "max_width": 50}}), format!("{size} {{\"max_height\":40,\"max_width\":50}}")),
        // transformers fails on these when it resizes or crops.
        (json!({"size": {"longest_edge": 40}}), format!("{size} {{\"longest_edge\":40}}")),
        (json!({"size": [40]}), format!("{size} [40]")),
        (json!({"crop_size": {"shortest_edge": 30}}), format!("{crop_size} {{\"shortest_edge\":30}}")),
        (json!({"size": 0}), "`size` must be a positive integer, got 0".to_string()),
        (json!({"size": {"shortest_edge": -1}}), "`size.shortest_edge` must be a positive integer, got -1".to_string()),
        (json!({"size": [30, "44"]}), "`size[1]` must be a positive integer, got \"44\"".to_string()),
        (json!({"crop_size": {"height": 0, "width": 5}}), "`crop_size.height` must be a positive integer, got 0".to_string()),
        (json!({"crop_size": [1, 2.5]}), "`crop_size[1]` must be a positive integer, got 2.5".to_string()),
        (json!({"crop_size": "336"}), format!("{crop_size} \"336\"")),
        // The engine needs one output size to count an image's tokens.
        (json!({"do_center_crop": false}), "`do_center_crop: false` is not supported with `size.shortest_edge`: the output size would follow each image's aspect ratio".to_string()),
        (json!({"do_resize": false, "do_center_crop": false}), "`do_resize: false` with `do_center_crop: false` is not supported: the output size would be each image's own".to_string()),
        (json!({"do_pad": true, "pad_size": {"height": 400, "width": 400}}), "`do_pad: true` with a `pad_size` is not supported".to_string()),
        (json!({"do_convert_rgb": "yes"}), "`do_convert_rgb` must be true or false, got \"yes\"".to_string()),
        (json!({"use_square_size": 1}), "`use_square_size` must be true or false, got 1".to_string()),
        (json!({"size": 40, "default_to_square": "no"}), "`default_to_square` must be true or false, got \"no\"".to_string()),
        (json!({"image_std": [0.5, 0.0, 0.5]}), "`image_std` must not contain 0".to_string()),
        (json!({"image_mean": [0.5, 0.5]}), "`image_mean` must be a number or 3 numbers, got [0.5,0.5]".to_string()),
        (json!({"rescale_factor": 0}), "`rescale_factor` must be a positive number, got 0".to_string()),
        (json!("CLIPImageProcessor"), "the preprocessor config must be a JSON object".to_string()),
    ];
    for (config, message) in cases {
        assert_eq!(config_error(config.clone()), format!("invalid image processor config: {message}"), "{config}");
    }
}

#[test]
fn empty_images_and_extreme_aspect_ratios_are_refused() {
    let processor = processor(llava_1_5());
    assert_eq!(
        processor.resized_size(0, 5).unwrap_err().to_string(),
        "image is 5x0 pixels: it has no pixels to process"
    );
    assert!(matches!(processor.preprocess(&RgbImage::new(4, 0)), Err(MultimodalError::EmptyImage { .. })));
    assert_eq!(
        processor.resized_size(1, 201).unwrap_err().to_string(),
        "image is 201x1 pixels, an aspect ratio of 201: more than the 200 allowed"
    );
    assert!(matches!(processor.preprocess(&RgbImage::new(1, 250)), Err(MultimodalError::AspectRatio { .. })));
    // Only a resize to a shortest edge grows with the aspect ratio.
    let fixed = self::processor(json!({"size": {"height": 336, "width": 336}}));
    assert_eq!(fixed.resized_size(1, 1000).unwrap(), (336, 336));
    let unresized = self::processor(json!({"do_resize": false, "crop_size": 8}));
    let output = unresized.preprocess(&RgbImage::new(1000, 1)).unwrap();
    assert_eq!(output.pixel_values.len(), 3 * 8 * 8);
}

#[test]
fn model_dir_config_comes_from_processor_config_first_and_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("ferrite-multimodal-clip-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let preprocessor = dir.join("preprocessor_config.json");
    let processor_file = dir.join("processor_config.json");

    let error = ClipImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: cannot read it: ", preprocessor.display())), "{error}");

    std::fs::write(&preprocessor, llava_1_5().to_string()).unwrap();
    assert_eq!(ClipImageProcessor::from_model_dir(&dir).unwrap(), processor(llava_1_5()));

    // A processor_config.json without an image processor (or a null one) leaves the choice to
    // preprocessor_config.json ...
    for processor_config in [json!({"patch_size": 14}), json!({"image_processor": null})] {
        std::fs::write(&processor_file, processor_config.to_string()).unwrap();
        assert_eq!(ClipImageProcessor::from_model_dir(&dir).unwrap().output_size(), (336, 336), "{processor_config}");
    }
    // ... and one with an image processor takes precedence.
    std::fs::write(&processor_file, json!({"image_processor": {"crop_size": 448}}).to_string()).unwrap();
    assert_eq!(ClipImageProcessor::from_model_dir(&dir).unwrap().output_size(), (448, 448));

    std::fs::write(&processor_file, json!({"image_processor": {"crop_size": 0}}).to_string()).unwrap();
    let error = ClipImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    let expected = "invalid image processor config: `crop_size` must be a positive integer, got 0";
    assert_eq!(error, format!("{}: {expected}", processor_file.display()));

    std::fs::write(&processor_file, "{\"image_processor\": ").unwrap();
    let error = ClipImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    assert!(error.starts_with(&format!("{}: not valid JSON: ", processor_file.display())), "{error}");

    std::fs::remove_file(&processor_file).unwrap();
    std::fs::write(&preprocessor, json!({"resample": 0}).to_string()).unwrap();
    let error = ClipImageProcessor::from_model_dir(&dir).unwrap_err().to_string();
    let expected = "invalid image processor config: `resample` 0 is not supported, only 3 (bicubic)";
    assert_eq!(error, format!("{}: {expected}", preprocessor.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}
