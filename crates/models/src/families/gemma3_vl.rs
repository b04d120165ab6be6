//! Gemma 3 with images (`Gemma3ForConditionalGeneration`): a SigLIP tower over a fixed-size
//! image, its patch grid average-pooled to `mm_tokens_per_image` embeddings, normalized (Gemma's
//! `(1 + w)` RMSNorm) and projected into Gemma 3's text model, where they take the place of the
//! image's run of `<image_soft_token>`s. The processor writes that run between `<start_of_image>`
//! and `<end_of_image>`; within it the tokens attend to one another both ways (transformers'
//! `token_type_ids` mask), which the engine honours by computing each run in one chunk as a
//! bidirectional sequence ([`VisionInfo::bidirectional`]). Positions stay 1-D.
//!
//! Checkpoint layouts: the Hub's (`language_model.model.*`, `vision_tower.vision_model.*`,
//! `multi_modal_projector.*`) and transformers 5's (`model.language_model.*`,
//! `model.vision_tower.vision_model.*`, `model.multi_modal_projector.*`, `lm_head`); the LM head
//! is usually tied to the embedding.

use serde_json::Value;

use ferrite_tensor::{PagedKvLayer, Tensor};

use crate::decoder::Decoder;
use crate::families::gemma::gemma_norm;
use crate::families::gemma3;
use crate::layers::vit::{VitConfig, VitKind, VitTower};
use crate::layers::{Linear, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{
    image_input_error, pixel_input, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder, VisionInfo,
};
use crate::Result;

pub struct Gemma3Vl {
    decoder: Decoder,
    tower: VitTower,
    /// Patches per side pooled into one embedding.
    kernel: usize,
    soft_norm: RmsNorm,
    projection: Linear,
    info: ModelInfo,
}

/// The first of `prefixes` under which the checkpoint has `leaf`.
fn prefix_of(w: &Weights, prefixes: &[&'static str], leaf: &str) -> &'static str {
    prefixes.iter().copied().find(|p| w.contains(&format!("{p}.{leaf}"))).unwrap_or(prefixes[0])
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Gemma3Vl> {
    let text_prefix = prefix_of(w, &["language_model.model", "model.language_model"], "embed_tokens.weight");
    let lm_head = prefix_of(w, &["language_model.lm_head", "lm_head"], "weight");
    let tower_prefix = prefix_of(
        w,
        &["vision_tower.vision_model", "model.vision_tower.vision_model", "vision_tower", "model.vision_tower"],
        "embeddings.patch_embedding.weight",
    );
    let projector =
        prefix_of(w, &["multi_modal_projector", "model.multi_modal_projector"], "mm_input_projection_weight");

    let text = raw.text_config()?;
    if let Some(other) = text.value.get("model_type").and_then(Value::as_str).filter(|t| *t != "gemma3_text") {
        return Err(raw.error(format!("text_config.model_type `{other}`: Gemma 3 loads a gemma3_text model")));
    }
    let decoder = gemma3::load_at(&text, w, text_prefix, lm_head)?;
    let text_hidden = decoder.embed.table.shape()[1];

    let vision = VitConfig::siglip(raw)?;
    if let Some(other) = vision.model_type.as_deref().filter(|t| *t != "siglip_vision_model") {
        return Err(raw.error(format!("vision_config.model_type `{other}`: Gemma 3 loads SigLIP vision towers")));
    }
    let tower = VitTower::load(raw, &vision, &w.at(tower_prefix), VitKind::Siglip, vision.num_hidden_layers)?;

    // transformers takes `int(mm_tokens_per_image ** 0.5)` tokens a side and pools the patch grid
    // in windows of `patches // side`; anything but an exact fit would drop patches or tokens.
    let tokens = raw.value.get("mm_tokens_per_image").and_then(Value::as_u64).unwrap_or(256) as usize;
    let side = (tokens as f64).sqrt() as usize;
    if side == 0 || side * side != tokens || !tower.grid.is_multiple_of(side) {
        return Err(raw.error(format!(
            "mm_tokens_per_image {tokens} must be a square whose side divides the {} patches along the image",
            tower.grid
        )));
    }
    let kernel = tower.grid / side;
    let p = w.at(projector);
    let soft_norm = gemma_norm(&p, "mm_soft_emb_norm", vision.hidden_size, vision.layer_norm_eps)?;
    let projection = Linear::new(
        w.parameter_transposed(&p.name("mm_input_projection_weight"), [text_hidden, vision.hidden_size])?,
        None,
    );

    let mut info = decoder.info().clone();
    info.vision = Some(VisionInfo {
        image_token_id: raw.image_token_id(262_144)?,
        video_token_id: None,
        spatial_merge_size: kernel,
        patch_size: tower.patch,
        placeholder: "<start_of_image>",
        video_placeholder: None,
        bidirectional: true,
        anyres: None,
        video_runs_per_step: false,
        row_breaks: false,
    });
    info.weight_bytes += tower.linears().chain([&projection]).map(Linear::size_in_bytes).sum::<usize>();
    Ok(Gemma3Vl { decoder, tower, kernel, soft_norm, projection, info })
}

impl Gemma3Vl {
    /// `AvgPool2d(kernel)` over the tower's `[grid * grid, hidden]` output laid out as a
    /// `[hidden, grid, grid]` image: each output row the mean of a `kernel` x `kernel` window of
    /// patches, summed row by row in f32 and divided by the window's size, as torch's CPU kernel
    /// does. Computed on the host, where that order is ours to keep.
    fn pool(&self, hidden: &Tensor) -> Result<Tensor> {
        let (grid, k) = (self.tower.grid, self.kernel);
        let width = hidden.last_dim();
        let values = hidden.to_f32_vec();
        let side = grid / k;
        let mut pooled = vec![0.0f32; side * side * width];
        for (out_row, window) in pooled.chunks_exact_mut(width).enumerate() {
            let (top, left) = (out_row / side * k, out_row % side * k);
            for (channel, out) in window.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for y in top..top + k {
                    for x in left..left + k {
                        sum += values[(y * grid + x) * width + channel];
                    }
                }
                *out = sum / (k * k) as f32;
            }
        }
        pixel_input(pooled, &[side * side, width], hidden.device(), hidden.dtype())
    }
}

impl VisionEncoder for Gemma3Vl {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let t = &self.tower;
        let side = t.image_side();
        if grid_thw != [1, t.grid, t.grid] || pixel_values.len() != t.channels * side * side {
            return Err(image_input_error(format!(
                "{} pixel values in a {grid_thw:?} grid for a tower of {side}x{side} images ({} patches a side)",
                pixel_values.len(),
                t.grid
            )));
        }
        let table = &self.decoder.embed.table;
        let hidden = t.last_hidden_state(pixel_values, table.device(), table.dtype())?;
        let normed = self.soft_norm.forward(&self.pool(&hidden)?)?;
        Ok(Encoded { embeddings: self.projection.forward(&normed)?, deepstack: Vec::new() })
    }
}

impl CausalLM for Gemma3Vl {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.decoder.forward(input, kv)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.decoder.hidden_states(input, kv)
    }

    fn vision(&self) -> Option<&dyn VisionEncoder> {
        Some(self)
    }
}
