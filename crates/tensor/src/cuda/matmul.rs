//! `x @ w^T (+ bias)` on CUDA: the streaming GEMV kernel for decode-sized batches, cuBLAS
//! (f32 accumulation, no TF32) for everything else.

use cudarc::cublas::{result as blas_result, sys as blas_sys};
use cudarc::driver::LaunchConfig;

use super::device::{dev_err, GEMV};
use super::ops::{broadcast_row, cuda_of, wrap};
use super::storage::{dtype_suffix, int, Arg, CudaStorage};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::DType;

/// Warps per GEMV block.
const GEMV_WARPS: usize = 8;

pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = cuda_of("matmul_t", x)?;
    let dtype = xs.dtype();
    let dev = xs.device();
    // Mixed dtypes (f32 activations over bf16 weights, say) widen or round the weight per call:
    // correct, but a model that wants speed loads its weights in the activation dtype.
    let ws = cuda_of("matmul_t", w)?.as_dtype(dtype)?;
    let bs = bias.map(|b| cuda_of("matmul_t", b)).transpose()?;
    let (n, k) = (w.shape()[0], w.shape()[1]);
    let m = x.rows();
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    let out = CudaStorage::alloc(dev, dtype, m * n)?;
    if m == 0 || n == 0 {
        return wrap(out, shape);
    }
    if k == 0 {
        let out = match bs {
            Some(b) => {
                broadcast_row(b, &out)?;
                out
            }
            None => CudaStorage::zeros(dev, dtype, m * n)?,
        };
        return wrap(out, shape);
    }
    let vec = 16 / dtype.size_in_bytes();
    if m <= dev.gemv_max_rows() && k % vec == 0 {
        gemv(xs, &ws, bs, &out, m, n, k)?;
    } else {
        gemm(xs, &ws, bs, &out, m, n, k)?;
    }
    wrap(out, shape)
}

fn gemv(x: &CudaStorage, w: &CudaStorage, bias: Option<&CudaStorage>, out: &CudaStorage, m: usize, n: usize, k: usize) -> Result<()> {
    let dev = x.device();
    // The instantiations in kernels::GEMV: rows M, weight rows per warp R.
    let (mm, rows_per_warp) = match m {
        1 => (1, 2),
        2 => (2, 2),
        3..=4 => (4, 4),
        5..=8 => (8, 4),
        _ => (16, 4),
    };
    let bias = bias.map(|b| b.as_dtype(x.dtype())).transpose()?;
    let f = dev.function(GEMV, &format!("gemv_{}_m{mm}", dtype_suffix(x.dtype())?))?;
    let blocks = n.div_ceil(GEMV_WARPS * rows_per_warp);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (GEMV_WARPS as u32 * 32, 1, 1), shared_mem_bytes: 0 };
    let bias_ptr = bias.as_ref().map(|b| b.ptr()).unwrap_or(Arg::Ptr(0));
    dev.launch(&f, cfg, &[x.ptr(), w.ptr(), bias_ptr, out.ptr(), int(m)?, int(n)?, int(k)?])
}

fn gemm(x: &CudaStorage, w: &CudaStorage, bias: Option<&CudaStorage>, out: &CudaStorage, m: usize, n: usize, k: usize) -> Result<()> {
    let dev = x.device();
    let beta: f32 = match bias {
        Some(b) => {
            broadcast_row(b, out)?;
            1.0
        }
        None => 0.0,
    };
    let alpha: f32 = 1.0;
    let ty = match x.dtype() {
        DType::BF16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
        _ => blas_sys::cudaDataType_t::CUDA_R_32F,
    };
    let dim = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("matmul_t dimension {v} exceeds cuBLAS's int")));
    let (mi, ni, ki) = (dim(m)?, dim(n)?, dim(k)?);
    let (wp, xp, op) = (w.raw_ptr(), x.raw_ptr(), out.raw_ptr());
    // Row-major out[m, n] = x[m, k] w[n, k]^T is column-major out^T[n, m] = (w^T)^T[n, k] x^T[k, m].
    dev.with_blas(|handle| unsafe {
        // SAFETY: the pointers address live device buffers of at least the sizes implied by the
        // dimensions and leading dimensions; the handle is bound to the device's stream.
        blas_result::gemm_ex(
            handle,
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            ni,
            mi,
            ki,
            &alpha as *const f32 as *const _,
            wp as *const _,
            ty,
            ki,
            xp as *const _,
            ty,
            ki,
            &beta as *const f32 as *const _,
            op as *mut _,
            ty,
            ni,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    })?
    .map_err(|e| dev_err(format!("cuBLAS gemm {m}x{n}x{k}: {e:?}")))
}
