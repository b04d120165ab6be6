//! `LlavaNextImageProcessor`'s configuration and tiling against what transformers 5.24 does with
//! the same config, and the configs it refuses.

use ferrite_multimodal::{AnyRes, LlavaNextImageProcessor, MultimodalError, RgbImage};
use serde_json::{json, Value};

fn refused(config: Value) -> String {
    match LlavaNextImageProcessor::from_config(&config) {
        Err(MultimodalError::Config(message)) => message,
        other => panic!("{config}: expected a config error, got {other:?}"),
    }
}

#[test]
fn defaults_are_the_class_defaults() {
    // `size` {"shortest_edge": 224}, `crop_size` 224 x 224 and llava-v1.6's pinpoints, which are
    // not whole 224-pixel tiles: transformers cuts ragged tiles that it cannot stack.
    let message = refused(json!({}));
    assert_eq!(message, "`image_grid_pinpoints` entry [336, 672] is not whole 224-pixel tiles");
    let processor = LlavaNextImageProcessor::from_config(&json!({"size": 336, "crop_size": 336})).unwrap();
    assert_eq!(processor.anyres().tile(), 336);
    assert_eq!(processor.anyres(), &AnyRes::from_config(None, 336).unwrap());
    let default_pinpoints = json!([[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]);
    assert_eq!(AnyRes::from_config(Some(&default_pinpoints), 336).unwrap(), AnyRes::from_config(None, 336).unwrap());
    // A number `size` is a shortest edge, a number `crop_size` a square: both one 28-pixel tile.
    let processor =
        LlavaNextImageProcessor::from_config(&json!({"size": 28, "crop_size": 28, "image_grid_pinpoints": [[28, 56]]}))
            .unwrap();
    let image = RgbImage::new(30, 10);
    assert_eq!(processor.anyres().tiles(10, 30).unwrap(), (1, 2));
    let output = processor.preprocess(&image).unwrap();
    assert_eq!(output.pixel_values.len(), 3 * 3 * 28 * 28);
    assert_eq!(output.image_size, (10, 30));
}

#[test]
fn pipelines_that_would_resize_or_crop_the_tiles_are_refused() {
    let message = refused(json!({"size": {"shortest_edge": 336}, "crop_size": {"height": 224, "width": 224}}));
    assert!(message.contains("must both be one square tile (224x224)"), "{message}");
    let message = refused(json!({"size": {"height": 28, "width": 56}, "crop_size": 28}));
    assert!(message.contains("must both be one square tile (28x28)"), "{message}");
    let message = refused(json!({"size": 28, "crop_size": {"height": 28, "width": 20}}));
    assert!(message.contains("one square tile"), "{message}");
    // Without the crop its width does not matter.
    LlavaNextImageProcessor::from_config(&json!({"size": 28, "crop_size": {"height": 28, "width": 20},
                                                 "do_center_crop": false, "image_grid_pinpoints": [[28, 28]]}))
    .unwrap();
    let message = refused(json!({"crop_size": {"shortest_edge": 224}}));
    assert!(message.contains("`crop_size` must be {\"height\": h"), "{message}");
}

#[test]
fn pinpoints_must_be_whole_tiles() {
    let message = refused(json!({"size": 28, "crop_size": 28, "image_grid_pinpoints": [[28, 50]]}));
    assert_eq!(message, "`image_grid_pinpoints` entry [28, 50] is not whole 28-pixel tiles");
    for bad in [json!([]), json!([[28]]), json!([[28, 0]]), json!("28x56"), json!([[28, -56]])] {
        let message = refused(json!({"size": 28, "crop_size": 28, "image_grid_pinpoints": bad}));
        assert!(message.starts_with("`image_grid_pinpoints` must be a non-empty list"), "{message}");
    }
    let message = refused(json!({"size": 28, "crop_size": 28, "image_grid_pinpoints": [[28, 56]], "resample": 1}));
    assert!(message.contains("`resample` 1 is not supported"), "{message}");
}

#[test]
fn empty_and_thin_images() {
    let anyres = AnyRes::from_config(None, 336).unwrap();
    assert!(matches!(anyres.best_resolution(0, 5), Err(MultimodalError::EmptyImage { .. })));
    // transformers keeps the first pinpoint of the least area when no pinpoint keeps a whole
    // pixel row of a 1 x 4000 strip: 336 x 672.
    assert_eq!(anyres.best_resolution(1, 4000).unwrap(), (336, 672));
    assert_eq!(anyres.tiles(1, 4000).unwrap(), (1, 2));
    let processor = LlavaNextImageProcessor::from_config(&json!({"size": 28, "crop_size": 28})).unwrap();
    let error = processor.preprocess(&RgbImage::new(0, 0)).unwrap_err();
    assert!(matches!(error, MultimodalError::EmptyImage { .. }), "{error}");
}
