//! LLaVA (`LlavaForConditionalGeneration`): a CLIP vision tower whose hidden states at
//! `vision_feature_layer` (the patch rows; the class row dropped) pass through a two-layer
//! projector into a Llama-family text model, where each image's embeddings take the place of its
//! run of `<image>` tokens. Positions stay 1-D: an image token is one more position.
//!
//! The checkpoint layouts in use load: llava-hf's (`language_model.model.*`,
//! `language_model.lm_head`, `vision_tower.vision_model.*`, `multi_modal_projector.*`), what
//! transformers 5 saves (the same, with the tower's modules directly under `vision_tower.*`), and
//! the `model.*`-rooted one of its in-memory module tree.

use serde::Deserialize;
use serde_json::Value;

use ferrite_tensor::{ops, Activation, AttentionParams, DType, Device, Tensor};

use crate::decoder::load::{activation, attention_params, check_dims};
use crate::decoder::Decoder;
use crate::families::llama::{self, Variant};
use crate::layers::{LayerNorm, Linear};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::model::{
    image_input_error, pixel_input, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder, VisionInfo, VisualGrid,
};
use crate::Result;

/// CLIPVisionConfig, with its defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct VisionConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_channels: usize,
    image_size: usize,
    patch_size: usize,
    hidden_act: String,
    layer_norm_eps: f64,
    model_type: Option<String>,
}

impl Default for VisionConfig {
    fn default() -> VisionConfig {
        VisionConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 32,
            hidden_act: "quick_gelu".into(),
            layer_norm_eps: 1e-5,
            model_type: None,
        }
    }
}

struct EncoderLayer {
    norm1: LayerNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

struct ClipTower {
    patch_embed: Linear,
    /// `[1, hidden]`: the class token's embedding, the first row of every image.
    class_embedding: Tensor,
    /// `[1 + patches, hidden]`.
    position_embedding: Tensor,
    pre_norm: LayerNorm,
    /// Only the layers up to the deepest feature layer: the rest would run for nothing.
    layers: Vec<EncoderLayer>,
    act: Activation,
    attention: AttentionParams,
    channels: usize,
    patch: usize,
    /// Patches per side.
    grid: usize,
    /// The hidden states projected: `k` is the output of layer `k` (0: the embeddings).
    feature_layers: Vec<usize>,
}

pub struct Llava {
    decoder: Decoder,
    tower: ClipTower,
    projector_1: Linear,
    projector_2: Linear,
    projector_act: Activation,
    info: ModelInfo,
}

/// Where a checkpoint keeps the text model, its LM head, the tower and the projector: each
/// under the first of its prefixes that holds it.
struct Layout {
    text: &'static str,
    lm_head: &'static str,
    tower: &'static str,
    projector: &'static str,
}

impl Layout {
    fn of(w: &Weights) -> Layout {
        let first = |prefixes: &[&'static str], leaf: &str| {
            prefixes.iter().copied().find(|p| w.contains(&format!("{p}.{leaf}"))).unwrap_or(prefixes[0])
        };
        Layout {
            text: first(&["language_model.model", "model.language_model"], "embed_tokens.weight"),
            lm_head: first(&["language_model.lm_head", "lm_head"], "weight"),
            tower: first(
                &["vision_tower.vision_model", "vision_tower", "model.vision_tower.vision_model", "model.vision_tower"],
                "embeddings.patch_embedding.weight",
            ),
            projector: first(&["multi_modal_projector", "model.multi_modal_projector"], "linear_1.weight"),
        }
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Llava> {
    let layout = Layout::of(w);
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

    let vision_value = raw.value.get("vision_config").cloned().unwrap_or(Value::Object(Default::default()));
    let vision: VisionConfig =
        serde_json::from_value(vision_value).map_err(|e| raw.error(format!("vision_config: {e}")))?;
    if let Some(other) = vision.model_type.as_deref().filter(|t| *t != "clip_vision_model") {
        return Err(raw.error(format!("vision_config.model_type `{other}`: LLaVA loads CLIP vision towers")));
    }
    let strategy = raw.value.get("vision_feature_select_strategy").and_then(Value::as_str).unwrap_or("default");
    if strategy != "default" {
        return Err(raw.error(format!(
            "vision_feature_select_strategy `{strategy}`: only `default` (the class row dropped) is supported"
        )));
    }
    let feature_layers = feature_layers(raw, vision.num_hidden_layers)?;
    let tower = load_tower(raw, &vision, &w.at(layout.tower), feature_layers)?;

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
        patch_size: tower.patch,
        placeholder: "<image>",
        video_placeholder: None,
    });
    let linears = tower.layers.iter().flat_map(|l| [&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2]);
    info.weight_bytes +=
        linears.chain([&tower.patch_embed, &projector_1, &projector_2]).map(Linear::size_in_bytes).sum::<usize>();
    Ok(Llava { decoder, tower, projector_1, projector_2, projector_act, info })
}

/// `vision_feature_layer` as indices into the tower's hidden states (0: the embeddings, `k`: the
/// output of layer `k`); negative ones count from the last, as Python indexes.
fn feature_layers(raw: &RawConfig, layers: usize) -> Result<Vec<usize>> {
    let value = raw.value.get("vision_feature_layer").cloned().unwrap_or(Value::from(-2));
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

fn load_tower(raw: &RawConfig, cfg: &VisionConfig, v: &Scope, feature_layers: Vec<usize>) -> Result<ClipTower> {
    let (e, heads) = (cfg.hidden_size, cfg.num_attention_heads);
    check_dims(
        raw,
        &[
            ("vision_config.hidden_size", e),
            ("vision_config.intermediate_size", cfg.intermediate_size),
            ("vision_config.num_attention_heads", heads),
            ("vision_config.num_channels", cfg.num_channels),
            ("vision_config.patch_size", cfg.patch_size),
            ("vision_config.image_size", cfg.image_size),
        ],
    )?;
    if !e.is_multiple_of(heads) || !cfg.image_size.is_multiple_of(cfg.patch_size) {
        return Err(raw.error(format!(
            "vision_config: hidden_size {e} over {heads} heads, image_size {} in patches of {}: each must divide",
            cfg.image_size, cfg.patch_size
        )));
    }
    let grid = cfg.image_size / cfg.patch_size;
    let patch_dim = cfg.num_channels * cfg.patch_size * cfg.patch_size;
    let eps = cfg.layer_norm_eps;
    let emb = v.at("embeddings");
    let weights = v.weights();
    let patch_weight = weights
        .get(&emb.name("patch_embedding.weight"), &[e, cfg.num_channels, cfg.patch_size, cfg.patch_size])?
        .reshape(&[e, patch_dim])?;
    let depth = feature_layers.iter().copied().max().unwrap_or(0);
    let layers = (0..depth)
        .map(|i| {
            let l = v.at(&format!("encoder.layers.{i}"));
            let a = l.at("self_attn");
            Ok(EncoderLayer {
                norm1: l.layer_norm("layer_norm1", e, eps, true)?,
                q: a.linear("q_proj", e, e, true)?,
                k: a.linear("k_proj", e, e, true)?,
                v: a.linear("v_proj", e, e, true)?,
                out: a.linear("out_proj", e, e, true)?,
                norm2: l.layer_norm("layer_norm2", e, eps, true)?,
                fc1: l.linear("mlp.fc1", e, cfg.intermediate_size, true)?,
                fc2: l.linear("mlp.fc2", cfg.intermediate_size, e, true)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let head_dim = e / heads;
    Ok(ClipTower {
        patch_embed: Linear::new(patch_weight, None),
        class_embedding: emb.get("class_embedding", &[e])?.reshape(&[1, e])?,
        position_embedding: emb.get("position_embedding.weight", &[grid * grid + 1, e])?,
        pre_norm: v.layer_norm("pre_layrnorm", e, eps, true)?,
        layers,
        act: activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?,
        attention: attention_params(heads, heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
        channels: cfg.num_channels,
        patch: cfg.patch_size,
        grid,
        feature_layers,
    })
}

impl ClipTower {
    /// Channel-first pixels `[channels, H, W]` as patch rows `[patches, channels * p * p]`, each
    /// row ordered (channel, row, column) as the patch embedding's convolution reads it.
    fn patch_rows(&self, chw: &[f32]) -> Vec<f32> {
        let (p, g) = (self.patch, self.grid);
        let side = p * g;
        let mut rows = Vec::with_capacity(chw.len());
        for pr in 0..g {
            for pc in 0..g {
                for c in 0..self.channels {
                    for y in 0..p {
                        let start = (c * side + pr * p + y) * side + pc * p;
                        rows.extend_from_slice(&chw[start..start + p]);
                    }
                }
            }
        }
        rows
    }

    /// The feature layers' hidden states of one image, side by side, the class row dropped.
    fn features(&self, chw: &[f32], device: Device, dtype: DType) -> Result<Tensor> {
        let patches = self.grid * self.grid;
        let pixels =
            pixel_input(self.patch_rows(chw), &[patches, self.channels * self.patch * self.patch], device, dtype)?;
        let embedded = self.patch_embed.forward(&pixels)?;
        // Tables kept in the weights' dtype join activations in theirs (f32 on the CPU).
        let class = self.class_embedding.to_dtype(embedded.dtype());
        let x = ops::concat_rows(&[&class, &embedded])?;
        let positions = self.position_embedding.to_dtype(embedded.dtype());
        let mut x = self.pre_norm.forward(&ops::add(&x, &positions)?)?;
        // Slot `j` holds feature layer `j`'s patch rows, in `vision_feature_layer`'s order, which
        // the projector's input columns follow.
        let mut features: Vec<Option<Tensor>> = vec![None; self.feature_layers.len()];
        let patch_rows: Vec<usize> = (1..=patches).collect();
        let mut keep = |k: usize, x: &Tensor| -> Result<()> {
            for (slot, _) in features.iter_mut().zip(&self.feature_layers).filter(|(_, &layer)| layer == k) {
                *slot = Some(ops::gather_rows(x, &patch_rows)?);
            }
            Ok(())
        };
        keep(0, &x)?;
        for (i, l) in self.layers.iter().enumerate() {
            let normed = l.norm1.forward(&x)?;
            let (q, k, v) = (l.q.forward(&normed)?, l.k.forward(&normed)?, l.v.forward(&normed)?);
            let attn = ops::attention_dense(&q, &k, &v, &self.attention, &[patches + 1], false)?;
            x = ops::add(&x, &l.out.forward(&attn)?)?;
            let mlp = l.fc2.forward(&ops::activation(&l.fc1.forward(&l.norm2.forward(&x)?)?, self.act)?)?;
            x = ops::add(&x, &mlp)?;
            keep(i + 1, &x)?;
        }
        let ordered: Vec<&Tensor> =
            features.iter().map(|f| f.as_ref().expect("the tower runs to its deepest feature layer")).collect();
        match ordered.as_slice() {
            [one] => Ok((*one).clone()),
            many => Ok(ops::concat_cols(many)?),
        }
    }
}

impl VisionEncoder for Llava {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let t = &self.tower;
        let side = t.grid * t.patch;
        if grid_thw != [1, t.grid, t.grid] || pixel_values.len() != t.channels * side * side {
            return Err(image_input_error(format!(
                "{} pixel values in a {grid_thw:?} grid for a tower of {side}x{side} images ({} patches a side)",
                pixel_values.len(),
                t.grid
            )));
        }
        let table = &self.decoder.embed.table;
        let features = t.features(pixel_values, table.device(), table.dtype())?;
        let hidden = ops::activation(&self.projector_1.forward(&features)?, self.projector_act)?;
        Ok(Encoded { embeddings: self.projector_2.forward(&hidden)?, deepstack: Vec::new() })
    }

    fn mrope_positions(&self, _prompt: &[u32], _visuals: &[VisualGrid]) -> Result<Option<(Vec<[usize; 3]>, i64)>> {
        Ok(None)
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
