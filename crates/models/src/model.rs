use ferrite_tensor::kv::Fp8KvScales;
use ferrite_tensor::{AttnMetadata, DType, Device, PagedKvLayer, Tensor};

use crate::Result;

/// Shape of one layer's paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayerSpec {
    pub num_kv_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

/// Shape of one recurrent layer's per-sequence state (f32 elements per sequence): a linear-attention
/// or state-space layer keeps a fixed-size state instead of a growing KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLayerSpec {
    /// The short causal conv's last inputs.
    pub conv: usize,
    /// The recurrent (delta-rule or SSM) state.
    pub recurrent: usize,
}

impl StateLayerSpec {
    pub fn bytes_per_sequence(&self) -> usize {
        (self.conv + self.recurrent) * 4
    }
}

/// What the engine needs to know about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub kv_layers: Vec<KvLayerSpec>,
    /// The checkpoint's FP8 KV-cache scales per KV layer (`self_attn.k_scale` / `v_scale`, as
    /// compressed-tensors' `kv_cache_scheme` writes them), which an FP8 cache takes in place of
    /// 1.0; empty where the checkpoint has none.
    pub kv_scales: Vec<Option<Fp8KvScales>>,
    /// Recurrent layers (hybrid models): their caches follow the KV layers in the slice that
    /// [`CausalLM::forward`] receives.
    pub state_layers: Vec<StateLayerSpec>,
    /// Decoder layers, of every kind: what EAGLE-3's auxiliary layer ids index.
    pub num_layers: usize,
    /// Bytes of weights, for roofline and memory reports.
    pub weight_bytes: usize,
    /// What the prompt side of a vision-language model needs; `None` for text-only models.
    pub vision: Option<VisionInfo>,
}

/// How a vision-language model's prompts hold images and videos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionInfo {
    /// The placeholder token each image embedding takes the place of.
    pub image_token_id: u32,
    /// The placeholder token of a video embedding; `None` for a model without video input.
    pub video_token_id: Option<u32>,
    /// Patches merged into one embedding along each side (2 for Qwen2-VL's 2x2 windows).
    pub spatial_merge_size: usize,
    /// Pixels along a patch's side: what a fixed-size image processor's grid is counted in.
    pub patch_size: usize,
    /// The text an image stands as in a prompt whose chat template takes content as a string
    /// (vLLM's placeholder for the model), holding one placeholder token.
    pub placeholder: &'static str,
    /// The same for a video.
    pub video_placeholder: Option<&'static str>,
    /// Whether an image's tokens attend to one another both ways in the text model (Gemma 3's
    /// `token_type_ids` mask): the engine then computes each image's placeholder run within one
    /// prefill chunk, as a sequence of its own whose rows see the whole run.
    pub bidirectional: bool,
    /// LLaVA-NeXT's tiling, for a model whose image embeddings follow the image's aspect ratio:
    /// its images' grids are then `[1, height, width]` of the image in pixels (transformers'
    /// `image_sizes`) rather than in patches.
    pub anyres: Option<ferrite_multimodal::AnyRes>,
    /// Whether each temporal patch of a video fills a placeholder run of its own (Qwen3-VL's
    /// processor writes a patch's timestamp text and vision start and end tokens around its
    /// placeholders): the engine then places, encodes and caches each patch as an item of its own.
    pub video_runs_per_step: bool,
    /// Whether each row of an image's embeddings is closed in the prompt by a token that keeps its
    /// text embedding (Pixtral's `[IMG_BREAK]`, the last row's `[IMG_END]`): an image's span is
    /// then its rows of image tokens with those between, and its embeddings fill the image tokens.
    pub row_breaks: bool,
}

impl VisionInfo {
    /// How many prompt tokens an image or video whose patch grid is `grid_thw` spans (an
    /// image's size in pixels under [`VisionInfo::anyres`]; 0 for one it cannot take): its
    /// embeddings, and under [`VisionInfo::row_breaks`] the token after each row.
    pub fn placeholder_tokens(&self, [t, h, w]: [usize; 3]) -> usize {
        let (rows, columns) = (h / self.spatial_merge_size, w / self.spatial_merge_size);
        match &self.anyres {
            Some(anyres) => anyres.image_tokens(h, w, self.patch_size).unwrap_or(0),
            None if self.row_breaks => t * rows * (columns + 1),
            None => t * rows * columns,
        }
    }

    /// The runs of `token` in `prompt` (see [`placeholder_runs`]); for the image token under
    /// [`VisionInfo::row_breaks`], each run taking the token after it, so that an image's rows and
    /// the breaks between them are one run.
    pub fn placeholder_runs(&self, prompt: &[u32], token: u32) -> Vec<std::ops::Range<usize>> {
        let runs = placeholder_runs(prompt, token);
        if !(self.row_breaks && token == self.image_token_id) {
            return runs;
        }
        let mut joined: Vec<std::ops::Range<usize>> = Vec::with_capacity(runs.len());
        for run in runs {
            let run = run.start..(run.end + 1).min(prompt.len());
            match joined.last_mut() {
                Some(last) if last.end == run.start => last.end = run.end,
                _ => joined.push(run),
            }
        }
        joined
    }

    /// The placeholder token of a kind of visual input, if the model takes that kind.
    pub fn token_id(&self, visual: Visual) -> Option<u32> {
        match visual {
            Visual::Image => Some(self.image_token_id),
            Visual::Video { .. } => self.video_token_id,
        }
    }
}

/// A visual input of a prompt: a still image, or a video (whose temporal positions some models
/// count in seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Visual {
    Image,
    /// `seconds_per_grid`: the seconds one temporal patch spans (transformers'
    /// `second_per_grid_ts`).
    Video {
        seconds_per_grid: f64,
    },
}

impl Visual {
    /// The modality's name in vLLM's messages (`image`, `video`).
    pub fn modality(self) -> &'static str {
        match self {
            Visual::Image => "image",
            Visual::Video { .. } => "video",
        }
    }
}

/// A visual input as the prompt's positions see it: its kind and its patch grid `(t, h, w)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisualGrid {
    pub visual: Visual,
    pub grid_thw: [usize; 3],
}

/// An image input a vision encoder cannot take: the request's error.
/// The runs of consecutive `token`s in `prompt`, in order: where a prompt's images (or videos)
/// sit, adjacent items of a kind sharing one run.
pub fn placeholder_runs(prompt: &[u32], token: u32) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, _) in prompt.iter().enumerate().filter(|(_, &t)| t == token) {
        match runs.last_mut() {
            Some(run) if run.end == i => run.end += 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

pub(crate) fn image_input_error(detail: String) -> crate::ModelError {
    ferrite_tensor::TensorError::Shape { op: "image input", detail }.into()
}

/// Processed pixels as a vision encoder's input on `device`: rounded to the model's `dtype`, as
/// transformers casts them, and held in f32 on the CPU, whose backend computes in f32.
pub(crate) fn pixel_input(values: Vec<f32>, shape: &[usize], device: Device, dtype: DType) -> Result<Tensor> {
    let pixels = Tensor::from_f32_as(values, shape, dtype)?;
    Ok(match device {
        Device::Cpu => pixels.to_dtype(DType::F32),
        _ => pixels.to_device(device)?,
    })
}

impl ModelInfo {
    /// The caches a forward pass reads and writes: each KV layer as `num_blocks` blocks of
    /// `block_size` tokens in `kv_dtype`, then each recurrent layer as `state_slots` f32 slots
    /// (one per sequence that may run at once; a slot is one "block" of a state layer, as in
    /// vLLM's hybrid cache).
    pub fn allocate_caches(
        &self,
        device: Device,
        kv_dtype: DType,
        num_blocks: usize,
        block_size: usize,
        state_slots: usize,
    ) -> ferrite_tensor::Result<Vec<PagedKvLayer>> {
        let kv = self.kv_layers.iter().enumerate().map(|(i, l)| {
            let cache =
                PagedKvLayer::new_on(device, kv_dtype, num_blocks, block_size, l.num_kv_heads, l.k_dim, l.v_dim)?;
            match self.kv_scales.get(i).copied().flatten() {
                Some(scales) if kv_dtype == DType::Fp8 => cache.with_fp8_scales(scales),
                _ => Ok(cache),
            }
        });
        let state = self
            .state_layers
            .iter()
            .map(|l| PagedKvLayer::new_on(device, DType::F32, state_slots, 1, 1, l.conv, l.recurrent));
        kv.chain(state).collect()
    }

    /// Bytes of recurrent state per sequence, over all layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.state_layers.iter().map(StateLayerSpec::bytes_per_sequence).sum()
    }
}

/// One forward step over a flattened batch of sequences.
pub struct ForwardInput<'a> {
    pub tokens: &'a [u32],
    pub meta: &'a AttnMetadata,
    /// Rows of the batch whose logits are wanted (usually the last token of each sequence).
    pub logit_rows: &'a [usize],
    /// Rows whose input embeddings an encoder made (an image's placeholder tokens).
    pub embeds: Option<&'a InputEmbeds>,
}

/// Encoder outputs that replace the token embeddings of some rows of a step: row `rows[k]` of the
/// batch takes row `k` of `values` (`[rows.len(), hidden]`, in the model's activation dtype).
#[derive(Debug, Clone)]
pub struct InputEmbeds {
    pub rows: Vec<usize>,
    pub values: Tensor,
    /// DeepStack (Qwen3-VL): per early decoder layer, `[rows.len(), hidden]` added to those rows
    /// of that layer's output. Empty for other models.
    pub deepstack: Vec<Tensor>,
}

/// A vision encoder's output for one image or video: the embeddings its placeholder tokens take,
/// and, for DeepStack models, the features the first decoder layers add to those tokens.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub embeddings: Tensor,
    pub deepstack: Vec<Tensor>,
}

/// The vision half of a vision-language model: it turns an image's or a video's processed pixels
/// into the embeddings its placeholder tokens take, and places the prompt's tokens for the rotary
/// embedding.
pub trait VisionEncoder: Send + Sync {
    /// Embeddings `[VisionInfo::placeholder_tokens(grid_thw), hidden]` (under
    /// [`VisionInfo::row_breaks`], one per image token of that span) of one image or video from
    /// its processed pixels `[patches, patch_dim]` (row-major f32, as the model's processor lays
    /// them out).
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded>;

    /// The (temporal, height, width) rotary positions of every prompt token, given the prompt's
    /// images and videos in order (the n-th image fills the n-th run of image placeholders, the
    /// n-th video the n-th run of video placeholders), and the offset decode positions then take
    /// (`position + delta` on every axis). `None` for models without MRoPE, the default.
    fn mrope_positions(&self, _prompt: &[u32], _visuals: &[VisualGrid]) -> Result<Option<(Vec<[usize; 3]>, i64)>> {
        Ok(None)
    }
}

/// A draft head that reads the target's hidden states (speculative decoding's `mtp` and `eagle3`
/// drafters, vLLM's EAGLE proposer): from the embedding of the token after each row and a hidden
/// state of the target at that row, one decoder block of its own predicts the token after that.
/// It has one attention layer, whose cache takes the target's block geometry.
pub trait DraftHead: Send + Sync {
    fn kv_layer(&self) -> KvLayerSpec;

    /// Which of the target's hidden states the head's first pass over a position reads.
    fn hidden_tap(&self) -> HiddenTap;

    /// `next_tokens[i]` is the token after row `i`'s position, `hidden` `[rows, width]` the
    /// target's hidden state at each row as [`DraftHead::hidden_tap`] names it (or, for a further
    /// draft, this head's output there). Returns the logits of `logit_rows` over the target's
    /// vocabulary and the head's output at every row.
    fn forward(
        &self,
        next_tokens: &[u32],
        hidden: &Tensor,
        meta: &AttnMetadata,
        logit_rows: &[usize],
        kv: &mut PagedKvLayer,
    ) -> Result<(Tensor, Tensor)>;
}

/// Which hidden states a forward also returns, at every row of the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HiddenTap {
    /// The LM head's input (after the final norm): what an MTP head reads.
    Final,
    /// The residual stream entering each of these layers (ascending, each below the layer
    /// count), side by side: `[rows, layers.len() * hidden]`. Layer 0's input is the token
    /// embedding. What EAGLE-3 reads, as vLLM's `aux_hidden_state_layers` index it.
    LayerInputs(Vec<usize>),
}

/// A decoder-only language model that reads and writes a paged KV cache.
pub trait CausalLM: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// Runs the model over `input.tokens`, writing their keys and values into `kv` (one entry per
    /// layer, shaped as `info().kv_layers`, then one per recurrent layer, shaped as
    /// `info().state_layers`, see [`ModelInfo::allocate_caches`]), and returns logits
    /// `[logit_rows.len(), vocab]` (f32).
    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor>;

    /// Whether the rotary frequencies depend on the sequence length (dynamic NTK, LongRoPE): the
    /// cached keys of a prefix then depend on the length of the sequence that wrote them, so they
    /// cannot be shared with another sequence (the engine turns prefix caching off).
    fn rotary_depends_on_length(&self) -> bool {
        false
    }

    /// A sequence length at which transformers recomputes a sequence's whole cache: the first time
    /// a sequence grows past it while at most that many tokens are cached (Phi-3's generate, where
    /// LongRoPE switches to its long factors past `original_max_position_embeddings`), so that
    /// every key is rotated with the factors of the longer sequence. `None` for most models.
    fn rotary_recompute_at(&self) -> Option<usize> {
        None
    }

    /// The vision encoder of a vision-language model; `None` for text-only models.
    fn vision(&self) -> Option<&dyn VisionEncoder> {
        None
    }

    /// [`CausalLM::forward`]'s logits, and the hidden states `tap` names at every row of the
    /// step, which a [`DraftHead`] reads. Families no draft head reads need not provide it.
    fn forward_with_hidden(
        &self,
        input: &ForwardInput<'_>,
        kv: &mut [PagedKvLayer],
        tap: &HiddenTap,
    ) -> Result<(Tensor, Tensor)> {
        let _ = (input, kv, tap);
        Err(ferrite_tensor::TensorError::Unsupported {
            op: "forward_with_hidden",
            detail: format!("{} (no hidden states for a draft head)", self.info().architecture),
        }
        .into())
    }

    /// The checkpoint's multi-token-prediction head, loaded when asked for
    /// ([`crate::LoadOptions::load_mtp`]); `None` for most models.
    fn mtp(&self) -> Option<&dyn DraftHead> {
        None
    }

    /// The token embedding, which an EAGLE head without its own shares.
    fn token_embedding(&self) -> Option<&crate::layers::Embedding> {
        None
    }

    /// The LM head, which an EAGLE-1 head without its own shares.
    fn lm_head(&self) -> Option<&crate::layers::Linear> {
        None
    }

    /// As [`CausalLM::forward`], but returns the final-norm hidden states of `logit_rows`
    /// (`[logit_rows.len(), hidden]`, the LM head's input) instead of logits: a decoder used as an
    /// embedding model pools these. Families that do not expose them say so.
    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let _ = (input, kv);
        Err(ferrite_tensor::TensorError::Unsupported {
            op: "hidden_states",
            detail: format!("{} (no hidden-state output yet)", self.info().architecture),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pixtral's layout: an image's rows of image tokens and the token after each are one run,
    /// adjacent images one run together, as long as their grids say.
    #[test]
    fn row_breaks_join_an_images_rows_and_their_breaks() {
        const IMG: u32 = 10;
        let info = VisionInfo {
            image_token_id: IMG,
            video_token_id: None,
            spatial_merge_size: 2,
            patch_size: 14,
            placeholder: "[IMG]",
            video_placeholder: None,
            bidirectional: false,
            anyres: None,
            video_runs_per_step: false,
            row_breaks: true,
        };
        // Two images of 2x1 and 1x2 merged tokens back to back, then text, then a 1x1 image last.
        let prompt = [1, IMG, 12, IMG, 13, IMG, IMG, 13, 5, IMG, 13];
        assert_eq!(info.placeholder_runs(&prompt, IMG), [1..8, 9..11]);
        assert_eq!(info.placeholder_tokens([1, 4, 2]), 4);
        assert_eq!(info.placeholder_tokens([1, 2, 4]), 3);
        // A model without breaks keeps plain runs.
        let plain = VisionInfo { row_breaks: false, ..info.clone() };
        assert_eq!(plain.placeholder_runs(&prompt, IMG), [1..2, 3..4, 5..7, 9..10]);
        assert_eq!(plain.placeholder_tokens([1, 4, 2]), 2);
    }
}
