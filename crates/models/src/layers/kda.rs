//! Kimi Delta Attention (Kimi Linear's `KimiLinearDeltaAttention`): Gated DeltaNet
//! ([`crate::layers::gdn`]) with a decay per key channel instead of per head. q, k and v come from
//! separate projections through one short causal conv (no bias) and the model's activation; the
//! log decay is `-exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)` per channel (a low-rank
//! projection), `beta = sigmoid(b_proj(x))`; the delta rule's output goes through a per-head
//! RMSNorm gated by `sigmoid(g_b(g_a(x)))` (another low-rank projection) and `o_proj`.

use ferrite_tensor::{ops, Activation, AttnMetadata, GdnParams, PagedKvLayer, Tensor};

use crate::layers::{Linear, RmsNorm};
use crate::loading::weights::Scope;
use crate::model::StateLayerSpec;
use crate::Result;

/// The chunk length of the reference's chunked prefill form.
const CHUNK_SIZE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdaDims {
    pub num_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
}

impl KdaDims {
    fn width(&self) -> usize {
        self.num_heads * self.head_dim
    }
}

#[derive(Debug, Clone)]
pub struct KimiDeltaAttention {
    /// q, k and v, in the conv's channel order.
    pub qkv: Linear,
    /// Depthwise conv taps `[3 * width, kernel]`, f32.
    pub conv: Tensor,
    pub act: Activation,
    /// The forget gate's low-rank pair (`f_a_proj`, `f_b_proj`).
    pub f_a: Linear,
    pub f_b: Linear,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    pub b: Linear,
    /// The output gate's low-rank pair (`g_a_proj`, `g_b_proj`).
    pub g_a: Linear,
    pub g_b: Linear,
    pub norm: RmsNorm,
    pub out: Linear,
    pub dims: KdaDims,
}

impl KimiDeltaAttention {
    /// The layer under `s` (a `self_attn` scope); `eps` is the gated norm's (`rms_norm_eps`).
    /// Checkpoints (and transformers' saves) keep q, k and v's conv taps apart and the forget
    /// gate's tensors directly under `self_attn`; transformers' modules hold one `conv1d` and a
    /// `forget_gate` submodule. Both load.
    pub fn load(s: &Scope, hidden: usize, dims: KdaDims, act: Activation, eps: f64) -> Result<KimiDeltaAttention> {
        let (width, h, dk, taps) = (dims.width(), dims.num_heads, dims.head_dim, dims.conv_kernel);
        let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|name| s.linear(name, hidden, width, false));
        let qkv = Linear::new(ops::concat_rows(&[&q?.weight, &k?.weight, &v?.weight])?, None);
        let channels = 3 * width;
        let w = s.weights();
        let conv = if w.contains(&s.name("conv1d.weight")) {
            s.get_f32("conv1d.weight", &[channels, 1, taps])?.reshape(&[channels, taps])?
        } else {
            let [q, k, v] = ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"]
                .map(|leaf| -> Result<Tensor> { Ok(s.get_f32(leaf, &[width, 1, taps])?.reshape(&[width, taps])?) });
            ops::concat_rows(&[&q?, &k?, &v?])?
        };
        let gate = if w.contains(&s.name("forget_gate.dt_bias")) { s.at("forget_gate") } else { s.at("") };
        Ok(KimiDeltaAttention {
            qkv,
            conv,
            act,
            f_a: gate.linear("f_a_proj", hidden, dk, false)?,
            f_b: gate.linear("f_b_proj", dk, width, false)?,
            a_log: gate.get_f32("A_log", &[1, 1, h, 1])?.reshape(&[h])?,
            dt_bias: gate.get_f32("dt_bias", &[width])?,
            b: s.linear("b_proj", hidden, h, false)?,
            g_a: s.linear("g_a_proj", hidden, dk, false)?,
            g_b: s.linear("g_b_proj", dk, width, false)?,
            norm: s.rms("o_norm", dk, eps)?,
            out: s.linear("o_proj", width, hidden, false)?,
            dims,
        })
    }

    pub fn state_spec(&self) -> StateLayerSpec {
        let d = &self.dims;
        StateLayerSpec { conv: (d.conv_kernel - 1) * 3 * d.width(), recurrent: d.num_heads * d.head_dim * d.head_dim }
    }

    pub fn forward(&self, x: &Tensor, meta: &AttnMetadata, state: &mut PagedKvLayer) -> Result<Tensor> {
        let d = &self.dims;
        let width = d.width();
        ops::copy_state_slots(state, &meta.state_copies.before)?;
        let mixed = ops::causal_conv1d(&self.qkv.forward(x)?, &self.conv, None, Some(self.act), state, meta)?;
        let [q, k, v] = [0, 1, 2].map(|i| ops::narrow_cols(&mixed, i * width, width));
        let params = GdnParams {
            num_k_heads: d.num_heads,
            num_v_heads: d.num_heads,
            k_dim: d.head_dim,
            v_dim: d.head_dim,
            chunk_size: CHUNK_SIZE,
            beta_scale: 1.0,
            channel_decay: true,
        };
        let f = self.f_b.forward(&self.f_a.forward(x)?)?;
        let b = self.b.forward(x)?;
        let core = ops::gated_delta_rule(&q?, &k?, &v?, &f, &b, &self.a_log, &self.dt_bias, state, meta, &params)?;
        ops::copy_state_slots(state, &meta.state_copies.after)?;
        let normed = self.norm.forward_heads(&core, d.head_dim)?;
        let gate = self.g_b.forward(&self.g_a.forward(x)?)?;
        self.out.forward(&ops::act_mul(&gate, &normed, Activation::Sigmoid)?)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.qkv, &self.f_a, &self.f_b, &self.b, &self.g_a, &self.g_b, &self.out]
            .iter()
            .map(|l| l.weight.size_in_bytes())
            .sum::<usize>()
            + self.conv.size_in_bytes()
    }
}
