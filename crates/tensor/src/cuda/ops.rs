//! The elementwise and data-movement ops on CUDA (kernels/elementwise.cu). `crate::ops` has
//! validated shapes and checked that every operand lives on the same device before calling these.

use cudarc::driver::LaunchConfig;

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice};
use super::graph::StepIndex;
use super::kernels::ELEMENTWISE;
use super::storage::{dtype_suffix, flat_cfg, row_cfg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::ops::Activation;
use crate::tensor::{Storage, Tensor};
use crate::DType;

pub(crate) fn cuda_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
    t.cuda().ok_or_else(|| dev_err(format!("{op}: an operand is not on a CUDA device")))
}

pub(crate) fn wrap(storage: CudaStorage, shape: Vec<usize>) -> Result<Tensor> {
    Tensor::from_storage(Storage::Cuda(storage), shape)
}

pub(crate) fn same_dtype(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(TensorError::Unsupported { op, detail: format!("mixed dtypes {} and {}", a.dtype(), b.dtype()) });
    }
    Ok(())
}

/// The codes of [`Activation`] that the kernels' `activate` switches on.
pub(crate) const ACT_SILU: i32 = 0;
pub(crate) const ACT_GELU: i32 = 1;
pub(crate) const ACT_GELU_TANH: i32 = 2;
pub(crate) const ACT_RELU: i32 = 3;
pub(crate) const ACT_RELU2: i32 = 4;
pub(crate) const ACT_SIGMOID: i32 = 5;
pub(crate) const ACT_QUICK_GELU: i32 = 6;

pub(crate) fn activation_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => ACT_SILU,
        Activation::Gelu => ACT_GELU,
        Activation::GeluTanh => ACT_GELU_TANH,
        Activation::Relu => ACT_RELU,
        Activation::Relu2 => ACT_RELU2,
        Activation::Sigmoid => ACT_SIGMOID,
        Activation::QuickGelu => ACT_QUICK_GELU,
    }
}

kernel_params! {
    /// `cast_<from>_<to>`: `n` elements converted.
    pub(crate) struct Cast { x: u64, y: u64, n: u64 }
}

impl Cast {
    pub(crate) fn launch(&self, dev: &CudaDevice, from: DType, to: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("cast_{}_{}", dtype_suffix(from)?, dtype_suffix(to)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.n as usize))
    }
}

pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    wrap(cuda_of("to_dtype", x)?.cast(dtype)?, x.shape().to_vec())
}

pub(crate) const UNARY_SCALE: i32 = 0;
pub(crate) const UNARY_SOFTCAP: i32 = 1;
pub(crate) const UNARY_ACTIVATION: i32 = 2;

kernel_params! {
    /// `unary_<t>`: `op` is one of the `UNARY_*` codes, `act` an activation code.
    struct Unary { x: u64, y: u64, n: u64, op: i32, a: f32, act: i32 }
}

impl Unary {
    fn launch(&self, dev: &CudaDevice, t: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("unary_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.n as usize))
    }
}

fn unary(x: &Tensor, op: i32, a: f32, act: i32) -> Result<Tensor> {
    let xs = cuda_of("unary", x)?;
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !xs.is_empty() {
        Unary { x: xs.ptr(), y: out.ptr(), n: xs.len() as u64, op, a, act }.launch(dev, xs.dtype())?;
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

kernel_params! {
    /// `xielu_<t>`: the xIELU activation with one layer's constants.
    struct XieluArgs { x: u64, y: u64, n: u64, alpha_p: f32, alpha_n: f32, beta: f32, eps: f32 }
}

pub fn xielu(x: &Tensor, p: crate::ops::Xielu) -> Result<Tensor> {
    let xs = cuda_of("xielu", x)?;
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !xs.is_empty() {
        let args = XieluArgs {
            x: xs.ptr(),
            y: out.ptr(),
            n: xs.len() as u64,
            alpha_p: p.alpha_p,
            alpha_n: p.alpha_n,
            beta: p.beta,
            eps: p.eps,
        };
        let f = dev.function(ELEMENTWISE, &format!("xielu_{}", dtype_suffix(xs.dtype())?))?;
        args.launch_with(dev, &f, flat_cfg(dev, xs.len()))?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `clamped_swiglu_<t>`: gpt-oss's expert activation of `gate` and `up`.
    struct ClampedSwigluArgs { g: u64, u: u64, y: u64, n: u64, alpha: f32, limit: f32 }
}

pub fn clamped_swiglu(gate: &Tensor, up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
    let (gs, us) = (cuda_of("clamped_swiglu", gate)?, cuda_of("clamped_swiglu", up)?);
    if gs.dtype() != us.dtype() {
        return Err(TensorError::Unsupported {
            op: "clamped_swiglu",
            detail: "gate and up of different dtypes".into(),
        });
    }
    let dev = gs.device();
    let out = CudaStorage::alloc(dev, gs.dtype(), gs.len())?;
    if !gs.is_empty() {
        let args = ClampedSwigluArgs { g: gs.ptr(), u: us.ptr(), y: out.ptr(), n: gs.len() as u64, alpha, limit };
        let f = dev.function(ELEMENTWISE, &format!("clamped_swiglu_{}", dtype_suffix(gs.dtype())?))?;
        args.launch_with(dev, &f, flat_cfg(dev, gs.len()))?;
    }
    wrap(out, gate.shape().to_vec())
}

pub(crate) const BINARY_ADD: i32 = 0;
pub(crate) const BINARY_MUL: i32 = 1;
pub(crate) const BINARY_ACT_MUL: i32 = 2;

kernel_params! {
    /// `binary_<t>`: `op` is one of the `BINARY_*` codes, `act` an activation code.
    struct Binary { a: u64, b: u64, y: u64, n: u64, op: i32, act: i32 }
}

impl Binary {
    fn launch(&self, dev: &CudaDevice, t: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("binary_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.n as usize))
    }
}

fn binary(op_name: &'static str, a: &Tensor, b: &Tensor, op: i32, act: i32) -> Result<Tensor> {
    let (sa, sb) = (cuda_of(op_name, a)?, cuda_of(op_name, b)?);
    same_dtype(op_name, sa, sb)?;
    let dev = sa.device();
    let out = CudaStorage::alloc(dev, sa.dtype(), sa.len())?;
    if !sa.is_empty() {
        Binary { a: sa.ptr(), b: sb.ptr(), y: out.ptr(), n: sa.len() as u64, op, act }.launch(dev, sa.dtype())?;
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

kernel_params! {
    /// `mul_row_<t>_<w>`: every row of `x` times `row` (`cols` elements).
    struct MulRow { x: u64, row: u64, y: u64, n: u64, cols: i32 }
}

impl MulRow {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("mul_row_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.n as usize))
    }
}

pub fn mul_row(x: &Tensor, row: &Tensor) -> Result<Tensor> {
    let (xs, rs) = (cuda_of("mul_row", x)?, cuda_of("mul_row", row)?);
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !xs.is_empty() {
        let launch = MulRow { x: xs.ptr(), row: rs.ptr(), y: out.ptr(), n: xs.len() as u64, cols: int(x.last_dim())? };
        launch.launch(dev, xs.dtype(), rs.dtype())?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `mix_streams_<t>`: see [`crate::ops::mix_streams`].
    struct MixStreams { x: u64, coefs: u64, y: u64, total: u64, n: i32, m: i32, d: i32 }
}

pub fn mix_streams(x: &Tensor, coefs: &Tensor, n: usize) -> Result<Tensor> {
    let (xs, cs) = (cuda_of("mix_streams", x)?, cuda_of("mix_streams", coefs)?);
    same_dtype("mix_streams", xs, cs)?;
    let dev = xs.device();
    let m = coefs.last_dim() / n;
    let d = x.last_dim() / m;
    let total = x.rows() * n * d;
    let out = CudaStorage::alloc(dev, xs.dtype(), total)?;
    if total > 0 {
        let f = dev.function(ELEMENTWISE, &format!("mix_streams_{}", dtype_suffix(xs.dtype())?))?;
        let launch = MixStreams {
            x: xs.ptr(),
            coefs: cs.ptr(),
            y: out.ptr(),
            total: total as u64,
            n: int(n)?,
            m: int(m)?,
            d: int(d)?,
        };
        launch.launch_with(dev, &f, flat_cfg(dev, total))?;
    }
    wrap(out, vec![x.rows(), n * d])
}

kernel_params! {
    /// `broadcast_row_<t>_<w>`: `y` filled with copies of `row` (`cols` elements).
    struct BroadcastRow { row: u64, y: u64, n: u64, cols: i32 }
}

impl BroadcastRow {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("broadcast_row_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.n as usize))
    }
}

/// Fills `out [rows, row.len()]` with copies of `row` (converted to `out`'s dtype).
pub(crate) fn broadcast_row(row: &CudaStorage, out: &CudaStorage) -> Result<()> {
    let launch = BroadcastRow { row: row.ptr(), y: out.ptr(), n: out.len() as u64, cols: int(row.len())? };
    launch.launch(out.device(), out.dtype(), row.dtype())
}

fn upload_u32(dev: &std::sync::Arc<super::CudaDevice>, v: &[u32]) -> Result<cudarc::driver::CudaSlice<u32>> {
    dev.check_not_capturing("an index upload")?;
    dev.stream().clone_htod(v).map_err(dev_err)
}

kernel_params! {
    /// `gather_rows_<t>`: row `i` of `dst` is row `idx[i]` of `src`; one block per row.
    struct GatherRows { src: u64, idx: u64, dst: u64, cols: i32 }
}

impl GatherRows {
    fn launch(&self, dev: &CudaDevice, t: DType, rows: usize) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("gather_rows_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, row_cfg(rows, self.cols as usize))
    }
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
                dptr(&uploaded, dev)
            }
        };
        GatherRows { src: src.ptr(), idx: p, dst: out.ptr(), cols: int(cols)? }
            .launch(dev, src.dtype(), n)
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

/// Whole key rows gathered, then the columns copied out: two existing launches, no kernel of
/// its own. A capture fails on the uploaded row list, as on any gather but the logit rows'.
pub fn gather_cached_keys(cache: &crate::kv::PagedKvLayer, rows: &[usize], start: usize, len: usize) -> Result<Tensor> {
    let op = "gather_cached_keys";
    let crate::kv::KvStorage::Cuda { k, .. } = &cache.storage else {
        return Err(dev_err(format!("{op}: a CPU KV cache read as a CUDA one")));
    };
    let full = gather(op, k, cache.k_dim, StepIndex::LogitRows(rows))?;
    let out = CudaStorage::alloc(k.device(), k.dtype(), rows.len() * len)?;
    copy_cols(&full, cache.k_dim, start, &out, len, 0, rows.len(), len)?;
    wrap(out, vec![rows.len(), len])
}

kernel_params! {
    /// `gather_cols_f32`: see [`crate::ops::gather_cols`].
    struct GatherCols { src: u64, cols: u64, out: u64, src_cols: i32, out_cols: i32, n: u64, fill: f32 }
}

pub fn gather_cols(x: &Tensor, cols: &Tensor, fill: f32) -> Result<Tensor> {
    let (xs, cs) = (cuda_of("gather_cols", x)?, cuda_of("gather_cols", cols)?);
    let dev = xs.device();
    let (rows, out_cols) = (x.rows(), cols.numel());
    let out = CudaStorage::alloc(dev, DType::F32, rows * out_cols)?;
    let n = rows * out_cols;
    if n > 0 {
        let f = dev.function(ELEMENTWISE, "gather_cols_f32")?;
        GatherCols {
            src: xs.ptr(),
            cols: cs.ptr(),
            out: out.ptr(),
            src_cols: int(x.last_dim())?,
            out_cols: int(out_cols)?,
            n: n as u64,
            fill,
        }
        .launch_with(dev, &f, flat_cfg(dev, n))
        .map_err(|e| dev_err(format!("gather_cols: {e}")))?;
    }
    wrap(out, vec![rows, out_cols])
}

kernel_params! {
    /// `copy_cols_<t>`: `len` columns of `rows` rows from `src` (from column `src_off`) into
    /// `dst` (from column `dst_off`).
    struct CopyCols { src: u64, src_cols: i32, src_off: i32, dst: u64, dst_cols: i32, dst_off: i32, rows: i32, len: i32 }
}

impl CopyCols {
    fn launch(&self, dev: &CudaDevice, t: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("copy_cols_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.rows as usize * self.len as usize))
    }
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
    let launch = CopyCols {
        src: src.ptr(),
        src_cols: int(src_cols)?,
        src_off: int(src_off)?,
        dst: dst.ptr(),
        dst_cols: int(dst_cols)?,
        dst_off: int(dst_off)?,
        rows: int(rows)?,
        len: int(len)?,
    };
    launch.launch(src.device(), src.dtype())
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

/// Each part is copied as one long row into its stretch of the output's single long row.
pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
    let first = cuda_of("concat_rows", parts[0])?;
    let cols = parts[0].last_dim();
    let rows: usize = parts.iter().map(|p| p.rows()).sum();
    let out = CudaStorage::alloc(first.device(), first.dtype(), rows * cols)?;
    let mut off = 0;
    for p in parts {
        let ps = cuda_of("concat_rows", p)?;
        same_dtype("concat_rows", first, ps)?;
        if p.numel() > 0 {
            copy_cols(ps, p.numel(), 0, &out, rows * cols, off, 1, p.numel())?;
        }
        off += p.numel();
    }
    wrap(out, vec![rows, cols])
}

kernel_params! {
    /// `combine_rows_<t>`: output row `i` is the `weights`-weighted sum of the `per_row` rows of
    /// `y` listed at `rows[i * per_row..]`; one block per output row.
    struct CombineRows { y: u64, rows: u64, weights: u64, out: u64, cols: i32, per_row: i32 }
}

impl CombineRows {
    fn launch(&self, dev: &CudaDevice, t: DType, out_rows: usize) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("combine_rows_{}", dtype_suffix(t)?))?;
        self.launch_with(dev, &f, row_cfg(out_rows, self.cols as usize))
    }
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
        let launch = CombineRows {
            y: ys.ptr(),
            rows: dptr(&idx, dev),
            weights: dptr(&w, dev),
            out: out.ptr(),
            cols: int(cols)?,
            per_row: int(per_row)?,
        };
        launch.launch(dev, ys.dtype(), out_rows)?;
    }
    wrap(out, vec![out_rows, cols])
}

kernel_params! {
    /// `argmax_parts_<t>`: block (part, row) writes the best (value, index) of columns
    /// `[part * per_part, (part + 1) * per_part)` of its row.
    struct ArgmaxParts { x: u64, part_v: u64, part_i: u64, cols: i32, per_part: i32 }
}

impl ArgmaxParts {
    fn launch(&self, dev: &CudaDevice, t: DType, parts: usize, rows: usize) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("argmax_parts_{}", dtype_suffix(t)?))?;
        let cfg =
            LaunchConfig { grid_dim: (parts as u32, rows as u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        self.launch_with(dev, &f, cfg)
    }
}

kernel_params! {
    /// `argmax_merge`: one block per row over its `parts` pairs from `argmax_parts`.
    struct ArgmaxMerge { part_v: u64, part_i: u64, out: u64, parts: i32 }
}

impl ArgmaxMerge {
    fn launch(&self, dev: &CudaDevice, rows: usize) -> Result<()> {
        let f = dev.function(ELEMENTWISE, "argmax_merge")?;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        self.launch_with(dev, &f, cfg)
    }
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
    let launch = ArgmaxParts { x: xs.ptr(), part_v: pv, part_i: pi, cols: int(cols)?, per_part: int(per_part)? };
    launch.launch(dev, xs.dtype(), parts, rows)?;
    ArgmaxMerge { part_v: pv, part_i: pi, out: po, parts: int(parts)? }.launch(dev, rows)?;
    dev.stream().clone_dtoh(&out).map_err(dev_err)
}
