//! Mamba's mixer (the selective SSM of Mamba 1): one input projection gives the scan input x and
//! the gate z; a causal conv with SiLU over x; `x_proj` gives the rank-`dt_rank` time step and
//! the state's B and C (shared by all channels) from the conv output; `dt_proj` widens the time
//! step to one per channel (its bias added inside the scan, before the softplus, as
//! transformers adds it); the selective scan over a `[channels, state]` state with `A` per
//! channel and state entry, the D skip, `* silu(z)` and the output projection.
//!
//! Falcon-Mamba normalises the time step, B and C by a weightless RMSNorm each before use; Jamba
//! by RMSNorms with weights ([`SsmNorms`]).

use ferrite_tensor::{ops, Activation, AttnMetadata, PagedKvLayer, SelectiveScanParams, Tensor};

use crate::layers::{Linear, RmsNorm};
use crate::loading::weights::Scope;
use crate::model::StateLayerSpec;
use crate::Result;

/// The most channels one GPU block of the scan takes (its threads); wider mixers are spread over
/// several blocks.
const CHANNELS_PER_BLOCK: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MambaDims {
    /// Channels of the scan (`intermediate_size`, `expand * hidden_size`).
    pub inner: usize,
    pub state_size: usize,
    pub conv_kernel: usize,
    pub dt_rank: usize,
    pub conv_bias: bool,
    pub proj_bias: bool,
}

/// RMSNorms of the time step, B and C before the scan: Falcon-Mamba's have no weights
/// (`mixer_rms_eps`; here weights of ones, which multiply exactly), Jamba's `dt_layernorm`,
/// `b_layernorm` and `c_layernorm` do.
#[derive(Debug, Clone)]
pub struct SsmNorms {
    pub dt: RmsNorm,
    pub b: RmsNorm,
    pub c: RmsNorm,
}

impl SsmNorms {
    pub fn weightless(dims: &MambaDims, eps: f64, device: ferrite_tensor::Device) -> Result<SsmNorms> {
        let unit = |width: usize| -> Result<RmsNorm> {
            let weight = Tensor::from_f32(vec![1.0; width], &[width])?.to_device(device)?;
            Ok(RmsNorm { weight, eps: eps as f32, offset: 0.0 })
        };
        Ok(SsmNorms { dt: unit(dims.dt_rank)?, b: unit(dims.state_size)?, c: unit(dims.state_size)? })
    }
}

#[derive(Debug, Clone)]
pub struct MambaMixer {
    pub x: Linear,
    pub z: Linear,
    /// Depthwise conv taps `[inner, kernel]` and bias, f32.
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    /// `[inner, dt_rank + 2 * state]`: the time step, B and C side by side.
    pub x_proj: Linear,
    /// `dt_proj` without its bias, which the scan adds (`dt_bias`).
    pub dt_proj: Linear,
    pub dt_bias: Tensor,
    /// `[inner, state]`.
    pub a_log: Tensor,
    pub d: Tensor,
    pub out: Linear,
    pub norms: Option<SsmNorms>,
    pub dims: MambaDims,
}

impl MambaMixer {
    /// The mixer under `s` (a `mixer` scope): `in_proj` rows are `[x, z]`.
    pub fn load(s: &Scope, hidden: usize, dims: MambaDims, norms: Option<SsmNorms>) -> Result<MambaMixer> {
        let (inner, n, rank) = (dims.inner, dims.state_size, dims.dt_rank);
        let in_proj = s.linear("in_proj", hidden, 2 * inner, dims.proj_bias)?;
        let [x, z]: [Linear; 2] = in_proj.split_rows(&[inner, inner])?.try_into().expect("two row blocks");
        let w = s.weights();
        let conv = w.get_f32(&s.name("conv1d.weight"), &[inner, 1, dims.conv_kernel])?;
        let conv_bias = dims.conv_bias.then(|| w.get_f32(&s.name("conv1d.bias"), &[inner])).transpose()?;
        let dt_proj = s.linear("dt_proj", rank, inner, false)?;
        Ok(MambaMixer {
            x,
            z,
            conv: conv.reshape(&[inner, dims.conv_kernel])?,
            conv_bias,
            x_proj: s.linear("x_proj", inner, rank + 2 * n, false)?,
            dt_proj,
            dt_bias: w.get_f32(&s.name("dt_proj.bias"), &[inner])?,
            a_log: w.get_f32(&s.name("A_log"), &[inner, n])?,
            d: w.get_f32(&s.name("D"), &[inner])?,
            out: s.linear("out_proj", inner, hidden, dims.proj_bias)?,
            norms,
            dims,
        })
    }

    pub fn state_spec(&self) -> StateLayerSpec {
        let d = &self.dims;
        StateLayerSpec { conv: (d.conv_kernel - 1) * d.inner, recurrent: d.inner * d.state_size }
    }

    /// The scan's channels as GPU blocks: the fewest blocks of at most `CHANNELS_PER_BLOCK`
    /// channels that split them evenly.
    fn heads(&self) -> usize {
        let inner = self.dims.inner;
        (inner.div_ceil(CHANNELS_PER_BLOCK)..=inner).find(|h| inner.is_multiple_of(*h)).unwrap_or(1)
    }

    pub fn forward(&self, x: &Tensor, meta: &AttnMetadata, state: &mut PagedKvLayer) -> Result<Tensor> {
        let d = &self.dims;
        ops::copy_state_slots(state, &meta.state_copies.before)?;
        let xs = self.x.forward(x)?;
        let xs = ops::causal_conv1d(&xs, &self.conv, self.conv_bias.as_ref(), Some(Activation::Silu), state, meta)?;
        let proj = self.x_proj.forward(&xs)?;
        let (rank, n) = (d.dt_rank, d.state_size);
        let (mut time_step, mut b, mut c) = (
            ops::narrow_cols(&proj, 0, rank)?,
            ops::narrow_cols(&proj, rank, n)?,
            ops::narrow_cols(&proj, rank + n, n)?,
        );
        if let Some(norms) = &self.norms {
            (time_step, b, c) = (norms.dt.forward(&time_step)?, norms.b.forward(&b)?, norms.c.forward(&c)?);
        }
        let heads = self.heads();
        let params = SelectiveScanParams {
            num_heads: heads,
            head_dim: d.inner / heads,
            num_groups: 1,
            state_size: n,
            dt_limit: (0.0, f32::INFINITY),
            per_channel: true,
        };
        let dt = self.dt_proj.forward(&time_step)?;
        let y = ops::selective_scan(&xs, &dt, &b, &c, &self.a_log, &self.dt_bias, &self.d, state, meta, &params)?;
        ops::copy_state_slots(state, &meta.state_copies.after)?;
        let gated = ops::act_mul(&self.z.forward(x)?, &y, Activation::Silu)?;
        self.out.forward(&gated)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.x, &self.z, &self.x_proj, &self.dt_proj, &self.out]
            .iter()
            .map(|l| l.weight.size_in_bytes())
            .sum::<usize>()
            + self.conv.size_in_bytes()
            + self.a_log.size_in_bytes()
    }
}
