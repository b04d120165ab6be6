//! Mistral 3 (`Mistral3ForConditionalGeneration`, Mistral-Small-3.1/3.2): a Pixtral vision tower
//! over an image at its own size (patches embedded by a bias-free convolution, `ln_pre`, RMSNorm
//! blocks of full attention with a 2-D axial rotary embedding and a gated MLP), whose hidden
//! states at `vision_feature_layer` pass Mistral 3's projector (RMSNorm, each 2x2 block of patches
//! merged by `merging_layer`, a two-layer MLP) into a Mistral text model. Positions stay 1-D.
//!
//! Pixtral's processor writes an image as rows of `[IMG]`, one per merged patch, each row closed by
//! `[IMG_BREAK]` and the last by `[IMG_END]`; those keep their text embeddings and the image's
//! embeddings fill its `[IMG]` tokens ([`VisionInfo::row_breaks`]). The encoder takes the image
//! channel-first, `[3, height, width]` in whole merged patches, and its grid in patches.
//!
//! Checkpoint layouts: LLaVA's ([`crate::families::llava`]), the tower's modules directly under
//! `vision_tower.*`.

use serde::Deserialize;
use serde_json::Value;

use ferrite_tensor::{ops, Activation, AttentionParams, DType, Device, PagedKvLayer, RopeStyle, Tensor};

use crate::decoder::load::{activation, attention_params, check_dims};
use crate::decoder::Decoder;
use crate::families::llama::{self, Variant};
use crate::families::llava::{feature_layers, Layout};
use crate::layers::{GatedMlp, Linear, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::model::{
    image_input_error, pixel_input, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder, VisionInfo,
};
use crate::Result;

/// `PixtralVisionConfig`, with its class defaults (Pixtral-12B's tower).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
struct PixtralConfig {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_channels: usize,
    patch_size: usize,
    hidden_act: String,
    rope_parameters: Option<Value>,
    /// Where configs written before transformers 5 keep the rotary base.
    rope_theta: Option<f64>,
}

impl Default for PixtralConfig {
    fn default() -> PixtralConfig {
        PixtralConfig {
            hidden_size: 1024,
            intermediate_size: 4096,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            num_channels: 3,
            patch_size: 16,
            hidden_act: "gelu".into(),
            rope_parameters: None,
            rope_theta: None,
        }
    }
}

/// Pixtral's blocks normalize with a fixed epsilon, whatever the config says.
const PIXTRAL_EPS: f64 = 1e-5;

struct PixtralLayer {
    attention_norm: RmsNorm,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: RmsNorm,
    mlp: GatedMlp,
}

struct PixtralTower {
    /// The convolution as a matmul over patches laid out `(channel, row, column)`.
    patch_conv: Linear,
    ln_pre: RmsNorm,
    /// The layers up to `vision_feature_layer`, whose output is projected: the rest are unloaded.
    layers: Vec<PixtralLayer>,
    attention: AttentionParams,
    /// The row's frequencies, then the column's (`head_dim / 4` each): transformers' axial
    /// `inv_freq` split into its even and odd entries.
    inv_freq: Vec<f32>,
    channels: usize,
    patch: usize,
}

pub struct Mistral3 {
    decoder: Decoder,
    tower: PixtralTower,
    norm: RmsNorm,
    /// `merging_layer` with its input columns reordered from unfold's `(channel, patch)` to the
    /// merged block's patches side by side, `(patch, channel)`.
    merger: Linear,
    merge: usize,
    linear_1: Linear,
    linear_2: Linear,
    act: Activation,
    info: ModelInfo,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Mistral3> {
    let layout = Layout::of(w, "patch_conv.weight");
    let text = raw.text_config()?;
    let variant = match text.value.get("model_type").and_then(Value::as_str).unwrap_or("mistral") {
        "mistral" => Variant::MISTRAL,
        "llama" => Variant::LLAMA,
        other => {
            return Err(
                raw.error(format!("text_config.model_type `{other}`: Mistral 3 loads mistral and llama text models"))
            )
        }
    };
    let decoder = llama::load_at(&text, w, variant, layout.text, layout.lm_head)?;
    let text_hidden = decoder.embed.table.shape()[1];
    let text_eps = text.value.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6);

    let vision_value = raw.value.get("vision_config").cloned().unwrap_or(Value::Object(Default::default()));
    let vision: PixtralConfig =
        serde_json::from_value(vision_value).map_err(|e| raw.error(format!("vision_config: {e}")))?;
    // The projector's norm and merger are one hidden state wide: transformers' own model cannot
    // take a list of layers either.
    let feature_layer = match feature_layers(raw, vision.num_hidden_layers, -1)?.as_slice() {
        &[layer] => layer,
        _ => return Err(raw.error("vision_feature_layer: Mistral 3 projects one layer's hidden states, not a list")),
    };
    let tower = PixtralTower::load(raw, &vision, &w.at(layout.tower), feature_layer)?;

    let merge = raw.value.get("spatial_merge_size").and_then(Value::as_u64).unwrap_or(2) as usize;
    let d = vision.hidden_size;
    check_dims(raw, &[("spatial_merge_size", merge)])?;
    let p = w.at(layout.projector);
    let bias = raw.value.get("multimodal_projector_bias").and_then(Value::as_bool).unwrap_or(false);
    let merger = merging_layer(&p, d, merge)?;
    let linear_1 = p.linear("linear_1", d, text_hidden, bias)?;
    let linear_2 = p.linear("linear_2", text_hidden, text_hidden, bias)?;
    let act_name = raw.value.get("projector_hidden_act").and_then(Value::as_str).unwrap_or("gelu");
    let act = activation(raw, "projector_hidden_act", act_name)?;
    let norm = p.rms("norm", d, text_eps)?;

    let mut info = decoder.info().clone();
    info.vision = Some(VisionInfo {
        image_token_id: raw.image_token_id(10)?,
        video_token_id: None,
        spatial_merge_size: merge,
        patch_size: tower.patch,
        placeholder: "[IMG]",
        video_placeholder: None,
        bidirectional: false,
        anyres: None,
        video_runs_per_step: false,
        row_breaks: true,
    });
    info.weight_bytes +=
        tower.weight_bytes() + [&merger, &linear_1, &linear_2].into_iter().map(Linear::size_in_bytes).sum::<usize>();
    Ok(Mistral3 { decoder, tower, norm, merger, merge, linear_1, linear_2, act, info })
}

/// `patch_merger.merging_layer` (`[features, features * merge^2]`), its input columns reordered
/// from `c * merge^2 + k` (torch's `unfold`: channel-major) to `k * features + c`, so that the
/// merged input is a block's `merge^2` patch rows side by side.
fn merging_layer(p: &Scope, features: usize, merge: usize) -> Result<Linear> {
    let unit = merge * merge;
    let stored = p.linear("patch_merger.merging_layer", features * unit, features, false)?.weight;
    let host = stored.to_device(Device::Cpu)?.to_f32_vec();
    let mut reordered = vec![0.0f32; host.len()];
    for (out_row, in_row) in reordered.chunks_exact_mut(features * unit).zip(host.chunks_exact(features * unit)) {
        for c in 0..features {
            for k in 0..unit {
                out_row[k * features + c] = in_row[c * unit + k];
            }
        }
    }
    let weight = Tensor::from_f32_as(reordered, &[features, features * unit], stored.dtype())?;
    Ok(Linear::new(weight.to_device(stored.device())?, None))
}

impl PixtralTower {
    fn load(raw: &RawConfig, cfg: &PixtralConfig, v: &Scope, depth: usize) -> Result<PixtralTower> {
        let (e, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        check_dims(raw, &[("vision patch size", cfg.patch_size), ("vision heads", heads)])?;
        if !e.is_multiple_of(heads) || !(e / heads).is_multiple_of(4) {
            return Err(raw.error(format!(
                "vision_config: width {e} over {heads} heads must give a head size that is a multiple of 4"
            )));
        }
        let head_dim = e / heads;
        let theta = cfg
            .rope_parameters
            .as_ref()
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(cfg.rope_theta)
            .unwrap_or(10000.0) as f32;
        let all: Vec<f32> = (0..head_dim).step_by(2).map(|i| 1.0f32 / theta.powf(i as f32 / head_dim as f32)).collect();
        let inv_freq = all.iter().step_by(2).chain(all.iter().skip(1).step_by(2)).copied().collect();
        let act = activation(raw, "vision_config.hidden_act", &cfg.hidden_act)?;
        let patch_dim = cfg.num_channels * cfg.patch_size * cfg.patch_size;
        let conv = v
            .weights()
            .get(&v.name("patch_conv.weight"), &[e, cfg.num_channels, cfg.patch_size, cfg.patch_size])?
            .reshape(&[e, patch_dim])?;
        let layers = (0..depth)
            .map(|i| {
                let l = v.at(&format!("transformer.layers.{i}"));
                Ok(PixtralLayer {
                    attention_norm: l.rms("attention_norm", e, PIXTRAL_EPS)?,
                    q: l.linear("attention.q_proj", e, e, false)?,
                    k: l.linear("attention.k_proj", e, e, false)?,
                    v: l.linear("attention.v_proj", e, e, false)?,
                    o: l.linear("attention.o_proj", e, e, false)?,
                    ffn_norm: l.rms("ffn_norm", e, PIXTRAL_EPS)?,
                    mlp: l.gated_mlp("feed_forward", e, cfg.intermediate_size, act, false)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(PixtralTower {
            patch_conv: Linear::new(conv, None),
            ln_pre: v.rms("ln_pre", e, PIXTRAL_EPS)?,
            layers,
            attention: attention_params(heads, heads, head_dim, (head_dim as f64).powf(-0.5), None, None),
            inv_freq,
            channels: cfg.num_channels,
            patch: cfg.patch_size,
        })
    }

    fn weight_bytes(&self) -> usize {
        let linears = self.layers.iter().flat_map(|l| [&l.q, &l.k, &l.v, &l.o]).chain([&self.patch_conv]);
        linears.map(Linear::size_in_bytes).sum::<usize>()
            + self.layers.iter().map(|l| l.mlp.weight_bytes()).sum::<usize>()
    }

    /// cos/sin `[rows * columns, head_dim / 2]` of the patch grid, row-major: the first half of
    /// each row turns with the patch's row, the second with its column.
    fn rope_tables(&self, rows: usize, columns: usize) -> (Vec<f32>, Vec<f32>) {
        let quarter = self.inv_freq.len() / 2;
        let size = rows * columns * self.inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(size), Vec::with_capacity(size));
        for row in 0..rows {
            for column in 0..columns {
                for (j, &f) in self.inv_freq.iter().enumerate() {
                    let angle = if j < quarter { row } else { column } as f32 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        (cos, sin)
    }

    /// The last loaded layer's hidden states (the embeddings after `ln_pre` where none is) of one
    /// `[channels, rows * patch, columns * patch]` image, a row per patch in row-major order.
    fn forward(&self, chw: &[f32], (rows, columns): (usize, usize), device: Device, dtype: DType) -> Result<Tensor> {
        let (p, width) = (self.patch, columns * self.patch);
        let plane = rows * p * width;
        let patches = rows * columns;
        let mut rows_of_patches = Vec::with_capacity(chw.len());
        for row in 0..rows {
            for column in 0..columns {
                for channel in 0..self.channels {
                    for y in row * p..(row + 1) * p {
                        let start = channel * plane + y * width + column * p;
                        rows_of_patches.extend_from_slice(&chw[start..start + p]);
                    }
                }
            }
        }
        let pixels = pixel_input(rows_of_patches, &[patches, self.channels * p * p], device, dtype)?;
        let mut x = self.ln_pre.forward(&self.patch_conv.forward(&pixels)?)?;
        let (cos, sin) = self.rope_tables(rows, columns);
        let half = self.inv_freq.len();
        let cos = Tensor::from_f32(cos, &[patches, half])?.to_device(device)?;
        let sin = Tensor::from_f32(sin, &[patches, half])?.to_device(device)?;
        let head_dim = self.attention.head_dim;
        for l in &self.layers {
            let normed = l.attention_norm.forward(&x)?;
            let q = ops::rope(&l.q.forward(&normed)?, &cos, &sin, head_dim, RopeStyle::Neox)?;
            let k = ops::rope(&l.k.forward(&normed)?, &cos, &sin, head_dim, RopeStyle::Neox)?;
            let attn = ops::attention_dense(&q, &k, &l.v.forward(&normed)?, &self.attention, &[patches], false)?;
            x = ops::add(&x, &l.o.forward(&attn)?)?;
            x = ops::add(&x, &l.mlp.forward(&l.ffn_norm.forward(&x)?)?)?;
        }
        Ok(x)
    }
}

impl VisionEncoder for Mistral3 {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let [frames, rows, columns] = grid_thw;
        let (t, m) = (&self.tower, self.merge);
        let expected = t.channels * rows * t.patch * columns * t.patch;
        if frames != 1 || rows * columns == 0 || !rows.is_multiple_of(m) || !columns.is_multiple_of(m) {
            return Err(image_input_error(format!(
                "image grid {grid_thw:?}: Mistral 3 takes one image of whole {m}x{m} blocks of patches"
            )));
        }
        if pixel_values.len() != expected {
            return Err(image_input_error(format!(
                "{} pixel values for a {grid_thw:?} grid of {}-pixel patches: {expected} values",
                pixel_values.len(),
                t.patch
            )));
        }
        let table = &self.decoder.embed.table;
        let features =
            self.norm.forward(&t.forward(pixel_values, (rows, columns), table.device(), table.dtype())?)?;
        // Each merged block's patches in a row, block by block in row-major order, as unfold
        // walks the grid.
        let order: Vec<usize> = (0..rows / m)
            .flat_map(|br| (0..columns / m).map(move |bc| (br, bc)))
            .flat_map(|(br, bc)| (0..m * m).map(move |k| (br * m + k / m) * columns + bc * m + k % m))
            .collect();
        let width = features.last_dim() * m * m;
        let merged = ops::gather_rows(&features, &order)?.reshape(&[order.len() / (m * m), width])?;
        let hidden = ops::activation(&self.linear_1.forward(&self.merger.forward(&merged)?)?, self.act)?;
        Ok(Encoded { embeddings: self.linear_2.forward(&hidden)?, deepstack: Vec::new() })
    }
}

impl CausalLM for Mistral3 {
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
