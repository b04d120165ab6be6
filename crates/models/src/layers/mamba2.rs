//! Mamba2's mixer (state-space duality): one input projection gives the gate z, the conv input
//! (x, B, C) and dt; a causal conv with SiLU, the selective scan over a `[head_dim, state]` state
//! per head (B and C shared by groups of heads), the D skip, a gated RMSNorm per group
//! (`norm(y * silu(z))`, transformers' `norm_before_gate=False`) and the output projection.

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
    pub proj_bias: bool,
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
    /// Normalises each group of `inner / groups` channels (a weightless RMSNorm), then `norm_weight`.
    pub group_norm: RmsNorm,
    pub norm_weight: Tensor,
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
        let group = inner / dims.num_groups;
        let ones = Tensor::from_f32(vec![1.0; group], &[group])?.to_device(w.device())?;
        Ok(Mamba2Mixer {
            z,
            xbc,
            dt,
            conv: conv.reshape(&[channels, dims.conv_kernel])?,
            conv_bias,
            a_log: w.get_f32(&s.name("A_log"), &[heads])?,
            dt_bias: w.get_f32(&s.name("dt_bias"), &[heads])?,
            d: w.get_f32(&s.name("D"), &[heads])?,
            group_norm: RmsNorm { weight: ones, eps: dims.eps as f32, offset: 0.0 },
            norm_weight: w.get_f32(&s.name("norm.weight"), &[inner])?,
            out: s.linear("out_proj", inner, hidden, dims.proj_bias)?,
            dims,
        })
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
        let xbc = self.xbc.forward(x)?;
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
            &self.dt.forward(x)?,
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
        let gated = ops::act_mul(&self.z.forward(x)?, &y, Activation::Silu)?;
        let normed = self.group_norm.forward_heads(&gated, inner / d.num_groups)?;
        self.out.forward(&ops::mul_row(&normed, &self.norm_weight)?)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.z, &self.xbc, &self.dt, &self.out].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
            + self.conv.size_in_bytes()
    }
}
