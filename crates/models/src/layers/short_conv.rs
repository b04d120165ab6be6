//! LFM2's gated short convolution: one input projection gives B, C and x; `B * x` goes through a
//! causal depthwise conv of a few taps (no activation), is gated by C and projected out. Its only
//! state between steps is the conv's last inputs.

use ferrite_tensor::{ops, AttnMetadata, PagedKvLayer, Tensor};

use crate::layers::Linear;
use crate::loading::weights::Scope;
use crate::model::StateLayerSpec;
use crate::Result;

#[derive(Debug, Clone)]
pub struct ShortConv {
    pub b: Linear,
    pub c: Linear,
    pub x: Linear,
    /// Depthwise conv taps `[channels, kernel]` and bias, f32.
    pub conv: Tensor,
    pub conv_bias: Option<Tensor>,
    pub out: Linear,
}

impl ShortConv {
    /// The mixer under `s` (a `conv` scope): `in_proj` rows are `[B, C, x]`, `conv.weight`
    /// `[hidden, 1, kernel]`.
    pub fn load(s: &Scope, hidden: usize, kernel: usize, bias: bool) -> Result<ShortConv> {
        let in_proj = s.linear("in_proj", hidden, 3 * hidden, bias)?;
        let [b, c, x]: [Linear; 3] = in_proj.split_rows(&[hidden; 3])?.try_into().expect("three row blocks");
        let w = s.weights();
        let conv = w.get_f32(&s.name("conv.weight"), &[hidden, 1, kernel])?.reshape(&[hidden, kernel])?;
        let conv_bias = bias.then(|| w.get_f32(&s.name("conv.bias"), &[hidden])).transpose()?;
        Ok(ShortConv { b, c, x, conv, conv_bias, out: s.linear("out_proj", hidden, hidden, bias)? })
    }

    pub fn state_spec(&self) -> StateLayerSpec {
        let [channels, kernel] = [self.conv.shape()[0], self.conv.shape()[1]];
        StateLayerSpec { conv: (kernel - 1) * channels, recurrent: 0 }
    }

    pub fn forward(&self, h: &Tensor, meta: &AttnMetadata, state: &mut PagedKvLayer) -> Result<Tensor> {
        ops::copy_state_slots(state, &meta.state_copies.before)?;
        let bx = ops::mul(&self.b.forward(h)?, &self.x.forward(h)?)?;
        let conv = ops::causal_conv1d(&bx, &self.conv, self.conv_bias.as_ref(), None, state, meta)?;
        ops::copy_state_slots(state, &meta.state_copies.after)?;
        self.out.forward(&ops::mul(&self.c.forward(h)?, &conv)?)
    }

    pub fn weight_bytes(&self) -> usize {
        [&self.b, &self.c, &self.x, &self.out].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
            + self.conv.size_in_bytes()
    }
}
