//! Gated DeltaNet (Qwen3-Next, Qwen3.5): a linear-attention token mixer whose per-sequence state
//! is fixed in size. Projections give q, k, v (through a short causal conv and SiLU), the output
//! gate z and the raw gates a, b; the gated delta rule updates a `[k_dim, v_dim]` state per value
//! head; a gated RMSNorm (`norm(o) * w * silu(z)`) and the output projection close the layer.

use ferrite_tensor::{ops, Activation, AttnMetadata, GdnParams, PagedKvLayer, Tensor};

use crate::layers::{Linear, RmsNorm};
use crate::loading::weights::Scope;
use crate::model::StateLayerSpec;
use crate::Result;

/// The chunk length of the references' chunked prefill form.
const CHUNK_SIZE: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub conv_kernel: usize,
}

impl GdnDims {
    fn key_width(&self) -> usize {
        self.num_k_heads * self.k_dim
    }

    fn value_width(&self) -> usize {
        self.num_v_heads * self.v_dim
    }

    /// Channels of the causal conv: q, k and v side by side.
    fn conv_channels(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }
}

/// How a checkpoint lays out the input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdnProjections {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, interleaved per key head
    /// (`[q, k, v group, z group]` and `[b group, a group]`).
    Interleaved,
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
    Separate,
    /// OLMo Hybrid: `q_proj`, `k_proj`, `v_proj`, the gate `g_proj`, `b_proj`, `a_proj`; the
    /// output projection `o_proj` and the gated norm `o_norm`.
    OlmoHybrid,
}

#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    /// q, k and v, in the conv's channel order.
    pub qkv: Linear,
    pub z: Linear,
    pub b: Linear,
    pub a: Linear,
    /// Depthwise conv taps `[channels, kernel]`, f32.
    pub conv: Tensor,
    pub a_log: Tensor,
    pub dt_bias: Tensor,
    /// The gated norm's RMSNorm over one value head.
    pub norm: RmsNorm,
    pub out: Linear,
    pub dims: GdnDims,
    /// See [`GdnParams::beta_scale`].
    pub beta_scale: f32,
}

impl GatedDeltaNet {
    /// The layer under `s` (a `linear_attn` scope).
    pub fn load(s: &Scope, hidden: usize, dims: GdnDims, layout: GdnProjections, eps: f64) -> Result<GatedDeltaNet> {
        let (kw, vw, hv) = (dims.key_width(), dims.value_width(), dims.num_v_heads);
        let (qkv, z, b, a) = match layout {
            GdnProjections::OlmoHybrid => {
                let parts = [("q_proj", kw), ("k_proj", kw), ("v_proj", vw)]
                    .map(|(name, rows)| s.linear(name, hidden, rows, false).map(|l| l.weight));
                let [q, k, v] = parts;
                let qkv = ops::concat_rows(&[&q?, &k?, &v?])?;
                (
                    Linear::new(qkv, None),
                    s.linear("g_proj", hidden, vw, false)?,
                    s.linear("b_proj", hidden, hv, false)?,
                    s.linear("a_proj", hidden, hv, false)?,
                )
            }
            GdnProjections::Separate => (
                s.linear("in_proj_qkv", hidden, 2 * kw + vw, false)?,
                s.linear("in_proj_z", hidden, vw, false)?,
                s.linear("in_proj_b", hidden, hv, false)?,
                s.linear("in_proj_a", hidden, hv, false)?,
            ),
            GdnProjections::Interleaved => {
                let (dk, group) = (dims.k_dim, hv / dims.num_k_heads * dims.v_dim);
                let qkvz = s.linear("in_proj_qkvz", hidden, 2 * kw + 2 * vw, false)?;
                let per_head = 2 * dk + 2 * group;
                let part = |offset: usize, len: usize| -> Vec<std::ops::Range<usize>> {
                    (0..dims.num_k_heads).map(|h| h * per_head + offset..h * per_head + offset + len).collect()
                };
                let qkv_rows: Vec<_> = [part(0, dk), part(dk, dk), part(2 * dk, group)].concat();
                let ba = s.linear("in_proj_ba", hidden, 2 * hv, false)?;
                let heads_per_group = hv / dims.num_k_heads;
                let ba_part = |offset: usize| -> Vec<std::ops::Range<usize>> {
                    (0..dims.num_k_heads)
                        .map(|h| 2 * heads_per_group * h + offset..2 * heads_per_group * h + offset + heads_per_group)
                        .collect()
                };
                (
                    qkvz.select_rows(&qkv_rows)?,
                    qkvz.select_rows(&part(2 * dk + group, group))?,
                    ba.select_rows(&ba_part(0))?,
                    ba.select_rows(&ba_part(heads_per_group))?,
                )
            }
        };
        let olmo = layout == GdnProjections::OlmoHybrid;
        let channels = dims.conv_channels();
        let w = s.weights();
        let fused = s.name("conv1d.weight");
        let conv = if olmo && !w.contains(&fused) {
            // OLMo-core checkpoints keep q, k and v's conv taps apart; transformers concatenates
            // them (and splits them again evenly on save, so the parts' sizes vary).
            let taps = dims.conv_kernel;
            let part = |leaf: &str| -> Result<Tensor> {
                let t = w.get_f32_any_shape(&s.name(leaf))?;
                let rows = t.numel() / taps.max(1);
                if t.shape() != [rows, 1, taps] {
                    return Err(crate::ModelError::TensorShape {
                        name: s.name(leaf),
                        expected: vec![rows, 1, taps],
                        actual: t.shape().to_vec(),
                    });
                }
                Ok(t.reshape(&[rows, taps])?)
            };
            let (q, k, v) = (part("q_conv1d.weight")?, part("k_conv1d.weight")?, part("v_conv1d.weight")?);
            let joined = ops::concat_rows(&[&q, &k, &v])?;
            if joined.shape() != [channels, taps] {
                return Err(crate::ModelError::TensorShape {
                    name: s.name("{q,k,v}_conv1d.weight"),
                    expected: vec![channels, taps],
                    actual: joined.shape().to_vec(),
                });
            }
            joined.reshape(&[channels, 1, taps])?
        } else {
            w.get_f32(&fused, &[channels, 1, dims.conv_kernel])?
        };
        Ok(GatedDeltaNet {
            qkv,
            z,
            b,
            a,
            conv: conv.reshape(&[channels, dims.conv_kernel])?,
            a_log: w.get_f32(&s.name("A_log"), &[hv])?,
            dt_bias: w.get_f32(&s.name("dt_bias"), &[hv])?,
            norm: s.rms(if olmo { "o_norm" } else { "norm" }, dims.v_dim, eps)?,
            out: s.linear(if olmo { "o_proj" } else { "out_proj" }, vw, hidden, false)?,
            dims,
            beta_scale: 1.0,
        })
    }

    pub fn state_spec(&self) -> StateLayerSpec {
        let d = &self.dims;
        StateLayerSpec { conv: (d.conv_kernel - 1) * d.conv_channels(), recurrent: d.num_v_heads * d.k_dim * d.v_dim }
    }

    pub fn forward(&self, x: &Tensor, meta: &AttnMetadata, state: &mut PagedKvLayer) -> Result<Tensor> {
        let d = &self.dims;
        ops::copy_state_slots(state, &meta.state_copies.before)?;
        let mixed = ops::causal_conv1d(&self.qkv.forward(x)?, &self.conv, None, Some(Activation::Silu), state, meta)?;
        let kw = d.key_width();
        let q = ops::narrow_cols(&mixed, 0, kw)?;
        let k = ops::narrow_cols(&mixed, kw, kw)?;
        let v = ops::narrow_cols(&mixed, 2 * kw, d.value_width())?;
        let params = GdnParams {
            num_k_heads: d.num_k_heads,
            num_v_heads: d.num_v_heads,
            k_dim: d.k_dim,
            v_dim: d.v_dim,
            chunk_size: CHUNK_SIZE,
            beta_scale: self.beta_scale,
            channel_decay: false,
        };
        let (a, b) = (self.a.forward(x)?, self.b.forward(x)?);
        let core = ops::gated_delta_rule(&q, &k, &v, &a, &b, &self.a_log, &self.dt_bias, state, meta, &params)?;
        ops::copy_state_slots(state, &meta.state_copies.after)?;
        let normed = self.norm.forward_heads(&core, d.v_dim)?;
        let z = self.z.forward(x)?;
        self.out.forward(&ops::act_mul(&z, &normed, Activation::Silu)?)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.qkv, &self.z, &self.b, &self.a, &self.out].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
            + self.conv.size_in_bytes()
    }
}
