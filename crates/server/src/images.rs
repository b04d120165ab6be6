//! A chat request's images, from fetched bytes to what the engine takes: decoded to RGB, run
//! through the model's image processor (with the request's `mm_processor_kwargs`), and each
//! image's one placeholder token in the rendered prompt expanded to as many tokens as the image
//! becomes embeddings, as vLLM's multimodal processor updates the prompt.

use std::hash::{Hash, Hasher};

use ferrite_engine::ImageData;
use ferrite_multimodal::{
    decode_image, image_processor_config, ClipImageProcessor, MultimodalError, Qwen2VlImageProcessor,
};

use crate::error::ApiError;
use crate::generate::Prompt;

/// Pillow's decompression-bomb limit (`2 * Image.MAX_IMAGE_PIXELS`): a larger image is refused
/// from its header, before its pixels are decoded.
pub const MAX_IMAGE_PIXELS: u64 = 178_956_970;

/// The image processors the server runs, picked by the model's `image_processor_type`.
#[derive(Debug, Clone)]
pub enum ImageProcessor {
    /// Qwen2-VL's and Qwen2.5-VL's: any size, resized to whole merge windows of patches.
    Qwen2Vl(Qwen2VlImageProcessor),
    /// CLIP's (LLaVA): one fixed-size image; `patch` pixels a patch side, which sets how many
    /// embeddings the image becomes.
    Clip { processor: ClipImageProcessor, patch: usize },
}

impl ImageProcessor {
    /// An encoded image's processed pixels and its grid in patches `(t, h, w)`.
    fn process(&self, bytes: &[u8]) -> Result<(Vec<f32>, [usize; 3]), MultimodalError> {
        let rgb = &decode_image(bytes, MAX_IMAGE_PIXELS)?;
        match self {
            ImageProcessor::Qwen2Vl(p) => p.preprocess(rgb).map(|out| (out.pixel_values, out.grid_thw)),
            ImageProcessor::Clip { processor, patch } => {
                let (height, width) = processor.output_size();
                Ok((processor.preprocess(rgb)?.pixel_values, [1, height / patch, width / patch]))
            }
        }
    }

    /// Patches per side of one embedding.
    fn merge(&self) -> usize {
        match self {
            ImageProcessor::Qwen2Vl(p) => p.merge_size,
            ImageProcessor::Clip { .. } => 1,
        }
    }

    fn with_overrides(&self, kwargs: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        match self {
            ImageProcessor::Qwen2Vl(p) => {
                p.with_overrides(kwargs).map(ImageProcessor::Qwen2Vl).map_err(|e| e.to_string())
            }
            ImageProcessor::Clip { .. } => Err(format!(
                "this model's image processor (CLIP) takes no mm_processor_kwargs; got {}",
                kwargs.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

/// A vision-language model's image side as the server runs it.
#[derive(Debug)]
pub struct ImageProcessing {
    pub processor: ImageProcessor,
    /// The token the chat template writes once per image, and the engine expects once per
    /// image embedding.
    pub image_token_id: u32,
}

impl ImageProcessing {
    /// The image processor of the model in `dir` (`image_processor_config`: the
    /// `image_processor` section of `processor_config.json`, else `preprocessor_config.json`),
    /// for a vision tower of `patch_size`-pixel patches.
    pub fn from_model_dir(
        dir: &std::path::Path,
        image_token_id: u32,
        patch_size: usize,
    ) -> Result<ImageProcessing, String> {
        let (path, section) = image_processor_config(dir).map_err(|e| e.to_string())?;
        let path = path.display();
        let kind =
            section.get("image_processor_type").and_then(serde_json::Value::as_str).unwrap_or("Qwen2VLImageProcessor");
        let processor = if kind.starts_with("Qwen2VLImageProcessor") {
            ImageProcessor::Qwen2Vl(Qwen2VlImageProcessor::from_config(&section).map_err(|e| format!("{path}: {e}"))?)
        } else if kind.starts_with("CLIPImageProcessor") {
            let processor = ClipImageProcessor::from_config(&section).map_err(|e| format!("{path}: {e}"))?;
            let (height, width) = processor.output_size();
            if patch_size == 0 || !height.is_multiple_of(patch_size) || !width.is_multiple_of(patch_size) {
                return Err(format!("{path}: a {height}x{width} crop is not whole patches of {patch_size} pixels"));
            }
            ImageProcessor::Clip { processor, patch: patch_size }
        } else {
            return Err(format!(
                "{path}: image_processor_type `{kind}` is not supported (Qwen2VLImageProcessor, CLIPImageProcessor)"
            ));
        };
        Ok(ImageProcessing { processor, image_token_id })
    }

    /// Turns `prompt.media` into the engine's images and expands their placeholders in
    /// `prompt.ids`. A prompt without media is left as it is; processor settings on a model
    /// without a processor are refused.
    pub(crate) fn apply(processing: Option<&ImageProcessing>, prompt: &mut Prompt) -> Result<(), ApiError> {
        let kwargs = prompt.mm_processor_kwargs.take().filter(|k| !k.is_empty());
        let Some(processing) = processing else {
            if kwargs.is_some() {
                return Err(ApiError::invalid(
                    "mm_processor_kwargs",
                    "mm_processor_kwargs needs a multimodal processor, and this model has none",
                ));
            }
            return Ok(());
        };
        if prompt.media.is_empty() {
            return Ok(());
        }
        let processor = match &kwargs {
            Some(kwargs) => {
                processing.processor.with_overrides(kwargs).map_err(|e| ApiError::invalid("mm_processor_kwargs", e))?
            }
            None => processing.processor.clone(),
        };
        let mut images = Vec::with_capacity(prompt.media.len());
        for item in std::mem::take(&mut prompt.media) {
            let fail = |e: ferrite_multimodal::MultimodalError| {
                ApiError::invalid("messages", format!("{}: {e}", item.location))
            };
            let (pixel_values, grid_thw) = processor.process(&item.bytes).map_err(fail)?;
            images.push(ImageData {
                hash: content_hash(&pixel_values, grid_thw),
                pixel_values: pixel_values.into(),
                grid_thw,
            });
        }
        let id = processing.image_token_id;
        let merge = processor.merge();
        let mut ids = Vec::with_capacity(prompt.ids.len());
        let mut next = images.iter();
        for &token in &prompt.ids {
            if token != id {
                ids.push(token);
                continue;
            }
            let Some(image) = next.next() else {
                return Err(ApiError::invalid(
                    "messages",
                    format!("the prompt has more image placeholders than the request's {} images", images.len()),
                ));
            };
            let [t, h, w] = image.grid_thw;
            ids.extend(std::iter::repeat_n(id, t * (h / merge) * (w / merge)));
        }
        if next.next().is_some() {
            return Err(ApiError::invalid(
                "messages",
                format!("the chat template placed fewer image placeholders than the request's {} images", images.len()),
            ));
        }
        prompt.ids = ids;
        prompt.images = images;
        Ok(())
    }
}

/// Identifies an image as the model sees it (its processed pixels and grid), for the prefix
/// cache's block hashes.
fn content_hash(pixels: &[f32], grid: [usize; 3]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    grid.hash(&mut h);
    // In blocks of bytes: a million-pixel image is 25 MB of values, which one `write` per value
    // would take several times longer to hash.
    let mut block = [0u8; 4096];
    for chunk in pixels.chunks(block.len() / 4) {
        for (bytes, v) in block.chunks_exact_mut(4).zip(chunk) {
            bytes.copy_from_slice(&v.to_bits().to_le_bytes());
        }
        h.write(&block[..chunk.len() * 4]);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{FetchedMedia, MediaKind};

    const PAD: u32 = 1002;

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2-vl")
    }

    fn processing() -> ImageProcessing {
        ImageProcessing::from_model_dir(&fixture(), PAD, 14).unwrap()
    }

    fn png(name: &str) -> FetchedMedia {
        let bytes = std::fs::read(fixture().join("images").join(format!("{name}.png"))).unwrap();
        FetchedMedia {
            kind: MediaKind::Image,
            location: "messages[0].content[0]".into(),
            bytes: bytes.into(),
            mime: None,
        }
    }

    fn prompt(ids: Vec<u32>, media: Vec<FetchedMedia>) -> Prompt {
        Prompt { media, ..Prompt::new(ids, None) }
    }

    #[test]
    fn placeholders_grow_to_the_images_embeddings_with_transformers_pixels() {
        let mut p = prompt(vec![5, PAD, 6, PAD], vec![png("square"), png("large")]);
        ImageProcessing::apply(Some(&processing()), &mut p).unwrap();
        // 56x56 is 4x4 patches (4 tokens); 200x150 is resized to 112x84, 6x8 patches (12 tokens).
        let pads = |n| std::iter::repeat_n(PAD, n);
        let want: Vec<u32> = [5].into_iter().chain(pads(4)).chain([6]).chain(pads(12)).collect();
        assert_eq!(p.ids, want);
        assert!(p.media.is_empty());
        assert_eq!(p.images.iter().map(|i| i.grid_thw).collect::<Vec<_>>(), [[1, 4, 4], [1, 6, 8]]);
        // The fixture's processed pixels came from transformers' processor on the same file.
        let oracle = std::fs::read(fixture().join("pixels/square.bin")).unwrap();
        let oracle: Vec<u32> = oracle.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let ours: Vec<u32> = p.images[0].pixel_values.iter().map(|v| v.to_bits()).collect();
        assert!(ours == oracle, "pixel values differ from transformers'");
        assert_ne!(p.images[0].hash, p.images[1].hash);
    }

    #[test]
    fn processor_kwargs_change_the_grid_and_are_checked() {
        let mut p = prompt(vec![PAD], vec![png("large")]);
        p.mm_processor_kwargs = serde_json::from_str(r#"{"max_pixels": 3136}"#).unwrap();
        ImageProcessing::apply(Some(&processing()), &mut p).unwrap();
        // transformers' smart_resize: 200x150 under 3136 pixels is 56x28, 2x4 patches.
        assert_eq!(p.images[0].grid_thw, [1, 2, 4]);
        assert_eq!(p.ids.len(), 2);
        let mut p = prompt(vec![PAD], vec![png("large")]);
        p.mm_processor_kwargs = serde_json::from_str(r#"{"do_pan_and_scan": true}"#).unwrap();
        let e = ImageProcessing::apply(Some(&processing()), &mut p).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("mm_processor_kwargs"));
        let mut p = prompt(vec![1], Vec::new());
        p.mm_processor_kwargs = serde_json::from_str(r#"{"max_pixels": 3136}"#).unwrap();
        let e = ImageProcessing::apply(None, &mut p).unwrap_err();
        assert!(e.message.contains("needs a multimodal processor"), "{}", e.message);
    }

    #[test]
    fn bad_images_and_miscounted_placeholders_are_the_requests_fault() {
        let mut garbage = png("square");
        garbage.bytes = vec![1u8, 2, 3, 4].into();
        let e = ImageProcessing::apply(Some(&processing()), &mut prompt(vec![PAD], vec![garbage])).unwrap_err();
        assert!(e.message.starts_with("messages[0].content[0]: "), "{}", e.message);
        let e = ImageProcessing::apply(Some(&processing()), &mut prompt(vec![PAD, PAD], vec![png("square")]));
        assert!(e.unwrap_err().message.contains("more image placeholders"));
        let e = ImageProcessing::apply(Some(&processing()), &mut prompt(vec![1], vec![png("square")]));
        assert!(e.unwrap_err().message.contains("fewer image placeholders"));
    }
}
