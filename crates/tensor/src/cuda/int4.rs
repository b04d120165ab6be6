//! W4A16 products on CUDA (kernels/int4.cu): a 4-bit weight stays packed in device memory, half
//! a byte per weight, in the order [`crate::int4::kernel_layout`] gives it.
//!
//! Up to `INT4_MAX_ROWS` input rows multiply the packed words directly on tensor cores; a larger
//! product (a prompt) dequantizes the weight to bf16 into a scratch matrix for cuBLAS, where the
//! GEMM's compute, not the weight read, is the cost.

use cudarc::driver::CudaSlice;

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice};
use super::kernels::INT4;
use super::ops::{broadcast_row, cuda_of, wrap};
use super::storage::{flat_cfg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::int4::{from_kernel_layout, kernel_layout, Int4Matrix, CHUNK_COLS, STRIP_ROWS};
use crate::tensor::Tensor;
use crate::DType;

/// Warps per block and 16-byte weight loads each warp has in flight (`-D` for the kernels).
pub(crate) const INT4_WARPS: usize = 4;
pub(crate) const INT4_UNROLL: usize = 4;
/// The most input rows the packed kernel takes (four 16-row tiles).
const INT4_MAX_ROWS: usize = 64;
/// The most blocks that share one strip's inputs (and add up their partials).
const MAX_SPLITS: usize = 8;

/// A packed 4-bit weight matrix in device memory.
#[derive(Debug)]
pub(crate) struct Int4Buf {
    packed: CudaSlice<u32>,
    scales: CudaSlice<u32>,
    rows: usize,
    cols: usize,
    pub group: usize,
}

impl Int4Buf {
    pub(crate) fn upload(dev: &CudaDevice, m: &Int4Matrix) -> Result<Int4Buf> {
        if !Int4Matrix::kernel_takes(m.rows, m.cols, m.group) {
            return Err(TensorError::Unsupported {
                op: "to_device",
                detail: format!(
                    "a {}x{} 4-bit weight in groups of {} on CUDA (rows a multiple of {STRIP_ROWS}, inputs of \
                     {CHUNK_COLS}, groups of 32)",
                    m.rows, m.cols, m.group
                ),
            });
        }
        let (packed, scales) = kernel_layout(m);
        let s = dev.stream();
        Ok(Int4Buf {
            packed: s.clone_htod(&packed).map_err(dev_err)?,
            scales: s.clone_htod(&scales).map_err(dev_err)?,
            rows: m.rows,
            cols: m.cols,
            group: m.group,
        })
    }

    pub(crate) fn download(&self, dev: &CudaDevice) -> Result<Int4Matrix> {
        let s = dev.stream();
        let packed = s.clone_dtoh(&self.packed).map_err(dev_err)?;
        let scales = s.clone_dtoh(&self.scales).map_err(dev_err)?;
        Ok(from_kernel_layout(self.rows, self.cols, self.group, &packed, &scales))
    }

    pub(crate) fn size_in_bytes(&self) -> usize {
        (self.packed.len() + self.scales.len()) * 4
    }

    pub(crate) fn packed_ptr(&self, dev: &CudaDevice) -> u64 {
        dptr(&self.packed, dev)
    }
}

kernel_params! {
    /// `w4a16x3_mt<MT>`: up to three products `y_i[m, n_i] (+)= x[m, k] w_i[n_i, k]^T` with each `w_i`
    /// packed (a product with `n_i = 0` is absent); `partial` holds `splits * m * sum(n_i)` f32 and
    /// `counters` one zeroed word per strip where the grid splits the inputs.
    struct W4a16x3 {
        x: u64,
        m: i32,
        k: i32,
        group: i32,
        partial: u64,
        counters: u64,
        wq0: u64,
        sc0: u64,
        y0: u64,
        n0: i32,
        a0: i32,
        wq1: u64,
        sc1: u64,
        y1: u64,
        n1: i32,
        a1: i32,
        wq2: u64,
        sc2: u64,
        y2: u64,
        n2: i32,
        a2: i32,
    }
}

kernel_params! {
    /// `int4_dequant_bf16`: `w[n, k]` in bf16 from the packed words.
    struct Int4Dequant { wq: u64, sc: u64, w: u64, n: i32, k: i32, group: i32 }
}

/// `x @ w^T (+ bias)` for each packed 4-bit `w` of `products`, all of `x`'s width and one group
/// size: up to three in one launch. `x` must be bf16.
pub(crate) fn matmul_t_many(x: &Tensor, products: &[(&Tensor, &Int4Buf, Option<&Tensor>)]) -> Result<Vec<Tensor>> {
    let xs = cuda_of("matmul_t", x)?;
    let dev = xs.device();
    for &(w, packed, _) in products {
        check(x, xs, w, packed)?;
    }
    let k = x.last_dim();
    let m = x.numel().checked_div(k).unwrap_or(0);
    let shape_of = |n: usize| {
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank >= 1") = n;
        shape
    };
    if m == 0 {
        return products
            .iter()
            .map(|(_, p, _)| wrap(CudaStorage::alloc(dev, DType::BF16, 0)?, shape_of(p.rows)))
            .collect();
    }
    let one_launch = products.len() <= 3 && products.iter().all(|(_, p, _)| p.group == products[0].1.group);
    if m > INT4_MAX_ROWS || !one_launch {
        return products.iter().map(|&(w, packed, bias)| matmul_t(x, w, packed, bias)).collect();
    }
    let outs = products
        .iter()
        .map(|&(_, packed, bias)| {
            let out = CudaStorage::alloc(dev, DType::BF16, m * packed.rows)?;
            if let Some(b) = bias {
                broadcast_row(cuda_of("matmul_t", b)?, &out)?;
            }
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    let strips: usize = products.iter().map(|(_, p, _)| p.rows / STRIP_ROWS).sum();
    let columns: usize = products.iter().map(|(_, p, _)| p.rows).sum();
    let splits = splits(k);
    // Partials and per-strip arrival counters only where the inputs are split; zeroed f32 words
    // are zeroed counters.
    let (partial, counters) = if splits > 1 {
        (
            Some(CudaStorage::alloc(dev, DType::F32, splits * m * columns)?),
            Some(CudaStorage::zeros(dev, DType::F32, strips)?),
        )
    } else {
        (None, None)
    };
    let product = |i: usize| -> Result<(u64, u64, u64, i32, i32)> {
        Ok(match products.get(i) {
            Some(&(_, packed, bias)) => (
                dptr(&packed.packed, dev),
                dptr(&packed.scales, dev),
                outs[i].ptr(),
                int(packed.rows)?,
                bias.is_some() as i32,
            ),
            None => (0, 0, 0, 0, 0),
        })
    };
    let ((wq0, sc0, y0, n0, a0), (wq1, sc1, y1, n1, a1), (wq2, sc2, y2, n2, a2)) =
        (product(0)?, product(1)?, product(2)?);
    let launch = W4a16x3 {
        x: xs.ptr(),
        m: int(m)?,
        k: int(k)?,
        group: int(products[0].1.group)?,
        partial: partial.as_ref().map_or(0, |p| p.ptr()),
        counters: counters.as_ref().map_or(0, |c| c.ptr()),
        wq0,
        sc0,
        y0,
        n0,
        a0,
        wq1,
        sc1,
        y1,
        n1,
        a1,
        wq2,
        sc2,
        y2,
        n2,
        a2,
    };
    let mt = match m.div_ceil(16) {
        1 => 1,
        2 => 2,
        _ => 4,
    };
    let f = dev.function(INT4, &format!("w4a16x3_mt{mt}"))?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (strips as u32, splits as u32, 1),
        block_dim: ((32 * INT4_WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch.launch_with(dev, &f, cfg)?;
    products.iter().zip(outs).map(|(&(_, packed, _), out)| wrap(out, shape_of(packed.rows))).collect()
}

/// `x @ w^T (+ bias)` for a packed 4-bit `w`.
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor, packed: &Int4Buf, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = cuda_of("matmul_t", x)?;
    check(x, xs, w, packed)?;
    let m = x.numel() / packed.cols;
    if m <= INT4_MAX_ROWS {
        return Ok(matmul_t_many(x, &[(w, packed, bias)])?.remove(0));
    }
    let dense = wrap(dequantize(xs.device(), packed)?, vec![packed.rows, packed.cols])?;
    super::matmul::matmul_t(x, &dense, bias)
}

/// A product the kernels take: `x [.., k]` in bf16 by `w [n, k]`.
fn check(x: &Tensor, xs: &CudaStorage, w: &Tensor, packed: &Int4Buf) -> Result<()> {
    if w.shape() != [packed.rows, packed.cols] || x.last_dim() != packed.cols {
        return Err(TensorError::Shape {
            op: "matmul_t",
            detail: format!("x {:?} by a 4-bit weight {:?} of {}x{}", x.shape(), w.shape(), packed.rows, packed.cols),
        });
    }
    if xs.dtype() != DType::BF16 {
        return Err(TensorError::Unsupported {
            op: "matmul_t",
            detail: format!("{} activations with a 4-bit weight (bf16 only)", xs.dtype()),
        });
    }
    Ok(())
}

/// Splits of the inputs per 16-row strip: one per full round of every warp's loads, at most
/// `MAX_SPLITS`. A function of `k` alone, so that a row's sums are the same in every launch that
/// holds it, fused or not, whatever the batch.
fn splits(k: usize) -> usize {
    (k / CHUNK_COLS / (INT4_WARPS * INT4_UNROLL)).clamp(1, MAX_SPLITS)
}

/// The weight as a bf16 matrix (for products too large for the packed kernel).
fn dequantize(dev: &std::sync::Arc<CudaDevice>, packed: &Int4Buf) -> Result<CudaStorage> {
    let (n, k) = (packed.rows, packed.cols);
    let out = CudaStorage::alloc(dev, DType::BF16, n * k)?;
    let launch = Int4Dequant {
        wq: dptr(&packed.packed, dev),
        sc: dptr(&packed.scales, dev),
        w: out.ptr(),
        n: int(n)?,
        k: int(k)?,
        group: int(packed.group)?,
    };
    let f = dev.function(INT4, "int4_dequant_bf16")?;
    launch.launch_with(dev, &f, flat_cfg(dev, n * k / 8))?;
    Ok(out)
}
