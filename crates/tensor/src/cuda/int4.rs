//! W4A16 products on CUDA (kernels/int4.cu): a 4-bit weight stays packed in device memory, half
//! a byte per weight, in the order [`crate::int4::kernel_layout`] gives it.
//!
//! Up to `INT4_MAX_ROWS` input rows multiply the packed words directly on tensor cores; a larger
//! product (a prompt) dequantizes the weight to bf16 into a scratch matrix for cuBLAS, where the
//! GEMM's compute, not the weight read, is the cost.

use cudarc::driver::CudaSlice;

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice};
use super::kernels::GEMV;
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
/// Blocks per multiprocessor the input split aims at, so that enough weight loads are in flight.
const BLOCKS_PER_SM: usize = 8;

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

    /// Splits of the inputs per 16-row strip: enough blocks for the GPU, two 64-input chunks per
    /// warp at least.
    fn splits(&self, dev: &CudaDevice) -> usize {
        let strips = self.rows / STRIP_ROWS;
        let chunks = self.cols / CHUNK_COLS;
        (dev.multiprocessors() * BLOCKS_PER_SM).div_ceil(strips).clamp(1, (chunks / (2 * INT4_WARPS)).max(1))
    }
}

kernel_params! {
    /// `w4a16_mt<MT>`: `y[m, n] (+)= x[m, k] w[n, k]^T` with `w` packed; `partial` holds
    /// `splits * m * n` f32 and `counters` one zeroed word per strip where the grid splits.
    struct W4a16 {
        x: u64,
        wq: u64,
        sc: u64,
        y: u64,
        partial: u64,
        counters: u64,
        m: i32,
        n: i32,
        k: i32,
        group: i32,
        accumulate: i32,
    }
}

kernel_params! {
    /// `int4_dequant_bf16`: `w[n, k]` in bf16 from the packed words.
    struct Int4Dequant { wq: u64, sc: u64, w: u64, n: i32, k: i32, group: i32 }
}

/// `x @ w^T (+ bias)` for a packed 4-bit `w`; `x` must be bf16.
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor, packed: &Int4Buf, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = cuda_of("matmul_t", x)?;
    let dev = xs.device();
    let (n, k) = (packed.rows, packed.cols);
    if w.shape() != [n, k] || x.last_dim() != k {
        return Err(TensorError::Shape {
            op: "matmul_t",
            detail: format!("x {:?} by a 4-bit weight {:?} of {n}x{k}", x.shape(), w.shape()),
        });
    }
    if xs.dtype() != DType::BF16 {
        return Err(TensorError::Unsupported {
            op: "matmul_t",
            detail: format!("{} activations with a 4-bit weight (bf16 only)", xs.dtype()),
        });
    }
    let m = x.numel() / k;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    if m == 0 {
        return wrap(CudaStorage::alloc(dev, DType::BF16, 0)?, shape);
    }
    if m > INT4_MAX_ROWS {
        let dense = dequantize(dev, packed)?;
        let w = wrap(dense, vec![n, k])?;
        return super::matmul::matmul_t(x, &w, bias);
    }
    let out = CudaStorage::alloc(dev, DType::BF16, m * n)?;
    if let Some(b) = bias {
        broadcast_row(cuda_of("matmul_t", b)?, &out)?;
    }
    let splits = packed.splits(dev);
    let strips = n / STRIP_ROWS;
    // Partials and per-strip arrival counters only where the inputs are split; zeroed f32 words
    // are zeroed counters.
    let (partial, counters) = if splits > 1 {
        (Some(CudaStorage::alloc(dev, DType::F32, splits * m * n)?), Some(CudaStorage::zeros(dev, DType::F32, strips)?))
    } else {
        (None, None)
    };
    let tiles = m.div_ceil(16);
    let mt = match tiles {
        1 => 1,
        2 => 2,
        _ => 4,
    };
    let launch = W4a16 {
        x: xs.ptr(),
        wq: dptr(&packed.packed, dev),
        sc: dptr(&packed.scales, dev),
        y: out.ptr(),
        partial: partial.as_ref().map_or(0, |p| p.ptr()),
        counters: counters.as_ref().map_or(0, |c| c.ptr()),
        m: int(m)?,
        n: int(n)?,
        k: int(k)?,
        group: int(packed.group)?,
        accumulate: bias.is_some() as i32,
    };
    let f = dev.function(GEMV, &format!("w4a16_mt{mt}"))?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (strips as u32, splits as u32, 1),
        block_dim: ((32 * INT4_WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch.launch_with(dev, &f, cfg)?;
    wrap(out, shape)
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
    let f = dev.function(GEMV, "int4_dequant_bf16")?;
    launch.launch_with(dev, &f, flat_cfg(dev, n * k / 8))?;
    Ok(out)
}
