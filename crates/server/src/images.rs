//! A chat request's images and videos, from fetched bytes to what the engine takes: decoded to
//! RGB, run through the model's image or video processor (with the request's
//! `mm_processor_kwargs`), and each item's one placeholder token in the rendered prompt expanded
//! to as many tokens as the item becomes embeddings, as vLLM's multimodal processor updates the
//! prompt.

use std::hash::{Hash, Hasher};

use ferrite_engine::{Visual, VisualInput};
use ferrite_multimodal::{
    decode_image, image_processor_config, video_processor_config, ClipImageProcessor, Gemma3ImageProcessor,
    LlavaNextImageProcessor, MultimodalError, PixtralImageProcessor, Qwen2VlImageProcessor, Qwen2VlVideoProcessor,
    Qwen3VlVideoProcessor, RgbImage, FRAME_LIST_FPS, VIDEO_ONLY_KWARGS,
};
use ferrite_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::generate::Prompt;
use crate::media::{FetchedMedia, MediaKind};

/// Pillow's decompression-bomb limit (`2 * Image.MAX_IMAGE_PIXELS`): a larger image is refused
/// from its header, before its pixels are decoded. A video's frames share the same budget.
pub const MAX_IMAGE_PIXELS: u64 = 178_956_970;

/// The image processors the server runs, picked by the model's `image_processor_type`.
#[derive(Debug, Clone)]
pub enum ImageProcessor {
    /// Qwen2-VL's and Qwen2.5-VL's: any size, resized to whole merge windows of patches.
    Qwen2Vl(Qwen2VlImageProcessor),
    /// One fixed-size image; `patch` pixels a patch side, which sets how many embeddings the
    /// image becomes.
    WholeImage { processor: WholeImageProcessor, patch: usize },
    /// LLaVA-NeXT's: the whole image and the tiles of its best grid pinpoint, as many embeddings
    /// as its size makes them for a tower of `patch`-pixel patches; its grid is its size in
    /// pixels, `[1, height, width]`.
    LlavaNext { processor: LlavaNextImageProcessor, patch: usize },
    /// Pixtral's (Mistral 3's): the image at its own size in whole merged patches, its grid in the
    /// tower's `patch`-pixel patches; its placeholder becomes rows of image tokens, one per merged
    /// patch, each closed by the `row_tokens` (break, end) of `processor_config.json`.
    Pixtral { processor: PixtralImageProcessor, patch: usize, merge: usize, row_tokens: [String; 2] },
}

/// The processors that hand the tower one whole image of a fixed size.
#[derive(Debug, Clone)]
pub enum WholeImageProcessor {
    /// CLIP's (LLaVA-1.5): resized and center-cropped.
    Clip(ClipImageProcessor),
    /// Gemma 3's and SigLIP's: resized to the size.
    FixedSize(Gemma3ImageProcessor),
}

impl WholeImageProcessor {
    fn output_size(&self) -> (usize, usize) {
        match self {
            WholeImageProcessor::Clip(p) => p.output_size(),
            WholeImageProcessor::FixedSize(p) => p.output_size(),
        }
    }

    /// The image's pixels, then those of its pan-and-scan crops (Gemma 3's, when asked for), each
    /// an image of its own to the tower.
    fn preprocess(&self, rgb: &RgbImage) -> Result<Vec<Vec<f32>>, MultimodalError> {
        match self {
            WholeImageProcessor::Clip(p) => p.preprocess(rgb).map(|out| vec![out.pixel_values]),
            WholeImageProcessor::FixedSize(p) => {
                let images = p.preprocess_with_crops(rgb)?;
                Ok(images.into_iter().map(|out| out.pixel_values).collect())
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            WholeImageProcessor::Clip(_) => "CLIP",
            WholeImageProcessor::FixedSize(_) => "Gemma 3 / SigLIP",
        }
    }
}

/// One image as the tower takes it: its processed pixels and its grid in patches `(t, h, w)`.
type ProcessedImage = (Vec<f32>, [usize; 3]);

impl ImageProcessor {
    /// An encoded image's processed pixels and grid: one item, or for Gemma 3 with pan-and-scan,
    /// the whole image and then each crop, the tower's images each.
    fn process(&self, bytes: &[u8]) -> Result<Vec<ProcessedImage>, MultimodalError> {
        let rgb = &decode_image(bytes, MAX_IMAGE_PIXELS)?;
        match self {
            ImageProcessor::Qwen2Vl(p) => p.preprocess(rgb).map(|out| vec![(out.pixel_values, out.grid_thw)]),
            ImageProcessor::WholeImage { processor, patch } => {
                let (height, width) = processor.output_size();
                let grid = [1, height / patch, width / patch];
                Ok(processor.preprocess(rgb)?.into_iter().map(|pixels| (pixels, grid)).collect())
            }
            ImageProcessor::LlavaNext { processor, .. } => {
                let out = processor.preprocess(rgb)?;
                Ok(vec![(out.pixel_values, [1, out.image_size.0, out.image_size.1])])
            }
            ImageProcessor::Pixtral { processor, patch, .. } => {
                let out = processor.preprocess(rgb)?;
                Ok(vec![(out.pixel_values, [1, out.size.0 / patch, out.size.1 / patch])])
            }
        }
    }

    /// The processor's name in messages (the processors that take kwargs have none).
    fn name(&self) -> &'static str {
        match self {
            ImageProcessor::Qwen2Vl(_) => "Qwen2-VL",
            ImageProcessor::WholeImage { processor, .. } => processor.name(),
            ImageProcessor::LlavaNext { .. } => "LLaVA-NeXT",
            ImageProcessor::Pixtral { .. } => "Pixtral",
        }
    }

    /// The tokens an image of grid `grid_thw` (from [`ImageProcessor::process`]) stands as in the
    /// prompt: as many `token`s as it becomes embeddings, or for Pixtral its rows of them, each
    /// closed by the break token, the last by the end token (`row_ids`, from the tokenizer).
    fn image_placeholders(&self, token: u32, grid_thw: [usize; 3], row_ids: Option<[u32; 2]>) -> Vec<u32> {
        match (self, row_ids) {
            (ImageProcessor::Pixtral { merge, .. }, Some([row_break, end])) => {
                let (rows, columns) = (grid_thw[1] / merge, grid_thw[2] / merge);
                let mut out: Vec<u32> =
                    (0..rows).flat_map(|_| std::iter::repeat_n(token, columns).chain([row_break])).collect();
                if let Some(last) = out.last_mut() {
                    *last = end;
                }
                out
            }
            _ => vec![token; self.image_tokens(grid_thw)],
        }
    }

    /// How many embeddings an image of grid `grid_thw` (from [`ImageProcessor::process`]) becomes.
    fn image_tokens(&self, [t, h, w]: [usize; 3]) -> usize {
        match self {
            ImageProcessor::Qwen2Vl(p) => t * (h / p.merge_size) * (w / p.merge_size),
            ImageProcessor::WholeImage { .. } => t * h * w,
            // An image that processed has a size the tiling takes; 0 would be refused by the engine.
            ImageProcessor::LlavaNext { processor, patch } => {
                processor.anyres().image_tokens(h, w, *patch).unwrap_or(0)
            }
            ImageProcessor::Pixtral { merge, .. } => t * (h / merge) * (w / merge),
        }
    }

    fn with_overrides(&self, kwargs: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        match self {
            ImageProcessor::Qwen2Vl(p) => {
                p.with_overrides(kwargs).map(ImageProcessor::Qwen2Vl).map_err(|e| e.to_string())
            }
            // Gemma 3's takes its pan-and-scan settings.
            ImageProcessor::WholeImage { processor: WholeImageProcessor::FixedSize(p), patch }
                if p.has_pan_and_scan() =>
            {
                let processor = WholeImageProcessor::FixedSize(p.with_overrides(kwargs).map_err(|e| e.to_string())?);
                Ok(ImageProcessor::WholeImage { processor, patch: *patch })
            }
            ImageProcessor::WholeImage { .. } | ImageProcessor::LlavaNext { .. } | ImageProcessor::Pixtral { .. } => {
                Err(format!(
                    "this model's image processor ({}) takes no mm_processor_kwargs; got {}",
                    self.name(),
                    kwargs.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                ))
            }
        }
    }
}

/// The video processors the server runs, picked by the model's `video_processor_type` as
/// transformers' `AutoVideoProcessor` picks them.
#[derive(Debug, Clone)]
pub enum VideoProcessor {
    /// Qwen2-VL's and Qwen2.5-VL's: every frame, the video's placeholders one run.
    Qwen2Vl(Qwen2VlVideoProcessor),
    /// Qwen3-VL's (and Qwen3.5's): frames sampled by time, each temporal patch written after its
    /// timestamp in a run of its own.
    Qwen3Vl(Qwen3VlVideoProcessor),
}

/// What a video's processor made: the patches and their grid, the seconds a temporal patch spans,
/// and for Qwen3-VL each temporal patch's timestamp.
struct ProcessedVideo {
    pixel_values: Vec<f32>,
    grid_thw: [usize; 3],
    seconds_per_grid: f64,
    timestamps: Option<Vec<f64>>,
}

/// The text around each temporal patch's placeholders in Qwen3-VL's prompts (its processor's
/// defaults, which Qwen's tokenizers do not override).
const VISION_START: &str = "<|vision_start|>";
const VISION_END: &str = "<|vision_end|>";

impl VideoProcessor {
    /// The video processor of the model in `dir`, from where transformers reads its config.
    fn from_model_dir(dir: &std::path::Path) -> Result<VideoProcessor, String> {
        let (path, config) = video_processor_config(dir).map_err(|e| e.to_string())?;
        let kind = config.get("video_processor_type").and_then(serde_json::Value::as_str).unwrap_or("");
        let processor = match kind.starts_with("Qwen3VLVideoProcessor") {
            true => Qwen3VlVideoProcessor::from_config(&config).map(VideoProcessor::Qwen3Vl),
            false => Qwen2VlVideoProcessor::from_config(&config).map(VideoProcessor::Qwen2Vl),
        };
        processor.map_err(|e| format!("{}: {e}", path.display()))
    }

    fn merge_size(&self) -> usize {
        match self {
            VideoProcessor::Qwen2Vl(p) => p.merge_size,
            VideoProcessor::Qwen3Vl(p) => p.merge_size,
        }
    }

    fn with_overrides(&self, kwargs: &serde_json::Map<String, serde_json::Value>) -> Result<Self, MultimodalError> {
        Ok(match self {
            VideoProcessor::Qwen2Vl(p) => VideoProcessor::Qwen2Vl(p.with_overrides(kwargs)?),
            VideoProcessor::Qwen3Vl(p) => VideoProcessor::Qwen3Vl(p.with_overrides(kwargs)?),
        })
    }

    fn process(&self, frames: &[RgbImage]) -> Result<ProcessedVideo, MultimodalError> {
        Ok(match self {
            VideoProcessor::Qwen2Vl(p) => {
                let patches = p.preprocess(frames)?;
                ProcessedVideo {
                    pixel_values: patches.pixel_values,
                    grid_thw: patches.grid_thw,
                    seconds_per_grid: p.seconds_per_grid(),
                    timestamps: None,
                }
            }
            VideoProcessor::Qwen3Vl(p) => {
                let video = p.preprocess(frames)?;
                ProcessedVideo {
                    pixel_values: video.patches.pixel_values,
                    grid_thw: video.patches.grid_thw,
                    // Qwen3-VL's positions do not read it; the patch's span at the frames' 24 fps.
                    seconds_per_grid: p.temporal_patch_size as f64 / FRAME_LIST_FPS,
                    timestamps: Some(video.timestamps),
                }
            }
        })
    }
}

/// A model's video side: its processor and the token the chat template writes once per video.
#[derive(Debug, Clone)]
pub struct VideoProcessing {
    pub processor: VideoProcessor,
    pub video_token_id: u32,
}

impl VideoProcessing {
    /// The token ids a video's one placeholder becomes: a run of placeholders as long as its
    /// embedding, or for Qwen3-VL, per temporal patch, its timestamp (`<1.5 seconds>`, tokenized
    /// alone as vLLM does: in transformers' prompt it sits between vision start tokens, which
    /// split the text around them), vision start, the patch's placeholders and vision end.
    fn expansion(&self, video: &ProcessedVideo, tokenizer: &Tokenizer) -> Result<Vec<u32>, String> {
        let [t, h, w] = video.grid_thw;
        let merge = self.processor.merge_size();
        let per_step = (h / merge) * (w / merge);
        let Some(timestamps) = &video.timestamps else {
            return Ok(vec![self.video_token_id; t * per_step]);
        };
        let id = |token: &str| {
            tokenizer
                .token_to_id(token)
                .ok_or_else(|| format!("the tokenizer has no {token}, which video prompts need"))
        };
        let (start, end) = (id(VISION_START)?, id(VISION_END)?);
        let mut out = Vec::with_capacity(t * (per_step + 8));
        for &seconds in timestamps {
            let text = Qwen3VlVideoProcessor::frame_text(seconds);
            out.extend(tokenizer.encode(&text, false).map_err(|e| format!("cannot tokenize {text}: {e}"))?);
            out.push(start);
            out.extend(std::iter::repeat_n(self.video_token_id, per_step));
            out.push(end);
        }
        Ok(out)
    }
}

/// An image placeholder that the processor expands in the prompt's text, before tokenization:
/// Gemma 3's `<start_of_image>` becomes `\n\n<start_of_image>`, the image's soft tokens and
/// `<end_of_image>\n\n`, whose newlines then tokenize with the text around them as transformers'
/// processor (and so vLLM) tokenizes them. An image with pan-and-scan crops becomes
/// `Here is the original image `, its expansion, ` and here are some crops to help you see better `
/// and one expansion per crop, joined by spaces (`Gemma3Processor.replace_image_token`); the
/// crops are counted once the image is decoded, so such a prompt is expanded plainly first and
/// rewritten and tokenized again then ([`TextExpansion::with_crops`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TextExpansion {
    pub placeholder: String,
    pub replacement: String,
}

impl TextExpansion {
    /// Gemma 3's, from the files its processor reads: the `boi_token`, `image_token` and
    /// `eoi_token` of tokenizer_config.json and the `image_seq_length` of processor_config.json.
    fn gemma3(dir: &std::path::Path) -> Result<TextExpansion, String> {
        let read = |name: &str| -> Result<serde_json::Value, String> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
        };
        let tokenizer = read("tokenizer_config.json")?;
        let token = |key: &str| {
            tokenizer.get(key).and_then(serde_json::Value::as_str).map(str::to_owned).ok_or_else(|| {
                format!("{}: Gemma 3's processor needs `{key}`", dir.join("tokenizer_config.json").display())
            })
        };
        let (boi, image, eoi) = (token("boi_token")?, token("image_token")?, token("eoi_token")?);
        let length = match dir.join("processor_config.json").exists() {
            true => read("processor_config.json")?.get("image_seq_length").and_then(serde_json::Value::as_u64),
            false => None,
        };
        let length = usize::try_from(length.unwrap_or(256)).map_err(|e| e.to_string())?;
        Ok(TextExpansion { replacement: format!("\n\n{boi}{}{eoi}\n\n", image.repeat(length)), placeholder: boi })
    }

    /// A prompt's `text`, expanded plainly ([`TextExpansion::apply`]), with the `k`-th image's
    /// expansion rewritten for its `crops[k]` pan-and-scan crops, where it has any.
    fn with_crops(&self, text: &str, crops: &[usize]) -> Result<String, ApiError> {
        let pieces: Vec<&str> = text.split(&self.replacement).collect();
        if pieces.len() != crops.len() + 1 {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "pan-and-scan crops are written around their image's {} in the prompt, which has {} of them \
                     for its {} images (a truncated prompt cannot take crops)",
                    self.placeholder,
                    pieces.len() - 1,
                    crops.len()
                ),
            ));
        }
        let mut out = String::with_capacity(text.len() + crops.iter().sum::<usize>() * (self.replacement.len() + 1));
        for (piece, &n) in pieces.iter().zip(crops) {
            out.push_str(piece);
            if n == 0 {
                out.push_str(&self.replacement);
            } else {
                out.push_str("Here is the original image ");
                out.push_str(&self.replacement);
                out.push_str(" and here are some crops to help you see better ");
                out.push_str(&vec![self.replacement.as_str(); n].join(" "));
            }
        }
        out.push_str(pieces[crops.len()]);
        Ok(out)
    }

    /// `text` with each placeholder expanded, when there is one per image.
    fn apply(&self, text: &str, images: usize) -> Result<String, ApiError> {
        let found = text.matches(&self.placeholder).count();
        if found != images {
            return Err(ApiError::invalid(
                "messages",
                format!("the prompt has {found} {} placeholders for its {images} images", self.placeholder),
            ));
        }
        Ok(text.replace(&self.placeholder, &self.replacement))
    }
}

/// A vision-language model's image (and video) side as the server runs it.
#[derive(Debug)]
pub struct ImageProcessing {
    pub processor: ImageProcessor,
    /// Where the processor expands placeholders in the prompt's text rather than its tokens.
    pub text_expansion: Option<TextExpansion>,
    /// The token the chat template writes once per image, and the engine expects once per
    /// image embedding.
    pub image_token_id: u32,
    /// The video side, or why the model takes no video (the message a video request gets).
    pub video: Result<VideoProcessing, String>,
}

impl ImageProcessing {
    /// The image processor of the model in `dir` (`image_processor_config`: the
    /// `image_processor` section of `processor_config.json`, else `preprocessor_config.json`),
    /// for a vision tower of `patch_size`-pixel patches; and, for a model with a video token,
    /// its video processor (a video processor config the server cannot run leaves the model
    /// serving images, and video requests get the reason).
    pub fn from_model_dir(
        dir: &std::path::Path,
        image_token_id: u32,
        patch_size: usize,
        video_token_id: Option<u32>,
    ) -> Result<ImageProcessing, String> {
        let (path, section) = image_processor_config(dir).map_err(|e| e.to_string())?;
        let path = path.display();
        let kind =
            section.get("image_processor_type").and_then(serde_json::Value::as_str).unwrap_or("Qwen2VLImageProcessor");
        let processor = if kind.starts_with("Qwen2VLImageProcessor") {
            ImageProcessor::Qwen2Vl(Qwen2VlImageProcessor::from_config(&section).map_err(|e| format!("{path}: {e}"))?)
        } else if kind.starts_with("CLIPImageProcessor")
            || kind.starts_with("Gemma3ImageProcessor")
            || kind.starts_with("SiglipImageProcessor")
        {
            let processor = if kind.starts_with("CLIP") {
                ClipImageProcessor::from_config(&section).map(WholeImageProcessor::Clip)
            } else if kind.starts_with("Gemma3") {
                Gemma3ImageProcessor::from_config(&section).map(WholeImageProcessor::FixedSize)
            } else {
                Gemma3ImageProcessor::from_siglip_config(&section).map(WholeImageProcessor::FixedSize)
            }
            .map_err(|e| format!("{path}: {e}"))?;
            let (height, width) = processor.output_size();
            if patch_size == 0 || !height.is_multiple_of(patch_size) || !width.is_multiple_of(patch_size) {
                return Err(format!("{path}: a {height}x{width} image is not whole patches of {patch_size} pixels"));
            }
            ImageProcessor::WholeImage { processor, patch: patch_size }
        } else if kind.starts_with("LlavaNextImageProcessor") {
            let processor = LlavaNextImageProcessor::from_config(&section).map_err(|e| format!("{path}: {e}"))?;
            let tile = processor.anyres().tile();
            if patch_size == 0 || !tile.is_multiple_of(patch_size) {
                return Err(format!("{path}: a {tile}x{tile} tile is not whole patches of {patch_size} pixels"));
            }
            ImageProcessor::LlavaNext { processor, patch: patch_size }
        } else if kind.starts_with("PixtralImageProcessor") {
            let processor = PixtralImageProcessor::from_config(&section).map_err(|e| format!("{path}: {e}"))?;
            pixtral(dir, processor, patch_size)?
        } else {
            return Err(format!(
                "{path}: image_processor_type `{kind}` is not supported (Qwen2VLImageProcessor, CLIPImageProcessor, \
                 Gemma3ImageProcessor, SiglipImageProcessor, LlavaNextImageProcessor, PixtralImageProcessor)"
            ));
        };
        let text_expansion =
            if kind.starts_with("Gemma3ImageProcessor") { Some(TextExpansion::gemma3(dir)?) } else { None };
        let video = match video_token_id {
            None => Err("this model does not accept video input".to_string()),
            Some(video_token_id) => VideoProcessor::from_model_dir(dir)
                .map(|processor| VideoProcessing { processor, video_token_id })
                .map_err(|e| {
                    tracing::warn!("video input is off: {e}");
                    format!("video input is not available for this model: {e}")
                }),
        };
        Ok(ImageProcessing { processor, text_expansion, image_token_id, video })
    }

    /// The tokens that close an image's rows in the prompt (Pixtral's break and end), from
    /// `tokenizer`; `None` for the other processors.
    fn row_ids(processor: &ImageProcessor, tokenizer: &Tokenizer) -> Result<Option<[u32; 2]>, ApiError> {
        let ImageProcessor::Pixtral { row_tokens, .. } = processor else { return Ok(None) };
        let id = |token: &String| {
            tokenizer.token_to_id(token).ok_or_else(|| {
                ApiError::invalid("messages", format!("the tokenizer has no {token}, which image prompts need"))
            })
        };
        Ok(Some([id(&row_tokens[0])?, id(&row_tokens[1])?]))
    }

    /// The rendered chat `text` of a request with `images` images, its placeholders expanded
    /// where the processor expands them in text ([`TextExpansion`]); as it is otherwise.
    pub(crate) fn expand_text(
        processing: Option<&ImageProcessing>,
        text: String,
        images: usize,
    ) -> Result<String, ApiError> {
        match processing.and_then(|p| p.text_expansion.as_ref()) {
            Some(expansion) if images > 0 => expansion.apply(&text, images),
            _ => Ok(text),
        }
    }

    /// Turns `prompt.media` into the engine's images and videos and expands their placeholders
    /// in `prompt.ids` (`tokenizer` tokenizes the text some videos' placeholders become). A
    /// prompt without media is left as it is; processor settings on a model without a processor
    /// are refused.
    pub(crate) fn apply(
        processing: Option<&ImageProcessing>,
        prompt: &mut Prompt,
        tokenizer: &Tokenizer,
    ) -> Result<(), ApiError> {
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
        let has = |kind: MediaKind| prompt.media.iter().any(|m| m.kind == kind);
        let overridden = |e: String| ApiError::invalid("mm_processor_kwargs", e);
        // transformers hands a Qwen3-VL processor's video-only keys to its video processor alone.
        let image_kwargs = kwargs.as_ref().map(|kwargs| match &processing.video {
            Ok(VideoProcessing { processor: VideoProcessor::Qwen3Vl(_), .. }) => {
                kwargs.iter().filter(|(key, _)| !VIDEO_ONLY_KWARGS.contains(&key.as_str())).map(clone_entry).collect()
            }
            _ => kwargs.clone(),
        });
        let image_processor = match image_kwargs.filter(|k| !k.is_empty()) {
            Some(kwargs) if has(MediaKind::Image) => {
                processing.processor.with_overrides(&kwargs).map_err(overridden)?
            }
            _ => processing.processor.clone(),
        };
        let video = match (&processing.video, has(MediaKind::Video)) {
            (Ok(video), true) => Some(match &kwargs {
                Some(kwargs) => VideoProcessing {
                    processor: video.processor.with_overrides(kwargs).map_err(|e| overridden(e.to_string()))?,
                    ..video.clone()
                },
                None => video.clone(),
            }),
            (Err(reason), true) => return Err(ApiError::invalid("messages", reason.clone())),
            (_, false) => None,
        };
        let mut visuals = Vec::with_capacity(prompt.media.len());
        let mut video_expansions = Vec::new();
        // Per image, its pan-and-scan crops (each one more image to the engine after it).
        let mut crops = Vec::new();
        for item in std::mem::take(&mut prompt.media) {
            let fail = |e: String| ApiError::invalid("messages", format!("{}: {e}", item.location));
            let (visual, items) = match (&video, item.kind) {
                (Some(video), MediaKind::Video) => {
                    let processed = process_video(&video.processor, &item).map_err(fail)?;
                    video_expansions.push(video.expansion(&processed, tokenizer).map_err(fail)?);
                    let visual = Visual::Video { seconds_per_grid: processed.seconds_per_grid };
                    (visual, vec![(processed.pixel_values, processed.grid_thw)])
                }
                _ => {
                    let [bytes] = item.encoded.as_slice() else {
                        return Err(fail(format!("an image must be one picture, not {}", item.encoded.len())));
                    };
                    let items = image_processor.process(bytes).map_err(|e| fail(e.to_string()))?;
                    crops.push(items.len() - 1);
                    (Visual::Image, items)
                }
            };
            for (pixel_values, grid_thw) in items {
                visuals.push(VisualInput {
                    hash: content_hash(visual, &pixel_values, grid_thw),
                    visual,
                    pixel_values: pixel_values.into(),
                    grid_thw,
                });
            }
        }
        if let Some(expansion) = processing.text_expansion.as_ref().filter(|_| crops.iter().any(|&n| n > 0)) {
            // The crops' expansions change the text around the images: tokenized again, whole, as
            // transformers tokenizes the expanded prompt.
            let (Some(text), Some(special)) = (prompt.text.as_deref(), prompt.tokenized_with_special_tokens) else {
                return Err(ApiError::invalid(
                    "mm_processor_kwargs",
                    "pan-and-scan crops are written into the prompt's text: a truncated prompt or one given as \
                     token ids cannot take them",
                ));
            };
            let text = expansion.with_crops(text, &crops)?;
            prompt.ids = tokenizer.encode(&text, special).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            prompt.text = Some(text);
        }
        // Text-expanded placeholders are whole already: the engine checks each run's length.
        if processing.text_expansion.is_none() {
            let row_ids = Self::row_ids(&image_processor, tokenizer)?;
            prompt.ids = expand_placeholders(
                &prompt.ids,
                &visuals,
                processing,
                (&image_processor, row_ids),
                video.as_ref().map(|v| v.video_token_id),
                video_expansions,
            )?;
        }
        prompt.visuals = visuals;
        Ok(())
    }
}

/// A video's processed pixels and grid: its frames (vLLM's `video/jpeg` frame list) decoded,
/// together within one image's pixel budget, and processed as one clip.
fn process_video(processor: &VideoProcessor, item: &FetchedMedia) -> Result<ProcessedVideo, String> {
    if !item.mime.as_deref().is_some_and(|mime| mime.eq_ignore_ascii_case("video/jpeg")) {
        let mime = item.mime.as_deref().unwrap_or("without a media type");
        return Err(format!(
            "a video {mime} cannot be decoded: send a video as its frames, \
             `data:video/jpeg;base64,<frame>,<frame>,...` (vLLM's frame list); video files are not decoded"
        ));
    }
    let mut budget = MAX_IMAGE_PIXELS;
    let mut frames = Vec::with_capacity(item.encoded.len());
    for (k, bytes) in item.encoded.iter().enumerate() {
        let frame = decode_image(bytes, budget).map_err(|e| format!("frame {k}: {e} (for all frames together)"))?;
        budget -= u64::from(frame.width()) * u64::from(frame.height());
        frames.push(frame);
    }
    processor.process(&frames).map_err(|e| e.to_string())
}

fn clone_entry((key, value): (&String, &serde_json::Value)) -> (String, serde_json::Value) {
    (key.clone(), value.clone())
}

/// `ids` with each image's one placeholder token repeated as many times as the image becomes
/// embeddings (for Pixtral, in rows closed by `row_ids`), the n-th placeholder for the n-th image,
/// and each video's placeholder (the token `video_id`) replaced by the n-th of `video_expansions`.
fn expand_placeholders(
    ids: &[u32],
    visuals: &[VisualInput],
    processing: &ImageProcessing,
    (image_processor, row_ids): (&ImageProcessor, Option<[u32; 2]>),
    video_id: Option<u32>,
    video_expansions: Vec<Vec<u32>>,
) -> Result<Vec<u32>, ApiError> {
    let mut images = visuals.iter().filter(|v| matches!(v.visual, Visual::Image));
    let mut videos = video_expansions.into_iter();
    let count = |kind: &str| visuals.iter().filter(|v| v.visual.modality() == kind).count();
    let more = |kind: &str| {
        ApiError::invalid(
            "messages",
            format!("the prompt has more {kind} placeholders than the request's {} {kind}s", count(kind)),
        )
    };
    let mut out = Vec::with_capacity(ids.len());
    for &token in ids {
        if token == processing.image_token_id {
            let grid = images.next().ok_or_else(|| more("image"))?.grid_thw;
            out.extend(image_processor.image_placeholders(token, grid, row_ids));
        } else if Some(token) == video_id {
            out.extend(videos.next().ok_or_else(|| more("video"))?);
        } else {
            out.push(token);
        }
    }
    for (kind, unplaced) in [("image", images.next().is_some()), ("video", videos.next().is_some())] {
        if unplaced {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "the chat template placed fewer {kind} placeholders than the request's {} {kind}s",
                    count(kind)
                ),
            ));
        }
    }
    Ok(out)
}

/// Pixtral's processor for a tower of `patch_size`-pixel patches: `PixtralProcessor` (its
/// `processor_config.json`, class defaults where absent) resizes to whole merged patches of
/// `patch_size * spatial_merge_size` pixels and closes each row with `image_break_token`, the last
/// with `image_end_token`.
fn pixtral(
    dir: &std::path::Path,
    processor: PixtralImageProcessor,
    patch_size: usize,
) -> Result<ImageProcessor, String> {
    let path = dir.join("processor_config.json");
    let config: serde_json::Value = match path.exists() {
        true => std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
            .map_err(|e| format!("{}: {e}", path.display()))?,
        false => serde_json::Value::Null,
    };
    let number = |key: &str, default: u64| config.get(key).and_then(serde_json::Value::as_u64).unwrap_or(default);
    let token =
        |key: &str, default: &str| config.get(key).and_then(serde_json::Value::as_str).unwrap_or(default).to_string();
    let (patch, merge) = (number("patch_size", 16) as usize, number("spatial_merge_size", 1) as usize);
    if patch != patch_size || merge == 0 {
        return Err(format!(
            "{}: a patch_size of {patch} and spatial_merge_size {merge} for a tower of {patch_size}-pixel patches",
            path.display()
        ));
    }
    Ok(ImageProcessor::Pixtral {
        processor: processor.with_patch_size(patch * merge),
        patch,
        merge,
        row_tokens: [token("image_break_token", "[IMG_BREAK]"), token("image_end_token", "[IMG_END]")],
    })
}

/// Identifies an image or video as the model sees it (its kind, processed pixels and grid), for
/// the prefix cache's block hashes.
fn content_hash(visual: Visual, pixels: &[f32], grid: [usize; 3]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    visual.modality().hash(&mut h);
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

    const PAD: u32 = 1002;
    const VIDEO_PAD: u32 = 1003;

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2-vl")
    }

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_dir(&fixture()).unwrap()
    }

    fn processing() -> ImageProcessing {
        ImageProcessing::from_model_dir(&fixture(), PAD, 14, Some(VIDEO_PAD)).unwrap()
    }

    fn png(name: &str) -> FetchedMedia {
        let bytes = std::fs::read(fixture().join("images").join(format!("{name}.png"))).unwrap();
        FetchedMedia {
            kind: MediaKind::Image,
            location: "messages[0].content[0]".into(),
            encoded: vec![bytes.into()],
            mime: None,
        }
    }

    fn prompt(ids: Vec<u32>, media: Vec<FetchedMedia>) -> Prompt {
        Prompt { media, ..Prompt::new(ids, None) }
    }

    #[test]
    fn placeholders_grow_to_the_images_embeddings_with_transformers_pixels() {
        let mut p = prompt(vec![5, PAD, 6, PAD], vec![png("square"), png("large")]);
        ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap();
        // 56x56 is 4x4 patches (4 tokens); 200x150 is resized to 112x84, 6x8 patches (12 tokens).
        let pads = |n| std::iter::repeat_n(PAD, n);
        let want: Vec<u32> = [5].into_iter().chain(pads(4)).chain([6]).chain(pads(12)).collect();
        assert_eq!(p.ids, want);
        assert!(p.media.is_empty());
        assert_eq!(p.visuals.iter().map(|i| i.grid_thw).collect::<Vec<_>>(), [[1, 4, 4], [1, 6, 8]]);
        // The fixture's processed pixels came from transformers' processor on the same file.
        let oracle = std::fs::read(fixture().join("pixels/square.bin")).unwrap();
        let oracle: Vec<u32> = oracle.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let ours: Vec<u32> = p.visuals[0].pixel_values.iter().map(|v| v.to_bits()).collect();
        assert!(ours == oracle, "pixel values differ from transformers'");
        assert_ne!(p.visuals[0].hash, p.visuals[1].hash);
    }

    fn video(name: &str, frames: usize, mime: &str) -> FetchedMedia {
        let frame = |k: usize| std::fs::read(fixture().join(format!("videos/{name}/{k}.png"))).unwrap().into();
        FetchedMedia {
            kind: MediaKind::Video,
            location: "messages[0].content[1]".into(),
            encoded: (0..frames).map(frame).collect(),
            mime: Some(mime.into()),
        }
    }

    #[test]
    fn videos_take_their_own_placeholders_with_transformers_pixels() {
        // The fixture's 5-frame 84x56 clip: padded to 6 frames, 3 time steps of 4x6 patches.
        let mut p = prompt(vec![5, VIDEO_PAD, 6, PAD], vec![video("clip", 5, "video/jpeg"), png("square")]);
        ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap();
        let want: Vec<u32> =
            [5].into_iter().chain(std::iter::repeat_n(VIDEO_PAD, 18)).chain([6]).chain([PAD; 4]).collect();
        assert_eq!(p.ids, want);
        assert_eq!(p.visuals[0].grid_thw, [3, 4, 6]);
        assert_eq!(p.visuals[0].visual, Visual::Video { seconds_per_grid: 2.0 / 24.0 });
        assert_eq!(p.visuals[1].visual, Visual::Image);
        let oracle = std::fs::read(fixture().join("pixels/video-clip.bin")).unwrap();
        let oracle: Vec<u32> = oracle.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let ours: Vec<u32> = p.visuals[0].pixel_values.iter().map(|v| v.to_bits()).collect();
        assert!(ours == oracle, "video pixel values differ from transformers'");

        // A video file is not decoded; a video where the template placed an image is miscounted.
        let mut p = prompt(vec![VIDEO_PAD], vec![video("clip", 1, "video/mp4")]);
        let e = ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap_err();
        assert!(e.message.contains("video video/mp4 cannot be decoded"), "{}", e.message);
        let mut p = prompt(vec![PAD], vec![video("clip", 2, "video/jpeg")]);
        let e = ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap_err();
        assert!(e.message.contains("more image placeholders than the request's 0 images"), "{}", e.message);
        // A model without a video token refuses videos with the reason.
        let images_only = ImageProcessing::from_model_dir(&fixture(), PAD, 14, None).unwrap();
        let mut p = prompt(vec![VIDEO_PAD], vec![video("clip", 2, "video/jpeg")]);
        let e = ImageProcessing::apply(Some(&images_only), &mut p, &tokenizer()).unwrap_err();
        assert!(e.message.contains("does not accept video input"), "{}", e.message);
    }

    /// A fixture's case from its oracle.json, with the model's image and video token ids.
    fn qwen3_case(name: &str) -> (std::path::PathBuf, serde_json::Value, u32, u32) {
        let dir = fixture().join("../qwen3-vl");
        let read = |file: &str| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap()
        };
        let (oracle, config) = (read("oracle.json"), read("config.json"));
        let case = oracle["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone();
        let id = |key: &str| config[key].as_u64().unwrap() as u32;
        (dir.clone(), case, id("image_token_id"), id("video_token_id"))
    }

    fn qwen3_media(dir: &std::path::Path, case: &serde_json::Value) -> Vec<FetchedMedia> {
        let read = |file: &serde_json::Value| std::fs::read(dir.join(file.as_str().unwrap())).unwrap().into();
        let media = |kind, encoded, mime: Option<&str>| FetchedMedia {
            kind,
            location: "messages[0].content[0]".into(),
            encoded,
            mime: mime.map(Into::into),
        };
        let items = case["images"].as_array().unwrap().iter();
        items
            .map(|item| match item.get("frames") {
                Some(frames) => {
                    media(MediaKind::Video, frames.as_array().unwrap().iter().map(read).collect(), Some("video/jpeg"))
                }
                None => media(MediaKind::Image, vec![read(&item["file"])], None),
            })
            .collect()
    }

    #[test]
    fn qwen3_videos_become_timestamped_runs_as_transformers_writes_them() {
        for name in ["long-video", "image-and-video", "video"] {
            let (dir, case, image_id, video_id) = qwen3_case(name);
            let tokenizer = Tokenizer::from_dir(&dir).unwrap();
            let processing = ImageProcessing::from_model_dir(&dir, image_id, 16, Some(video_id)).unwrap();
            assert!(matches!(processing.video, Ok(VideoProcessing { processor: VideoProcessor::Qwen3Vl(_), .. })));
            let ids = tokenizer.encode(case["prompt"].as_str().unwrap(), false).unwrap();
            let mut p = prompt(ids, qwen3_media(&dir, &case));
            ImageProcessing::apply(Some(&processing), &mut p, &tokenizer).unwrap();
            let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
            assert_eq!(p.ids, want, "{name}: prompt ids");
            assert_pixels_are_transformers(&dir, name, &p.visuals, &case["images"]);
        }
    }

    /// Each visual's pixel values bit for bit, and its grid, as the oracle's `items` record them.
    fn assert_pixels_are_transformers(
        dir: &std::path::Path,
        name: &str,
        visuals: &[VisualInput],
        items: &serde_json::Value,
    ) {
        for (visual, item) in visuals.iter().zip(items.as_array().unwrap()) {
            let oracle = std::fs::read(dir.join(item["pixels"].as_str().unwrap())).unwrap();
            let oracle: Vec<u32> = oracle.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let ours: Vec<u32> = visual.pixel_values.iter().map(|v| v.to_bits()).collect();
            assert!(ours == oracle, "{name}: pixel values differ from transformers'");
            assert_eq!(serde_json::json!(visual.grid_thw), item["grid_thw"], "{name}: grid");
        }
    }

    /// Mistral 3 on the server's path: each image's one `[IMG]` becomes its rows of `[IMG]` closed
    /// by `[IMG_BREAK]` and `[IMG_END]` (the tokenizer's ids, the processor config's tokens), with
    /// transformers' pixels and the grid in the tower's patches: transformers' prompt ids.
    #[test]
    fn mistral3_images_become_rows_with_breaks_as_transformers_writes_them() {
        let dir = fixture().join("../mistral3");
        let oracle: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let image = tokenizer.token_to_id("[IMG]").unwrap();
        let processing = ImageProcessing::from_model_dir(&dir, image, 4, None).unwrap();
        let mut checked = 0;
        for case in oracle["cases"].as_array().unwrap().iter().filter(|c| !c["images"].as_array().unwrap().is_empty()) {
            let name = case["name"].as_str().unwrap();
            let media = case["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|item| FetchedMedia {
                    kind: MediaKind::Image,
                    location: "messages[0].content[0]".into(),
                    encoded: vec![std::fs::read(dir.join(item["file"].as_str().unwrap())).unwrap().into()],
                    mime: None,
                })
                .collect();
            let ids = tokenizer.encode(case["prompt"].as_str().unwrap(), false).unwrap();
            let mut p = prompt(ids, media);
            ImageProcessing::apply(Some(&processing), &mut p, &tokenizer).unwrap();
            let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
            assert_eq!(p.ids, want, "{name}: prompt ids");
            assert_pixels_are_transformers(&dir, name, &p.visuals, &case["images"]);
            checked += 1;
        }
        assert!(checked >= 7, "the fixture's image cases");
        // A processor whose patch is not the tower's is refused.
        let e = ImageProcessing::from_model_dir(&dir, image, 14, None).unwrap_err();
        assert!(e.contains("for a tower of 14-pixel patches"), "{e}");
    }

    #[test]
    fn qwen3_video_kwargs_and_short_videos_are_the_requests_fault() {
        let (dir, case, image_id, video_id) = qwen3_case("long-video");
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let processing = ImageProcessing::from_model_dir(&dir, image_id, 16, Some(video_id)).unwrap();
        let run = |kwargs: &str, media: Vec<FetchedMedia>| {
            let mut p = prompt(vec![video_id], media);
            p.mm_processor_kwargs = serde_json::from_str(kwargs).unwrap();
            ImageProcessing::apply(Some(&processing), &mut p, &tokenizer).map(|()| (p.ids, p.visuals))
        };
        // fps 24 keeps all 16 frames: 8 temporal patches, each after its timestamp.
        let (ids, visuals) = run(r#"{"fps": 24}"#, qwen3_media(&dir, &case)).unwrap();
        assert_eq!(visuals[0].grid_thw[0], 8);
        assert_eq!(placeholder_runs(&ids, video_id), 8);
        let text = tokenizer.decode(&ids, false).unwrap();
        assert!(text.starts_with("<0.0 seconds><|vision_start|><|video_pad|>"), "{text}");
        // 16 frames spend the budget 1 merged token a patch; frames 14 and 15 average 0.604 s.
        assert!(text.ends_with("<0.6 seconds><|vision_start|><|video_pad|><|vision_end|>"), "{text}");
        // `fps` is the video processor's alone: an image beside it is processed as without it.
        let (_, image_case, ..) = qwen3_case("image-and-video");
        let mut both = qwen3_media(&dir, &image_case);
        both.truncate(1);
        let mut p = prompt(vec![image_id], both);
        p.mm_processor_kwargs = serde_json::from_str(r#"{"fps": 1, "do_sample_frames": true}"#).unwrap();
        ImageProcessing::apply(Some(&processing), &mut p, &tokenizer).unwrap();
        assert_eq!(p.visuals[0].grid_thw, [1, 4, 4]);

        for (kwargs, message) in [
            (r#"{"num_frames": 4}"#, "mutually exclusive"),
            (r#"{"fps": -1}"#, "`fps` must be a positive number"),
            (r#"{"size": {"longest_edge": 9}}"#, "`size` must have the keys shortest_edge and longest_edge"),
            (r#"{"max_frames": 9}"#, "unknown key `max_frames`"),
        ] {
            let e = run(kwargs, qwen3_media(&dir, &case)).unwrap_err();
            assert!(e.message.contains(message), "{kwargs}: {}", e.message);
        }
        // One frame cannot fill a temporal patch.
        let mut one = qwen3_media(&dir, &case);
        one[0].encoded.truncate(1);
        let e = run("{}", one).unwrap_err();
        assert!(e.message.contains("1 frames (after sampling) is too short"), "{}", e.message);
    }

    fn placeholder_runs(ids: &[u32], token: u32) -> usize {
        ids.windows(2).filter(|w| w[0] != token && w[1] == token).count() + usize::from(ids.first() == Some(&token))
    }

    #[test]
    fn processor_kwargs_change_the_grid_and_are_checked() {
        let mut p = prompt(vec![PAD], vec![png("large")]);
        p.mm_processor_kwargs = serde_json::from_str(r#"{"max_pixels": 3136}"#).unwrap();
        ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap();
        // transformers' smart_resize: 200x150 under 3136 pixels is 56x28, 2x4 patches.
        assert_eq!(p.visuals[0].grid_thw, [1, 2, 4]);
        assert_eq!(p.ids.len(), 2);
        let mut p = prompt(vec![PAD], vec![png("large")]);
        p.mm_processor_kwargs = serde_json::from_str(r#"{"do_pan_and_scan": true}"#).unwrap();
        let e = ImageProcessing::apply(Some(&processing()), &mut p, &tokenizer()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("mm_processor_kwargs"));
        let mut p = prompt(vec![1], Vec::new());
        p.mm_processor_kwargs = serde_json::from_str(r#"{"max_pixels": 3136}"#).unwrap();
        let e = ImageProcessing::apply(None, &mut p, &tokenizer()).unwrap_err();
        assert!(e.message.contains("needs a multimodal processor"), "{}", e.message);
    }

    /// Gemma 3's pan-and-scan on the server's path: the rendered prompt expanded plainly, then,
    /// once the image's crops are counted, rewritten and tokenized again into transformers' prompt
    /// ids, the whole image and each crop one image to the engine with transformers' pixels.
    #[test]
    fn gemma3_pan_and_scan_rewrites_the_prompt_as_transformers_does() {
        let dir = fixture().join("../gemma3-vl");
        let oracle: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("oracle.json")).unwrap()).unwrap();
        let case = oracle["cases"].as_array().unwrap().iter().find(|c| c["name"] == "pan-and-scan").unwrap();
        let tokenizer = Tokenizer::from_dir(&dir).unwrap();
        let soft = tokenizer.token_to_id("<image_soft_token>").unwrap();
        let processing = ImageProcessing::from_model_dir(&dir, soft, 14, None).unwrap();
        let text = case["prompt"].as_str().unwrap().to_string();
        let text = ImageProcessing::expand_text(Some(&processing), text, 1).unwrap();
        let ids = tokenizer.encode(&text, false).unwrap();
        let image = FetchedMedia {
            kind: MediaKind::Image,
            location: "messages[0].content[1]".into(),
            encoded: vec![std::fs::read(dir.join("images/wide.png")).unwrap().into()],
            mime: None,
        };
        let run = |kwargs: &serde_json::Value, tokenized: Option<bool>| {
            let mut p = Prompt {
                media: vec![image.clone()],
                mm_processor_kwargs: kwargs.as_object().cloned(),
                tokenized_with_special_tokens: tokenized,
                ..Prompt::new(ids.clone(), Some(text.clone()))
            };
            ImageProcessing::apply(Some(&processing), &mut p, &tokenizer).map(|()| p)
        };
        let p = run(&case["mm_processor_kwargs"], Some(false)).unwrap();
        let want: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(p.ids, want, "prompt ids");
        assert!(p.text.as_deref().unwrap().contains("Here is the original image \n\n<start_of_image>"));
        let items = case["images"].as_array().unwrap();
        assert_eq!(p.visuals.len(), items.len(), "the image and its crops");
        for (k, (visual, item)) in p.visuals.iter().zip(items).enumerate() {
            let oracle = std::fs::read(dir.join(item["pixels"].as_str().unwrap())).unwrap();
            let oracle: Vec<u32> = oracle.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let ours: Vec<u32> = visual.pixel_values.iter().map(|v| v.to_bits()).collect();
            assert!(ours == oracle, "image {k}: pixel values differ from transformers'");
            assert_eq!((visual.visual, visual.grid_thw), (Visual::Image, [1, 8, 8]));
        }
        assert_ne!(p.visuals[1].hash, p.visuals[2].hash);

        // Off, or its thresholds unmet (the default minimum crop, 256 pixels): the prompt as it was.
        for kwargs in [serde_json::json!({}), serde_json::json!({"do_pan_and_scan": true})] {
            let p = run(&kwargs, Some(false)).unwrap();
            assert_eq!((p.ids.len(), p.visuals.len()), (ids.len(), 1), "{kwargs}");
        }
        // A truncated prompt cannot be rewritten; bad settings are the request's fault.
        let e = run(&case["mm_processor_kwargs"], None).err().unwrap();
        assert!(e.message.contains("truncated prompt"), "{}", e.message);
        for (kwargs, message) in [
            (serde_json::json!({"do_pan_and_scan": "yes"}), "`do_pan_and_scan` must be true or false"),
            (serde_json::json!({"pan_and_scan_min_crop_size": 0}), "must be a positive integer, got 0"),
            (serde_json::json!({"min_pixels": 5}), "unknown key `min_pixels`"),
        ] {
            let e = run(&kwargs, Some(false)).err().unwrap();
            assert_eq!(e.param.as_deref(), Some("mm_processor_kwargs"));
            assert!(e.message.contains(message), "{kwargs}: {}", e.message);
        }
    }

    #[test]
    fn bad_images_and_miscounted_placeholders_are_the_requests_fault() {
        let mut garbage = png("square");
        garbage.encoded = vec![vec![1u8, 2, 3, 4].into()];
        let e = ImageProcessing::apply(Some(&processing()), &mut prompt(vec![PAD], vec![garbage]), &tokenizer())
            .unwrap_err();
        assert!(e.message.starts_with("messages[0].content[0]: "), "{}", e.message);
        let e =
            ImageProcessing::apply(Some(&processing()), &mut prompt(vec![PAD, PAD], vec![png("square")]), &tokenizer());
        assert!(e.unwrap_err().message.contains("more image placeholders"));
        let e = ImageProcessing::apply(Some(&processing()), &mut prompt(vec![1], vec![png("square")]), &tokenizer());
        assert!(e.unwrap_err().message.contains("fewer image placeholders"));
    }
}
