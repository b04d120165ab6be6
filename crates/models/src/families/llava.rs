//! LLaVA (`LlavaForConditionalGeneration`): a CLIP vision tower (LLaVA-1.5; its class row dropped,
//! `vision_feature_select_strategy: default`) or a SigLIP one (LLaVA-interleave; every row,
//! `full`) whose hidden states at `vision_feature_layer` pass through a two-layer projector into a
//! Llama-family text model, where each image's embeddings take the place of its run of `<image>`
//! tokens. Positions stay 1-D: an image token is one more position.
//!
//! The checkpoint layouts in use load: llava-hf's (`language_model.model.*`,
//! `language_model.lm_head`, `vision_tower.vision_model.*`, `multi_modal_projector.*`), what
//! transformers 5 saves (the same, with the tower's modules directly under `vision_tower.*`), and
//! the `model.*`-rooted one of its in-memory module tree.

use serde_json::Value;

use ferrite_tensor::{ops, Activation, DType, Device, Tensor};

use crate::decoder::load::activation;
use crate::decoder::Decoder;
use crate::families::llama::{self, Variant};
use crate::layers::vit::{VitConfig, VitKind, VitTower};
use crate::layers::Linear;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{image_input_error, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder, VisionInfo};
use crate::Result;

/// LLaVA's vision tower (CLIP or SigLIP) and the hidden states it hands the projector.
struct FeatureTower {
    vit: VitTower,
    /// The hidden states projected: `k` is the output of layer `k` (0: the embeddings).
    feature_layers: Vec<usize>,
    /// The first row of each hidden state projected: 1 where CLIP's class row is dropped.
    first_row: usize,
}

pub struct Llava {
    decoder: Decoder,
    tower: FeatureTower,
    projector_1: Linear,
    projector_2: Linear,
    projector_act: Activation,
    info: ModelInfo,
}

/// Where a checkpoint keeps the text model, its LM head, the tower and the projector: each
/// under the first of its prefixes that holds it.
pub(crate) struct Layout {
    pub text: &'static str,
    pub lm_head: &'static str,
    pub tower: &'static str,
    pub projector: &'static str,
}

impl Layout {
    /// The layout of `w`, whose tower is found by `tower_leaf`, a tensor at its root.
    pub(crate) fn of(w: &Weights, tower_leaf: &str) -> Layout {
        let first = |prefixes: &[&'static str], leaf: &str| {
            prefixes.iter().copied().find(|p| w.contains(&format!("{p}.{leaf}"))).unwrap_or(prefixes[0])
        };
        Layout {
            text: first(&["language_model.model", "model.language_model"], "embed_tokens.weight"),
            lm_head: first(&["language_model.lm_head", "lm_head"], "weight"),
            tower: first(
                &["vision_tower.vision_model", "vision_tower", "model.vision_tower.vision_model", "model.vision_tower"],
                tower_leaf,
            ),
            projector: first(&["multi_modal_projector", "model.multi_modal_projector"], "linear_1.weight"),
        }
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Llava> {
    let layout = Layout::of(w, "embeddings.patch_embedding.weight");
    let text = raw.text_config()?;
    let text_type = text.value.get("model_type").and_then(Value::as_str).unwrap_or("llama");
    let variant = match text_type {
        "llama" => Variant::LLAMA,
        "mistral" => Variant::MISTRAL,
        "qwen2" => Variant::QWEN2,
        other => {
            return Err(raw
                .error(format!("text_config.model_type `{other}`: LLaVA loads llama, mistral and qwen2 text models")))
        }
    };
    let decoder = llama::load_at(&text, w, variant, layout.text, layout.lm_head)?;
    let text_hidden = decoder.embed.table.shape()[1];

    let vision_type =
        raw.value.pointer("/vision_config/model_type").and_then(Value::as_str).unwrap_or("clip_vision_model");
    let (vision, kind) = match vision_type {
        "clip_vision_model" => (VitConfig::clip(raw)?, VitKind::Clip),
        "siglip_vision_model" => (VitConfig::siglip(raw)?, VitKind::Siglip),
        other => {
            return Err(
                raw.error(format!("vision_config.model_type `{other}`: LLaVA loads CLIP and SigLIP vision towers"))
            )
        }
    };
    // `default` drops each image's first row, `full` keeps every row. An image's placeholders are
    // one per patch, which the features match for CLIP's `default` (its class row dropped) and
    // SigLIP's `full` (no class row).
    let strategy = raw.value.get("vision_feature_select_strategy").and_then(Value::as_str).unwrap_or("default");
    let first_row = match (strategy, kind) {
        ("default", VitKind::Clip) => 1,
        ("full", VitKind::Siglip) => 0,
        _ => {
            return Err(raw.error(format!(
                "vision_feature_select_strategy `{strategy}` with a {vision_type} tower is not supported (CLIP \
                 towers with `default`, SigLIP towers with `full`)"
            )))
        }
    };
    let feature_layers = feature_layers(raw, vision.num_hidden_layers, -2)?;
    let depth = feature_layers.iter().copied().max().unwrap_or(0);
    let vit = VitTower::load(raw, &vision, &w.at(layout.tower), kind, depth)?;
    let tower = FeatureTower { vit, feature_layers, first_row };

    let p = w.at(layout.projector);
    let bias = raw.value.get("multimodal_projector_bias").and_then(Value::as_bool).unwrap_or(true);
    let features = vision.hidden_size * tower.feature_layers.len();
    let projector_1 = p.linear("linear_1", features, text_hidden, bias)?;
    let projector_2 = p.linear("linear_2", text_hidden, text_hidden, bias)?;
    let act_name = raw.value.get("projector_hidden_act").and_then(Value::as_str).unwrap_or("gelu");
    let projector_act = activation(raw, "projector_hidden_act", act_name)?;

    let image_token_id = raw.image_token_id(32000)?;
    let mut info = decoder.info().clone();
    info.vision = Some(VisionInfo {
        image_token_id,
        video_token_id: None,
        spatial_merge_size: 1,
        patch_size: tower.vit.patch,
        placeholder: "<image>",
        video_placeholder: None,
        bidirectional: false,
        anyres: None,
        video_runs_per_step: false,
        row_breaks: false,
    });
    info.weight_bytes +=
        tower.vit.linears().chain([&projector_1, &projector_2]).map(Linear::size_in_bytes).sum::<usize>();
    Ok(Llava { decoder, tower, projector_1, projector_2, projector_act, info })
}

/// `vision_feature_layer` (absent: `default`) as indices into the tower's hidden states (0: the
/// embeddings, `k`: the output of layer `k`); negative ones count from the last, as Python indexes.
pub(crate) fn feature_layers(raw: &RawConfig, layers: usize, default: i64) -> Result<Vec<usize>> {
    let value = raw.value.get("vision_feature_layer").cloned().unwrap_or(Value::from(default));
    let wanted: Vec<i64> = match &value {
        Value::Number(n) => n.as_i64().into_iter().collect(),
        Value::Array(items) => items.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    };
    let states = layers as i64 + 1;
    let resolved: Option<Vec<usize>> = wanted
        .iter()
        .map(|&k| {
            let k = if k < 0 { states + k } else { k };
            (0..states).contains(&k).then_some(k as usize)
        })
        .collect();
    match resolved {
        Some(v) if !v.is_empty() && v.len() == value.as_array().map_or(1, Vec::len) => Ok(v),
        _ => Err(raw.error(format!(
            "vision_feature_layer {value} must name hidden states of a {layers}-layer tower (an index or a list)"
        ))),
    }
}

impl FeatureTower {
    /// The feature layers' hidden states of one image, side by side, from `first_row` on.
    fn features(&self, chw: &[f32], device: Device, dtype: DType) -> Result<Tensor> {
        // Slot `j` holds feature layer `j`'s patch rows, in `vision_feature_layer`'s order, which
        // the projector's input columns follow.
        let mut features: Vec<Option<Tensor>> = vec![None; self.feature_layers.len()];
        let patch_rows: Vec<usize> = (self.first_row..self.vit.rows()).collect();
        self.vit.hidden_states(chw, device, dtype, |k, x| {
            for (slot, _) in features.iter_mut().zip(&self.feature_layers).filter(|(_, &layer)| layer == k) {
                *slot = Some(ops::gather_rows(x, &patch_rows)?);
            }
            Ok(())
        })?;
        let ordered: Vec<&Tensor> =
            features.iter().map(|f| f.as_ref().expect("the tower runs to its deepest feature layer")).collect();
        match ordered.as_slice() {
            [one] => Ok((*one).clone()),
            many => Ok(ops::concat_cols(many)?),
        }
    }
}

impl Llava {
    /// The tower's image: its side in pixels, patches a side and channels.
    pub(crate) fn tower(&self) -> &VitTower {
        &self.tower.vit
    }

    /// The embeddings of one tower-sized image (`[channels, side, side]`, checked by the caller),
    /// one per patch: the tower's features through the projector.
    pub(crate) fn embed_image(&self, chw: &[f32]) -> Result<Tensor> {
        let table = &self.decoder.embed.table;
        let features = self.tower.features(chw, table.device(), table.dtype())?;
        let hidden = ops::activation(&self.projector_1.forward(&features)?, self.projector_act)?;
        self.projector_2.forward(&hidden)
    }

    /// The text model's hidden size, which the projector's output has.
    pub(crate) fn text_hidden(&self) -> usize {
        self.decoder.embed.table.shape()[1]
    }

    /// The model's info, for a family built on LLaVA to extend.
    pub(crate) fn info_mut(&mut self) -> &mut ModelInfo {
        &mut self.info
    }
}

impl VisionEncoder for Llava {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let t = &self.tower.vit;
        let side = t.image_side();
        if grid_thw != [1, t.grid, t.grid] || pixel_values.len() != t.channels * side * side {
            return Err(image_input_error(format!(
                "{} pixel values in a {grid_thw:?} grid for a tower of {side}x{side} images ({} patches a side)",
                pixel_values.len(),
                t.grid
            )));
        }
        Ok(Encoded { embeddings: self.embed_image(pixel_values)?, deepstack: Vec::new() })
    }
}

impl CausalLM for Llava {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [ferrite_tensor::PagedKvLayer]) -> Result<Tensor> {
        self.decoder.forward(input, kv)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [ferrite_tensor::PagedKvLayer]) -> Result<Tensor> {
        self.decoder.hidden_states(input, kv)
    }

    fn vision(&self) -> Option<&dyn VisionEncoder> {
        Some(self)
    }
}
