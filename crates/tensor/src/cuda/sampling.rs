//! `ops::sample_rows` and `ops::mask_tokens` on CUDA (kernels/sampling.cu): the row plans (or
//! the token bitmask) go up in one small buffer, one token id per row comes back, and the logits
//! never leave the device.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice};
use super::kernels::SAMPLING;
use super::ops::{cuda_of, wrap};
use super::storage::dtype_suffix;
use super::storage::CudaStorage;
use crate::cpu::sampling::RowPlan;
use crate::error::{Result, TensorError};
use crate::ops::RowSampling;
use crate::tensor::Tensor;
use crate::DType;

/// The block size, which the kernel's `__launch_bounds__` allows (kernels.rs defines it there).
pub(crate) const SAMPLE_THREADS: u32 = 1024;

/// A row's plan as the kernel reads it (`SamplePlan` in sampling.cu).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct SamplePlan {
    pub(crate) greedy: u32,
    pub(crate) inv_t: f32,
    pub(crate) log_min_p: f32,
    pub(crate) top_p: f32,
    pub(crate) top_k: u32,
    pub(crate) seed_lo: u32,
    pub(crate) seed_hi: u32,
    pub(crate) step_lo: u32,
    pub(crate) step_hi: u32,
}

// SAFETY: plain 32-bit words laid out as the kernel's struct, which the NVRTC unit test checks.
unsafe impl DeviceRepr for SamplePlan {}

impl SamplePlan {
    fn new(p: &RowPlan) -> SamplePlan {
        SamplePlan {
            greedy: u32::from(p.greedy),
            inv_t: p.inv_t,
            log_min_p: p.log_min_p,
            top_p: p.top_p,
            top_k: p.top_k,
            seed_lo: p.seed as u32,
            seed_hi: (p.seed >> 32) as u32,
            step_lo: p.step as u32,
            step_hi: (p.step >> 32) as u32,
        }
    }
}

kernel_params! {
    /// `sample_rows_<t>`: one token id per row of `logits` into `out`, by the row's plan.
    struct SampleRows { logits: u64, plans: u64, out: u64, cols: i32 }
}

impl SampleRows {
    fn launch(&self, dev: &CudaDevice, t: DType, rows: u32) -> Result<()> {
        let f = dev.function(SAMPLING, &format!("sample_rows_{}", dtype_suffix(t)?))?;
        let cfg = LaunchConfig { grid_dim: (rows, 1, 1), block_dim: (SAMPLE_THREADS, 1, 1), shared_mem_bytes: 0 };
        self.launch_with(dev, &f, cfg)
    }
}

pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<u32>> {
    let xs = cuda_of("sample_rows", logits)?;
    let dev = xs.device();
    let vocab = logits.last_dim();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if vocab > 1 << 24 {
        // The top-k select counts in f32, which is exact only up to 2^24.
        return Err(TensorError::Unsupported { op: "sample_rows", detail: format!("a vocab of {vocab} on CUDA") });
    }
    let grid = u32::try_from(rows.len()).map_err(|_| dev_err(format!("sample_rows: {} rows", rows.len())))?;
    let plans: Vec<SamplePlan> = rows.iter().map(|r| SamplePlan::new(&RowPlan::new(r, vocab))).collect();
    dev.check_not_capturing("sampling")?;
    let s = dev.stream();
    let plans = s.clone_htod(&plans).map_err(dev_err)?;
    // SAFETY: the kernel writes one id per row before the copy back reads them.
    let out = unsafe { s.alloc::<u32>(rows.len()) }.map_err(dev_err)?;
    let launch = SampleRows { logits: xs.ptr(), plans: dptr(&plans, dev), out: dptr(&out, dev), cols: int(vocab)? };
    launch.launch(dev, xs.dtype(), grid)?;
    s.clone_dtoh(&out).map_err(dev_err)
}

/// Threads a block of `mask_tokens_<t>`, one column each.
const MASK_THREADS: u32 = 256;

kernel_params! {
    /// `mask_tokens_<t>`: `logits` into `out` with the columns whose bit is clear set to -inf.
    struct MaskTokens { logits: u64, bitmask: u64, out: u64, cols: i32, words: i32 }
}

impl MaskTokens {
    fn launch(&self, dev: &CudaDevice, t: DType, rows: u32) -> Result<()> {
        let f = dev.function(SAMPLING, &format!("mask_tokens_{}", dtype_suffix(t)?))?;
        let blocks = (self.cols as u32).div_ceil(MASK_THREADS);
        let cfg = LaunchConfig { grid_dim: (blocks, rows, 1), block_dim: (MASK_THREADS, 1, 1), shared_mem_bytes: 0 };
        self.launch_with(dev, &f, cfg)
    }
}

pub fn mask_tokens(logits: &Tensor, bitmask: &[u32]) -> Result<Tensor> {
    let xs = cuda_of("mask_tokens", logits)?;
    let dev = xs.device();
    let (rows, cols) = (logits.rows(), logits.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let grid = u32::try_from(rows).map_err(|_| dev_err(format!("mask_tokens: {rows} rows")))?;
        dev.check_not_capturing("token masks")?;
        let words = bitmask.len() / rows;
        let bitmask = dev.stream().clone_htod(bitmask).map_err(dev_err)?;
        MaskTokens {
            logits: xs.ptr(),
            bitmask: dptr(&bitmask, dev),
            out: out.ptr(),
            cols: int(cols)?,
            words: int(words)?,
        }
        .launch(dev, xs.dtype(), grid)?;
    }
    wrap(out, logits.shape().to_vec())
}
