use rayon::prelude::*;

use super::f32_tensor;
use crate::error::Result;
use crate::ops::RopeStyle;
use crate::tensor::Tensor;

pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize, style: RopeStyle) -> Result<Tensor> {
    let cols = x.last_dim();
    let half = cos.last_dim();
    let (cos, sin) = (cos.as_f32_slice()?, sin.as_f32_slice()?);
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols.max(1)).enumerate().for_each(|(t, row)| {
        let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
        for head in row.chunks_mut(head_dim) {
            for i in 0..half {
                let (a, b) = match style {
                    RopeStyle::Neox => (i, i + half),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x1, x2) = (head[a], head[b]);
                head[a] = x1 * c[i] - x2 * s[i];
                head[b] = x2 * c[i] + x1 * s[i];
            }
        }
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}
