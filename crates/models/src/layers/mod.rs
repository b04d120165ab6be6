//! Layers shared by the model families. Each layer owns its weights and a `forward` over the
//! flattened `[tokens, features]` batch: linear, norms, MLPs and attention here, rotary
//! embeddings in [`rope`], multi-head latent attention in [`mla`] (DeepSeek-V3.2's sparse-attention
//! indexer in [`dsa`]), mixtures of experts in [`moe`].

pub mod dsa;
pub mod gdn;
pub mod kda;
pub mod mamba;
pub mod mamba2;
pub mod mla;
pub mod moe;
pub mod rope;
pub mod shared_block;
pub mod short_conv;
pub mod vit;

use std::ops::Range;

use ferrite_tensor::{
    ops, Activation, ActivationQuant, AttentionParams, AttnMetadata, CpuStorage, Device, PagedKvLayer, Storage, Tensor,
    TensorError, Xielu,
};

use crate::layers::rope::Rope;
use crate::loading::weights::{Scope, Weights};
use crate::Result;

/// A `torch.nn.Linear`: weight `[out, in]`, optional bias `[out]`, and for an FP8 W8A8
/// checkpoint's layers the quantization its input goes through first.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub input_quant: Option<ActivationQuant>,
}

impl Linear {
    /// Its weight's and bias's bytes.
    pub fn size_in_bytes(&self) -> usize {
        self.weight.size_in_bytes() + self.bias.as_ref().map_or(0, Tensor::size_in_bytes)
    }

    /// An unquantized layer.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear { weight, bias, input_quant: None }
    }

    pub fn load(w: &Weights, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = w.linear_weight(prefix, [out_features, in_features])?;
        let bias = if bias { Some(w.get_f32(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear { weight, bias, input_quant: w.input_quant(prefix)? })
    }

    /// The LM head: as stored, never quantized at load (vLLM keeps it in the model's dtype).
    pub fn load_head(w: &Weights, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = w.matrix(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = if bias { Some(w.get_f32(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear { weight, bias, input_quant: w.stored_input_quant(prefix)? })
    }

    /// Loads a bias when the checkpoint has one (some configs do not say).
    pub fn load_opt_bias(w: &Weights, prefix: &str, in_features: usize, out_features: usize) -> Result<Linear> {
        let weight = w.linear_weight(prefix, [out_features, in_features])?;
        let bias = w.get_f32_opt(&format!("{prefix}.bias"), &[out_features])?;
        Ok(Linear { weight, bias, input_quant: w.input_quant(prefix)? })
    }

    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// A GPT-2 `Conv1D` (`x @ W + b` with `W [in, out]`): transposed here to the `Linear` layout.
    pub fn load_conv1d(w: &Weights, prefix: &str, in_features: usize, out_features: usize) -> Result<Linear> {
        let weight = w.linear_weight_transposed(prefix, [out_features, in_features])?;
        let bias = Some(w.get_f32(&format!("{prefix}.bias"), &[out_features])?);
        Ok(Linear { weight, bias, input_quant: w.input_quant(prefix)? })
    }

    /// Splits a fused projection (`qkv_proj`, `gate_up_proj`) into consecutive blocks of output rows.
    pub fn split_rows(&self, sizes: &[usize]) -> Result<Vec<Linear>> {
        let mut start = 0;
        let mut parts = Vec::with_capacity(sizes.len());
        for &n in sizes {
            parts.push(self.select_rows(std::slice::from_ref(&(start..start + n)))?);
            start += n;
        }
        if start != self.out_features() {
            return Err(TensorError::Shape {
                op: "split_rows",
                detail: format!("{sizes:?} do not add up to {} rows", self.out_features()),
            }
            .into());
        }
        Ok(parts)
    }

    /// The output rows in `ranges`, concatenated in that order (de-interleaves per-head fused layouts).
    pub fn select_rows(&self, ranges: &[Range<usize>]) -> Result<Linear> {
        Ok(Linear {
            weight: select_rows(&self.weight, ranges)?,
            bias: self.bias.as_ref().map(|b| select_rows(b, ranges)).transpose()?,
            input_quant: self.input_quant,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = quantized_input(x, self.input_quant)?;
        Ok(ops::matmul_t(&x, &self.weight, self.bias.as_ref())?)
    }

    fn operands(&self) -> (&Tensor, Option<&Tensor>) {
        (&self.weight, self.bias.as_ref())
    }
}

/// `x` as a layer whose input is quantized by `quant` sees it.
fn quantized_input(x: &Tensor, quant: Option<ActivationQuant>) -> Result<std::borrow::Cow<'_, Tensor>> {
    Ok(match quant {
        Some(q) => std::borrow::Cow::Owned(ops::fp8_fake_quant(x, q)?),
        None => std::borrow::Cow::Borrowed(x),
    })
}

#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
    /// 1.0 for norms stored as `w` and applied as `(1 + w)` (Gemma), else 0.
    pub offset: f32,
}

impl RmsNorm {
    pub fn load(w: &Weights, name: &str, size: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: w.get_f32(&format!("{name}.weight"), &[size])?, eps: eps as f32, offset: 0.0 })
    }

    pub fn with_offset(mut self, offset: f32) -> RmsNorm {
        self.offset = offset;
        self
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, &self.weight, self.eps, self.offset)?)
    }

    /// `residual + x` and its norm in one pass: `(norm(residual + x), residual + x)`.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok(ops::add_rms_norm(x, residual, &self.weight, self.eps, self.offset)?)
    }

    /// Normalises each head of `x [tokens, heads * head_dim]` separately (QK-norm).
    pub fn forward_heads(&self, x: &Tensor, head_dim: usize) -> Result<Tensor> {
        let rows = x.rows();
        let per_head = x.reshape(&[rows * (x.last_dim() / head_dim), head_dim])?;
        Ok(ops::rms_norm(&per_head, &self.weight, self.eps, self.offset)?.reshape(x.shape())?)
    }
}

#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub eps: f32,
}

impl LayerNorm {
    pub fn load(w: &Weights, name: &str, size: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        let weight = Some(w.get_f32(&format!("{name}.weight"), &[size])?);
        let bias = if bias { Some(w.get_f32(&format!("{name}.bias"), &[size])?) } else { None };
        Ok(LayerNorm { weight, bias, eps: eps as f32 })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::layer_norm(x, self.weight.as_ref(), self.bias.as_ref(), self.eps)?)
    }
}

/// `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct GatedMlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    pub act: Activation,
}

impl GatedMlp {
    pub fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
        act: Activation,
        bias: bool,
    ) -> Result<GatedMlp> {
        Ok(GatedMlp {
            gate: Linear::load(w, &format!("{prefix}.gate_proj"), hidden, intermediate, bias)?,
            up: Linear::load(w, &format!("{prefix}.up_proj"), hidden, intermediate, bias)?,
            down: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, bias)?,
            act,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let shared_input = self.gate.input_quant == self.up.input_quant;
        let h = match (&self.gate.bias, &self.up.bias) {
            (None, None) if shared_input => {
                let x = quantized_input(x, self.gate.input_quant)?;
                ops::gated_matmul_t(&x, &self.gate.weight, &self.up.weight, self.act)?
            }
            _ => ops::act_mul(&self.gate.forward(x)?, &self.up.forward(x)?, self.act)?,
        };
        self.down.forward(&h)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down].iter().map(|l| l.weight.size_in_bytes()).sum()
    }
}

/// Falcon-H1's MLP: `down(act(gate(x) * gate_scale) * up(x)) * down_scale`. The muP multipliers
/// scale the products, as transformers applies them, rather than being folded into the weights.
#[derive(Debug, Clone)]
pub struct ScaledGatedMlp {
    pub mlp: GatedMlp,
    pub gate_scale: f32,
    pub down_scale: f32,
}

impl ScaledGatedMlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = ops::scale(&self.mlp.gate.forward(x)?, self.gate_scale)?;
        let h = ops::act_mul(&gate, &self.mlp.up.forward(x)?, self.mlp.act)?;
        Ok(ops::scale(&self.mlp.down.forward(&h)?, self.down_scale)?)
    }
}

/// Self-attention over the paged cache: q/k/v projections, optional per-head QK-norm, rotary
/// embeddings, cache write, paged attention and the output projection.
#[derive(Debug, Clone)]
pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    /// Multiplies the rotated queries by a factor of their position.
    pub query_scale: Option<QueryScale>,
    pub params: AttentionParams,
}

/// A per-position query multiplier, applied after the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueryScale {
    /// Llama 4's long-context scaling as Ministral 3 applies it (`llama_4_scaling_beta`):
    /// `1 + beta * ln(1 + floor(position / original_max_position_embeddings))`.
    Llama4 { beta: f64, original_max: usize },
    /// Llama 4's attention temperature tuning on its NoPE layers:
    /// `log1p(floor((position + 1) / floor_scale)) * attn_scale + 1`.
    Temperature { floor_scale: f32, attn_scale: f32 },
}

impl QueryScale {
    /// The factor at `position`, in f32 as torch computes it from the integer positions.
    pub fn at(&self, position: usize) -> f32 {
        match *self {
            QueryScale::Llama4 { beta, original_max } => {
                let steps = (position as f32 / original_max as f32).floor();
                1.0 + (beta as f32) * (1.0 + steps).ln()
            }
            QueryScale::Temperature { floor_scale, attn_scale } => {
                ((position as f32 + 1.0) / floor_scale).floor().ln_1p() * attn_scale + 1.0
            }
        }
    }

    /// `q [tokens, width]` times each token's factor, rounded to `q`'s dtype first (as
    /// `scale.to(query.dtype)`). The factors are a step table, so CUDA graphs replay them.
    pub fn apply(&self, q: &Tensor, meta: &AttnMetadata) -> Result<Tensor> {
        let (this, width) = (*self, q.last_dim());
        let fill: ferrite_tensor::cuda::HostFill = std::sync::Arc::new(move |meta: &AttnMetadata| {
            meta.positions().into_iter().flat_map(|p| std::iter::repeat_n(this.at(p), width)).collect()
        });
        let factors = ops::step_tensor(meta, q.device(), width, fill)?.to_dtype(q.dtype());
        Ok(ops::mul(q, &factors)?)
    }
}

impl Attention {
    /// `cos`/`sin` come from the layer's [`Rope`] for this batch (shared by layers with the same rope).
    pub fn forward(
        &self,
        x: &Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let (q, k, v) = self.project(x)?;
        self.attend(q, k, v, rope, meta, cache)
    }

    /// The q/k/v projections and the RMS QK-norm. A norm spans its weight's width: one head
    /// (weight `[head_dim]`, Qwen3, Gemma 3) or all heads at once (weight `[heads * head_dim]`,
    /// OLMo-2).
    pub fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        // Static W8A8 checkpoints give each projection its own input scale, so the three see
        // differently quantized inputs; otherwise one input serves all three products.
        let (mut q, mut k, v) = if self.q.input_quant == self.k.input_quant && self.q.input_quant == self.v.input_quant
        {
            let x = quantized_input(x, self.q.input_quant)?;
            let qkv = ops::matmul_t_many(&x, &[self.q.operands(), self.k.operands(), self.v.operands()])?;
            let [q, k, v]: [Tensor; 3] = qkv.try_into().expect("one product per weight");
            (q, k, v)
        } else {
            (self.q.forward(x)?, self.k.forward(x)?, self.v.forward(x)?)
        };
        if let Some(n) = &self.q_norm {
            q = n.forward_heads(&q, n.weight.numel())?;
        }
        if let Some(n) = &self.k_norm {
            k = n.forward_heads(&k, n.weight.numel())?;
        }
        Ok((q, k, v))
    }

    /// Rotary embeddings, cache write, paged attention and the output projection over q/k/v
    /// that are already projected (and normalised, for families whose QK-norm is not RMS).
    pub fn attend(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        self.attend_sinks(q, k, v, rope, meta, cache, None, None)
    }

    /// [`Attention::attend`] with an attention sink per head (`[heads]` f32 logits), and the
    /// attention output multiplied by `sigmoid(output_gate)` before the output projection
    /// (Qwen3-Next's gated attention).
    #[allow(clippy::too_many_arguments)]
    pub fn attend_sinks(
        &self,
        mut q: Tensor,
        k: Tensor,
        v: Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
        sinks: Option<&Tensor>,
        output_gate: Option<&Tensor>,
    ) -> Result<Tensor> {
        match rope {
            Some((rope, cos, sin)) => q = rope.apply_with_kv(&q, &k, &v, cos, sin, cache, meta)?,
            None => ops::write_kv(cache, &k, &v, meta)?,
        }
        if let Some(s) = &self.query_scale {
            q = s.apply(&q, meta)?;
        }
        let attn = ops::paged_attention_sinks(&q, cache, meta, &self.params, sinks)?;
        match output_gate {
            Some(gate) => self.o.forward(&ops::act_mul(gate, &attn, Activation::Sigmoid)?),
            None => self.o.forward(&attn),
        }
    }
}

/// Token embeddings, optionally shared with the LM head.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub table: Tensor,
}

impl Embedding {
    pub fn forward(&self, ids: &[u32]) -> Result<Tensor> {
        Ok(ops::embedding(&self.table, ids)?)
    }
}

/// The layers a loader reads from a scope, each by the name of its checkpoint module.
impl Scope<'_> {
    pub fn linear(&self, leaf: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        Linear::load(self.weights(), &self.name(leaf), in_features, out_features, bias)
    }

    pub fn rms(&self, leaf: &str, size: usize, eps: f64) -> Result<RmsNorm> {
        RmsNorm::load(self.weights(), &self.name(leaf), size, eps)
    }

    pub fn layer_norm(&self, leaf: &str, size: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        LayerNorm::load(self.weights(), &self.name(leaf), size, eps, bias)
    }

    /// `{leaf}.{gate,up,down}_proj`.
    pub fn gated_mlp(&self, leaf: &str, hidden: usize, width: usize, act: Activation, bias: bool) -> Result<GatedMlp> {
        GatedMlp::load(self.weights(), &self.name(leaf), hidden, width, act, bias)
    }
}

/// Rows `ranges` of a CPU matrix (a 1-D tensor is one column), concatenated; for reshaping
/// checkpoint tensors at load time, before they move to a device.
fn select_rows(t: &Tensor, ranges: &[Range<usize>]) -> Result<Tensor> {
    let cols = if t.rank() == 1 { 1 } else { t.last_dim() };
    let rows = t.numel().checked_div(cols).unwrap_or(0);
    if let Some(bad) = ranges.iter().find(|r| r.start > r.end || r.end > rows) {
        return Err(TensorError::Shape { op: "select_rows", detail: format!("rows {bad:?} of {:?}", t.shape()) }.into());
    }
    fn pick<T: Copy>(v: &[T], cols: usize, ranges: &[Range<usize>]) -> Vec<T> {
        ranges.iter().flat_map(|r| v[r.start * cols..r.end * cols].iter().copied()).collect()
    }
    // Load-time only, so a device tensor takes the round trip through host memory.
    let host = t.to_device(Device::Cpu)?;
    let storage = match host.cpu() {
        Some(CpuStorage::F32(v)) => CpuStorage::F32(pick(v, cols, ranges)),
        Some(CpuStorage::F16(v)) => CpuStorage::F16(pick(v, cols, ranges)),
        Some(CpuStorage::BF16(v)) => CpuStorage::BF16(pick(v, cols, ranges)),
        // A row of a kept-quantized matrix is whole blocks: its bytes move as a unit.
        Some(CpuStorage::Ggml(b)) => {
            let bytes = pick(&b.bytes, b.ty.bytes_for(cols), ranges);
            CpuStorage::Ggml(ferrite_tensor::ggml::GgmlBlocks { ty: b.ty, bytes })
        }
        // Packed rows move as words; a part the CUDA kernel cannot take is dequantized.
        Some(CpuStorage::Int4(m)) => {
            let part = m.select_rows(ranges);
            if ferrite_tensor::int4::Int4Matrix::kernel_takes(part.rows, part.cols, part.group) {
                CpuStorage::Int4(part)
            } else {
                CpuStorage::BF16(part.to_f32_vec().into_iter().map(half::bf16::from_f32).collect())
            }
        }
        // Whole blocks of rows move with their scales; a part that cuts a block is dequantized.
        Some(CpuStorage::Fp8(m)) => match m.select_rows(ranges) {
            Some(part) => CpuStorage::Fp8(part),
            None => CpuStorage::BF16(
                ranges
                    .iter()
                    .flat_map(|r| {
                        (r.start * cols..r.end * cols).map(|i| half::bf16::from_f32(m.value(i / cols, i % cols)))
                    })
                    .collect(),
            ),
        },
        None => {
            return Err(TensorError::Unsupported { op: "select_rows", detail: "a tensor on a device".into() }.into())
        }
    };
    let n: usize = ranges.iter().map(|r| r.len()).sum();
    let shape = if t.rank() == 1 { vec![n] } else { vec![n, cols] };
    Ok(Tensor::from_storage(Storage::Cpu(storage), shape)?.to_device(t.device())?)
}

/// RMSNorm or LayerNorm, for blocks whose family picks one.
#[derive(Debug, Clone)]
pub enum Norm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

impl Norm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Rms(n) => n.forward(x),
            Norm::Layer(n) => n.forward(x),
        }
    }
}

/// LayerNorm over each head of `x [tokens, heads * head_dim]` (the QK-norm of StableLM and Cohere).
/// The affine weight is shared by every head (`[head_dim]`, Phi's `qk_layernorm` form) or one per
/// head (`[heads * head_dim]`); a bias, where present, is shared.
#[derive(Debug, Clone)]
pub struct HeadLayerNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub head_dim: usize,
    pub eps: f32,
}

impl HeadLayerNorm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.head_dim;
        let per_head = x.reshape(&[x.numel() / d, d])?;
        let shared = self.weight.as_ref().is_none_or(|w| w.numel() == d);
        if shared {
            return Ok(
                ops::layer_norm(&per_head, self.weight.as_ref(), self.bias.as_ref(), self.eps)?.reshape(x.shape())?
            );
        }
        if self.bias.is_some() {
            return Err(TensorError::Unsupported {
                op: "HeadLayerNorm",
                detail: "per-head weights with a bias".into(),
            }
            .into());
        }
        let normed = ops::layer_norm(&per_head, None, None, self.eps)?.reshape(x.shape())?;
        match &self.weight {
            Some(w) => Ok(ops::mul_row(&normed, w)?),
            None => Ok(normed),
        }
    }
}

/// `fc2(act(fc1(x)))`: the ungated MLP of GPT-2, OPT, GPT-NeoX, Phi and Starcoder2.
#[derive(Debug, Clone)]
pub struct DenseMlp {
    pub fc1: Linear,
    pub fc2: Linear,
    pub act: MlpActivation,
}

/// What an ungated MLP applies between its projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MlpActivation {
    Fixed(Activation),
    /// xIELU with the layer's learned constants (Apertus).
    Xielu(Xielu),
}

impl From<Activation> for MlpActivation {
    fn from(act: Activation) -> MlpActivation {
        MlpActivation::Fixed(act)
    }
}

impl DenseMlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc1.forward(x)?;
        let h = match self.act {
            MlpActivation::Fixed(act) => ops::activation(&h, act)?,
            MlpActivation::Xielu(p) => ops::xielu(&h, p)?,
        };
        self.fc2.forward(&h)
    }
}

#[cfg(test)]
mod tests {
    use ferrite_tensor::{DType, Tensor};

    use super::*;

    #[test]
    fn select_rows_keeps_dtype_and_order() {
        let t = Tensor::from_f32_as((0..12).map(|v| v as f32).collect(), &[4, 3], DType::BF16).unwrap();
        let picked = select_rows(&t, &[2..3, 0..2]).unwrap();
        assert_eq!((picked.shape(), picked.dtype()), (&[3usize, 3][..], DType::BF16));
        assert_eq!(picked.to_f32_vec(), [6., 7., 8., 0., 1., 2., 3., 4., 5.]);
        let bias = Tensor::from_f32(vec![1., 2., 3., 4.], &[4]).unwrap();
        assert_eq!(select_rows(&bias, &[3..4, 1..2]).unwrap().to_f32_vec(), [4., 2.]);
        assert!(select_rows(&t, std::slice::from_ref(&(3..5))).is_err());
    }

    #[test]
    fn split_rows_covers_every_row() {
        let w = Tensor::from_f32((0..10).map(|v| v as f32).collect(), &[5, 2]).unwrap();
        let lin = Linear::new(w, Some(Tensor::from_f32(vec![0., 1., 2., 3., 4.], &[5]).unwrap()));
        let parts = lin.split_rows(&[3, 2]).unwrap();
        assert_eq!(parts[1].weight.to_f32_vec(), [6., 7., 8., 9.]);
        assert_eq!(parts[1].bias.as_ref().unwrap().to_f32_vec(), [3., 4.]);
        assert!(lin.split_rows(&[3, 1]).is_err());
    }

    #[test]
    fn head_layer_norm_per_head_weights_match_shared_when_equal() {
        let x = Tensor::from_f32((0..16).map(|v| ((v * 7) % 5) as f32 - 2.0).collect(), &[2, 8]).unwrap();
        let shared = HeadLayerNorm {
            weight: Some(Tensor::from_f32(vec![0.5, 1.0, 1.5, 2.0], &[4]).unwrap()),
            bias: None,
            head_dim: 4,
            eps: 1e-5,
        };
        let per_head = HeadLayerNorm {
            weight: Some(Tensor::from_f32(vec![0.5, 1.0, 1.5, 2.0, 0.5, 1.0, 1.5, 2.0], &[8]).unwrap()),
            ..shared.clone()
        };
        let (a, b) = (shared.forward(&x).unwrap().to_f32_vec(), per_head.forward(&x).unwrap().to_f32_vec());
        assert_eq!(a, b);
        // Each head is normalised on its own: zero mean over every 4 values once the weight is divided out.
        for head in a.chunks(4) {
            let unweighted: f32 = head.iter().zip([0.5, 1.0, 1.5, 2.0]).map(|(v, w)| v / w).sum();
            assert!(unweighted.abs() < 1e-4, "{head:?}");
        }
    }
}
