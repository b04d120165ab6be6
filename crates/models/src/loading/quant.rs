//! Quantized checkpoints: what `config.json`'s `quantization_config` says, as vLLM reads it.
//!
//! FP8 checkpoints store each quantized linear's weight in e4m3 beside its scales. The weights
//! are dequantized as they load (`f32(w) * f32(scale)`, the scale broadcast per tensor, per
//! output channel or per block), which is what transformers computes with on a CPU; the inputs of
//! a compressed-tensors W8A8 linear are then quantized per token, per group or by a stored scale
//! ([`ActivationQuant`]) before the product. Which tensors are quantized is read off the
//! checkpoint (an e4m3 weight has a scale next to it); the config says how.
//!
//! compressed-tensors' pack-quantized format (W4A16, W8A16) stores integer weights packed into
//! int32 words (`weight_packed`, `weight_shape`) with f32/bf16 scales per output channel or per
//! group of inputs; they are unpacked and dequantized the same way (`f32(q) * f32(scale)`).
//!
//! compressed-tensors' nvfp4-pack-quantized format (NVFP4A16, weight-only) stores FP4 e2m1 codes two
//! to a byte (`weight_packed`), an e4m3 scale per group of 16 inputs (`weight_scale`) and an f32
//! `weight_global_scale` per tensor that each group scale is divided by; they are dequantized as
//! compressed-tensors decompresses them ([`dequantize_nvfp4`]).
//!
//! GPTQ and AWQ (GEMM) checkpoints store 4- or 8-bit integers with a zero point and an f16 scale per
//! group (`qweight`, `qzeros`, `scales`, GPTQ's `g_idx`). They are dequantized at load as gptqmodel
//! (which transformers runs both formats through) does in its torch kernels: `scale * (q - zero)`
//! rounded to the scales' dtype.

use ferrite_tensor::int4::Int4Matrix;
use ferrite_tensor::ActivationQuant;
use half::bf16;
use regex::Regex;
use serde_json::Value;

use crate::loading::config::RawConfig;
use crate::Result;

/// A checkpoint's quantization method.
#[derive(Debug, Clone)]
pub enum Quantization {
    /// compressed-tensors (`quant_method: compressed-tensors`), the format llm-compressor
    /// writes: FP8 weights per tensor, channel or block (`float-quantized`) with FP8 inputs per
    /// token, per group or with a static scale; packed integer weights (`pack-quantized`); NVFP4
    /// weights (`nvfp4-pack-quantized`).
    CompressedTensors(CompressedTensors),
    /// `quant_method: fp8` with `weight_block_size` (DeepSeek-V3, Qwen3-*-FP8): e4m3 weights with
    /// one `weight_scale_inv` per block.
    Fp8Block { block: [usize; 2] },
    /// gpt-oss's MXFP4 experts, which its family loader unpacks.
    Mxfp4,
    /// `quant_method: gptq` (AutoGPTQ, GPTQModel).
    Gptq(Gptq),
    /// `quant_method: awq` in AutoAWQ's GEMM layout, 4 bits with zero points.
    Awq(Awq),
    /// `--quantization fp8` on an unquantized checkpoint: each linear layer's weight rounded to
    /// e4m3 with one scale per output channel as it loads, its input quantized per token, which
    /// is what llm-compressor's FP8_DYNAMIC scheme stores (vLLM's online FP8). The LM head, the
    /// routers and the experts of MoE layers stay as they are.
    OnlineFp8,
}

/// A GPTQ checkpoint: `qweight` `[in / (32 / bits), out]` packed along the inputs, `qzeros`
/// `[groups, out / (32 / bits)]` packed along the outputs, `scales` `[groups, out]` and `g_idx`
/// `[in]`, each input's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gptq {
    pub bits: u32,
    /// Inputs per group, for checkpoints without `g_idx`; `None` for one group over all inputs
    /// (`group_size: -1`).
    pub group: Option<usize>,
    /// `desc_act`: groups follow an activation order, so `g_idx` must be stored.
    pub act_order: bool,
    /// `checkpoint_format: gptq` (v1, the default) stores each zero point minus one; `gptq_v2`
    /// stores it as is.
    pub zeros_minus_one: bool,
}

/// An AWQ GEMM checkpoint: `qweight` `[in, out / 8]` and `qzeros` `[in / group, out / 8]`, eight
/// 4-bit values a word in the order of [`AWQ_ORDER`], and `scales` `[in / group, out]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Awq {
    pub group: usize,
}

/// The output column of each 4-bit field of an AWQ word, low bits first (AutoAWQ's pack order).
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// How an FP8 weight's scales cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightScales {
    Tensor,
    /// One per output row.
    Channel,
    /// One per `[rows, cols]` block; the last block of a dimension may be partial.
    Block([usize; 2]),
    /// One per output row and run of this many inputs (the last run may be partial).
    Group(usize),
}

#[derive(Debug, Clone)]
pub struct CompressedTensors {
    groups: Vec<SchemeGroup>,
}

#[derive(Debug, Clone)]
struct SchemeGroup {
    name: String,
    targets: Vec<Target>,
    weights: WeightScales,
    stored: StoredWeights,
    inputs: Option<InputScheme>,
}

/// How a compressed-tensors scheme's weights are stored, from `quantization_config.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoredWeights {
    /// `float-quantized`: e4m3 weights beside their scales.
    Fp8,
    /// `pack-quantized`: integers of this many bits in int32 words.
    Int(u32),
    /// `nvfp4-pack-quantized`: e2m1 codes two to a byte, e4m3 group scales and a global scale.
    Nvfp4,
}

#[derive(Debug, Clone)]
enum Target {
    /// `Linear`: every quantized module (only linear layers carry FP8 weights).
    Linear,
    /// `re:...`: module names the pattern matches from their start (Python's `re.match`).
    Pattern(Regex),
    Name(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum InputScheme {
    Dynamic(ActivationQuant),
    /// The module's own `input_scale`.
    Static,
}

impl Quantization {
    /// The checkpoint's quantization, `None` for an unquantized one; an unsupported method or
    /// scheme is an error naming the key.
    pub fn from_config(raw: &RawConfig) -> Result<Option<Quantization>> {
        let Some(q) = raw.value.get("quantization_config") else { return Ok(None) };
        if q.is_null() {
            return Ok(None);
        }
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
        match method {
            "compressed-tensors" => CompressedTensors::parse(raw, q).map(|c| Some(Quantization::CompressedTensors(c))),
            "fp8" => {
                let block = q.get("weight_block_size").filter(|b| !b.is_null()).ok_or_else(|| {
                    raw.error(
                        "`quantization_config`: quant_method fp8 without `weight_block_size` (per-tensor fp8 \
                         checkpoints) is not supported; block-quantized ones (DeepSeek-V3, Qwen3-FP8) are",
                    )
                })?;
                let block = block_size(raw, block, "quantization_config.weight_block_size")?;
                let fmt = q.get("fmt").and_then(Value::as_str).unwrap_or("e4m3");
                if fmt != "e4m3" {
                    return Err(raw.error(format!("`quantization_config.fmt` {fmt}: only e4m3 FP8 is supported")));
                }
                Ok(Some(Quantization::Fp8Block { block }))
            }
            "mxfp4" => Ok(Some(Quantization::Mxfp4)),
            "gptq" => Gptq::parse(raw, q).map(|g| Some(Quantization::Gptq(g))),
            "awq" => Awq::parse(raw, q).map(|a| Some(Quantization::Awq(a))),
            other => Err(raw.error(format!(
                "`quantization_config.quant_method` {other:?} is not supported; supported: compressed-tensors \
                 (FP8, W4A16, W8A16, NVFP4A16), fp8 (block-quantized), gptq, awq (GEMM), mxfp4 (gpt-oss)"
            ))),
        }
    }

    /// The checkpoint's quantization, or the one `requested` with vLLM's `--quantization`: a
    /// request must name the checkpoint's own method, or ask for `fp8` on an unquantized one.
    pub fn resolve(raw: &RawConfig, requested: Option<&str>) -> Result<Option<Quantization>> {
        let stored = Quantization::from_config(raw)?;
        match (stored, requested) {
            (stored, None) => Ok(stored),
            (None, Some("fp8")) => Ok(Some(Quantization::OnlineFp8)),
            (None, Some(other)) => Err(raw.error(format!(
                "--quantization {other}: the checkpoint has no `quantization_config`, and the one method ferrite                  quantizes to at load is fp8"
            ))),
            (Some(stored), Some(requested)) if stored.method() == requested => Ok(Some(stored)),
            (Some(stored), Some(requested)) => Err(raw.error(format!(
                "--quantization {requested} does not match the checkpoint's `quantization_config.quant_method` {}                  (leave the flag out to use the checkpoint's)",
                stored.method()
            ))),
        }
    }

    /// The method as `quant_method` and vLLM's `--quantization` spell it.
    pub fn method(&self) -> &'static str {
        match self {
            Quantization::CompressedTensors(_) => "compressed-tensors",
            Quantization::Fp8Block { .. } | Quantization::OnlineFp8 => "fp8",
            Quantization::Mxfp4 => "mxfp4",
            Quantization::Gptq(_) => "gptq",
            Quantization::Awq(_) => "awq",
        }
    }

    /// How the scales of module `module`'s e4m3 weight cover it, and the name of its scale.
    pub fn weight_scales(&self, module: &str) -> Result<(WeightScales, String)> {
        match self {
            Quantization::CompressedTensors(ct) => Ok((ct.group_of(module)?.weights, format!("{module}.weight_scale"))),
            Quantization::Fp8Block { block } => Ok((WeightScales::Block(*block), format!("{module}.weight_scale_inv"))),
            Quantization::Mxfp4 | Quantization::OnlineFp8 | Quantization::Gptq(_) | Quantization::Awq(_) => {
                Err(crate::ModelError::Config {
                    path: module.into(),
                    message: format!("an FP8 weight in a checkpoint whose quantization is {}", self.method()),
                })
            }
        }
    }

    /// For a pack-quantized checkpoint, module `module`'s bits per weight and how its scales
    /// cover it; an error for any other quantization.
    pub fn packed_weight(&self, module: &str) -> Result<(u32, WeightScales)> {
        let group = match self {
            Quantization::CompressedTensors(ct) => Some(ct.group_of(module)?),
            _ => None,
        };
        match group.map(|g| (g.stored, g.weights)) {
            Some((StoredWeights::Int(bits), how)) => Ok((bits, how)),
            _ => Err(crate::ModelError::Config {
                path: module.into(),
                message: format!(
                    "`{module}.weight_packed` in a checkpoint whose quantization_config is not compressed-tensors' \
                     pack-quantized format"
                ),
            }),
        }
    }

    /// Whether module `module`'s `weight_packed` holds NVFP4 codes (compressed-tensors'
    /// nvfp4-pack-quantized format) rather than packed integers.
    pub fn is_nvfp4(&self, module: &str) -> Result<bool> {
        match self {
            Quantization::CompressedTensors(ct) => Ok(ct.group_of(module)?.stored == StoredWeights::Nvfp4),
            _ => Ok(false),
        }
    }

    /// How the input of quantized module `module` is quantized, `None` for weight-only schemes.
    /// A static scheme's scale is read by the caller from `{module}.input_scale`.
    pub fn input_scheme(&self, module: &str) -> Result<Option<InputQuantSource>> {
        if matches!(self, Quantization::OnlineFp8) {
            return Ok(Some(InputQuantSource::Dynamic(ActivationQuant::PerToken)));
        }
        let Quantization::CompressedTensors(ct) = self else { return Ok(None) };
        Ok(ct.group_of(module)?.inputs.map(|i| match i {
            InputScheme::Dynamic(q) => InputQuantSource::Dynamic(q),
            InputScheme::Static => InputQuantSource::StaticScale(format!("{module}.input_scale")),
        }))
    }
}

/// Where a W8A8 linear's input scale comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum InputQuantSource {
    Dynamic(ActivationQuant),
    /// The tensor holding the fixed scale.
    StaticScale(String),
}

fn block_size(raw: &RawConfig, v: &Value, key: &str) -> Result<[usize; 2]> {
    let dims: Option<Vec<usize>> =
        v.as_array().map(|a| a.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
    match dims.as_deref() {
        Some(&[rows, cols]) if (1..=1 << 16).contains(&rows) && (1..=1 << 16).contains(&cols) => Ok([rows, cols]),
        _ => Err(raw.error(format!("`{key}` must be two block sizes [rows, cols], got {v}"))),
    }
}

/// `quantization_config.{key}` as written, for error messages.
fn shown(q: &Value, key: &str) -> String {
    q.get(key).map_or_else(|| "(absent)".into(), Value::to_string)
}

impl Gptq {
    fn parse(raw: &RawConfig, q: &Value) -> Result<Gptq> {
        let bits = match q.get("bits").and_then(Value::as_u64) {
            Some(b @ (4 | 8)) => b as u32,
            _ => {
                return Err(raw.error(format!(
                    "`quantization_config.bits` {}: GPTQ checkpoints of 4 and 8 bits are supported",
                    shown(q, "bits")
                )))
            }
        };
        let group = match q.get("group_size").and_then(Value::as_i64) {
            Some(-1) => None,
            Some(g) if (1..=1 << 16).contains(&g) => Some(g as usize),
            _ => {
                return Err(raw.error(format!(
                    "`quantization_config.group_size` {}: a positive group size or -1 (one group over all inputs) \
                     is supported",
                    shown(q, "group_size")
                )))
            }
        };
        let zeros_minus_one = match q.get("checkpoint_format").filter(|f| !f.is_null()).map(Value::as_str) {
            None | Some(Some("gptq")) => true,
            Some(Some("gptq_v2")) => false,
            Some(_) => {
                return Err(raw.error(format!(
                    "`quantization_config.checkpoint_format` {}: GPTQ's gptq (v1) and gptq_v2 layouts are supported",
                    shown(q, "checkpoint_format")
                )))
            }
        };
        if q.get("is_marlin_format").and_then(Value::as_bool) == Some(true) {
            return Err(raw.error("`quantization_config.is_marlin_format` true: GPTQ's Marlin layout is not supported"));
        }
        if q.get("pack_dtype").is_some_and(|d| !d.is_null() && d.as_str() != Some("int32")) {
            return Err(raw.error(format!(
                "`quantization_config.pack_dtype` {}: GPTQ weights packed in int32 words are supported",
                shown(q, "pack_dtype")
            )));
        }
        let act_order = q.get("desc_act").and_then(Value::as_bool).unwrap_or(false);
        Ok(Gptq { bits, group, act_order, zeros_minus_one })
    }
}

impl Awq {
    fn parse(raw: &RawConfig, q: &Value) -> Result<Awq> {
        match q.get("version").filter(|v| !v.is_null()).map(Value::as_str) {
            None => {}
            Some(Some(v)) if v.eq_ignore_ascii_case("gemm") => {}
            Some(_) => {
                return Err(raw.error(format!(
                    "`quantization_config.version` {}: AWQ's GEMM layout is supported (GEMV, exllama, marlin and ipex \
                     are not)",
                    shown(q, "version")
                )))
            }
        }
        if q.get("bits").and_then(Value::as_u64) != Some(4) {
            return Err(raw.error(format!(
                "`quantization_config.bits` {}: 4-bit AWQ checkpoints are supported",
                shown(q, "bits")
            )));
        }
        if q.get("zero_point").and_then(Value::as_bool) == Some(false) {
            return Err(raw.error("`quantization_config.zero_point` false: AWQ without zero points is not supported"));
        }
        // llm-awq's own packing differs from AutoAWQ's, which transformers calls `autoawq`.
        if q.get("backend").is_some_and(|b| !b.is_null() && b.as_str() != Some("autoawq")) {
            return Err(raw.error(format!(
                "`quantization_config.backend` {}: AutoAWQ's layout (autoawq) is supported",
                shown(q, "backend")
            )));
        }
        let group = q.get("group_size").and_then(Value::as_i64).filter(|g| (1..=1 << 16).contains(g));
        let group = group.ok_or_else(|| {
            raw.error(format!(
                "`quantization_config.group_size` {}: AWQ needs a positive group size",
                shown(q, "group_size")
            ))
        })?;
        Ok(Awq { group: group as usize })
    }
}

/// A GPTQ or AWQ linear's integer tensors as stored: shapes and values.
pub struct ZeroPointParts<'a> {
    pub qweight: (&'a [usize], &'a [i64]),
    pub qzeros: (&'a [usize], &'a [i64]),
    pub g_idx: Option<(&'a [usize], &'a [i64])>,
}

/// What went wrong dequantizing a GPTQ or AWQ linear: the tensor at fault (`qweight`, `qzeros`,
/// `scales`, `g_idx`) and why.
pub type PartError = (&'static str, String);

/// The `bits`-bit field `j` of each int32 word, low bits first (an `i64` holds the word's value).
fn field(word: i64, j: usize, bits: u32) -> i32 {
    ((word as u32 >> (j as u32 * bits)) & ((1u32 << bits) - 1)) as i32
}

fn expect_shape(
    leaf: &'static str,
    shape: &[usize],
    values: usize,
    expected: &[usize],
) -> std::result::Result<(), PartError> {
    if shape != expected || values != expected.iter().product::<usize>() {
        return Err((leaf, format!("shape {shape:?}, expected {expected:?}")));
    }
    Ok(())
}

/// The scales' shape `[groups, out]`, checked against their count.
fn scale_dims(scales: &[f32], scale_shape: &[usize]) -> std::result::Result<(usize, usize), PartError> {
    match *scale_shape {
        [groups, out] if groups > 0 && out > 0 && groups.checked_mul(out) == Some(scales.len()) => {
            if scales.iter().any(|s| !s.is_finite()) {
                return Err(("scales", "a scale is not finite".into()));
            }
            Ok((groups, out))
        }
        _ => Err(("scales", format!("shape {scale_shape:?} for {} values; expected [groups, out]", scales.len()))),
    }
}

/// A GPTQ linear's parts checked against each other: each input's group and each group's zero
/// points.
struct GptqLayout {
    inputs: usize,
    out: usize,
    /// `g_idx`, else `i / group`.
    group_of: Vec<usize>,
    /// `[groups, out]`, a v1 checkpoint's already plus one.
    zeros: Vec<i32>,
}

impl GptqLayout {
    fn read(
        gptq: &Gptq,
        parts: &ZeroPointParts,
        scales: &[f32],
        scale_shape: &[usize],
    ) -> std::result::Result<Self, PartError> {
        let bits = gptq.bits;
        let per_word = (32 / bits) as usize;
        let (groups, out) = scale_dims(scales, scale_shape)?;
        let (qw_shape, qweight) = parts.qweight;
        let &[words_in, _] = qw_shape else {
            return Err(("qweight", format!("shape {qw_shape:?}, expected [in / {per_word}, out]")));
        };
        let inputs = words_in.checked_mul(per_word).filter(|&i| i <= crate::decoder::load::MAX_DIM);
        let inputs = inputs.ok_or_else(|| ("qweight", format!("shape {qw_shape:?} is out of range")))?;
        expect_shape("qweight", qw_shape, qweight.len(), &[words_in, out])?;
        let (qz_shape, qzeros) = parts.qzeros;
        let zero_words = out.div_ceil(per_word);
        expect_shape("qzeros", qz_shape, qzeros.len(), &[groups, zero_words])?;
        let group_of: Vec<usize> = match parts.g_idx {
            Some((shape, g_idx)) => {
                expect_shape("g_idx", shape, g_idx.len(), &[inputs])?;
                g_idx
                    .iter()
                    .map(|&g| usize::try_from(g).ok().filter(|&g| g < groups))
                    .collect::<Option<_>>()
                    .ok_or_else(|| ("g_idx", format!("a group outside 0..{groups}")))?
            }
            None if gptq.act_order => return Err(("g_idx", "missing, and desc_act orders the groups by it".into())),
            None => {
                let size = gptq.group.unwrap_or(inputs).max(1);
                if inputs.div_ceil(size) != groups {
                    return Err(("scales", format!("{groups} groups for {inputs} inputs in groups of {size}")));
                }
                (0..inputs).map(|i| i / size).collect()
            }
        };
        let carry = match (gptq.zeros_minus_one, bits) {
            (false, _) => 0,
            (true, 4) => 0x1111_1111u32,
            (true, _) => 0x0101_0101,
        };
        let zeros = qzeros
            .chunks(zero_words)
            .flat_map(|row| {
                (0..out).map(move |o| field((row[o / per_word] as u32).wrapping_add(carry) as i64, o % per_word, bits))
            })
            .collect();
        Ok(GptqLayout { inputs, out, group_of, zeros })
    }
}

/// A GPTQ linear's weight `[out, in]`: `scale[g] * (q - zero[g])` with `g` the input's group
/// (`g_idx`, else `i / group`), each product rounded by `round` (to the scales' dtype), as
/// gptqmodel 7.7.0's `TorchLinear.dequantize_weight` computes it. A v1 checkpoint's zeros get one
/// added to every field of their int32 words at once, as gptqmodel's v1-to-v2 conversion does
/// (a field stored as all ones carries into the next).
pub fn dequantize_gptq(
    gptq: &Gptq,
    parts: &ZeroPointParts,
    scales: &[f32],
    scale_shape: &[usize],
    round: fn(f32) -> f32,
) -> std::result::Result<(Vec<f32>, [usize; 2]), PartError> {
    let GptqLayout { inputs, out, group_of, zeros } = GptqLayout::read(gptq, parts, scales, scale_shape)?;
    let (bits, per_word) = (gptq.bits, (32 / gptq.bits) as usize);
    let qweight = parts.qweight.1;
    let mut weight = vec![0f32; out * inputs];
    for (i, &g) in group_of.iter().enumerate() {
        let words = &qweight[(i / per_word) * out..][..out];
        let (scales, zeros) = (&scales[g * out..][..out], &zeros[g * out..][..out]);
        for o in 0..out {
            let q = field(words[o], i % per_word, bits);
            weight[o * inputs + i] = round(scales[o] * (q - zeros[o]) as f32);
        }
    }
    Ok((weight, [out, inputs]))
}

/// A GPTQ linear as an [`Int4Matrix`], where it is one: 4 bits, every zero point 8 (symmetric,
/// as `sym: true` quantizes), and groups in input order (no `g_idx`, or one that is `i / group`).
/// The words are GPTQ's, transposed: both put input `i` in bits `4 (i % 8)` of a word. The scales
/// are rounded to bf16, as vLLM's kernels take them in a bf16 model; so each weight is
/// `bf16(bf16(scale) * (q - 8))`, where the dequantized weight rounds the product in the scales'
/// own dtype. `None` where the matrix is not of that form (it is then dequantized).
pub fn gptq_as_int4(
    gptq: &Gptq,
    parts: &ZeroPointParts,
    scales: &[f32],
    scale_shape: &[usize],
) -> std::result::Result<Option<Int4Matrix>, PartError> {
    let GptqLayout { inputs, out, group_of, zeros } = GptqLayout::read(gptq, parts, scales, scale_shape)?;
    let group = gptq.group.unwrap_or(inputs);
    let in_order = group_of.iter().enumerate().all(|(i, &g)| g == i / group);
    if gptq.bits != 4 || !zeros.iter().all(|&z| z == 8) || !in_order || !inputs.is_multiple_of(group) {
        return Ok(None);
    }
    let (words_in, qweight) = (inputs / 8, parts.qweight.1);
    let packed = (0..out * words_in).map(|k| qweight[(k % words_in) * out + k / words_in] as u32).collect();
    let groups = inputs / group;
    let scales = (0..out * groups).map(|k| bf16::from_f32(scales[(k % groups) * out + k / groups])).collect();
    Int4Matrix::new(out, inputs, group, packed, scales).map(Some).map_err(|m| ("qweight", m))
}

/// An AWQ GEMM linear's weight `[out, in]`: `scale[g] * (q - zero[g])` with `g = i / group`, the
/// fields of each word read in [`AWQ_ORDER`] and each product rounded by `round` (to the scales'
/// dtype), as gptqmodel 7.7.0's `dequantize_gemm` (AWQ's torch kernel) computes it.
pub fn dequantize_awq(
    awq: &Awq,
    parts: &ZeroPointParts,
    scales: &[f32],
    scale_shape: &[usize],
    round: fn(f32) -> f32,
) -> std::result::Result<(Vec<f32>, [usize; 2]), PartError> {
    let (groups, out) = scale_dims(scales, scale_shape)?;
    if out % 8 != 0 {
        return Err(("scales", format!("{out} outputs, not a multiple of the 8 a word holds")));
    }
    let inputs = groups * awq.group;
    if inputs > crate::decoder::load::MAX_DIM {
        return Err(("scales", format!("{groups} groups of {} inputs is out of range", awq.group)));
    }
    let (qw_shape, qweight) = parts.qweight;
    expect_shape("qweight", qw_shape, qweight.len(), &[inputs, out / 8])?;
    let (qz_shape, qzeros) = parts.qzeros;
    expect_shape("qzeros", qz_shape, qzeros.len(), &[groups, out / 8])?;
    let unpack = |words: &[i64]| -> Vec<i32> {
        let mut row = vec![0; words.len() * 8];
        for (w, &word) in words.iter().enumerate() {
            for (j, &col) in AWQ_ORDER.iter().enumerate() {
                row[w * 8 + col] = field(word, j, 4);
            }
        }
        row
    };
    let mut weight = vec![0f32; out * inputs];
    for (g, zero_words) in qzeros.chunks(out / 8).enumerate() {
        let zeros = unpack(zero_words);
        let scales = &scales[g * out..][..out];
        for i in g * awq.group..(g + 1) * awq.group {
            let q = unpack(&qweight[i * out / 8..][..out / 8]);
            for o in 0..out {
                weight[o * inputs + i] = round(scales[o] * (q[o] - zeros[o]) as f32);
            }
        }
    }
    Ok((weight, [out, inputs]))
}

impl CompressedTensors {
    fn parse(raw: &RawConfig, q: &Value) -> Result<CompressedTensors> {
        let format = q.get("format").and_then(Value::as_str).unwrap_or("");
        let format = match format {
            "float-quantized" => Format::Fp8,
            "pack-quantized" => Format::Int,
            "nvfp4-pack-quantized" => Format::Nvfp4,
            _ => {
                return Err(raw.error(format!(
                    "`quantization_config.format` {format:?}: compressed-tensors' float-quantized (FP8), \
                     pack-quantized (W4A16, W8A16) and nvfp4-pack-quantized (NVFP4A16) formats are supported"
                )))
            }
        };
        // An FP8 KV-cache scheme stores a `k_scale` and `v_scale` per attention layer, which an
        // FP8 cache (`--kv-cache-dtype fp8`) takes and any other ignores, as in vLLM.
        if let Some(kv) = q.get("kv_cache_scheme").filter(|k| !k.is_null()) {
            let fp8 = kv.get("num_bits").and_then(Value::as_u64) == Some(8)
                && kv.get("type").and_then(Value::as_str) == Some("float");
            if !fp8 {
                return Err(raw.error(format!(
                    "`quantization_config.kv_cache_scheme` {kv}: only FP8 KV-cache scales (num_bits 8, type float) are \
                     supported"
                )));
            }
        }
        let groups = q
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| raw.error("`quantization_config.config_groups` is missing or empty"))?;
        let groups = groups
            .iter()
            .map(|(name, g)| SchemeGroup::parse(raw, &format!("quantization_config.config_groups.{name}"), g, format))
            .collect::<Result<Vec<_>>>()?;
        Ok(CompressedTensors { groups })
    }

    /// The scheme of `module`: a group naming it (by name or pattern) before one that takes every
    /// `Linear`, as compressed-tensors ranks matches.
    fn group_of(&self, module: &str) -> Result<&SchemeGroup> {
        let by_name = self.groups.iter().find(|g| {
            g.targets.iter().any(|t| match t {
                Target::Pattern(re) => re.is_match(module),
                Target::Name(n) => n == module,
                Target::Linear => false,
            })
        });
        by_name
            .or_else(|| self.groups.iter().find(|g| g.targets.iter().any(|t| matches!(t, Target::Linear))))
            .ok_or_else(|| crate::ModelError::Config {
                path: module.into(),
                message: format!(
                    "quantized module `{module}` matches none of the `config_groups` targets ({})",
                    self.groups.iter().map(|g| g.name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            })
    }
}

/// `quantization_config.format`: how every group's weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Fp8,
    Int,
    Nvfp4,
}

impl SchemeGroup {
    fn parse(raw: &RawConfig, key: &str, g: &Value, format: Format) -> Result<SchemeGroup> {
        let targets = g
            .get("targets")
            .and_then(Value::as_array)
            .ok_or_else(|| raw.error(format!("`{key}.targets` is missing")))?
            .iter()
            .map(|t| match t.as_str() {
                Some("Linear") => Ok(Target::Linear),
                Some(p) if p.starts_with("re:") => Regex::new(&format!("^(?:{})", &p[3..]))
                    .map(Target::Pattern)
                    .map_err(|e| raw.error(format!("`{key}.targets`: pattern {p:?}: {e}"))),
                Some(n) if n.contains('.') => Ok(Target::Name(n.to_owned())),
                _ => Err(raw
                    .error(format!("`{key}.targets`: {t} is not supported (Linear, a module name or a re: pattern)"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let weights = g.get("weights").filter(|w| !w.is_null()).ok_or_else(|| {
            raw.error(format!("`{key}.weights` is missing: activation-only schemes are not supported"))
        })?;
        let wkey = format!("{key}.weights");
        let stored = match format {
            Format::Fp8 => {
                fp8_args(raw, &wkey, weights)?;
                StoredWeights::Fp8
            }
            Format::Int => StoredWeights::Int(int_args(raw, &wkey, weights)?),
            Format::Nvfp4 => {
                nvfp4_args(raw, &wkey, weights)?;
                StoredWeights::Nvfp4
            }
        };
        if weights.get("dynamic").and_then(Value::as_bool) == Some(true) {
            return Err(raw.error(format!("`{key}.weights.dynamic`: dynamically quantized weights are not supported")));
        }
        let packed = format == Format::Int;
        let weights = match weights.get("strategy").and_then(Value::as_str) {
            // nvfp4_args checked the strategy and the group size.
            _ if format == Format::Nvfp4 => WeightScales::Group(NVFP4_GROUP),
            Some("tensor") => WeightScales::Tensor,
            Some("channel") => WeightScales::Channel,
            Some("group") if packed => {
                let size = weights.get("group_size").and_then(Value::as_u64).filter(|&s| (1..=1 << 16).contains(&s));
                WeightScales::Group(
                    size.ok_or_else(|| raw.error(format!("`{key}.weights.group_size` must be set for groups")))?
                        as usize,
                )
            }
            Some("block") if !packed => WeightScales::Block(block_size(
                raw,
                weights.get("block_structure").unwrap_or(&Value::Null),
                &format!("{key}.weights.block_structure"),
            )?),
            other => {
                return Err(raw.error(format!(
                    "`{key}.weights.strategy` {other:?}: FP8 weights per tensor, channel or block, and packed \
                     integer weights per channel or group are supported"
                )))
            }
        };
        if packed && matches!(weights, WeightScales::Tensor) {
            return Err(raw.error(format!(
                "`{key}.weights.strategy` tensor: packed integer weights per channel or group are supported"
            )));
        }
        let inputs = match g.get("input_activations").filter(|a| !a.is_null()) {
            None => None,
            Some(_) if format == Format::Nvfp4 => {
                return Err(raw.error(format!(
                    "`{key}.input_activations`: NVFP4 weights with quantized inputs (W4A4, llm-compressor's NVFP4 \
                     scheme) are not supported; the weight-only NVFP4A16 scheme is"
                )))
            }
            Some(_) if packed => {
                return Err(raw.error(format!(
                    "`{key}.input_activations`: integer weights with quantized inputs (W4A8, W8A8 int) are not \
                     supported; weight-only schemes (W4A16, W8A16) are"
                )))
            }
            Some(a) => {
                let akey = format!("{key}.input_activations");
                fp8_args(raw, &akey, a)?;
                let dynamic = a.get("dynamic").and_then(Value::as_bool).unwrap_or(false);
                let strategy = a.get("strategy").and_then(Value::as_str);
                Some(match (dynamic, strategy) {
                    (true, Some("token")) => InputScheme::Dynamic(ActivationQuant::PerToken),
                    (true, Some("group")) => {
                        let size = a.get("group_size").and_then(Value::as_u64).filter(|&s| (1..=1 << 16).contains(&s));
                        let size = size.ok_or_else(|| raw.error(format!("`{akey}.group_size` must be set")))?;
                        InputScheme::Dynamic(ActivationQuant::PerGroup(size as usize))
                    }
                    (false, Some("tensor")) => InputScheme::Static,
                    _ => {
                        return Err(raw.error(format!(
                            "`{akey}`: dynamic {dynamic}, strategy {strategy:?} is not supported (dynamic per token \
                             or group, or static per tensor)"
                        )))
                    }
                })
            }
        };
        if g.get("output_activations").is_some_and(|o| !o.is_null()) {
            return Err(raw.error(format!("`{key}.output_activations`: output quantization is not supported")));
        }
        Ok(SchemeGroup { name: key.rsplit('.').next().unwrap_or(key).to_owned(), targets, weights, stored, inputs })
    }
}

/// Checks that `args` describe symmetric 8-bit floats (e4m3), the one format supported so far.
fn fp8_args(raw: &RawConfig, key: &str, args: &Value) -> Result<()> {
    let bits = args.get("num_bits").and_then(Value::as_u64);
    let kind = args.get("type").and_then(Value::as_str);
    if (bits, kind) != (Some(8), Some("float")) {
        return Err(raw.error(format!(
            "`{key}`: {} bits of type {} is not supported; FP8 (8-bit float) schemes are",
            bits.map_or("?".into(), |b| b.to_string()),
            kind.unwrap_or("?")
        )));
    }
    if args.get("symmetric").and_then(Value::as_bool) == Some(false) {
        return Err(raw.error(format!("`{key}.symmetric`: asymmetric FP8 is not supported")));
    }
    Ok(())
}

/// Checks that `args` describe symmetric 4- or 8-bit integers; returns the bits.
fn int_args(raw: &RawConfig, key: &str, args: &Value) -> Result<u32> {
    let bits = args.get("num_bits").and_then(Value::as_u64);
    let kind = args.get("type").and_then(Value::as_str);
    let bits = match (bits, kind) {
        (Some(b @ (4 | 8)), Some("int")) => b as u32,
        _ => {
            return Err(raw.error(format!(
                "`{key}`: {} bits of type {} is not supported; packed 4- and 8-bit integers are",
                bits.map_or("?".into(), |b| b.to_string()),
                kind.unwrap_or("?")
            )))
        }
    };
    if args.get("symmetric").and_then(Value::as_bool) == Some(false) {
        return Err(
            raw.error(format!("`{key}.symmetric`: asymmetric integer weights (zero points) are not supported yet"))
        );
    }
    if args.get("actorder").is_some_and(|a| !a.is_null() && a != &Value::Bool(false)) {
        return Err(raw.error(format!("`{key}.actorder`: activation-ordered groups (g_idx) are not supported yet")));
    }
    Ok(bits)
}

/// Checks that `args` describe compressed-tensors' NVFP4 weights: symmetric 4-bit floats (e2m1)
/// with an e4m3 scale per 16 inputs under one global scale (`tensor_group`), as the NVFP4A16
/// preset writes them.
fn nvfp4_args(raw: &RawConfig, key: &str, args: &Value) -> Result<()> {
    let bits = args.get("num_bits").and_then(Value::as_u64);
    let kind = args.get("type").and_then(Value::as_str);
    if (bits, kind) != (Some(4), Some("float")) {
        return Err(raw.error(format!(
            "`{key}`: {} bits of type {} in the nvfp4-pack-quantized format, which holds 4-bit floats (e2m1)",
            bits.map_or("?".into(), |b| b.to_string()),
            kind.unwrap_or("?")
        )));
    }
    if args.get("symmetric").and_then(Value::as_bool) == Some(false) {
        return Err(raw.error(format!("`{key}.symmetric`: asymmetric NVFP4 (zero points) is not supported")));
    }
    // Groups without a global scale are dequantized in bf16 by compressed-tensors, another
    // computation; only the NVFP4 preset's layout is read.
    let strategy = args.get("strategy").and_then(Value::as_str);
    if strategy != Some("tensor_group") {
        return Err(raw.error(format!(
            "`{key}.strategy` {strategy:?}: NVFP4 weights per tensor_group (group scales under a global scale) \
             are supported"
        )));
    }
    if args.get("group_size").and_then(Value::as_u64) != Some(NVFP4_GROUP as u64) {
        return Err(raw.error(format!(
            "`{key}.group_size` {}: NVFP4 takes one scale per {NVFP4_GROUP} inputs",
            shown(args, "group_size")
        )));
    }
    match args.get("scale_dtype").filter(|d| !d.is_null()).map(Value::as_str) {
        None | Some(Some("torch.float8_e4m3fn")) => {}
        Some(_) => {
            return Err(raw.error(format!(
                "`{key}.scale_dtype` {}: NVFP4 scales in float8_e4m3fn are supported",
                shown(args, "scale_dtype")
            )))
        }
    }
    if args.get("actorder").is_some_and(|a| !a.is_null() && a != &Value::Bool(false)) {
        return Err(raw.error(format!("`{key}.actorder`: activation-ordered groups are not supported")));
    }
    Ok(())
}

/// Inputs per NVFP4 weight scale.
pub const NVFP4_GROUP: usize = 16;

/// The value of each FP4 e2m1 code: bit 3 the sign, bits 0-2 the magnitude's index, as
/// compressed-tensors' `kE2M1ToFloat` (a zero with its sign bit set is -0.0, as its `* -1.0`
/// gives).
const E2M1: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// An NVFP4 linear's weight `[rows, cols]` from its `weight_packed` bytes `[rows, cols / 2]` (the
/// code of column `2k` in byte `k`'s low nibble), `weight_scale` `[rows, cols / 16]` and
/// `weight_global_scale` `[1]`, as compressed-tensors 0.20.0's `NVFP4PackedCompressor.decompress`
/// computes it: each group scale rounded to bf16 (`_decompress_scale` to the unpacked codes'
/// dtype; exact for e4m3 scales) and divided by the global scale in f32 (a bf16 tensor over an
/// f32 one of shape `[1]` promotes to f32), the code's value times that in f32, and the product
/// rounded to bf16 (`dequantize` casts back to the codes' dtype, bf16).
pub fn dequantize_nvfp4(
    packed: (&[usize], &[i64]),
    scales: (&[usize], &[f32]),
    global_scale: (&[usize], &[f32]),
) -> std::result::Result<(Vec<f32>, [usize; 2]), PartError> {
    let (packed_shape, bytes) = packed;
    let &[rows, half] = packed_shape else {
        return Err(("weight_packed", format!("shape {packed_shape:?}, expected [rows, inputs / 2]")));
    };
    let max = crate::decoder::load::MAX_DIM;
    if rows > max || half > max / 2 {
        return Err(("weight_packed", format!("shape {packed_shape:?} is out of range")));
    }
    let cols = half * 2;
    expect_shape("weight_packed", packed_shape, bytes.len(), &[rows, half])?;
    if cols % NVFP4_GROUP != 0 {
        return Err(("weight_packed", format!("{cols} inputs, not a multiple of the {NVFP4_GROUP} a scale covers")));
    }
    let groups = cols / NVFP4_GROUP;
    let (scale_shape, scales) = scales;
    expect_shape("weight_scale", scale_shape, scales.len(), &[rows, groups])?;
    let global = match global_scale {
        ([1], [g]) if g.is_finite() && *g > 0.0 => *g,
        (shape, values) => {
            return Err((
                "weight_global_scale",
                format!("shape {shape:?} holding {values:?}; expected one positive number of shape [1]"),
            ))
        }
    };
    let group_scales: Vec<f32> = scales.iter().map(|&s| bf16::from_f32(s).to_f32() / global).collect();
    if group_scales.iter().any(|s| !s.is_finite()) {
        return Err(("weight_scale", "a scale is not finite".into()));
    }
    let mut weight = Vec::with_capacity(rows * cols);
    for (k, &byte) in bytes.iter().enumerate() {
        let byte = u8::try_from(byte).map_err(|_| ("weight_packed", format!("{byte} is not a byte (uint8)")))?;
        let scale = group_scales[(k / half) * groups + (k % half) * 2 / NVFP4_GROUP];
        for code in [byte & 0x0F, byte >> 4] {
            weight.push(bf16::from_f32(E2M1[code as usize] * scale).to_f32());
        }
    }
    Ok((weight, [rows, cols]))
}

/// Unpacks compressed-tensors' `pack_to_int32` layout: each row of `cols` `bits`-bit values
/// packed densely into little-endian int32 words, value `j` at bit `j * bits`, stored with an
/// offset of `2^(bits-1)`; returns the signed values as f32, row-major `[rows, cols]`.
pub fn unpack_int32(
    words: &[i64],
    word_shape: &[usize],
    bits: u32,
    rows: usize,
    cols: usize,
) -> std::result::Result<Vec<f32>, String> {
    let per_row = (cols * bits as usize).div_ceil(32);
    if word_shape != [rows, per_row] || words.len() != rows * per_row {
        return Err(format!(
            "packed words of shape {word_shape:?} for [{rows}, {cols}] {bits}-bit values; expected [{rows}, {per_row}]"
        ));
    }
    let (mask, offset) = ((1u32 << bits) - 1, 1i32 << (bits - 1));
    let mut out = Vec::with_capacity(rows * cols);
    for row in words.chunks(per_row.max(1)).take(rows) {
        for j in 0..cols {
            let bit = j * bits as usize;
            let word = row[bit / 32] as u32;
            out.push((((word >> (bit % 32)) & mask) as i32 - offset) as f32);
        }
    }
    Ok(out)
}

/// Checks `scales` (of `scale_shape`) against a weight of `shape` under `how`; returns the
/// matrix's rows and columns and the scales each matrix has.
fn check_scales(
    shape: &[usize],
    scales: &[f32],
    scale_shape: &[usize],
    how: WeightScales,
) -> std::result::Result<(usize, usize, usize), String> {
    let (rows, cols) = match shape {
        [.., r, c] => (*r, *c),
        _ => return Err(format!("a quantized weight of shape {shape:?} (need at least 2 dimensions)")),
    };
    let batch: usize = shape[..shape.len() - 2].iter().product();
    let batch_dims = &shape[..shape.len() - 2];
    let per_matrix = match how {
        WeightScales::Tensor => 1,
        WeightScales::Channel => rows,
        WeightScales::Block([br, bc]) => rows.div_ceil(br) * cols.div_ceil(bc),
        WeightScales::Group(g) => rows * cols.div_ceil(g),
    };
    let expected: Vec<usize> = match how {
        WeightScales::Tensor => batch_dims.to_vec(),
        WeightScales::Channel => [batch_dims, &[rows, 1]].concat(),
        WeightScales::Block([br, bc]) => [batch_dims, &[rows.div_ceil(br), cols.div_ceil(bc)]].concat(),
        WeightScales::Group(g) => [batch_dims, &[rows, cols.div_ceil(g)]].concat(),
    };
    // Per-tensor scales come as `[]`, `[1]` or one per batch entry; channel scales as `[rows, 1]`
    // or `[rows]`. The same count in another arrangement is refused.
    let accepted = match how {
        WeightScales::Tensor => {
            (batch == 1 && scale_shape.iter().all(|&d| d == 1))
                || scale_shape == batch_dims
                || scale_shape == [batch_dims, &[1]].concat()
        }
        WeightScales::Channel => scale_shape == expected || scale_shape == [batch_dims, &[rows]].concat(),
        WeightScales::Block(_) | WeightScales::Group(_) => scale_shape == expected,
    };
    if scales.len() != batch * per_matrix || !accepted {
        return Err(format!(
            "scale of shape {scale_shape:?} for a weight of shape {shape:?} ({how:?}); expected {expected:?}"
        ));
    }
    if scales.iter().any(|s| !s.is_finite()) {
        return Err("a scale is not finite".into());
    }
    Ok((rows, cols, per_matrix))
}

/// The scales of a `[rows, cols]` FP8 weight as blocks of `[block_rows, block_cols]` weights
/// (row-major over the block grid, as [`ferrite_tensor::fp8::Fp8Matrix`] keeps them), checked as
/// [`dequantize`] checks them: a per-tensor scale repeated for every row.
pub fn scale_blocks(
    rows: usize,
    cols: usize,
    scales: &[f32],
    scale_shape: &[usize],
    how: WeightScales,
) -> std::result::Result<(Vec<f32>, [usize; 2]), String> {
    check_scales(&[rows, cols], scales, scale_shape, how)?;
    let row_block = [1, cols.max(1)];
    Ok(match how {
        WeightScales::Tensor => (vec![scales[0]; rows], row_block),
        WeightScales::Channel => (scales.to_vec(), row_block),
        WeightScales::Block(block) => (scales.to_vec(), block),
        WeightScales::Group(g) => (scales.to_vec(), [1, g]),
    })
}

/// `weight` (e4m3 values as f32, `[.., rows, cols]`) times its scales, in f32: each scale
/// broadcast over the rows, row or block it covers, as compressed-tensors and transformers
/// dequantize. `scale_shape` is checked against the weight's so that a mis-shaped scale is an
/// error rather than a wrong broadcast.
pub fn dequantize(
    weight: &mut [f32],
    shape: &[usize],
    scales: &[f32],
    scale_shape: &[usize],
    how: WeightScales,
) -> std::result::Result<(), String> {
    let (rows, cols, per_matrix) = check_scales(shape, scales, scale_shape, how)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    for (m, matrix) in weight.chunks_mut(rows * cols).enumerate() {
        let scales = &scales[m * per_matrix..(m + 1) * per_matrix];
        for (r, row) in matrix.chunks_mut(cols).enumerate() {
            match how {
                WeightScales::Tensor => row.iter_mut().for_each(|w| *w *= scales[0]),
                WeightScales::Channel => row.iter_mut().for_each(|w| *w *= scales[r]),
                WeightScales::Block([br, bc]) => {
                    let block_row = &scales[(r / br) * cols.div_ceil(bc)..];
                    row.iter_mut().enumerate().for_each(|(c, w)| *w *= block_row[c / bc]);
                }
                WeightScales::Group(g) => {
                    let groups = &scales[r * cols.div_ceil(g)..];
                    row.iter_mut().enumerate().for_each(|(c, w)| *w *= groups[c / g]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(q: Value) -> RawConfig {
        RawConfig { path: "m/config.json".into(), value: json!({ "quantization_config": q }) }
    }

    fn fp8_dynamic() -> Value {
        json!({
            "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": true, "dynamic": false, "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": true, "dynamic": true, "strategy": "token"}
            }}
        })
    }

    #[test]
    fn schemes_map_to_scales_and_input_quantization() {
        let q = Quantization::from_config(&raw(fp8_dynamic())).unwrap().unwrap();
        let m = "model.layers.0.self_attn.q_proj";
        assert_eq!(q.weight_scales(m).unwrap(), (WeightScales::Channel, format!("{m}.weight_scale")));
        assert_eq!(q.input_scheme(m).unwrap(), Some(InputQuantSource::Dynamic(ActivationQuant::PerToken)));

        let mut block = fp8_dynamic();
        block["config_groups"]["group_0"]["weights"]["strategy"] = json!("block");
        block["config_groups"]["group_0"]["weights"]["block_structure"] = json!([128, 128]);
        block["config_groups"]["group_0"]["input_activations"]["strategy"] = json!("group");
        block["config_groups"]["group_0"]["input_activations"]["group_size"] = json!(128);
        let q = Quantization::from_config(&raw(block)).unwrap().unwrap();
        assert_eq!(q.weight_scales(m).unwrap().0, WeightScales::Block([128, 128]));
        assert_eq!(q.input_scheme(m).unwrap(), Some(InputQuantSource::Dynamic(ActivationQuant::PerGroup(128))));

        let mut stat = fp8_dynamic();
        stat["config_groups"]["group_0"]["weights"]["strategy"] = json!("tensor");
        stat["config_groups"]["group_0"]["input_activations"] =
            json!({"num_bits": 8, "type": "float", "dynamic": false, "strategy": "tensor"});
        let q = Quantization::from_config(&raw(stat)).unwrap().unwrap();
        assert_eq!(q.input_scheme(m).unwrap(), Some(InputQuantSource::StaticScale(format!("{m}.input_scale"))));

        let q = Quantization::from_config(&raw(json!({"quant_method": "fp8", "weight_block_size": [128, 128]})));
        let q = q.unwrap().unwrap();
        assert_eq!(q.weight_scales(m).unwrap(), (WeightScales::Block([128, 128]), format!("{m}.weight_scale_inv")));
        assert_eq!(q.input_scheme(m).unwrap(), None);
        assert!(Quantization::from_config(&RawConfig { path: "c".into(), value: json!({}) }).unwrap().is_none());
    }

    #[test]
    fn a_requested_method_must_match_the_checkpoint() {
        let plain = RawConfig { path: "m/config.json".into(), value: json!({}) };
        assert!(matches!(Quantization::resolve(&plain, Some("fp8")).unwrap(), Some(Quantization::OnlineFp8)));
        assert!(Quantization::resolve(&plain, None).unwrap().is_none());
        let err = Quantization::resolve(&plain, Some("awq")).unwrap_err().to_string();
        assert!(err.contains("--quantization awq"), "{err}");
        let ct = raw(fp8_dynamic());
        assert!(Quantization::resolve(&ct, Some("compressed-tensors")).unwrap().is_some());
        let err = Quantization::resolve(&ct, Some("fp8")).unwrap_err().to_string();
        assert!(err.contains("does not match") && err.contains("compressed-tensors"), "{err}");
    }

    #[test]
    fn a_named_group_wins_over_linear() {
        let mut two = fp8_dynamic();
        two["config_groups"]["attn"] = json!({
            "targets": ["re:.*self_attn\\.(q|k|v)_proj$"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
            "input_activations": null
        });
        let q = Quantization::from_config(&raw(two)).unwrap().unwrap();
        assert_eq!(q.weight_scales("model.layers.3.self_attn.k_proj").unwrap().0, WeightScales::Tensor);
        assert_eq!(q.input_scheme("model.layers.3.self_attn.k_proj").unwrap(), None);
        assert_eq!(q.weight_scales("model.layers.3.self_attn.o_proj").unwrap().0, WeightScales::Channel);
    }

    #[test]
    fn unsupported_schemes_are_named() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"quant_method": "bitsandbytes", "load_in_4bit": true}), "\"bitsandbytes\" is not supported"),
            (json!({"quant_method": "fp8", "activation_scheme": "static"}), "weight_block_size"),
            (json!({"quant_method": "fp8", "weight_block_size": [128]}), "weight_block_size"),
            (json!({"quant_method": "compressed-tensors", "format": "marlin-24"}), "marlin-24"),
        ];
        for (q, needle) in cases {
            let err = Quantization::from_config(&raw(q)).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("m/config.json"), "{err}");
        }
        let mut w4 = fp8_dynamic();
        w4["config_groups"]["group_0"]["weights"] = json!({"num_bits": 4, "type": "int", "strategy": "group"});
        let err = Quantization::from_config(&raw(w4)).unwrap_err().to_string();
        assert!(err.contains("group_0.weights") && err.contains("4 bits of type int"), "{err}");
        let mut kv = fp8_dynamic();
        kv["kv_cache_scheme"] = json!({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false});
        assert!(Quantization::from_config(&raw(kv.clone())).is_ok(), "FP8 KV-cache scales load");
        kv["kv_cache_scheme"] = json!({"num_bits": 8, "type": "int"});
        assert!(Quantization::from_config(&raw(kv)).unwrap_err().to_string().contains("kv_cache_scheme"));
    }

    /// A `quantization_config` or scale tensor from a stranger is read or refused, never a panic.
    mod hostile {
        use proptest::prelude::*;
        use serde_json::{json, Value};

        use super::super::*;
        use super::raw;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                (-3i64..300).prop_map(Value::from),
                Just(json!(u64::MAX)),
                prop_oneof![
                    Just("float"),
                    Just("int"),
                    Just("token"),
                    Just("group"),
                    Just("tensor"),
                    Just("channel"),
                    Just("block"),
                    Just("Linear"),
                    Just("re:(("),
                    Just("re:.*q_proj$"),
                    Just("e4m3"),
                ]
                .prop_map(Value::from),
                Just(json!([128, 128])),
                Just(json!([0, 1u64 << 40])),
                Just(json!(["Linear"])),
            ]
        }

        fn args() -> impl Strategy<Value = Value> {
            let keys = prop_oneof![
                Just("num_bits"),
                Just("type"),
                Just("strategy"),
                Just("dynamic"),
                Just("group_size"),
                Just("block_structure"),
                Just("symmetric"),
            ];
            proptest::collection::vec((keys, leaf()), 0..7)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
        }

        fn config() -> impl Strategy<Value = Value> {
            let method = prop_oneof![Just("compressed-tensors"), Just("fp8"), Just("mxfp4"), Just("gptq"), Just("awq")];
            let group = (args(), prop_oneof![args(), Just(Value::Null)], leaf())
                .prop_map(|(w, a, t)| json!({"weights": w, "input_activations": a, "targets": [t]}));
            let zero_point_keys = (leaf(), leaf(), leaf(), leaf());
            (method, proptest::option::of(group), leaf(), leaf(), zero_point_keys).prop_map(
                |(m, g, block, fmt, (bits, group_size, version, checkpoint_format))| {
                    json!({
                        "quant_method": m, "format": "float-quantized", "config_groups": g.map(|g| json!({"group_0": g})),
                        "weight_block_size": block, "fmt": fmt, "bits": bits, "group_size": group_size,
                        "version": version, "checkpoint_format": checkpoint_format,
                    })
                },
            )
        }

        proptest! {
            #[test]
            fn any_quantization_config_is_read_or_refused(q in config(), module in "[a-z_.0-9]{0,24}") {
                if let Ok(Some(q)) = Quantization::from_config(&raw(q)) {
                    let _ = q.weight_scales(&module);
                    let _ = q.input_scheme(&module);
                }
            }

            #[test]
            fn any_gptq_or_awq_tensors_dequantize_or_are_refused(
                qweight_shape in proptest::collection::vec(0usize..9, 0..3),
                qzeros_shape in proptest::collection::vec(0usize..3, 0..3),
                scale_shape in proptest::collection::vec(0usize..17, 0..3),
                g_idx in proptest::option::of(proptest::collection::vec(-1i64..3, 0..17)),
                bits in prop_oneof![Just(4u32), Just(8)],
                group in 1usize..5,
                act_order: bool,
            ) {
                let count = |s: &[usize]| s.iter().product::<usize>();
                let words: Vec<i64> = (0..count(&qweight_shape) as i64).map(|w| w * 0x1357_9bdf).collect();
                let zeros: Vec<i64> = (0..count(&qzeros_shape) as i64).map(|w| -w).collect();
                let scales = vec![0.5f32; count(&scale_shape)];
                let g_shape = g_idx.as_ref().map(|g| vec![g.len()]);
                let parts = ZeroPointParts {
                    qweight: (&qweight_shape, &words),
                    qzeros: (&qzeros_shape, &zeros),
                    g_idx: g_idx.as_deref().map(|g| (g_shape.as_deref().unwrap(), g)),
                };
                let gptq = Gptq { bits, group: Some(group), act_order, zeros_minus_one: true };
                let round: fn(f32) -> f32 = |v| v;
                if let Ok((w, [out, inputs])) = dequantize_gptq(&gptq, &parts, &scales, &scale_shape, round) {
                    prop_assert_eq!(w.len(), out * inputs);
                }
                if let Ok((w, [out, inputs])) = dequantize_awq(&Awq { group }, &parts, &scales, &scale_shape, round) {
                    prop_assert_eq!(w.len(), out * inputs);
                }
            }

            #[test]
            fn any_scale_shape_dequantizes_or_is_refused(
                shape in proptest::collection::vec(0usize..6, 0..4),
                scale_shape in proptest::collection::vec(0usize..4, 0..4),
                block in (1usize..4, 1usize..4),
                how in 0u8..3,
            ) {
                let how = [WeightScales::Tensor, WeightScales::Channel, WeightScales::Block([block.0, block.1])][how as usize];
                let mut weight = vec![1.0f32; shape.iter().product()];
                let scales = vec![2.0f32; scale_shape.iter().product()];
                if dequantize(&mut weight, &shape, &scales, &scale_shape, how).is_ok() {
                    prop_assert!(weight.iter().all(|&w| w == 2.0));
                }
            }
        }
    }

    #[test]
    fn dequantization_broadcasts_each_strategy_and_refuses_mis_shaped_scales() {
        let ones = || vec![1.0f32; 3 * 5];
        let mut w = ones();
        dequantize(&mut w, &[3, 5], &[2.0], &[], WeightScales::Tensor).unwrap();
        assert!(w.iter().all(|&v| v == 2.0));
        let mut w = ones();
        dequantize(&mut w, &[3, 5], &[1.0, 2.0, 3.0], &[3, 1], WeightScales::Channel).unwrap();
        assert_eq!(&w[5..10], &[2.0; 5]);
        // Blocks of 2x4 over 3x5: a 2x2 grid whose last row and column are partial.
        let mut w = ones();
        dequantize(&mut w, &[3, 5], &[1.0, 2.0, 3.0, 4.0], &[2, 2], WeightScales::Block([2, 4])).unwrap();
        assert_eq!(w, [1., 1., 1., 1., 2., 1., 1., 1., 1., 2., 3., 3., 3., 3., 4.]);
        // Per expert: a batch of two matrices with their own scales.
        let mut w = vec![1.0f32; 2 * 2 * 2];
        dequantize(&mut w, &[2, 2, 2], &[1.0, 2.0, 3.0, 4.0], &[2, 2, 1], WeightScales::Channel).unwrap();
        assert_eq!(w, [1., 1., 2., 2., 3., 3., 4., 4.]);
        for (scales, shape, how) in [
            (vec![1.0; 3], vec![1, 3], WeightScales::Channel),
            (vec![1.0; 5], vec![5, 1], WeightScales::Channel),
            (vec![1.0; 3], vec![3, 1], WeightScales::Block([2, 4])),
            (vec![f32::NAN], vec![], WeightScales::Tensor),
        ] {
            assert!(dequantize(&mut ones(), &[3, 5], &scales, &shape, how).is_err(), "{shape:?} {how:?}");
        }
    }

    fn w4a16(weights: Value, inputs: Value) -> Value {
        json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}}
        })
    }

    #[test]
    fn pack_quantized_schemes_are_read_or_refused_by_name() {
        let int4 = json!({"num_bits": 4, "type": "int", "symmetric": true, "dynamic": false, "strategy": "group", "group_size": 32});
        let q = Quantization::from_config(&raw(w4a16(int4.clone(), Value::Null))).unwrap().unwrap();
        assert!(matches!(q.packed_weight("model.layers.0.mlp.up_proj").unwrap(), (4, WeightScales::Group(32))));
        let mut int8 = int4.clone();
        int8["num_bits"] = json!(8);
        int8["strategy"] = json!("channel");
        let q = Quantization::from_config(&raw(w4a16(int8, Value::Null))).unwrap().unwrap();
        assert!(matches!(q.packed_weight("model.layers.0.mlp.up_proj").unwrap(), (8, WeightScales::Channel)));
        let fp8 = Quantization::from_config(&raw(fp8_dynamic())).unwrap().unwrap();
        assert!(fp8.packed_weight("model.layers.0.mlp.up_proj").is_err());
        for (edit, needle) in [
            (json!({"symmetric": false}), "symmetric"),
            (json!({"actorder": "group"}), "actorder"),
            (json!({"num_bits": 3}), "3 bits"),
            (json!({"type": "float"}), "type float"),
            (json!({"group_size": 0}), "group_size"),
            (json!({"strategy": "tensor"}), "strategy"),
        ] {
            let mut w = int4.clone();
            for (k, v) in edit.as_object().unwrap() {
                w[k] = v.clone();
            }
            let err = Quantization::from_config(&raw(w4a16(w, Value::Null))).unwrap_err().to_string();
            assert!(err.contains(needle), "{edit}: {err}");
        }
        let inputs = json!({"num_bits": 8, "type": "int", "symmetric": true, "dynamic": true, "strategy": "token"});
        let err = Quantization::from_config(&raw(w4a16(int4, inputs))).unwrap_err().to_string();
        assert!(err.contains("input_activations") && err.contains("W4A8"), "{err}");
    }

    /// config.json's `quantization_config` as llm-compressor 0.14's NVFP4A16 preset writes it.
    fn nvfp4a16() -> Value {
        json!({
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
            "quantization_status": "compressed", "kv_cache_scheme": null,
            "config_groups": {"group_0": {
                "format": "nvfp4-pack-quantized", "targets": ["Linear"],
                "input_activations": null, "output_activations": null,
                "weights": {"num_bits": 4, "type": "float", "symmetric": true, "dynamic": false,
                            "strategy": "tensor_group", "group_size": 16, "observer": "memoryless_minmax",
                            "scale_dtype": "torch.float8_e4m3fn"}
            }}
        })
    }

    #[test]
    fn nvfp4_schemes_are_read_or_refused_by_name() {
        let m = "model.layers.0.mlp.up_proj";
        let q = Quantization::from_config(&raw(nvfp4a16())).unwrap().unwrap();
        assert!(q.is_nvfp4(m).unwrap());
        assert_eq!(q.input_scheme(m).unwrap(), None);
        assert!(q.packed_weight(m).is_err(), "NVFP4 codes are not packed integers");
        let int4 = json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32});
        assert!(!Quantization::from_config(&raw(w4a16(int4, Value::Null))).unwrap().unwrap().is_nvfp4(m).unwrap());

        // The NVFP4 (W4A4) preset: inputs quantized to FP4 per group of 16.
        let mut w4a4 = nvfp4a16();
        w4a4["config_groups"]["group_0"]["input_activations"] = json!({"num_bits": 4, "type": "float",
            "symmetric": true, "dynamic": "local", "strategy": "tensor_group", "group_size": 16});
        let err = Quantization::from_config(&raw(w4a4)).unwrap_err().to_string();
        assert!(err.contains("config_groups.group_0.input_activations") && err.contains("W4A4"), "{err}");
        assert!(err.contains("m/config.json"), "{err}");
        for (edit, needle) in [
            (json!({"num_bits": 8}), "8 bits of type float"),
            (json!({"type": "int"}), "4 bits of type int"),
            (json!({"symmetric": false}), "weights.symmetric"),
            (json!({"strategy": "group"}), "weights.strategy"),
            (json!({"group_size": 32}), "weights.group_size` 32"),
            (json!({"scale_dtype": "torch.uint8"}), "weights.scale_dtype` \"torch.uint8\""),
            (json!({"dynamic": true}), "weights.dynamic"),
        ] {
            let mut q = nvfp4a16();
            for (k, v) in edit.as_object().unwrap() {
                q["config_groups"]["group_0"]["weights"][k] = v.clone();
            }
            let err = Quantization::from_config(&raw(q)).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("m/config.json"), "{edit}: {err}");
        }
        let mut unset = nvfp4a16();
        unset["config_groups"]["group_0"]["weights"]["scale_dtype"] = Value::Null;
        assert!(Quantization::from_config(&raw(unset)).is_ok(), "scale_dtype defaults to float8_e4m3fn");
    }

    #[test]
    fn nvfp4_reads_low_nibble_first_and_rounds_as_compressed_tensors() {
        // One row of 32 inputs, two groups. Byte k holds columns 2k (low nibble) and 2k + 1.
        let mut bytes = vec![0i64; 16];
        bytes[0] = 0x72; // column 0: code 2 (1.0), column 1: code 7 (6.0)
        bytes[1] = 0x8D; // column 2: code 13 (-3.0), column 3: code 8 (-0.0)
        bytes[8] = 0x02; // column 16, the second group: 1.0
        let scales = [1.0f32, 1.003_906_3]; // the second is 1 + 2^-8, half a bf16 step: rounds to 1.0
        let (w, shape) = dequantize_nvfp4((&[1, 16], &bytes), (&[1, 2], &scales), (&[1], &[3.0])).unwrap();
        assert_eq!(shape, [1, 32]);
        // 1 / 3 in f32, then the product rounded to bf16: 0x3EAB.
        let third = f32::from_bits(0x3EAB_0000);
        assert_eq!(w[0], third);
        assert_ne!(w[0], 1.0 / 3.0);
        assert_eq!(w[1], bf16::from_f32(6.0 * (1.0f32 / 3.0)).to_f32());
        assert_eq!(w[2], -1.0);
        assert!(w[3] == 0.0 && w[3].is_sign_negative(), "code 8 is -0.0");
        assert_eq!(w[16], third, "the second group's scale rounded to bf16 before the division");
        assert!(w.iter().enumerate().all(|(i, &v)| [0, 1, 2, 3, 16].contains(&i) || v == 0.0));

        let ok_scales: (&[usize], &[f32]) = (&[1, 2], &scales);
        let wrong = |packed: (&[usize], &[i64]), scales: (&[usize], &[f32]), global: (&[usize], &[f32])| {
            dequantize_nvfp4(packed, scales, global).unwrap_err().0
        };
        assert_eq!(wrong((&[1, 4], &bytes[..4]), ok_scales, (&[1], &[3.0])), "weight_packed", "8 inputs, half a group");
        assert_eq!(wrong((&[1, 16], &bytes), (&[2, 1], &scales), (&[1], &[3.0])), "weight_scale");
        assert_eq!(wrong((&[1, 16], &bytes), (&[1, 2], &[1.0, f32::NAN]), (&[1], &[3.0])), "weight_scale");
        assert_eq!(wrong((&[1, 16], &bytes), ok_scales, (&[], &[3.0])), "weight_global_scale");
        assert_eq!(wrong((&[1, 16], &bytes), ok_scales, (&[1], &[0.0])), "weight_global_scale");
        let mut words = bytes.clone();
        words[5] = 256;
        assert_eq!(wrong((&[1, 16], &words), ok_scales, (&[1], &[3.0])), "weight_packed");
        assert_eq!(wrong((&[1, 16, 1], &bytes), ok_scales, (&[1], &[3.0])), "weight_packed");
    }

    #[test]
    fn unpack_int32_reads_compressed_tensors_layout() {
        // pack_to_int32: value j of a row at bit j * bits of the row's words, stored + 2^(bits-1).
        let values: Vec<i32> = (0..12).map(|j| (j * 5 % 16) - 8).collect();
        let mut words = vec![0i64; 2];
        for (j, v) in values.iter().enumerate() {
            words[j * 4 / 32] |= (((v + 8) as u32) << (j * 4 % 32)) as i64;
        }
        words[0] = words[0] as u32 as i32 as i64;
        let got = unpack_int32(&words, &[1, 2], 4, 1, 12).unwrap();
        assert_eq!(got, values.iter().map(|&v| v as f32).collect::<Vec<_>>());
        let bytes: Vec<i64> = vec![i32::from_le_bytes([0x80, 0x00, 0xFF, 0x7F]) as i64];
        assert_eq!(unpack_int32(&bytes, &[1, 1], 8, 1, 4).unwrap(), vec![0.0, -128.0, 127.0, -1.0]);
        assert!(unpack_int32(&words, &[2, 1], 4, 1, 12).is_err());
        let mut w = vec![1.0f32; 2 * 6];
        dequantize(&mut w, &[2, 6], &[1.0, 2.0, 3.0, 4.0], &[2, 2], WeightScales::Group(4)).unwrap();
        assert_eq!(w, [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 4.0, 4.0]);
    }

    #[test]
    fn gptq_and_awq_configs_are_read_or_refused_by_name() {
        let gptq = json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true, "sym": true});
        let q = Quantization::from_config(&raw(gptq.clone())).unwrap().unwrap();
        let want = Gptq { bits: 4, group: Some(128), act_order: true, zeros_minus_one: true };
        assert!(matches!(q, Quantization::Gptq(g) if g == want), "{q:?}");
        assert!(Quantization::resolve(&raw(gptq.clone()), Some("gptq")).unwrap().is_some());
        let mut v2 = gptq.clone();
        v2["checkpoint_format"] = json!("gptq_v2");
        v2["group_size"] = json!(-1);
        v2["bits"] = json!(8);
        let want = Gptq { bits: 8, group: None, act_order: true, zeros_minus_one: false };
        assert!(matches!(Quantization::from_config(&raw(v2)).unwrap().unwrap(), Quantization::Gptq(g) if g == want));
        let awq = json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "GEMM",
                         "modules_to_not_convert": ["lm_head"]});
        let q = Quantization::from_config(&raw(awq.clone())).unwrap().unwrap();
        assert!(matches!(q, Quantization::Awq(Awq { group: 128 })), "{q:?}");
        assert!(q.weight_scales("model.layers.0.mlp.up_proj").is_err());
        assert_eq!(q.input_scheme("model.layers.0.mlp.up_proj").unwrap(), None);

        let refusals: Vec<(&Value, Value, &str)> = vec![
            (&gptq, json!({"bits": 3}), "`quantization_config.bits` 3"),
            (&gptq, json!({"bits": 2}), "`quantization_config.bits` 2"),
            (&gptq, json!({"group_size": 0}), "`quantization_config.group_size` 0"),
            (&gptq, json!({"checkpoint_format": "marlin"}), "`quantization_config.checkpoint_format` \"marlin\""),
            (&gptq, json!({"is_marlin_format": true}), "is_marlin_format"),
            (&gptq, json!({"pack_dtype": "int16"}), "`quantization_config.pack_dtype` \"int16\""),
            (&awq, json!({"version": "gemv"}), "`quantization_config.version` \"gemv\""),
            (&awq, json!({"version": "exllama"}), "`quantization_config.version` \"exllama\""),
            (&awq, json!({"bits": 8}), "`quantization_config.bits` 8"),
            (&awq, json!({"zero_point": false}), "zero_point"),
            (&awq, json!({"backend": "llm-awq"}), "`quantization_config.backend` \"llm-awq\""),
            (&awq, json!({"group_size": -1}), "`quantization_config.group_size` -1"),
        ];
        for (base, edit, needle) in refusals {
            let mut q = base.clone();
            for (k, v) in edit.as_object().unwrap() {
                q[k] = v.clone();
            }
            let err = Quantization::from_config(&raw(q)).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("m/config.json"), "{edit}: {err}");
        }
    }

    /// `fields[k]` at bit `k * bits` of one word.
    fn word(fields: &[i32], bits: u32) -> i64 {
        fields.iter().enumerate().fold(0u32, |w, (k, &f)| w | (f as u32) << (k as u32 * bits)) as i32 as i64
    }

    fn f16_round(v: f32) -> f32 {
        half::f16::from_f32(v).to_f32()
    }

    #[test]
    fn gptq_reads_g_idx_and_v1_zeros_and_rounds_to_f16() {
        // 8 inputs in two groups interleaved by g_idx, 2 outputs; q[i][o], zero[g][o] as meant.
        let q: Vec<[i32; 2]> = (0..8).map(|i| [i * 2 % 16, 15 - i]).collect();
        let g_idx = [0i64, 1, 0, 1, 1, 0, 1, 0];
        let zero = [[8, 3], [1, 15]];
        let scales = [0.1f32, 0.7, 1.3, 0.01].map(f16_round);
        let qweight: Vec<i64> = (0..2).map(|o| word(&q.iter().map(|r| r[o]).collect::<Vec<_>>(), 4)).collect();
        let v1_zeros: Vec<i64> = zero.iter().map(|z| word(&[z[0] - 1, z[1] - 1], 4)).collect();
        let parts =
            ZeroPointParts { qweight: (&[1, 2], &qweight), qzeros: (&[2, 1], &v1_zeros), g_idx: Some((&[8], &g_idx)) };
        let gptq = Gptq { bits: 4, group: Some(4), act_order: true, zeros_minus_one: true };
        let (w, shape) = dequantize_gptq(&gptq, &parts, &scales, &[2, 2], f16_round).unwrap();
        assert_eq!(shape, [2, 8]);
        for (i, &g) in g_idx.iter().enumerate() {
            for o in 0..2 {
                let g = g as usize;
                let want = f16_round(scales[g * 2 + o] * (q[i][o] - zero[g][o]) as f32);
                assert_eq!(w[o * 8 + i], want, "input {i} output {o}");
            }
        }
        // v2 stores the zeros as they are.
        let v2_zeros: Vec<i64> = zero.iter().map(|z| word(&[z[0], z[1]], 4)).collect();
        let v2 = Gptq { zeros_minus_one: false, ..gptq };
        let parts_v2 = ZeroPointParts { qzeros: (&[2, 1], &v2_zeros), ..parts };
        assert_eq!(dequantize_gptq(&v2, &parts_v2, &scales, &[2, 2], f16_round).unwrap().0, w);
        // A v1 field of all ones carries into the next, as gptqmodel's word-wide addition does.
        let carried = [word(&[15, 2], 4), word(&[0, 0], 4)];
        let parts_carry = ZeroPointParts { qzeros: (&[2, 1], &carried), ..parts };
        let (w, _) = dequantize_gptq(&gptq, &parts_carry, &scales, &[2, 2], f16_round).unwrap();
        assert_eq!(w[0], f16_round(scales[0] * q[0][0] as f32), "field 0: 15 + 1 wraps to 0");
        assert_eq!(w[8], f16_round(scales[1] * (q[0][1] - 4) as f32), "field 1: 2 + 1 + the carry");

        let without_g_idx = ZeroPointParts { g_idx: None, ..parts };
        let err = dequantize_gptq(&gptq, &without_g_idx, &scales, &[2, 2], f16_round).unwrap_err();
        assert_eq!(err.0, "g_idx");
        let in_order = Gptq { act_order: false, ..gptq };
        let (w, _) = dequantize_gptq(&in_order, &without_g_idx, &scales, &[2, 2], f16_round).unwrap();
        assert_eq!(w[5], f16_round(scales[2] * (q[5][0] - zero[1][0]) as f32), "input 5 in group 5 / 4");
        let bad_g = [0i64, 1, 0, 1, 2, 0, 1, 0];
        let err = dequantize_gptq(
            &gptq,
            &ZeroPointParts { g_idx: Some((&[8], &bad_g)), ..parts },
            &scales,
            &[2, 2],
            f16_round,
        );
        assert_eq!(err.unwrap_err().0, "g_idx");
        let err = dequantize_gptq(
            &gptq,
            &ZeroPointParts { qweight: (&[2, 1], &qweight), ..parts },
            &scales,
            &[2, 2],
            f16_round,
        );
        assert_eq!(err.unwrap_err().0, "qweight");
        let err = dequantize_gptq(&gptq, &parts, &[0.1, 0.2, f32::NAN, 0.3], &[2, 2], f16_round);
        assert_eq!(err.unwrap_err().0, "scales");
    }

    #[test]
    fn symmetric_gptq_in_input_order_is_an_int4_matrix_of_the_same_weights() {
        // 64 inputs in groups of 32, 16 outputs, every zero point 8 (v1 stores 7).
        let (inputs, out, group) = (64usize, 16usize, 32usize);
        let q = |i: usize, o: usize| ((i * 7 + o * 3 + i / 9) % 16) as i32;
        let qweight: Vec<i64> = (0..inputs / 8)
            .flat_map(|w| (0..out).map(move |o| word(&(0..8).map(|k| q(w * 8 + k, o)).collect::<Vec<_>>(), 4)))
            .collect();
        let v1_zeros: Vec<i64> = (0..inputs / group).flat_map(|_| (0..out / 8).map(|_| word(&[7; 8], 4))).collect();
        // Scales that bf16 holds exactly, so the kept and the dequantized weights agree bit for bit.
        let scales: Vec<f32> =
            (0..inputs / group * out).map(|k| bf16::from_f32(0.01 + k as f32 * 0.003).to_f32()).collect();
        let parts =
            ZeroPointParts { qweight: (&[inputs / 8, out], &qweight), qzeros: (&[2, 2], &v1_zeros), g_idx: None };
        let gptq = Gptq { bits: 4, group: Some(group), act_order: false, zeros_minus_one: true };
        let bf16_round = |v: f32| bf16::from_f32(v).to_f32();
        let (want, _) = dequantize_gptq(&gptq, &parts, &scales, &[2, out], bf16_round).unwrap();
        let kept = gptq_as_int4(&gptq, &parts, &scales, &[2, out]).unwrap().expect("symmetric, in order");
        assert_eq!((kept.rows, kept.cols, kept.group), (out, inputs, group));
        assert_eq!(kept.to_f32_vec(), want);

        // A g_idx that is `i / group` keeps it; an act-order one, an asymmetric zero, 8 bits do not.
        let in_order: Vec<i64> = (0..inputs as i64).map(|i| i / group as i64).collect();
        let with_g_idx = ZeroPointParts { g_idx: Some((&[inputs], &in_order)), ..parts };
        assert!(gptq_as_int4(&gptq, &with_g_idx, &scales, &[2, out]).unwrap().is_some());
        let mut shuffled = in_order.clone();
        shuffled.swap(0, inputs - 1);
        let act_order = ZeroPointParts { g_idx: Some((&[inputs], &shuffled)), ..parts };
        assert!(gptq_as_int4(&gptq, &act_order, &scales, &[2, out]).unwrap().is_none());
        let mut asym = v1_zeros.clone();
        asym[3] = word(&[7, 7, 6, 7, 7, 7, 7, 7], 4);
        let asym = ZeroPointParts { qzeros: (&[2, 2], &asym), ..parts };
        assert!(gptq_as_int4(&gptq, &asym, &scales, &[2, out]).unwrap().is_none());
        // gptq_v2 stores 8 as it is.
        let v2_zeros: Vec<i64> = v1_zeros.iter().map(|_| word(&[8; 8], 4)).collect();
        let v2 = ZeroPointParts { qzeros: (&[2, 2], &v2_zeros), ..parts };
        let kept_v2 = gptq_as_int4(&Gptq { zeros_minus_one: false, ..gptq }, &v2, &scales, &[2, out]).unwrap();
        assert_eq!(kept_v2.expect("symmetric").to_f32_vec(), want);
    }

    #[test]
    fn awq_reads_fields_in_awq_order() {
        // 2 inputs in one group, 8 outputs: q[i][o] = o + 3 i, zero[o] = o / 2.
        let q = |i: i32, o: i32| o + 3 * i;
        let packed = |value: &dyn Fn(i32) -> i32| word(&AWQ_ORDER.map(|col| value(col as i32)), 4);
        let qweight = [packed(&|o| q(0, o)), packed(&|o| q(1, o))];
        let qzeros = [packed(&|o| o / 2)];
        let scales: Vec<f32> = (0..8).map(|o| f16_round(0.3 + o as f32 * 0.11)).collect();
        let parts = ZeroPointParts { qweight: (&[2, 1], &qweight), qzeros: (&[1, 1], &qzeros), g_idx: None };
        let (w, shape) = dequantize_awq(&Awq { group: 2 }, &parts, &scales, &[1, 8], f16_round).unwrap();
        assert_eq!(shape, [8, 2]);
        for o in 0..8 {
            for i in 0..2 {
                let want = f16_round(scales[o as usize] * (q(i, o) - o / 2) as f32);
                assert_eq!(w[o as usize * 2 + i as usize], want, "output {o} input {i}");
            }
        }
        let err = dequantize_awq(&Awq { group: 4 }, &parts, &scales, &[1, 8], f16_round).unwrap_err();
        assert_eq!(err.0, "qweight");
        let err = dequantize_awq(&Awq { group: 2 }, &parts, &scales[..4], &[1, 4], f16_round).unwrap_err();
        assert_eq!(err.0, "scales");
    }
}
