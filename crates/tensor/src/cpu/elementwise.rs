use rayon::prelude::*;

use super::{f32_tensor, PAR_THRESHOLD};
use crate::error::Result;
use crate::ops::Activation;
use crate::tensor::{CpuStorage, Tensor};

pub fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Gelu => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        Activation::GeluTanh => {
            let inner = (2.0f32 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
        Activation::Relu => x.max(0.0),
        Activation::Relu2 => {
            let r = x.max(0.0);
            r * r
        }
        Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Activation::QuickGelu => x * (1.0 / (1.0 + (-(1.702 * x)).exp())),
    }
}

pub fn unary(x: &Tensor, f: impl Fn(f32) -> f32 + Sync + Send) -> Result<Tensor> {
    let src = x.as_f32_slice()?;
    let out: Vec<f32> = if src.len() >= PAR_THRESHOLD {
        src.par_iter().map(|&v| f(v)).collect()
    } else {
        src.iter().map(|&v| f(v)).collect()
    };
    Ok(f32_tensor(out, x.shape().to_vec()))
}

pub fn binary(a: &Tensor, b: &Tensor, f: impl Fn(f32, f32) -> f32 + Sync + Send) -> Result<Tensor> {
    let (sa, sb) = (a.as_f32_slice()?, b.as_f32_slice()?);
    let out: Vec<f32> = if sa.len() >= PAR_THRESHOLD {
        sa.par_iter().zip(sb.par_iter()).map(|(&x, &y)| f(x, y)).collect()
    } else {
        sa.iter().zip(sb).map(|(&x, &y)| f(x, y)).collect()
    };
    Ok(f32_tensor(out, a.shape().to_vec()))
}

pub fn mul_row(x: &Tensor, row: &Tensor) -> Result<Tensor> {
    let src = x.as_f32_slice()?;
    let row = row.to_f32_vec();
    let cols = row.len();
    let mut out = src.to_vec();
    out.par_chunks_mut(cols.max(1)).for_each(|r| r.iter_mut().zip(&row).for_each(|(v, w)| *v *= w));
    Ok(f32_tensor(out, x.shape().to_vec()))
}

pub fn mix_streams(x: &Tensor, coefs: &Tensor, n: usize) -> Result<Tensor> {
    let (xs, cs) = (x.as_f32_slice()?, coefs.as_f32_slice()?);
    let m = coefs.last_dim() / n;
    let d = x.last_dim() / m;
    let mut out = vec![0.0f32; x.rows() * n * d];
    out.par_chunks_mut(n * d).zip(xs.par_chunks(m * d)).zip(cs.par_chunks(n * m)).for_each(|((o, xr), cr)| {
        for (i, stream) in o.chunks_mut(d).enumerate() {
            let w = &cr[i * m..(i + 1) * m];
            for (c, v) in stream.iter_mut().enumerate() {
                *v = (1..m).fold(w[0] * xr[c], |a, j| a + w[j] * xr[j * d + c]);
            }
        }
    });
    Ok(f32_tensor(out, vec![x.rows(), n * d]))
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let cols = x.last_dim().max(1);
    let mut out = x.as_f32_slice()?.to_vec();
    out.par_chunks_mut(cols).for_each(softmax_in_place);
    Ok(f32_tensor(out, x.shape().to_vec()))
}

pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// The index of each row's largest value; the lowest index wins ties and NaN counts as the
/// largest value, as in `torch.argmax`.
pub fn argmax_rows(x: &Tensor) -> Result<Vec<u32>> {
    let cols = x.last_dim().max(1);
    let src = x.as_f32_slice()?;
    Ok(src.par_chunks(cols).map(argmax_row).collect())
}

/// [`argmax_rows`] of one row.
pub(crate) fn argmax_row(row: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate().skip(1) {
        let b = row[best];
        if !b.is_nan() && (v.is_nan() || v > b) {
            best = i;
        }
    }
    best as u32
}

pub fn embedding(table: &Tensor, ids: &[u32]) -> Result<Tensor> {
    super::matmul::refuse_packed("embedding", table)?;
    let hidden = table.shape()[1];
    let mut out = vec![0.0f32; ids.len() * hidden];
    let storage = table.cpu().expect("dispatched to the CPU backend");
    out.par_chunks_mut(hidden.max(1)).zip(ids.par_iter()).for_each(|(dst, &id)| {
        let start = id as usize * hidden;
        match storage {
            CpuStorage::F32(v) => dst.copy_from_slice(&v[start..start + hidden]),
            CpuStorage::BF16(v) => dst.iter_mut().zip(&v[start..start + hidden]).for_each(|(d, s)| *d = s.to_f32()),
            CpuStorage::F16(v) => dst.iter_mut().zip(&v[start..start + hidden]).for_each(|(d, s)| *d = s.to_f32()),
            CpuStorage::Ggml(b) => {
                let (bytes, ty) = (b.ty.bytes_for(hidden), b.ty);
                let row = &b.bytes[id as usize * bytes..(id as usize + 1) * bytes];
                ty.dequantize_into(row, dst).expect("a row of whole blocks");
            }
            CpuStorage::Int4(_) | CpuStorage::Fp8(_) => unreachable!("refused above"),
        }
    });
    Ok(f32_tensor(out, vec![ids.len(), hidden]))
}

pub fn narrow_cols(x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let src = x.as_f32_slice()?;
    let cols = x.last_dim();
    let rows = x.rows();
    let mut out = Vec::with_capacity(rows * len);
    for r in 0..rows {
        out.extend_from_slice(&src[r * cols + start..r * cols + start + len]);
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = len;
    Ok(f32_tensor(out, shape))
}

pub fn concat_cols(parts: &[&Tensor]) -> Result<Tensor> {
    let rows = parts[0].rows();
    let total: usize = parts.iter().map(|p| p.last_dim()).sum();
    let slices = parts.iter().map(|p| p.as_f32_slice()).collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(rows * total);
    for r in 0..rows {
        for (p, s) in parts.iter().zip(&slices) {
            let c = p.last_dim();
            out.extend_from_slice(&s[r * c..(r + 1) * c]);
        }
    }
    Ok(f32_tensor(out, vec![rows, total]))
}

pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
    let cols = parts[0].last_dim();
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.numel()).sum());
    for p in parts {
        out.extend_from_slice(p.as_f32_slice()?);
    }
    let rows = out.len() / cols.max(1);
    Ok(f32_tensor(out, vec![rows, cols]))
}

pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let src = x.as_f32_slice()?;
    let cols = x.last_dim();
    let mut out = Vec::with_capacity(rows.len() * cols);
    for &r in rows {
        out.extend_from_slice(&src[r * cols..(r + 1) * cols]);
    }
    Ok(f32_tensor(out, vec![rows.len(), cols]))
}

pub fn gather_cols(x: &Tensor, cols: &Tensor, fill: f32) -> Result<Tensor> {
    let (src, map) = (x.as_f32_slice()?, cols.to_f32_vec());
    let width = x.last_dim();
    let mut out = Vec::with_capacity(x.rows() * map.len());
    for row in src.chunks(width.max(1)).take(x.rows()) {
        out.extend(map.iter().map(|&c| if c < 0.0 { fill } else { row[c as usize] }));
    }
    Ok(f32_tensor(out, vec![x.rows(), map.len()]))
}

/// `out[i] = sum_j weights[i * per_row + j] * y[rows[i * per_row + j]]`, the products added in
/// `j` order (the MoE combine: each token's expert outputs, weighted by its routing weights).
pub fn combine_rows(y: &Tensor, rows: &[usize], weights: &[f32], per_row: usize) -> Result<Tensor> {
    let src = y.as_f32_slice()?;
    let cols = y.last_dim();
    let out_rows = rows.len() / per_row.max(1);
    let mut out = vec![0.0f32; out_rows * cols];
    out.par_chunks_mut(cols.max(1)).enumerate().for_each(|(i, dst)| {
        for j in 0..per_row {
            let (r, w) = (rows[i * per_row + j], weights[i * per_row + j]);
            let row = &src[r * cols..(r + 1) * cols];
            dst.iter_mut().zip(row).for_each(|(d, v)| *d += w * v);
        }
    });
    Ok(f32_tensor(out, vec![out_rows, cols]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_rows_weights_and_sums_selected_rows() {
        let y = Tensor::from_f32((0..12).map(|v| v as f32).collect(), &[4, 3]).unwrap();
        // Two output rows, two picks each; row 2 is picked twice.
        let out = combine_rows(&y, &[2, 0, 3, 2], &[0.5, 2.0, 1.0, -1.0], 2).unwrap();
        assert_eq!(out.shape(), &[2, 3]);
        assert_eq!(out.to_f32_vec(), vec![3.0, 5.5, 8.0, 3.0, 3.0, 3.0]);
    }
}
