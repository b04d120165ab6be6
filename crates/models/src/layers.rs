//! Layers shared by the model families. Each layer owns its weights and a `forward` over the
//! flattened `[tokens, features]` batch.

use ferrite_tensor::{ops, Activation, AttentionParams, AttnMetadata, PagedKvLayer, Tensor};

use crate::rope::Rope;
use crate::weights::Weights;
use crate::Result;

/// A `torch.nn.Linear`: weight `[out, in]`, optional bias `[out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn load(w: &Weights, prefix: &str, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let weight = w.get(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = if bias { Some(w.get_f32(&format!("{prefix}.bias"), &[out_features])?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// Loads a bias when the checkpoint has one (some configs do not say).
    pub fn load_opt_bias(w: &Weights, prefix: &str, in_features: usize, out_features: usize) -> Result<Linear> {
        let weight = w.get(&format!("{prefix}.weight"), &[out_features, in_features])?;
        let bias = w.get_f32_opt(&format!("{prefix}.bias"), &[out_features])?;
        Ok(Linear { weight, bias })
    }

    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::matmul_t(x, &self.weight, self.bias.as_ref())?)
    }
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
    pub fn load(w: &Weights, prefix: &str, hidden: usize, intermediate: usize, act: Activation, bias: bool) -> Result<GatedMlp> {
        Ok(GatedMlp {
            gate: Linear::load(w, &format!("{prefix}.gate_proj"), hidden, intermediate, bias)?,
            up: Linear::load(w, &format!("{prefix}.up_proj"), hidden, intermediate, bias)?,
            down: Linear::load(w, &format!("{prefix}.down_proj"), intermediate, hidden, bias)?,
            act,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = ops::act_mul(&self.gate.forward(x)?, &self.up.forward(x)?, self.act)?;
        self.down.forward(&h)
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
    pub params: AttentionParams,
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
        let d = self.params.head_dim;
        let mut q = self.q.forward(x)?;
        let mut k = self.k.forward(x)?;
        let v = self.v.forward(x)?;
        if let Some(n) = &self.q_norm {
            q = n.forward_heads(&q, d)?;
        }
        if let Some(n) = &self.k_norm {
            k = n.forward_heads(&k, d)?;
        }
        if let Some((rope, cos, sin)) = rope {
            q = rope.apply(&q, cos, sin)?;
            k = rope.apply(&k, cos, sin)?;
        }
        ops::write_kv(cache, &k, &v, meta)?;
        let attn = ops::paged_attention(&q, cache, meta, &self.params)?;
        self.o.forward(&attn)
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
