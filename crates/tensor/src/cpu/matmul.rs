//! `x @ w^T` with f32 activations and f32/bf16/f16 weights.
//!
//! Decode-sized batches stream each weight row once and dot it with every input row: the step is
//! bound by reading the weights, so widening bf16 to f32 in registers costs nothing. Larger batches
//! (prefill) widen a panel of weight rows at a time and hand it to the `gemm` crate's blocked kernel.

use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;

use super::f32_tensor;
use crate::error::{Result, TensorError};
use crate::tensor::{CpuStorage, Tensor};
use crate::DType;

/// Up to this many input rows, the streaming dot-product path beats packing for `gemm`: a
/// speculative verify step of 5 rows on SmolLM2-135M (2 CPU threads) runs 1.4x faster streamed,
/// which took n-gram speculation from 1.13x to 1.55x plain decoding.
const STREAMING_MAX_ROWS: usize = 8;
/// Weight rows widened to f32 at a time on the `gemm` path.
const PANEL_ROWS: usize = 256;

pub(crate) trait Widen: Copy + Send + Sync {
    fn widen(self) -> f32;
    /// The weights as f32 already, which `gemm` reads in place.
    fn as_f32(_w: &[Self]) -> Option<&[f32]> {
        None
    }
}
impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    fn as_f32(w: &[f32]) -> Option<&[f32]> {
        Some(w)
    }
}
impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}
impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// `x · w` over 16 lanes of fused multiply-adds (vectorised; a sequential sum would not be).
#[inline(always)]
pub(crate) fn dot<W: Widen>(x: &[f32], w: &[W]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0.0f32; LANES];
    let chunks = x.len() / LANES;
    for c in 0..chunks {
        let (xs, ws) = (&x[c * LANES..(c + 1) * LANES], &w[c * LANES..(c + 1) * LANES]);
        for l in 0..LANES {
            acc[l] = xs[l].mul_add(ws[l].widen(), acc[l]);
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for i in chunks * LANES..x.len() {
        sum = x[i].mul_add(w[i].widen(), sum);
    }
    sum
}

fn streaming<W: Widen>(x: &[f32], m: usize, k: usize, w: &[W], n: usize, out: &mut [f32]) {
    // Column-blocks of the output, so each thread owns whole weight rows.
    const ROWS_PER_TASK: usize = 32;
    let mut col_blocks: Vec<Vec<f32>> = (0..n.div_ceil(ROWS_PER_TASK)).map(|_| Vec::new()).collect();
    col_blocks.par_iter_mut().enumerate().for_each(|(b, block)| {
        let j0 = b * ROWS_PER_TASK;
        let j1 = (j0 + ROWS_PER_TASK).min(n);
        block.resize(m * (j1 - j0), 0.0);
        for j in j0..j1 {
            let wr = &w[j * k..(j + 1) * k];
            for i in 0..m {
                block[i * (j1 - j0) + (j - j0)] = dot(&x[i * k..(i + 1) * k], wr);
            }
        }
    });
    for (b, block) in col_blocks.iter().enumerate() {
        let j0 = b * ROWS_PER_TASK;
        let width = block.len() / m.max(1);
        for i in 0..m {
            out[i * n + j0..i * n + j0 + width].copy_from_slice(&block[i * width..(i + 1) * width]);
        }
    }
}

/// `out[:, j0..j0+rows] = x @ panel^T` for a row-major f32 panel `[rows, k]`.
#[allow(clippy::too_many_arguments)]
fn gemm_panel(x: &[f32], m: usize, k: usize, panel: &[f32], rows: usize, out: &mut [f32], n: usize, j0: usize) {
    // SAFETY: all pointers address live slices of the sizes implied by the strides:
    // x is [m, k] row-major, panel is [rows, k] row-major read as its transpose [k, rows],
    // and out is [m, n] row-major with columns j0..j0+rows written.
    unsafe {
        gemm::gemm(
            m,
            rows,
            k,
            out.as_mut_ptr().add(j0),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            panel.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::Rayon(rayon::current_num_threads()),
        );
    }
}

fn blocked<W: Widen>(x: &[f32], m: usize, k: usize, w: &[W], n: usize, out: &mut [f32]) {
    if let Some(w) = W::as_f32(w) {
        gemm_panel(x, m, k, w, n, out, n, 0);
        return;
    }
    let mut panel = vec![0.0f32; PANEL_ROWS * k];
    for j0 in (0..n).step_by(PANEL_ROWS) {
        let rows = PANEL_ROWS.min(n - j0);
        let src = &w[j0 * k..(j0 + rows) * k];
        panel[..rows * k].par_chunks_mut(k.max(1)).zip(src.par_chunks(k.max(1))).for_each(|(d, s)| {
            d.iter_mut().zip(s).for_each(|(d, s)| *d = s.widen());
        });
        gemm_panel(x, m, k, &panel[..rows * k], rows, out, n, j0);
    }
}

fn dispatch<W: Widen>(x: &[f32], m: usize, k: usize, w: &[W], n: usize, out: &mut [f32]) {
    if m <= STREAMING_MAX_ROWS {
        streaming(x, m, k, w, n, out);
    } else {
        blocked(x, m, k, w, n, out);
    }
}

pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    refuse_packed("matmul_t", w)?;
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m = x.rows();
    let xs = x.as_f32_slice()?;
    let mut out = vec![0.0f32; m * n];
    if m > 0 && n > 0 {
        if k == 0 {
            // An empty contraction is all zeros; gemm would read nothing either way.
        } else {
            match w.cpu().expect("dispatched to the CPU backend") {
                CpuStorage::F32(ws) => {
                    if m <= STREAMING_MAX_ROWS {
                        streaming(xs, m, k, ws, n, &mut out);
                    } else {
                        gemm_panel(xs, m, k, ws, n, &mut out, n, 0);
                    }
                }
                CpuStorage::BF16(ws) => dispatch(xs, m, k, ws, n, &mut out),
                CpuStorage::F16(ws) => dispatch(xs, m, k, ws, n, &mut out),
                CpuStorage::Ggml(b) => super::ggml::matmul_t(xs, m, k, b.ty, &b.bytes, n, &mut out),
                CpuStorage::Int4(_) | CpuStorage::Fp8(_) => unreachable!("refused above"),
            }
        }
    }
    if let Some(b) = bias {
        let b = b.to_f32_vec();
        out.par_chunks_mut(n.max(1)).for_each(|row| row.iter_mut().zip(&b).for_each(|(v, b)| *v += b));
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    Ok(f32_tensor(out, shape))
}

/// `x [m, k] @ w^T` for one weight matrix `w` of `n * k` elements starting at element `w_start`
/// of `storage` (an expert's slice of a stacked `[experts, n, k]` tensor), into `out [m, n]`.
fn matmul_slice(xs: &[f32], m: usize, k: usize, storage: &CpuStorage, w_start: usize, n: usize, out: &mut [f32]) {
    let w_end = w_start + n * k;
    match storage {
        CpuStorage::F32(ws) => {
            let ws = &ws[w_start..w_end];
            if m <= STREAMING_MAX_ROWS {
                streaming(xs, m, k, ws, n, out);
            } else {
                gemm_panel(xs, m, k, ws, n, out, n, 0);
            }
        }
        CpuStorage::BF16(ws) => dispatch(xs, m, k, &ws[w_start..w_end], n, out),
        CpuStorage::F16(ws) => dispatch(xs, m, k, &ws[w_start..w_end], n, out),
        CpuStorage::Ggml(b) => {
            let bytes = &b.bytes[b.ty.bytes_for(w_start)..b.ty.bytes_for(w_end)];
            super::ggml::matmul_t(xs, m, k, b.ty, bytes, n, out)
        }
        CpuStorage::Int4(_) | CpuStorage::Fp8(_) => unreachable!("refused by grouped_matmul_t"),
    }
}

/// 4-bit and FP8 weights are dequantized at load for CPU; only CUDA keeps them packed.
pub(super) fn refuse_packed(op: &'static str, w: &Tensor) -> Result<()> {
    match w.dtype() {
        DType::Int4 { .. } => Err(TensorError::Unsupported { op, detail: "4-bit integer weights on CPU".into() }),
        DType::Fp8 => Err(TensorError::Unsupported { op, detail: "FP8 weights on CPU".into() }),
        _ => Ok(()),
    }
}

/// Grouped `x @ w[e]^T`: rows `offsets[e]..offsets[e + 1]` of `x [rows, k]` go through expert `e`
/// of `w [experts, n, k]`; one matmul per non-empty group (the layout a grouped GEMM consumes).
pub fn grouped_matmul_t(x: &Tensor, w: &Tensor, offsets: &[usize]) -> Result<Tensor> {
    refuse_packed("grouped_matmul_t", w)?;
    let (n, k) = (w.shape()[1], w.shape()[2]);
    let rows = x.shape().iter().rev().skip(1).product::<usize>();
    let xs = x.as_f32_slice()?;
    let storage = w.cpu().expect("dispatched to the CPU backend");
    let mut out = vec![0.0f32; rows * n];
    if n > 0 && k > 0 {
        for (e, pair) in offsets.windows(2).enumerate() {
            let (r0, r1) = (pair[0], pair[1]);
            if r1 > r0 {
                matmul_slice(&xs[r0 * k..r1 * k], r1 - r0, k, storage, e * n * k, n, &mut out[r0 * n..r1 * n]);
            }
        }
    }
    Ok(f32_tensor(out, vec![rows, n]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn reference(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * w[j * k + p] as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matmul_paths_agree_with_f64_reference() {
        let (k, n) = (67, 300);
        for m in [1, 3, 5, 40] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0).collect();
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let wt = Tensor::from_f32_as(w.clone(), &[n, k], dtype).unwrap();
                let rounded = wt.to_f32_vec();
                let want = reference(&x, m, k, &rounded, n);
                let got = matmul_t(&Tensor::from_f32(x.clone(), &[m, k]).unwrap(), &wt, None).unwrap().to_f32_vec();
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "m={m} {dtype}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn grouped_matmul_matches_one_matmul_per_group() {
        let (e, n, k) = (4, 37, 19);
        let w: Vec<f32> = (0..e * n * k).map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0).collect();
        // Group sizes exercise both paths (streaming <= 4 rows, gemm above) and an empty expert.
        let sizes = [3, 0, 9, 1];
        let rows: usize = sizes.iter().sum();
        let mut offsets = vec![0];
        for s in sizes {
            offsets.push(offsets.last().unwrap() + s);
        }
        let x: Vec<f32> = (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        for dtype in [DType::F32, DType::BF16] {
            let wt = Tensor::from_f32_as(w.clone(), &[e, n, k], dtype).unwrap();
            let got = grouped_matmul_t(&Tensor::from_f32(x.clone(), &[rows, k]).unwrap(), &wt, &offsets).unwrap();
            assert_eq!(got.shape(), &[rows, n]);
            let got = got.to_f32_vec();
            let wr = wt.to_f32_vec();
            for g in 0..e {
                let (r0, r1) = (offsets[g], offsets[g + 1]);
                let want = reference(&x[r0 * k..r1 * k], r1 - r0, k, &wr[g * n * k..(g + 1) * n * k], n);
                for (a, b) in got[r0 * n..r1 * n].iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{dtype} expert {g}: {a} vs {b}");
                }
            }
        }
    }
}
