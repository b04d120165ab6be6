//! Mamba2's mixer (state-space duality): one input projection gives the gate z, the conv input
//! (x, B, C) and dt; a causal conv with SiLU, the selective scan over a `[head_dim, state]` state
//! per head (B and C shared by groups of heads), the D skip, the gate `silu(z)` with an RMSNorm per
//! group (see [`GateNorm`]) and the output projection. Falcon-H1 adds muP multipliers on the input
//! projection's outputs ([`InProjScales`]).

use ferrite_tensor::{ops, Activation, AttnMetadata, PagedKvLayer, SelectiveScanParams, Tensor};

use crate::layers::{Linear, RmsNorm};
use crate::loading::weights::Scope;
use crate::model::StateLayerSpec;
use crate::Result;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2Dims {
    pub num_heads: usize,
    pub head_dim: usize,
    pub num_groups: usize,
    pub state_size: usize,
    pub conv_kernel: usize,
    pub conv_bias: bool,
    /// Bias on `in_proj`.
    pub proj_bias: bool,
    /// Bias on `out_proj` (Falcon-H1 sets it apart, by `projectors_bias`).
    pub out_bias: bool,
    pub gate_norm: GateNorm,
    /// The clamp of `dt` on prompts (see [`SelectiveScanParams::dt_limit`]).
    pub dt_limit: (f32, f32),
    pub eps: f64,
}

impl Mamba2Dims {
    fn inner(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Channels of the causal conv: x, B and C side by side.
    fn conv_channels(&self) -> usize {
        self.inner() + 2 * self.num_groups * self.state_size
    }
}

/// Where the gate `silu(z)` and the grouped RMSNorm (with its weight) meet the scan output `y`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateNorm {
    /// `norm(y * silu(z))`: Mamba2's, transformers' `norm_before_gate=False`.
    AfterGate,
    /// `norm(y) * silu(z)` (Falcon-H1's `mamba_norm_before_gate`).
    BeforeGate,
    /// `y * silu(z)` and no norm (Falcon-H1 without `mamba_rms_norm`).
    None,
}

/// Multipliers of `in_proj`'s output sections, applied after the product as transformers applies
/// its muP vector (folding them into the weights would round differently).
#[derive(Debug, Clone)]
pub struct InProjScales {
    pub z: f32,
    /// One factor per conv channel: x, then B, then C.
    pub xbc: Tensor,
    pub dt: f32,
}

#[derive(Debug, Clone)]
pub struct Mamba2Mixer {
    pub z: Linear,
    pub xbc: Linear,
    pub dt: Linear,
    /// Depthwise conv taps `[channels, kernel]` and bias, f32.
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    pub d: Tensor,
    /// Normalises each group of `inner / groups` channels (a weightless RMSNorm), then the weight;
    /// `None` for [`GateNorm::None`].
    pub norm: Option<(RmsNorm, Tensor)>,
    pub in_scales: Option<InProjScales>,
    pub out: Linear,
    pub dims: Mamba2Dims,
}

impl Mamba2Mixer {
    /// The mixer under `s` (a `mixer` scope): `in_proj` rows are `[z, x B C, dt]`.
    pub fn load(s: &Scope, hidden: usize, dims: Mamba2Dims) -> Result<Mamba2Mixer> {
        let (inner, channels, heads) = (dims.inner(), dims.conv_channels(), dims.num_heads);
        let in_proj = s.linear("in_proj", hidden, inner + channels + heads, dims.proj_bias)?;
        let [z, xbc, dt]: [Linear; 3] =
            in_proj.split_rows(&[inner, channels, heads])?.try_into().expect("three row blocks");
        let w = s.weights();
        let conv = w.get_f32(&s.name("conv1d.weight"), &[channels, 1, dims.conv_kernel])?;
        let conv_bias = dims.conv_bias.then(|| w.get_f32(&s.name("conv1d.bias"), &[channels])).transpose()?;
        let norm = match dims.gate_norm {
            GateNorm::None => None,
            GateNorm::AfterGate | GateNorm::BeforeGate => {
                let group = inner / dims.num_groups;
                let ones = Tensor::from_f32(vec![1.0; group], &[group])?.to_device(w.device())?;
                let group_norm = RmsNorm { weight: ones, eps: dims.eps as f32, offset: 0.0 };
                Some((group_norm, w.get_f32(&s.name("norm.weight"), &[inner])?))
            }
        };
        Ok(Mamba2Mixer {
            z,
            xbc,
            dt,
            conv: conv.reshape(&[channels, dims.conv_kernel])?,
            conv_bias,
            a_log: w.get_f32(&s.name("A_log"), &[heads])?,
            dt_bias: w.get_f32(&s.name("dt_bias"), &[heads])?,
            d: w.get_f32(&s.name("D"), &[heads])?,
            norm,
            in_scales: None,
            out: s.linear("out_proj", inner, hidden, dims.out_bias)?,
            dims,
        })
    }

    /// Falcon-H1's muP vector: `[z, x, B, C, dt]` multipliers of `in_proj`'s output sections.
    pub fn with_in_scales(mut self, [z, x, b, c, dt]: [f32; 5]) -> Result<Mamba2Mixer> {
        let (inner, bc) = (self.dims.inner(), self.dims.num_groups * self.dims.state_size);
        let xbc: Vec<f32> =
            [(x, inner), (b, bc), (c, bc)].iter().flat_map(|&(v, n)| std::iter::repeat_n(v, n)).collect();
        let xbc = Tensor::from_f32(xbc, &[inner + 2 * bc])?.to_device(self.conv.device())?;
        self.in_scales = Some(InProjScales { z, xbc, dt });
        Ok(self)
    }

    pub fn state_spec(&self) -> StateLayerSpec {
        let d = &self.dims;
        StateLayerSpec {
            conv: (d.conv_kernel - 1) * d.conv_channels(),
            recurrent: d.num_heads * d.head_dim * d.state_size,
        }
    }

    pub fn forward(&self, x: &Tensor, meta: &AttnMetadata, state: &mut PagedKvLayer) -> Result<Tensor> {
        let d = &self.dims;
        ops::copy_state_slots(state, &meta.state_copies.before)?;
        let (mut z, mut xbc, mut dt) = (self.z.forward(x)?, self.xbc.forward(x)?, self.dt.forward(x)?);
        if let Some(s) = &self.in_scales {
            (z, xbc, dt) = (ops::scale(&z, s.z)?, ops::mul_row(&xbc, &s.xbc)?, ops::scale(&dt, s.dt)?);
        }
        let xbc = ops::causal_conv1d(&xbc, &self.conv, self.conv_bias.as_ref(), Some(Activation::Silu), state, meta)?;
        let (inner, bc) = (d.inner(), d.num_groups * d.state_size);
        let params = SelectiveScanParams {
            num_heads: d.num_heads,
            head_dim: d.head_dim,
            num_groups: d.num_groups,
            state_size: d.state_size,
            dt_limit: d.dt_limit,
            per_channel: false,
        };
        let y = ops::selective_scan(
            &ops::narrow_cols(&xbc, 0, inner)?,
            &dt,
            &ops::narrow_cols(&xbc, inner, bc)?,
            &ops::narrow_cols(&xbc, inner + bc, bc)?,
            &self.a_log,
            &self.dt_bias,
            &self.d,
            state,
            meta,
            &params,
        )?;
        ops::copy_state_slots(state, &meta.state_copies.after)?;
        let group = inner / d.num_groups;
        let out = match (&self.norm, d.gate_norm) {
            (Some((norm, weight)), GateNorm::AfterGate) => {
                let gated = ops::act_mul(&z, &y, Activation::Silu)?;
                ops::mul_row(&norm.forward_heads(&gated, group)?, weight)?
            }
            (Some((norm, weight)), GateNorm::BeforeGate) => {
                let normed = ops::mul_row(&norm.forward_heads(&y, group)?, weight)?;
                ops::act_mul(&z, &normed, Activation::Silu)?
            }
            _ => ops::act_mul(&z, &y, Activation::Silu)?,
        };
        self.out.forward(&out)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.z, &self.xbc, &self.dt, &self.out].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
            + self.conv.size_in_bytes()
    }
}
