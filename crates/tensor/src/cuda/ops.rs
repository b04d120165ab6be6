//! The elementwise, normalisation and data-movement ops on CUDA. `crate::ops` has validated
//! shapes and checked that every operand lives on the same device before calling these.

use cudarc::driver::LaunchConfig;

use super::attention::dptr;
use super::device::{dev_err, ELEMENTWISE, NORM};
use super::graph::StepIndex;
use super::storage::{dtype_suffix, flat_cfg, int, row_cfg, Arg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::ops::{Activation, RopeStyle};
use crate::tensor::{Storage, Tensor};
use crate::DType;

pub(crate) fn cuda_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
    t.cuda().ok_or_else(|| dev_err(format!("{op}: an operand is not on a CUDA device")))
}

pub(crate) fn wrap(storage: CudaStorage, shape: Vec<usize>) -> Result<Tensor> {
    Tensor::from_storage(Storage::Cuda(storage), shape)
}

fn same_dtype(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(TensorError::Unsupported { op, detail: format!("mixed dtypes {} and {}", a.dtype(), b.dtype()) });
    }
    Ok(())
}

pub(crate) fn activation_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => 0,
        Activation::Gelu => 1,
        Activation::GeluTanh => 2,
        Activation::Relu => 3,
    }
}

pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    wrap(cuda_of("to_dtype", x)?.cast(dtype)?, x.shape().to_vec())
}

const UNARY_SCALE: i32 = 0;
const UNARY_SOFTCAP: i32 = 1;
const UNARY_ACTIVATION: i32 = 2;

fn unary(x: &Tensor, op: i32, a: f32, act: i32) -> Result<Tensor> {
    let xs = cuda_of("unary", x)?;
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !xs.is_empty() {
        let f = dev.function(ELEMENTWISE, &format!("unary_{}", dtype_suffix(xs.dtype())?))?;
        let args = [xs.ptr(), out.ptr(), Arg::U64(xs.len() as u64), Arg::I32(op), Arg::F32(a), Arg::I32(act)];
        dev.launch(&f, flat_cfg(dev, xs.len()), &args)?;
    }
    wrap(out, x.shape().to_vec())
}

pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor> {
    unary(x, UNARY_SCALE, factor, 0)
}

pub fn softcap(x: &Tensor, cap: f32) -> Result<Tensor> {
    unary(x, UNARY_SOFTCAP, cap, 0)
}

pub fn activation(x: &Tensor, act: Activation) -> Result<Tensor> {
    unary(x, UNARY_ACTIVATION, 0.0, activation_code(act))
}

const BINARY_ADD: i32 = 0;
const BINARY_MUL: i32 = 1;
const BINARY_ACT_MUL: i32 = 2;

fn binary(op_name: &'static str, a: &Tensor, b: &Tensor, op: i32, act: i32) -> Result<Tensor> {
    let (sa, sb) = (cuda_of(op_name, a)?, cuda_of(op_name, b)?);
    same_dtype(op_name, sa, sb)?;
    let dev = sa.device();
    let out = CudaStorage::alloc(dev, sa.dtype(), sa.len())?;
    if !sa.is_empty() {
        let f = dev.function(ELEMENTWISE, &format!("binary_{}", dtype_suffix(sa.dtype())?))?;
        let args = [sa.ptr(), sb.ptr(), out.ptr(), Arg::U64(sa.len() as u64), Arg::I32(op), Arg::I32(act)];
        dev.launch(&f, flat_cfg(dev, sa.len()), &args)?;
    }
    wrap(out, a.shape().to_vec())
}

pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("add", a, b, BINARY_ADD, 0)
}

pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    binary("mul", a, b, BINARY_MUL, 0)
}

pub fn act_mul(gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    binary("act_mul", gate, up, BINARY_ACT_MUL, activation_code(act))
}

pub fn mul_row(x: &Tensor, row: &Tensor) -> Result<Tensor> {
    let (xs, rs) = (cuda_of("mul_row", x)?, cuda_of("mul_row", row)?);
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !xs.is_empty() {
        let name = format!("mul_row_{}_{}", dtype_suffix(xs.dtype())?, dtype_suffix(rs.dtype())?);
        let f = dev.function(ELEMENTWISE, &name)?;
        let args = [xs.ptr(), rs.ptr(), out.ptr(), Arg::U64(xs.len() as u64), int(x.last_dim())?];
        dev.launch(&f, flat_cfg(dev, xs.len()), &args)?;
    }
    wrap(out, x.shape().to_vec())
}

/// Fills `out [rows, row.len()]` with copies of `row` (converted to `out`'s dtype).
pub(crate) fn broadcast_row(row: &CudaStorage, out: &CudaStorage) -> Result<()> {
    let dev = out.device();
    let name = format!("broadcast_row_{}_{}", dtype_suffix(out.dtype())?, dtype_suffix(row.dtype())?);
    let f = dev.function(ELEMENTWISE, &name)?;
    dev.launch(&f, flat_cfg(dev, out.len()), &[row.ptr(), out.ptr(), Arg::U64(out.len() as u64), int(row.len())?])
}

fn upload_u32(dev: &std::sync::Arc<super::CudaDevice>, v: &[u32]) -> Result<cudarc::driver::CudaSlice<u32>> {
    dev.check_not_capturing("an index upload")?;
    dev.stream().clone_htod(v).map_err(dev_err)
}

/// Gathers rows of `src` by `index`: the step's own indices come from the graph's buffer while
/// a capture runs, anything else is uploaded.
fn gather(op: &'static str, src: &CudaStorage, cols: usize, index: StepIndex<'_>) -> Result<CudaStorage> {
    let dev = src.device();
    let n = index.len();
    let out = CudaStorage::alloc(dev, src.dtype(), n * cols)?;
    if n > 0 && cols > 0 {
        let uploaded;
        let p = match dev.step_index(&index)? {
            Some(p) => p,
            None => {
                uploaded = upload_u32(dev, &index.host()?)?;
                cudarc::driver::DevicePtr::device_ptr(&uploaded, dev.stream()).0
            }
        };
        let f = dev.function(ELEMENTWISE, &format!("gather_rows_{}", dtype_suffix(src.dtype())?))?;
        dev.launch(&f, row_cfg(n, cols), &[src.ptr(), Arg::Ptr(p), out.ptr(), int(cols)?])
            .map_err(|e| dev_err(format!("{op}: {e}")))?;
    }
    Ok(out)
}

pub fn embedding(table: &Tensor, ids: &[u32]) -> Result<Tensor> {
    let hidden = table.shape()[1];
    let out = gather("embedding", cuda_of("embedding", table)?, hidden, StepIndex::Tokens(ids))?;
    wrap(out, vec![ids.len(), hidden])
}

pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let cols = x.last_dim();
    let out = gather("gather_rows", cuda_of("gather_rows", x)?, cols, StepIndex::LogitRows(rows))?;
    wrap(out, vec![rows.len(), cols])
}

/// Copies `len` columns from `src` (starting at `src_off`) into `dst` (starting at `dst_off`).
#[allow(clippy::too_many_arguments)]
fn copy_cols(
    src: &CudaStorage,
    src_cols: usize,
    src_off: usize,
    dst: &CudaStorage,
    dst_cols: usize,
    dst_off: usize,
    rows: usize,
    len: usize,
) -> Result<()> {
    if rows == 0 || len == 0 {
        return Ok(());
    }
    let dev = src.device();
    let f = dev.function(ELEMENTWISE, &format!("copy_cols_{}", dtype_suffix(src.dtype())?))?;
    let args =
        [src.ptr(), int(src_cols)?, int(src_off)?, dst.ptr(), int(dst_cols)?, int(dst_off)?, int(rows)?, int(len)?];
    dev.launch(&f, flat_cfg(dev, rows * len), &args)
}

pub fn narrow_cols(x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let xs = cuda_of("narrow_cols", x)?;
    let rows = x.rows();
    let out = CudaStorage::alloc(xs.device(), xs.dtype(), rows * len)?;
    copy_cols(xs, x.last_dim(), start, &out, len, 0, rows, len)?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = len;
    wrap(out, shape)
}

pub fn concat_cols(parts: &[&Tensor]) -> Result<Tensor> {
    let first = cuda_of("concat_cols", parts[0])?;
    let rows = parts[0].rows();
    let total: usize = parts.iter().map(|p| p.last_dim()).sum();
    let out = CudaStorage::alloc(first.device(), first.dtype(), rows * total)?;
    let mut off = 0;
    for p in parts {
        let ps = cuda_of("concat_cols", p)?;
        same_dtype("concat_cols", first, ps)?;
        copy_cols(ps, p.last_dim(), 0, &out, total, off, rows, p.last_dim())?;
        off += p.last_dim();
    }
    wrap(out, vec![rows, total])
}

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

pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    let (xs, ws) = (cuda_of("rms_norm", x)?, cuda_of("rms_norm", w)?);
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if let Some(cfg) = vec8_norm(xs.dtype(), rows, cols) {
        let f = dev.function(NORM, &format!("rms_norm_vec8_bf16_{}", dtype_suffix(ws.dtype())?))?;
        let none = Arg::U64(0);
        dev.launch(&f, cfg, &[xs.ptr(), none, ws.ptr(), out.ptr(), none, int(cols)?, Arg::F32(eps), Arg::F32(offset)])?;
    } else if rows > 0 && cols > 0 {
        let name = format!("rms_norm_{}_{}", dtype_suffix(xs.dtype())?, dtype_suffix(ws.dtype())?);
        let f = dev.function(NORM, &name)?;
        let args = [xs.ptr(), ws.ptr(), out.ptr(), int(cols)?, Arg::F32(eps), Arg::F32(offset)];
        dev.launch(&f, row_cfg(rows, cols), &args)?;
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
    let args = [xs.ptr(), rs.ptr(), ws.ptr(), normed.ptr(), sum.ptr(), int(cols)?, Arg::F32(eps), Arg::F32(offset)];
    if let Some(cfg) = vec8_norm(xs.dtype(), rows, cols) {
        let f = dev.function(NORM, &format!("rms_norm_vec8_bf16_{}", dtype_suffix(ws.dtype())?))?;
        dev.launch(&f, cfg, &args)?;
    } else if rows > 0 && cols > 0 {
        let name = format!("add_rms_norm_{}_{}", dtype_suffix(xs.dtype())?, dtype_suffix(ws.dtype())?);
        let f = dev.function(NORM, &name)?;
        dev.launch(&f, row_cfg(rows, cols), &args)?;
    }
    Ok((wrap(normed, x.shape().to_vec())?, wrap(sum, x.shape().to_vec())?))
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
        let name = format!("layer_norm_{}_{}", dtype_suffix(xs.dtype())?, dtype_suffix(wdtype)?);
        let f = dev.function(NORM, &name)?;
        let null = Arg::Ptr(0);
        let args = [
            xs.ptr(),
            ws.map(|s| s.ptr()).unwrap_or(null),
            bs.as_ref().map(|s| s.ptr()).unwrap_or(null),
            out.ptr(),
            int(cols)?,
            Arg::F32(eps),
        ];
        dev.launch(&f, row_cfg(rows, cols), &args)?;
    }
    wrap(out, x.shape().to_vec())
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let xs = cuda_of("softmax", x)?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let f = dev.function(NORM, &format!("softmax_{}", dtype_suffix(xs.dtype())?))?;
        dev.launch(&f, row_cfg(rows, cols), &[xs.ptr(), out.ptr(), int(cols)?])?;
    }
    wrap(out, x.shape().to_vec())
}

pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize, style: RopeStyle) -> Result<Tensor> {
    let (xs, cs, ss) = (cuda_of("rope", x)?, cuda_of("rope", cos)?, cuda_of("rope", sin)?);
    let ss = ss.as_dtype(cs.dtype())?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let name = format!("rope_{}_{}", dtype_suffix(xs.dtype())?, dtype_suffix(cs.dtype())?);
        let f = dev.function(ELEMENTWISE, &name)?;
        let args = [
            xs.ptr(),
            cs.ptr(),
            ss.ptr(),
            out.ptr(),
            int(rows)?,
            int(cols)?,
            int(head_dim)?,
            int(cos.last_dim())?,
            Arg::I32(interleaved(style)),
        ];
        dev.launch(&f, flat_cfg(dev, rows * cols), &args)?;
    }
    wrap(out, x.shape().to_vec())
}

pub(crate) fn interleaved(style: RopeStyle) -> i32 {
    matches!(style, RopeStyle::Interleaved) as i32
}

pub fn combine_rows(y: &Tensor, rows: &[usize], weights: &[f32], per_row: usize) -> Result<Tensor> {
    let ys = cuda_of("combine_rows", y)?;
    let dev = ys.device();
    let cols = y.last_dim();
    let out_rows = rows.len() / per_row;
    let out = CudaStorage::alloc(dev, ys.dtype(), out_rows * cols)?;
    if out_rows > 0 && cols > 0 {
        let idx = rows
            .iter()
            .map(|&r| u32::try_from(r).map_err(|_| dev_err(format!("combine_rows: row {r} beyond 32 bits"))))
            .collect::<Result<Vec<u32>>>()?;
        let idx = upload_u32(dev, &idx)?;
        dev.check_not_capturing("routing weights")?;
        let w = dev.stream().clone_htod(weights).map_err(dev_err)?;
        let f = dev.function(ELEMENTWISE, &format!("combine_rows_{}", dtype_suffix(ys.dtype())?))?;
        let s = dev.stream();
        let args = [
            ys.ptr(),
            Arg::Ptr(cudarc::driver::DevicePtr::device_ptr(&idx, s).0),
            Arg::Ptr(cudarc::driver::DevicePtr::device_ptr(&w, s).0),
            out.ptr(),
            int(cols)?,
            int(per_row)?,
        ];
        dev.launch(&f, row_cfg(out_rows, cols), &args)?;
    }
    wrap(out, vec![out_rows, cols])
}

pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    let xs = cuda_of("argmax_rows", logits)?;
    let dev = xs.device();
    let (rows, cols) = (logits.rows(), logits.last_dim());
    if rows == 0 {
        return Ok(Vec::new());
    }
    dev.check_not_capturing("reading token ids back")?;
    // Each row in parts of at least ARGMAX_PART columns, one block each, then a merge per row.
    const ARGMAX_PART: usize = 4096;
    let parts = cols.div_ceil(ARGMAX_PART).min(64);
    let per_part = cols.div_ceil(parts);
    // SAFETY: argmax_parts writes every part's pair and argmax_merge every row's index before
    // anything reads them.
    let (part_v, part_i, out) = unsafe {
        let s = dev.stream();
        (s.alloc::<f32>(rows * parts), s.alloc::<u32>(rows * parts), s.alloc::<u32>(rows))
    };
    let (part_v, part_i, out) = (part_v.map_err(dev_err)?, part_i.map_err(dev_err)?, out.map_err(dev_err)?);
    let (pv, pi, po) = (dptr(&part_v, dev), dptr(&part_i, dev), dptr(&out, dev));
    let f = dev.function(ELEMENTWISE, &format!("argmax_parts_{}", dtype_suffix(xs.dtype())?))?;
    let cfg = LaunchConfig { grid_dim: (parts as u32, rows as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    dev.launch(&f, cfg, &[xs.ptr(), pv, pi, int(cols)?, int(per_part)?])?;
    let merge = dev.function(ELEMENTWISE, "argmax_merge")?;
    let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    dev.launch(&merge, cfg, &[pv, pi, po, int(parts)?])?;
    dev.stream().clone_dtoh(&out).map_err(dev_err)
}
