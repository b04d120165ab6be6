//! The row-wise normalisations on CUDA (kernels/norm.cu): RMSNorm (plain and fused with the
//! residual add), LayerNorm, softmax, FP8 activation quantization, Gemma 3n's gaussian top-k and
//! AltUp's magnitude matching. One block per row (or group).

use cudarc::driver::LaunchConfig;

use super::device::{int, kernel_params, CudaDevice};
use super::kernels::NORM;
use super::ops::{cuda_of, same_dtype, wrap};
use super::storage::{dtype_suffix, row_cfg, CudaStorage};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::DType;

/// The launch of `rms_norm_vec8` (a thread per 8 elements, the row in registers) where it takes
/// the shape: bf16 rows of a multiple of 8 up to 8192 elements. A decode step's norms are one
/// row each, bound by latency: one round of loads instead of a strided loop read twice.
fn vec8_norm(dtype: DType, rows: usize, cols: usize) -> Option<LaunchConfig> {
    let fits = dtype == DType::BF16 && rows > 0 && cols > 0 && cols.is_multiple_of(8) && cols / 8 <= 1024;
    fits.then(|| LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: ((cols / 8).next_multiple_of(32) as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

kernel_params! {
    /// `rms_norm_<t>_<w>`.
    struct RmsNorm { x: u64, w: u64, y: u64, cols: i32, eps: f32, offset: f32 }
}

impl RmsNorm {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType, rows: usize) -> Result<()> {
        let f = dev.function(NORM, &format!("rms_norm_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, row_cfg(rows, self.cols as usize))
    }
}

kernel_params! {
    /// `add_rms_norm_<t>_<w>`, and `rms_norm_vec8_bf16_<w>`, which takes the same parameters
    /// and does a plain RMSNorm where `res` and `res_out` are null.
    struct AddRmsNorm { x: u64, res: u64, w: u64, y: u64, res_out: u64, cols: i32, eps: f32, offset: f32 }
}

impl AddRmsNorm {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType, rows: usize) -> Result<()> {
        let f = dev.function(NORM, &format!("add_rms_norm_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, row_cfg(rows, self.cols as usize))
    }

    fn launch_vec8(&self, dev: &CudaDevice, w: DType, cfg: LaunchConfig) -> Result<()> {
        let f = dev.function(NORM, &format!("rms_norm_vec8_bf16_{}", dtype_suffix(w)?))?;
        self.launch_with(dev, &f, cfg)
    }
}

pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    let (xs, ws) = (cuda_of("rms_norm", x)?, cuda_of("rms_norm", w)?);
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if let Some(cfg) = vec8_norm(xs.dtype(), rows, cols) {
        let launch =
            AddRmsNorm { x: xs.ptr(), res: 0, w: ws.ptr(), y: out.ptr(), res_out: 0, cols: int(cols)?, eps, offset };
        launch.launch_vec8(dev, ws.dtype(), cfg)?;
    } else if rows > 0 && cols > 0 {
        let launch = RmsNorm { x: xs.ptr(), w: ws.ptr(), y: out.ptr(), cols: int(cols)?, eps, offset };
        launch.launch(dev, xs.dtype(), ws.dtype(), rows)?;
    }
    wrap(out, x.shape().to_vec())
}

pub fn add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<(Tensor, Tensor)> {
    let (xs, rs, ws) = (cuda_of("add_rms_norm", x)?, cuda_of("add_rms_norm", residual)?, cuda_of("add_rms_norm", w)?);
    same_dtype("add_rms_norm", xs, rs)?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let normed = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    let sum = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    let launch = AddRmsNorm {
        x: xs.ptr(),
        res: rs.ptr(),
        w: ws.ptr(),
        y: normed.ptr(),
        res_out: sum.ptr(),
        cols: int(cols)?,
        eps,
        offset,
    };
    if let Some(cfg) = vec8_norm(xs.dtype(), rows, cols) {
        launch.launch_vec8(dev, ws.dtype(), cfg)?;
    } else if rows > 0 && cols > 0 {
        launch.launch(dev, xs.dtype(), ws.dtype(), rows)?;
    }
    Ok((wrap(normed, x.shape().to_vec())?, wrap(sum, x.shape().to_vec())?))
}

kernel_params! {
    /// `layer_norm_<t>_<w>`; `w` and `b` may be null.
    struct LayerNorm { x: u64, w: u64, b: u64, y: u64, cols: i32, eps: f32 }
}

impl LayerNorm {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType, rows: usize) -> Result<()> {
        let f = dev.function(NORM, &format!("layer_norm_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, row_cfg(rows, self.cols as usize))
    }
}

pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    let xs = cuda_of("layer_norm", x)?;
    let dev = xs.device();
    let ws = w.map(|t| cuda_of("layer_norm", t)).transpose()?;
    let bs = b.map(|t| cuda_of("layer_norm", t)).transpose()?;
    // One parameter dtype per kernel: the bias follows the weight where both are given.
    let wdtype = ws.or(bs).map(|s| s.dtype()).unwrap_or(xs.dtype());
    let bs = bs.map(|s| s.as_dtype(wdtype)).transpose()?;
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let launch = LayerNorm {
            x: xs.ptr(),
            w: ws.map_or(0, |s| s.ptr()),
            b: bs.as_ref().map_or(0, |s| s.ptr()),
            y: out.ptr(),
            cols: int(cols)?,
            eps,
        };
        launch.launch(dev, xs.dtype(), wdtype, rows)?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `gaussian_topk_<t>`.
    struct GaussianTopk { x: u64, y: u64, cols: i32, multiplier: f32 }
}

pub fn gaussian_topk(x: &Tensor, multiplier: f32) -> Result<Tensor> {
    let xs = cuda_of("gaussian_topk", x)?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let f = dev.function(NORM, &format!("gaussian_topk_{}", dtype_suffix(xs.dtype())?))?;
        let launch = GaussianTopk { x: xs.ptr(), y: out.ptr(), cols: int(cols)?, multiplier };
        launch.launch_with(dev, &f, row_cfg(rows, cols))?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `match_rms_<t>`.
    struct MatchRms { x: u64, reference: u64, y: u64, cols: i32, ref_cols: i32, floor: f32 }
}

pub fn match_rms(x: &Tensor, reference: &Tensor, min_mean_square: f32) -> Result<Tensor> {
    let (xs, rs) = (cuda_of("match_rms", x)?, cuda_of("match_rms", reference)?);
    same_dtype("match_rms", xs, rs)?;
    let dev = xs.device();
    let (rows, cols, ref_cols) = (x.rows(), x.last_dim(), reference.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 && ref_cols > 0 {
        let f = dev.function(NORM, &format!("match_rms_{}", dtype_suffix(xs.dtype())?))?;
        let launch = MatchRms {
            x: xs.ptr(),
            reference: rs.ptr(),
            y: out.ptr(),
            cols: int(cols)?,
            ref_cols: int(ref_cols)?,
            floor: min_mean_square,
        };
        launch.launch_with(dev, &f, row_cfg(rows, cols.max(ref_cols)))?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `softmax_<t>`.
    struct Softmax { x: u64, y: u64, cols: i32 }
}

impl Softmax {
    fn launch(&self, dev: &CudaDevice, t: DType, rows: usize) -> Result<()> {
        let f = dev.function(NORM, &format!("softmax_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, row_cfg(rows, self.cols as usize))
    }
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let xs = cuda_of("softmax", x)?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        Softmax { x: xs.ptr(), y: out.ptr(), cols: int(cols)? }.launch(dev, xs.dtype(), rows)?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `fp8_fake_quant_<t>`.
    struct Fp8FakeQuant { x: u64, y: u64, group: i32, static_scale: f32 }
}

kernel_params! {
    /// `fp8_fake_quant_row_chunks_bf16`.
    struct Fp8FakeQuantRows { x: u64, y: u64, cols: i32, static_scale: f32 }
}

/// 16-byte chunks of a row each thread of the `*_row_chunks_bf16` quantization kernels holds.
pub(crate) const QUANT_CHUNKS: usize = 4;

/// The launch of a `*_row_chunks_bf16` quantization kernel over `rows` rows `cols` wide: one
/// block per row, a thread per chunk up to 1024 threads; `None` for rows it does not take.
pub(crate) fn quant_chunks_cfg(rows: usize, cols: usize) -> Option<LaunchConfig> {
    let chunks = cols / 8;
    if !cols.is_multiple_of(8) || chunks == 0 || chunks > QUANT_CHUNKS * 1024 || rows == 0 {
        return None;
    }
    let threads = chunks.min(1024).next_multiple_of(32) as u32;
    Some(LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

pub fn fp8_fake_quant(x: &Tensor, quant: crate::ActivationQuant) -> Result<Tensor> {
    let xs = cuda_of("fp8_fake_quant", x)?;
    let dev = xs.device();
    let cols = x.last_dim();
    let (group, static_scale) = match quant {
        crate::ActivationQuant::PerToken => (cols, 0.0),
        crate::ActivationQuant::PerGroup(g) => (g, 0.0),
        // One "group" per row keeps the grid within bounds; the scale makes the reduction moot.
        crate::ActivationQuant::Static(s) => (cols, s),
    };
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    let chunked =
        if xs.dtype() == DType::BF16 && group == cols { quant_chunks_cfg(xs.len() / cols, cols) } else { None };
    if let (Some(cfg), false) = (chunked, xs.is_empty()) {
        let f = dev.function(NORM, "fp8_fake_quant_row_chunks_bf16")?;
        Fp8FakeQuantRows { x: xs.ptr(), y: out.ptr(), cols: int(cols)?, static_scale }.launch_with(dev, &f, cfg)?;
    } else if !xs.is_empty() && group > 0 {
        let f = dev.function(NORM, &format!("fp8_fake_quant_{}", dtype_suffix(xs.dtype())?))?;
        let launch = Fp8FakeQuant { x: xs.ptr(), y: out.ptr(), group: int(group)?, static_scale };
        launch.launch_with(dev, &f, row_cfg(xs.len() / group, group))?;
    }
    wrap(out, x.shape().to_vec())
}
