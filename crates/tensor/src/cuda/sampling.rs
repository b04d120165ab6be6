//! `ops::sample_rows` on CUDA: the row plans go up in one small buffer, one token id per row
//! comes back, and the logits never leave the device.

use cudarc::driver::{DevicePtr, LaunchConfig};

use super::device::{dev_err, SAMPLING};
use super::ops::cuda_of;
use super::storage::{dtype_suffix, int, Arg};
use crate::cpu::sampling::RowPlan;
use crate::error::{Result, TensorError};
use crate::ops::RowSampling;
use crate::tensor::Tensor;

/// The block size that the kernel's `__launch_bounds__` allows.
const THREADS: u32 = 1024;

/// A plan as the kernel's `SamplePlan` lays it out: nine 32-bit words.
fn plan_words(p: &RowPlan) -> [u32; 9] {
    [
        u32::from(p.greedy),
        p.inv_t.to_bits(),
        p.log_min_p.to_bits(),
        p.top_p.to_bits(),
        p.top_k,
        p.seed as u32,
        (p.seed >> 32) as u32,
        p.step as u32,
        (p.step >> 32) as u32,
    ]
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
    let plans: Vec<u32> = rows.iter().flat_map(|r| plan_words(&RowPlan::new(r, vocab))).collect();
    dev.check_not_capturing("sampling")?;
    let s = dev.stream();
    let plans = s.clone_htod(&plans).map_err(dev_err)?;
    // SAFETY: the kernel writes one id per row before the copy back reads them.
    let out = unsafe { s.alloc::<u32>(rows.len()) }.map_err(dev_err)?;
    let f = dev.function(SAMPLING, &format!("sample_rows_{}", dtype_suffix(xs.dtype())?))?;
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let args = [xs.ptr(), Arg::Ptr(plans.device_ptr(s).0), Arg::Ptr(out.device_ptr(s).0), int(vocab)?];
    dev.launch(&f, cfg, &args)?;
    s.clone_dtoh(&out).map_err(dev_err)
}
