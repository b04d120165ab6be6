use rayon::prelude::*;

use super::f32_tensor;
use crate::error::Result;
use crate::fp8::{fake_quantize, fp8_scale, ActivationQuant};
use crate::tensor::Tensor;

pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    let cols = x.last_dim().max(1);
    let w: Vec<f32> = w.to_f32_vec().into_iter().map(|v| v + offset).collect();
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols).for_each(|row| {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / cols as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        row.iter_mut().zip(&w).for_each(|(v, g)| *v = *v * inv * g);
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}

/// `residual + x`, then its RMSNorm: returns `(normed, new_residual)`.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<(Tensor, Tensor)> {
    let (xs, rs) = (x.as_f32_slice()?, residual.as_f32_slice()?);
    let sum = f32_tensor(xs.iter().zip(rs).map(|(a, b)| a + b).collect(), x.shape().to_vec());
    Ok((rms_norm(&sum, w, eps, offset)?, sum))
}

pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let cols = x.last_dim().max(1);
    let w = w.map(|t| t.to_f32_vec());
    let b = b.map(|t| t.to_f32_vec());
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols).for_each(|row| {
        let mean = row.iter().sum::<f32>() / cols as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            let mut y = (*v - mean) * inv;
            if let Some(w) = &w {
                y *= w[i];
            }
            if let Some(b) = &b {
                y += b[i];
            }
            *v = y;
        }
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}

pub fn gaussian_topk(x: &Tensor, multiplier: f32) -> Result<Tensor> {
    let cols = x.last_dim().max(1);
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols).for_each(|row| {
        let mean = row.iter().sum::<f32>() / cols as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cols as f32;
        let cutoff = mean + var.sqrt() * multiplier;
        row.iter_mut().for_each(|v| *v = (*v - cutoff).max(0.0));
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}

/// In transformers' order: `x * target / own`, each magnitude the square root of a mean square.
pub fn match_rms(x: &Tensor, reference: &Tensor, min_mean_square: f32) -> Result<Tensor> {
    let (cols, ref_cols) = (x.last_dim().max(1), reference.last_dim().max(1));
    let mean_square = |row: &[f32]| row.iter().map(|v| v * v).sum::<f32>() / row.len() as f32;
    let refs = reference.as_f32_slice()?;
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols).zip(refs.par_chunks(ref_cols)).for_each(|(row, r)| {
        let target = mean_square(r).sqrt();
        let own = mean_square(row).max(min_mean_square).sqrt();
        row.iter_mut().for_each(|v| *v = *v * target / own);
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}

/// FP8 activation quantization: every block of `group` elements of a row (the whole row when
/// `group` is the row length) fake-quantized with the scale of its largest magnitude, or with
/// a fixed scale.
pub fn fp8_fake_quant(x: &Tensor, quant: ActivationQuant) -> Result<Tensor> {
    let cols = x.last_dim().max(1);
    let mut out = x.as_f32_slice()?.to_vec();
    let group = match quant {
        ActivationQuant::PerToken => cols,
        ActivationQuant::PerGroup(g) => g,
        ActivationQuant::Static(scale) => {
            out.iter_mut().for_each(|v| *v = fake_quantize(*v, scale));
            return Ok(f32_tensor(out, x.shape().to_vec()));
        }
    };
    out.par_chunks_mut(group).for_each(|block| {
        let scale = fp8_scale(block.iter().fold(0.0f32, |m, v| m.max(v.abs())));
        block.iter_mut().for_each(|v| *v = fake_quantize(*v, scale));
    });
    Ok(f32_tensor(out, x.shape().to_vec()))
}
