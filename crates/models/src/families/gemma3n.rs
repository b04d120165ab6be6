//! Gemma 3n text (`Gemma3nForCausalLM`, `model_type: gemma3n_text`), and the text model of
//! `Gemma3nForConditionalGeneration` checkpoints (`text_config`, tensors under
//! `model.language_model.*`; images and audio are not read). Gemma 4's attention (per-head `x * w`
//! RMSNorms on queries and keys, a weightless one on values, scale 1, sliding and full layers with
//! their own rotary bases, the last `num_kv_shared_layers` layers reading the cache of the last
//! earlier layer of their type) and per-layer inputs, in a stream of its own shape:
//!
//! - AltUp: the stream is `altup_num_inputs` copies of the hidden state, side by side: the scaled
//!   embedding, then `altup_projections` of it brought to its RMS. A layer first predicts every
//!   copy from all of them, with coefficients routed (`modality_router`) from copy
//!   `altup_active_idx`; it runs on that copy's prediction, then corrects every prediction by its
//!   innovation on that copy, weighted by coefficients routed from its output. At the end the
//!   copies are brought back (`altup_unembed_projections`, the same RMS matching) and averaged.
//!   `altup_coef_clip` clamps the coefficients in training only, so it is not read.
//! - LAuReL: `x + norm(right(left(x)))` of the attention input (`laurel_rank` wide), added to the
//!   attention's residual sum, which is then scaled by `1 / sqrt(2)`.
//! - Activation sparsity: where `activation_sparsity_pattern[i]` is `p > 0`, layer `i` keeps the
//!   gate projections above `mean + std * icdf(p)` of their row (`relu` of the difference) before
//!   the activation.
//! - Per-layer inputs: the branch reads the corrected active copy (times `correct_output_scale`
//!   with `altup_correct_scale`) and joins every copy but the first. Token ids from
//!   `vocab_size_per_layer_input` up read that table's row 0, as transformers maps them.
//! - `intermediate_size` per layer; final-logit softcapping (30 by default).

use serde::Deserialize;
use serde_json::Value;

use ferrite_tensor::{ops, AttnMetadata, PagedKvLayer, Tensor, TensorError};

use super::gemma::GEMMA;
use crate::decoder::block::{LayerCache, LayerCaches, RopeTables};
use crate::decoder::load::{
    activation, attention_params, check_dims, is_sliding, kv_sources, lm_head, CommonConfig, Defaults, NormedAttention,
};
use crate::decoder::per_layer::PerLayerInputs;
use crate::decoder::{cache_slots, layer_caches, scalar_in_dtype, TokenMixer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Embedding, GatedMlp, Linear, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::{Scope, Weights};
use crate::model::{CausalLM, ForwardInput, ModelInfo};
use crate::Result;

const GEMMA3N: Defaults = Defaults { kv_heads: Some(2), max_positions: 32_768, ..GEMMA };

/// AltUp's floor under a copy's mean square before its RMS divides it.
const MIN_MEAN_SQUARE: f32 = 1e-5;

#[derive(Debug, Clone, Deserialize)]
struct Gemma3nConfig {
    #[serde(flatten)]
    common: CommonConfig,
    hidden_activation: Option<String>,
    /// One size for every layer or a list of one per layer; taken here so that `common`, whose
    /// field is a single size, does not see it.
    intermediate_size: Option<Value>,
}

pub struct Gemma3n {
    info: ModelInfo,
    embed: Embedding,
    /// `sqrt(hidden_size)` in the embedding's dtype.
    embed_scale: f32,
    per_layer: PerLayerInputs,
    /// `altup_projections`: the embedding into copies `1..` of the stream.
    altup_in: Vec<Linear>,
    /// `altup_unembed_projections`: copies `1..` back, before the copies are averaged.
    altup_out: Vec<Linear>,
    layers: Vec<Layer>,
    final_norm: RmsNorm,
    lm_head: Linear,
    softcap: Option<f32>,
    /// The sliding layers' rotary table, then the full layers'.
    ropes: Vec<Rope>,
    copies: Copies,
}

/// The stream's shape: `count` copies of `hidden` channels side by side; the layers run on copy
/// `active`.
#[derive(Debug, Clone, Copy)]
struct Copies {
    hidden: usize,
    count: usize,
    active: usize,
}

impl Copies {
    fn get(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        Ok(ops::narrow_cols(x, k * self.hidden, self.hidden)?)
    }
}

struct Layer {
    input_norm: RmsNorm,
    attn: TokenMixer,
    post_attn_norm: RmsNorm,
    laurel: Laurel,
    pre_ffw_norm: RmsNorm,
    mlp: GatedMlp,
    /// The standard normal's quantile at the layer's activation sparsity; `None` for a dense layer.
    sparsity: Option<f32>,
    post_ffw_norm: RmsNorm,
    altup: AltUp,
}

/// LAuReL's low-rank residual: `x + norm(right(left(x)))`.
struct Laurel {
    left: Linear,
    right: Linear,
    norm: RmsNorm,
}

struct AltUp {
    router_norm: RmsNorm,
    /// `1 / hidden_size`, on the router's normed input.
    router_scale: f32,
    modality_router: Linear,
    /// `[copies * copies, copies]`: row `i * copies + j` weighs copy `j` in the prediction of `i`.
    prediction: Linear,
    /// `correction_coefs`, with a bias of ones: transformers adds 1 to its output.
    correction: Linear,
    /// `correct_output_scale`, where `altup_correct_scale` applies it.
    output_scale: Option<Tensor>,
}

impl Laurel {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::add(x, &self.norm.forward(&self.right.forward(&self.left.forward(x)?)?)?)?)
    }
}

impl AltUp {
    /// `tanh(router(norm(x) / hidden))`, one coefficient input per copy.
    fn modalities(&self, x: &Tensor) -> Result<Tensor> {
        let routed = self.modality_router.forward(&ops::scale(&self.router_norm.forward(x)?, self.router_scale)?)?;
        // `softcap` with cap 1 is `tanh` to the bit (`tanh(x / 1) * 1`).
        Ok(ops::softcap(&routed, 1.0)?)
    }
}

impl Layer {
    /// The corrected predictions of every copy, from the copies `x [tokens, copies * hidden]`.
    fn forward(
        &self,
        x: &Tensor,
        c: Copies,
        ropes: &RopeTables,
        meta: &AttnMetadata,
        caches: LayerCaches,
    ) -> Result<Tensor> {
        let coefs = self.altup.prediction.forward(&self.altup.modalities(&c.get(x, c.active)?)?)?;
        let predictions = ops::add(&ops::mix_streams(x, &coefs, c.count)?, x)?;
        let active = c.get(&predictions, c.active)?;

        let normed = self.input_norm.forward(&active)?;
        let laurel = self.laurel.forward(&normed)?;
        let attn = self.post_attn_norm.forward(&self.attn.forward(&normed, None, ropes, meta, caches)?)?;
        // transformers divides by sqrt(2): the product by its inverse differs in the last bit at most.
        let h = ops::scale(&ops::add(&ops::add(&active, &attn)?, &laurel)?, std::f32::consts::FRAC_1_SQRT_2)?;
        let m = self.post_ffw_norm.forward(&self.mlp(&self.pre_ffw_norm.forward(&h)?)?)?;
        let activated = ops::add(&h, &m)?;

        let coefs = self.altup.correction.forward(&self.altup.modalities(&activated)?)?;
        let innovation = ops::add(&activated, &ops::scale(&active, -1.0)?)?;
        Ok(ops::add(&ops::mix_streams(&innovation, &coefs, c.count)?, &predictions)?)
    }

    fn mlp(&self, x: &Tensor) -> Result<Tensor> {
        let Some(quantile) = self.sparsity else { return self.mlp.forward(x) };
        let m = &self.mlp;
        let gate = ops::gaussian_topk(&m.gate.forward(x)?, quantile)?;
        m.down.forward(&ops::act_mul(&gate, &m.up.forward(x)?, m.act)?)
    }

    fn weight_bytes(&self) -> usize {
        let a = &self.altup;
        let linears = [&self.laurel.left, &self.laurel.right, &a.modality_router, &a.prediction, &a.correction];
        self.attn.weight_bytes() + self.mlp.weight_bytes() + linears.iter().map(|l| l.size_in_bytes()).sum::<usize>()
    }
}

impl Gemma3n {
    /// Layer `i`'s per-layer branch on its corrected active copy, added to every copy but the
    /// first.
    fn join_per_layer(&self, i: usize, corrected: &Tensor, input: &Tensor) -> Result<Tensor> {
        let c = self.copies;
        let mut first = c.get(corrected, c.active)?;
        if let Some(s) = &self.layers[i].altup.output_scale {
            first = ops::mul_row(&first, s)?;
        }
        let branch = self.per_layer.branch(i, &first, input)?;
        let mut copies = vec![c.get(corrected, 0)?];
        for k in 1..c.count {
            copies.push(ops::add(&c.get(corrected, k)?, &branch)?);
        }
        Ok(ops::concat_cols(&copies.iter().collect::<Vec<_>>())?)
    }

    /// The final norm's output at `input.logit_rows`.
    fn final_hidden(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        if input.embeds.is_some() {
            return Err(TensorError::Unsupported {
                op: "input embeddings",
                detail: format!("{} reads token ids only", self.info.architecture),
            }
            .into());
        }
        let meta = input.meta;
        let h = ops::scale(&self.embed.forward(input.tokens)?, self.embed_scale)?;
        let ropes = (self.ropes.iter())
            .map(|r| r.cos_sin(meta, h.device()).map(|(cos, sin)| (r, cos, sin)))
            .collect::<Result<Vec<_>>>()?;
        let slots = cache_slots(&self.layers.iter().map(|l| l.attn.cache()).collect::<Vec<_>>(), kv.len())?;
        let packed = self.per_layer.embed(input.tokens)?;

        let mut copies = vec![h.clone()];
        for p in &self.altup_in {
            copies.push(ops::match_rms(&p.forward(&h)?, &h, MIN_MEAN_SQUARE)?);
        }
        let mut x = ops::concat_cols(&copies.iter().collect::<Vec<_>>())?;
        for (i, layer) in self.layers.iter().enumerate() {
            let corrected = layer.forward(&x, self.copies, &ropes, meta, layer_caches(kv, slots[i]))?;
            x = self.join_per_layer(i, &corrected, &self.per_layer.input(i, &packed, &h)?)?;
        }

        let x = ops::gather_rows(&x, input.logit_rows)?;
        let first = self.copies.get(&x, 0)?;
        let mut sum = first.clone();
        for (k, p) in self.altup_out.iter().enumerate() {
            let back = p.forward(&self.copies.get(&x, k + 1)?)?;
            sum = ops::add(&sum, &ops::match_rms(&back, &first, MIN_MEAN_SQUARE)?)?;
        }
        // The mean as a product: the same bits as transformers' division for a power-of-two count
        // of copies (4 in every released checkpoint).
        self.final_norm.forward(&ops::scale(&sum, 1.0 / self.copies.count as f32)?)
    }
}

impl CausalLM for Gemma3n {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let logits = self.lm_head.forward(&self.final_hidden(input, kv)?)?;
        Ok(match self.softcap {
            Some(cap) => ops::softcap(&logits, cap)?,
            None => logits,
        })
    }

    fn rotary_depends_on_length(&self) -> bool {
        self.ropes.iter().any(Rope::depends_on_length)
    }

    fn rotary_recompute_at(&self) -> Option<usize> {
        self.ropes.iter().filter_map(Rope::long_factors_past).min()
    }

    fn token_embedding(&self) -> Option<&Embedding> {
        Some(&self.embed)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.final_hidden(input, kv)
    }
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<Gemma3n> {
    load_at(raw, &w.at("model"))
}

/// The text model of a `Gemma3nForConditionalGeneration` checkpoint.
pub fn load_conditional(raw: &RawConfig, w: &Weights) -> Result<Gemma3n> {
    let text = raw.text_config()?;
    if let Some(other) = text.value.get("model_type").and_then(Value::as_str).filter(|t| *t != "gemma3n_text") {
        return Err(raw.error(format!("text_config.model_type `{other}`: Gemma 3n loads a gemma3n_text model")));
    }
    load_at(&text, &w.at("model.language_model"))
}

fn flag(raw: &RawConfig, key: &str, default: bool) -> Result<bool> {
    match raw.value.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| raw.error(format!("`{key}` must be true or false, not {v}"))),
    }
}

/// `intermediate_size`: one size for every layer, or one per layer (transformers' default 16384).
fn intermediate_sizes(raw: &RawConfig, value: Option<&Value>, layers: usize) -> Result<Vec<usize>> {
    let bad = || raw.error("`intermediate_size` must be a size or a list of one size per layer");
    let sizes = match value {
        None | Some(Value::Null) => vec![16_384; layers],
        Some(Value::Array(list)) => {
            if list.len() != layers {
                return Err(raw.error(format!("`intermediate_size` lists {} sizes for {layers} layers", list.len())));
            }
            list.iter().map(|v| v.as_u64().map(|n| n as usize).ok_or_else(bad)).collect::<Result<_>>()?
        }
        Some(v) => vec![v.as_u64().ok_or_else(bad)? as usize; layers],
    };
    for &size in &sizes {
        check_dims(raw, &[("intermediate_size", size)])?;
    }
    Ok(sizes)
}

/// Each layer's sparsity quantile from `activation_sparsity_pattern` (transformers' default: 0.95
/// on the first 10 layers of a model with more than 10, else dense).
fn sparsity_quantiles(raw: &RawConfig, layers: usize) -> Result<Vec<Option<f32>>> {
    let pattern: Vec<f64> = match raw.value.get("activation_sparsity_pattern") {
        None | Some(Value::Null) => {
            let sparse = if layers > 10 { 10 } else { 0 };
            (0..layers).map(|i| if i < sparse { 0.95 } else { 0.0 }).collect()
        }
        Some(Value::Array(list)) if list.len() == layers => list
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| raw.error(format!("`activation_sparsity_pattern` entry {v}"))))
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(
                raw.error(format!("`activation_sparsity_pattern` must list one sparsity for each of {layers} layers"))
            )
        }
    };
    pattern
        .into_iter()
        .map(|p| match p {
            0.0 => Ok(None),
            p if p > 0.0 && p < 1.0 => Ok(Some(normal_icdf(p as f32))),
            p => Err(raw.error(format!("`activation_sparsity_pattern` entry {p} is not a fraction in [0, 1)"))),
        })
        .collect()
}

/// `torch.distributions.Normal(0, 1).icdf(p)` for an f32 `p`: `erfinv(2p - 1) * sqrt(2)` in f32,
/// with the inverse error function evaluated in f64 and rounded once. Torch's single-precision
/// `erfinv` is correctly rounded nearly everywhere, which the same algorithm in f32 arithmetic is
/// not; rounded from f64 it gives torch's bits at every sparsity of a 0.01 grid.
fn normal_icdf(p: f32) -> f32 {
    let y = 2.0 * p - 1.0;
    erfinv(y as f64) as f32 * std::f64::consts::SQRT_2 as f32
}

/// ATen's `calc_erfinv`: a rational first guess, then two Newton steps.
fn erfinv(y: f64) -> f64 {
    const A: [f64; 4] = [0.886226899, -1.645349621, 0.914624893, -0.140543331];
    const B: [f64; 4] = [-2.118377725, 1.442710462, -0.329097515, 0.012229801];
    const C: [f64; 4] = [-1.970840454, -1.624906493, 3.429567803, 1.641345311];
    const D: [f64; 2] = [3.543889200, 1.637067800];
    let y_abs = y.abs();
    if y_abs >= 1.0 {
        return if y_abs == 1.0 { f64::INFINITY.copysign(y) } else { f64::NAN };
    }
    let mut x = if y_abs <= 0.7 {
        let z = y * y;
        let num = ((A[3] * z + A[2]) * z + A[1]) * z + A[0];
        let dem = (((B[3] * z + B[2]) * z + B[1]) * z + B[0]) * z + 1.0;
        y * num / dem
    } else {
        let z = (-((1.0 - y_abs) / 2.0).ln()).sqrt();
        let num = ((C[3] * z + C[2]) * z + C[1]) * z + C[0];
        let dem = (D[1] * z + D[0]) * z + 1.0;
        num.copysign(y) / dem
    };
    for _ in 0..2 {
        x -= (libm::erf(x) - y) / (std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp());
    }
    x
}

fn load_at(raw: &RawConfig, model: &Scope) -> Result<Gemma3n> {
    let cfg: Gemma3nConfig = raw.parse()?;
    let mut d = cfg.common.resolve(raw, GEMMA3N)?;
    d.act = activation(raw, "hidden_activation", cfg.hidden_activation.as_deref().unwrap_or(GEMMA3N.act))?;
    let (hidden, layers, eps) = (d.hidden, d.layers, d.eps);
    let inter = intermediate_sizes(raw, cfg.intermediate_size.as_ref(), layers)?;
    let sparsity = sparsity_quantiles(raw, layers)?;
    let sliding: Vec<bool> = match &d.layer_types {
        Some(t) => (0..layers).map(|i| is_sliding(raw, t, i)).collect::<Result<_>>()?,
        None => (0..layers).map(|i| (i + 1) % 5 != 0).collect(),
    };
    let window = d.sliding_window.unwrap_or(512);
    let copies = raw.count_or("altup_num_inputs", 4)?;
    let active = raw.count_or("altup_active_idx", 0)?;
    let rank = raw.count_or("laurel_rank", 64)?;
    let width = raw.count_or("hidden_size_per_layer_input", 256)?;
    let per_layer_vocab = raw.count_or("vocab_size_per_layer_input", 262_144)?;
    check_dims(
        raw,
        &[
            ("sliding_window", window),
            ("altup_num_inputs", copies),
            ("altup_num_inputs * altup_num_inputs", copies.saturating_mul(copies)),
            ("laurel_rank", rank),
            ("hidden_size_per_layer_input", width),
            ("hidden_size_per_layer_input * num_hidden_layers", width.saturating_mul(layers)),
            ("vocab_size_per_layer_input", per_layer_vocab),
        ],
    )?;
    if active >= copies {
        return Err(raw.error(format!("`altup_active_idx` {active} is not one of the {copies} AltUp inputs")));
    }
    let softcap = match raw.value.get("final_logit_softcapping") {
        None => Some(30.0),
        Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
            _ => return Err(raw.error(format!("`final_logit_softcapping` must be a positive number or null, not {v}"))),
        },
    };
    let sources = kv_sources(raw, &sliding, raw.count_or("num_kv_shared_layers", 15)?)?;
    let [local, global] = RopeParameters::sliding_and_full(raw, 10_000.0, 1_000_000.0)?;
    let ropes = vec![
        Rope::new(&local, d.head_dim, d.max_positions, raw)?,
        Rope::new(&global, d.head_dim, d.max_positions, raw)?,
    ];

    let embed = Embedding { table: model.weights().matrix(&model.name("embed_tokens.weight"), &[d.vocab, hidden])? };
    let embed_scale = scalar_in_dtype((hidden as f64).sqrt(), embed.table.dtype());
    let mut per_layer = PerLayerInputs::load(model, layers, hidden, width, per_layer_vocab, d.act, eps)?;
    if per_layer_vocab < d.vocab {
        // Copies of row 0 for the ids transformers maps to 0, so that the lookup stays a gather by
        // the step's own ids, which a CUDA graph replays. (On the CPU the gather widens a bf16
        // table to f32, as it does activations.)
        let rows: Vec<u32> = (0..d.vocab).map(|id| if id < per_layer_vocab { id as u32 } else { 0 }).collect();
        per_layer.table = ops::embedding(&per_layer.table, &rows)?;
    }
    let projections = |leaf: &str| -> Result<Vec<Linear>> {
        (0..copies - 1).map(|k| model.linear(&format!("{leaf}.{k}"), hidden, hidden, false)).collect()
    };
    let (altup_in, altup_out) = (projections("altup_projections")?, projections("altup_unembed_projections")?);
    let correct_scale = flag(raw, "altup_correct_scale", true)?;
    let ones = Tensor::from_f32(vec![1.0; copies], &[copies])?.to_device(model.weights().device())?;

    let layers = (0..layers)
        .map(|i| {
            let l = model.at(&format!("layers.{i}"));
            let rms = |leaf: &str| l.rms(leaf, hidden, eps);
            let a = l.at("altup");
            let correction = a.linear("correction_coefs", copies, copies, false)?;
            let attn = NormedAttention {
                params: attention_params(d.heads, d.kv_heads, d.head_dim, 1.0, sliding[i].then_some(window), None),
                eps,
                bias: d.attention_bias,
                rope: if sliding[i] { 0 } else { 1 },
                source: sources[i],
                values_from_keys: false,
            };
            Ok(Layer {
                input_norm: rms("input_layernorm")?,
                attn: attn.load(&l.at("self_attn"), hidden)?,
                post_attn_norm: rms("post_attention_layernorm")?,
                laurel: Laurel {
                    left: l.linear("laurel.linear_left", hidden, rank, false)?,
                    right: l.linear("laurel.linear_right", rank, hidden, false)?,
                    norm: rms("laurel.post_laurel_norm")?,
                },
                pre_ffw_norm: rms("pre_feedforward_layernorm")?,
                mlp: l.gated_mlp("mlp", hidden, inter[i], d.act, false)?,
                sparsity: sparsity[i],
                post_ffw_norm: rms("post_feedforward_layernorm")?,
                altup: AltUp {
                    router_norm: a.rms("router_norm", hidden, eps)?,
                    router_scale: (hidden as f64).recip() as f32,
                    modality_router: a.linear("modality_router", hidden, copies, false)?,
                    prediction: a.linear("prediction_coefs", copies, copies * copies, false)?,
                    correction: Linear::new(correction.weight, Some(ones.clone())),
                    output_scale: correct_scale.then(|| a.get_f32("correct_output_scale", &[hidden])).transpose()?,
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;

    let lm_head = lm_head(model.weights(), "lm_head", &embed, d.tie, false)?;
    let tied = std::ptr::eq(embed.table.storage(), lm_head.weight.storage());
    let weight_bytes = embed.table.size_in_bytes()
        + if tied { 0 } else { lm_head.size_in_bytes() }
        + per_layer.weight_bytes()
        + altup_in.iter().chain(&altup_out).map(Linear::size_in_bytes).sum::<usize>()
        + layers.iter().map(Layer::weight_bytes).sum::<usize>();
    let info = ModelInfo {
        architecture: raw.architecture()?,
        vocab_size: lm_head.out_features(),
        max_position_embeddings: d.max_positions,
        kv_layers: (layers.iter())
            .filter_map(|l| match l.attn.cache() {
                LayerCache::Kv(spec) => Some(spec),
                _ => None,
            })
            .collect(),
        kv_scales: Vec::new(),
        state_layers: Vec::new(),
        num_layers: layers.len(),
        weight_bytes,
        vision: None,
    };
    Ok(Gemma3n {
        info,
        embed,
        embed_scale,
        per_layer,
        altup_in,
        altup_out,
        layers,
        final_norm: model.rms("norm", hidden, eps)?,
        lm_head,
        softcap,
        ropes,
        copies: Copies { hidden, count: copies, active },
    })
}

#[cfg(test)]
mod tests {
    use super::normal_icdf;

    /// `torch.distributions.Normal(0, 1).icdf(torch.tensor(p, dtype=torch.float32))` in torch
    /// 2.15 (transformers 5.24's oracle), as f32 bits.
    #[test]
    fn normal_quantiles_match_torch() {
        let torch: [(f64, u32); 13] = [
            (0.95, 0x3fd2_8a90),
            (0.3, 0xbf06_3f1c),
            (0.75, 0x3f2c_ab5c),
            (0.99, 0x4014_e2e4),
            (0.05, 0xbfd2_8a90),
            (0.6, 0x3e81_b6b8),
            (0.9, 0x3fa4_09e1),
            (0.85, 0x3f84_a9da),
            (0.35, 0xbec5_48ba),
            (0.999, 0x4045_c66e),
            (0.01, 0xc014_e2e4),
            (0.2, 0xbf57_747e),
            (0.7, 0x3f06_3f1c),
        ];
        for (p, bits) in torch {
            let got = normal_icdf(p as f32);
            assert_eq!(got.to_bits(), bits, "icdf({p}) = {got}, torch {}", f32::from_bits(bits));
        }
        assert_eq!(normal_icdf(0.5), 0.0);
    }
}
