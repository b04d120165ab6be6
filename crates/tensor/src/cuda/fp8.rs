//! FP8 weight products on CUDA (kernels/fp8.cu): an e4m3 weight stays one byte per weight in
//! device memory, with its f32 block scales.
//!
//! A W8A8 layer (its input quantized per token or by a fixed scale, one weight scale per row)
//! multiplies on FP8 tensor cores past the GEMV's rows (below): its input rows are quantized to
//! e4m3 with one scale per row, as the layer's input quantization does, and up to
//! `FP8_MMA_MAX_ROWS` rows (small batches) go to the MMA kernels (`fp8_mma3`, `fp8_mma_gated`),
//! which read the weight bytes once for all rows. Past that, cuBLASLt's FP8 GEMM multiplies the codes unscaled into bf16 and `fp8_gemm_scale` applies
//! the two scale vectors and the bias. (cuBLASLt's own per-row scales, `OUTER_VEC_32F`, have no
//! Hopper kernel: on an H100 its heuristic offers nothing for them.)
//!
//! Up to `FP8_GEMV_MAX_ROWS` rows (decode) of any FP8 weight go to the FP8 GEMV kernels, which
//! read the bytes directly with bf16 inputs (a W8A8 layer's already quantized by the layer).
//! Larger products of other FP8 weights (block scales, weight-only layers), or a cuBLASLt that
//! refuses the GEMM, dequantize the weight to bf16 for cuBLAS, where the GEMM's compute, not the
//! weight read, is the cost.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt_result, sys as lt_sys};
use cudarc::driver::CudaSlice;

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice, PerDevice};
use super::kernels::{FP8, NORM};
use super::matmul::gemv_cfg;
use super::ops::{act_mul, activation_code, broadcast_row, cuda_of, wrap};
use super::storage::{flat_cfg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::fp8::Fp8Matrix;
use crate::tensor::Tensor;
use crate::{Activation, ActivationQuant, DType};

/// The most input rows the GEMV kernels take (instantiated for 1 to 4).
const FP8_GEMV_MAX_ROWS: usize = 4;
/// The most input rows the tensor-core kernels for W8A8 weights take (an MMA's 8 columns).
const FP8_MMA_MAX_ROWS: usize = 8;
/// Weight rows per block of those kernels.
const FP8_MMA_ROWS: usize = 16;
/// Weight loads are 16 bytes (see [`Fp8Matrix::kernel_takes`]).
const LOAD_BYTES: usize = 16;

/// An FP8 weight matrix in device memory.
#[derive(Debug)]
pub(crate) struct Fp8Buf {
    codes: CudaSlice<u8>,
    scales: CudaSlice<f32>,
    rows: usize,
    cols: usize,
    block_rows: usize,
    block_cols: usize,
    input: Option<ActivationQuant>,
}

impl Fp8Buf {
    pub(crate) fn upload(dev: &CudaDevice, m: &Fp8Matrix) -> Result<Fp8Buf> {
        if !Fp8Matrix::kernel_takes(m.rows, m.cols, m.block_cols) {
            return Err(TensorError::Unsupported {
                op: "to_device",
                detail: format!(
                    "a {}x{} FP8 weight in {}x{} blocks on CUDA (inputs a multiple of {LOAD_BYTES}, as are blocks)",
                    m.rows, m.cols, m.block_rows, m.block_cols
                ),
            });
        }
        if m.w8a8() && m.block_rows == 1 && m.block_cols >= m.cols {
            // At load, not at the first product, which may be inside a graph capture.
            lt_ready(dev)?;
        }
        let s = dev.stream();
        Ok(Fp8Buf {
            codes: s.clone_htod(&m.codes).map_err(dev_err)?,
            scales: s.clone_htod(&m.scales).map_err(dev_err)?,
            rows: m.rows,
            cols: m.cols,
            block_rows: m.block_rows,
            block_cols: m.block_cols,
            input: m.input,
        })
    }

    pub(crate) fn download(&self, dev: &CudaDevice) -> Result<Fp8Matrix> {
        let s = dev.stream();
        let codes = s.clone_dtoh(&self.codes).map_err(dev_err)?;
        let scales = s.clone_dtoh(&self.scales).map_err(dev_err)?;
        Fp8Matrix::new(self.rows, self.cols, codes, scales, [self.block_rows, self.block_cols], self.input)
            .map_err(dev_err)
    }

    pub(crate) fn size_in_bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4
    }

    pub(crate) fn codes_ptr(&self, dev: &CudaDevice) -> u64 {
        dptr(&self.codes, dev)
    }

    fn scale_cols(&self) -> usize {
        self.cols.div_ceil(self.block_cols)
    }

    /// The scale layout as the GEMV kernels take it: blocks across a row, rows per block, and
    /// 16-byte loads per block.
    fn layout(&self) -> (usize, usize, usize) {
        (self.scale_cols(), self.block_rows, self.block_cols.min(self.cols) / LOAD_BYTES)
    }

    /// A W8A8 weight with one scale per row: its products may run on FP8 tensor cores, the
    /// input quantized per row as the layer quantizes it.
    fn fp8_by_fp8(&self) -> bool {
        matches!(self.input, Some(ActivationQuant::PerToken | ActivationQuant::Static(_))) && self.per_row()
    }

    /// The fixed input scale, or 0 for a scale per token (as `fp8_quant_rows_bf16` takes it).
    fn static_input_scale(&self) -> f32 {
        match self.input {
            Some(ActivationQuant::Static(s)) => s,
            _ => 0.0,
        }
    }

    fn per_row(&self) -> bool {
        self.block_rows == 1 && self.scale_cols() == 1
    }
}

kernel_params! {
    /// `gemv3_fp8_m<M>`: up to three products of one x (q/k/v) sharing a scale layout; a product
    /// with `n = 0` is absent.
    struct Gemv3Fp8 {
        x: u64,
        k: i32,
        scale_cols: i32,
        block_rows: i32,
        block_chunks: i32,
        w0: u64,
        s0: u64,
        y0: u64,
        n0: i32,
        a0: i32,
        w1: u64,
        s1: u64,
        y1: u64,
        n1: i32,
        a1: i32,
        w2: u64,
        s2: u64,
        y2: u64,
        n2: i32,
        a2: i32,
    }
}

kernel_params! {
    /// `gemv_gated_fp8_m<M>`: `y = act(x wg^T) * (x wu^T)`.
    struct GemvGatedFp8 {
        x: u64,
        wg: u64,
        sg: u64,
        wu: u64,
        su: u64,
        y: u64,
        n: i32,
        k: i32,
        scale_cols: i32,
        block_rows: i32,
        block_chunks: i32,
        act: i32,
    }
}

kernel_params! {
    /// `fp8_mma3`: up to three W8A8 products of one quantized x on tensor cores; a product with
    /// `n = 0` is absent.
    struct Fp8Mma3 {
        qx: u64,
        sx: u64,
        m: i32,
        k: i32,
        w0: u64,
        s0: u64,
        y0: u64,
        n0: i32,
        a0: i32,
        w1: u64,
        s1: u64,
        y1: u64,
        n1: i32,
        a1: i32,
        w2: u64,
        s2: u64,
        y2: u64,
        n2: i32,
        a2: i32,
    }
}

kernel_params! {
    /// `fp8_mma_gated`: `y = act(x wg^T) * (x wu^T)` for W8A8 weights on tensor cores.
    struct Fp8MmaGated { qx: u64, sx: u64, m: i32, k: i32, wg: u64, sg: u64, wu: u64, su: u64, y: u64, n: i32, act: i32 }
}

kernel_params! {
    /// `fp8_dequant_bf16`: `w[n, k]` in bf16.
    struct Fp8Dequant { wq: u64, sc: u64, w: u64, n: i32, k: i32, scale_cols: i32, block_rows: i32, block_cols: i32 }
}

kernel_params! {
    /// `fp8_gemm_scale`: `y[i, j] = y[i, j] sx[i] sw[j] (+ bias[j])` in place.
    struct Fp8GemmScale { y: u64, sx: u64, sw: u64, bias: u64, m: i32, n: i32 }
}

kernel_params! {
    /// `fp8_quant_rows_bf16` and `fp8_quant_row_chunks_bf16`: x's rows as e4m3 bytes and a scale
    /// per row (`static_scale` where positive).
    struct Fp8QuantRows { x: u64, q: u64, scales: u64, cols: i32, static_scale: f32 }
}

fn rows_of(x: &Tensor) -> usize {
    x.shape().iter().rev().skip(1).product()
}

fn shape_of(x: &Tensor, n: usize) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    shape
}

/// A product the kernels take: `x [.., k]` in bf16 by `w [n, k]`.
fn check(x: &Tensor, xs: &CudaStorage, w: &Tensor, buf: &Fp8Buf) -> Result<()> {
    if w.shape() != [buf.rows, buf.cols] || x.last_dim() != buf.cols {
        return Err(TensorError::Shape {
            op: "matmul_t",
            detail: format!("x {:?} by an FP8 weight {:?} of {}x{}", x.shape(), w.shape(), buf.rows, buf.cols),
        });
    }
    if xs.dtype() != DType::BF16 {
        return Err(TensorError::Unsupported {
            op: "matmul_t",
            detail: format!("{} activations with an FP8 weight (bf16 only)", xs.dtype()),
        });
    }
    Ok(())
}

/// An output of `m` rows of `n`, holding the bias where there is one (the kernels add onto it).
fn output(dev: &Arc<CudaDevice>, m: usize, n: usize, bias: Option<&Tensor>) -> Result<CudaStorage> {
    let out = CudaStorage::alloc(dev, DType::BF16, m * n)?;
    if let Some(b) = bias {
        broadcast_row(cuda_of("matmul_t", b)?, &out)?;
    }
    Ok(out)
}

/// One product's arguments to a fused launch: weight, scales, output, rows, adds onto a bias.
type LaunchProduct = (u64, u64, u64, i32, i32);

/// The arguments of the three products a fused launch takes; an absent product is zeros (`n = 0`).
fn launch_products(
    dev: &Arc<CudaDevice>,
    products: &[(&Tensor, &Fp8Buf, Option<&Tensor>)],
    outs: &[CudaStorage],
) -> Result<[LaunchProduct; 3]> {
    let product = |i: usize| -> Result<LaunchProduct> {
        Ok(match products.get(i) {
            Some(&(_, buf, bias)) => {
                (buf.codes_ptr(dev), dptr(&buf.scales, dev), outs[i].ptr(), int(buf.rows)?, bias.is_some() as i32)
            }
            None => (0, 0, 0, 0, 0),
        })
    };
    Ok([product(0)?, product(1)?, product(2)?])
}

/// `x @ w^T (+ bias)` for each FP8 `w` of `products`: up to three decode-sized products of one
/// scale layout in one launch, otherwise one product each.
pub(crate) fn matmul_t_many(x: &Tensor, products: &[(&Tensor, &Fp8Buf, Option<&Tensor>)]) -> Result<Vec<Tensor>> {
    let xs = cuda_of("matmul_t", x)?;
    for &(w, buf, _) in products {
        check(x, xs, w, buf)?;
    }
    let m = rows_of(x);
    if m > 0 && products.len() <= 3 && mma_takes(xs.device(), m, products.iter().map(|p| p.1)) {
        return mma_many(x, xs, m, products);
    }
    let one_launch = products.len() <= 3 && products.iter().all(|(_, b, _)| b.layout() == products[0].1.layout());
    if m == 0 || m > FP8_GEMV_MAX_ROWS || !one_launch {
        return products.iter().map(|&(w, buf, bias)| matmul_t(x, w, buf, bias)).collect();
    }
    let dev = xs.device();
    let outs = products.iter().map(|&(_, buf, bias)| output(dev, m, buf.rows, bias)).collect::<Result<Vec<_>>>()?;
    let [(w0, s0, y0, n0, a0), (w1, s1, y1, n1, a1), (w2, s2, y2, n2, a2)] = launch_products(dev, products, &outs)?;
    let (scale_cols, block_rows, block_chunks) = products[0].1.layout();
    let launch = Gemv3Fp8 {
        x: xs.ptr(),
        k: int(x.last_dim())?,
        scale_cols: int(scale_cols)?,
        block_rows: int(block_rows)?,
        block_chunks: int(block_chunks)?,
        w0,
        s0,
        y0,
        n0,
        a0,
        w1,
        s1,
        y1,
        n1,
        a1,
        w2,
        s2,
        y2,
        n2,
        a2,
    };
    let columns: usize = products.iter().map(|(_, b, _)| b.rows).sum();
    let f = dev.function(FP8, &format!("gemv3_fp8_m{m}"))?;
    launch.launch_with(dev, &f, gemv_cfg(columns))?;
    products.iter().zip(outs).map(|(&(_, buf, _), out)| wrap(out, shape_of(x, buf.rows))).collect()
}

/// `x @ w^T (+ bias)` for an FP8 `w`.
pub(crate) fn matmul_t(x: &Tensor, w: &Tensor, buf: &Fp8Buf, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = cuda_of("matmul_t", x)?;
    check(x, xs, w, buf)?;
    let m = rows_of(x);
    let dev = xs.device();
    if m == 0 {
        return wrap(CudaStorage::alloc(dev, DType::BF16, 0)?, shape_of(x, buf.rows));
    }
    if m <= FP8_GEMV_MAX_ROWS || mma_takes(dev, m, [buf]) {
        return Ok(matmul_t_many(x, &[(w, buf, bias)])?.remove(0));
    }
    if buf.fp8_by_fp8() {
        if let Some(out) = fp8_gemm(xs, m, buf, bias)? {
            return wrap(out, shape_of(x, buf.rows));
        }
    }
    let dense = wrap(dequantize(dev, buf)?, vec![buf.rows, buf.cols])?;
    super::matmul::matmul_t(x, &dense, bias)
}

/// `act(x gate^T) * (x up^T)` for FP8 gate and up weights of one scale layout.
pub(crate) fn gated_matmul_t(
    x: &Tensor,
    (gate, g): (&Tensor, &Fp8Buf),
    (up, u): (&Tensor, &Fp8Buf),
    act: Activation,
) -> Result<Tensor> {
    let xs = cuda_of("gated_matmul_t", x)?;
    check(x, xs, gate, g)?;
    check(x, xs, up, u)?;
    let m = rows_of(x);
    if g.rows == u.rows && mma_takes(xs.device(), m, [g, u]) {
        return mma_gated(x, xs, m, g, u, act);
    }
    if m == 0 || m > FP8_GEMV_MAX_ROWS || g.layout() != u.layout() || g.rows != u.rows {
        return act_mul(&matmul_t(x, gate, g, None)?, &matmul_t(x, up, u, None)?, act);
    }
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, DType::BF16, m * g.rows)?;
    let (scale_cols, block_rows, block_chunks) = g.layout();
    let launch = GemvGatedFp8 {
        x: xs.ptr(),
        wg: g.codes_ptr(dev),
        sg: dptr(&g.scales, dev),
        wu: u.codes_ptr(dev),
        su: dptr(&u.scales, dev),
        y: out.ptr(),
        n: int(g.rows)?,
        k: int(g.cols)?,
        scale_cols: int(scale_cols)?,
        block_rows: int(block_rows)?,
        block_chunks: int(block_chunks)?,
        act: activation_code(act),
    };
    let f = dev.function(FP8, &format!("gemv_gated_fp8_m{m}"))?;
    launch.launch_with(dev, &f, gemv_cfg(g.rows))?;
    wrap(out, shape_of(x, g.rows))
}

/// Whether `m` input rows by these weights run on the FP8 tensor-core kernels: W8A8 weights with
/// one scale per row and one input quantization, more rows than the GEMV takes but few enough,
/// and a GPU with FP8 MMA. Up to 4 rows the GEMV is the faster of the two: on an H100 the
/// Llama-3.1-8B shape decoded a single stream at 4.67 ms a token through the GEMV and 5.65 ms
/// through the MMA kernels, whose input quantization is one more launch per product
/// (benches/results/cuda-fp8-h100-2026-12-07.json).
fn mma_takes<'a>(dev: &CudaDevice, m: usize, bufs: impl IntoIterator<Item = &'a Fp8Buf>) -> bool {
    let mut bufs = bufs.into_iter().peekable();
    let Some(first) = bufs.peek().map(|b| (b.input, b.cols)) else { return false };
    (FP8_GEMV_MAX_ROWS + 1..=FP8_MMA_MAX_ROWS).contains(&m)
        && dev.compute_capability() >= (8, 9)
        && bufs.all(|b| b.fp8_by_fp8() && (b.input, b.cols) == first)
}

/// x's rows as e4m3 bytes and their scales, as the weights' layer quantizes its input.
fn quantize_input(xs: &CudaStorage, m: usize, buf: &Fp8Buf) -> Result<(CudaStorage, CudaStorage)> {
    let dev = xs.device();
    let k = buf.cols;
    let q = CudaStorage::alloc(dev, DType::F32, (m * k).div_ceil(4))?;
    let sx = CudaStorage::alloc(dev, DType::F32, m)?;
    let quant = Fp8QuantRows {
        x: xs.ptr(),
        q: q.ptr(),
        scales: sx.ptr(),
        cols: int(k)?,
        static_scale: buf.static_input_scale(),
    };
    match super::norm::quant_chunks_cfg(m, k) {
        Some(cfg) => quant.launch_with(dev, &dev.function(NORM, "fp8_quant_row_chunks_bf16")?, cfg)?,
        None => quant.launch_with(dev, &dev.function(NORM, "fp8_quant_rows_bf16")?, super::storage::row_cfg(m, k))?,
    }
    Ok((q, sx))
}

fn mma_cfg(rows: usize) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Up to three products of one x by W8A8 weights in one tensor-core launch.
fn mma_many(
    x: &Tensor,
    xs: &CudaStorage,
    m: usize,
    products: &[(&Tensor, &Fp8Buf, Option<&Tensor>)],
) -> Result<Vec<Tensor>> {
    let dev = xs.device();
    let (qx, sx) = quantize_input(xs, m, products[0].1)?;
    let outs = products.iter().map(|&(_, buf, bias)| output(dev, m, buf.rows, bias)).collect::<Result<Vec<_>>>()?;
    let [(w0, s0, y0, n0, a0), (w1, s1, y1, n1, a1), (w2, s2, y2, n2, a2)] = launch_products(dev, products, &outs)?;
    let launch = Fp8Mma3 {
        qx: qx.ptr(),
        sx: sx.ptr(),
        m: int(m)?,
        k: int(x.last_dim())?,
        w0,
        s0,
        y0,
        n0,
        a0,
        w1,
        s1,
        y1,
        n1,
        a1,
        w2,
        s2,
        y2,
        n2,
        a2,
    };
    let blocks: usize = products.iter().map(|(_, b, _)| b.rows.div_ceil(FP8_MMA_ROWS)).sum();
    let f = dev.function(FP8, "fp8_mma3")?;
    launch.launch_with(dev, &f, mma_cfg(blocks))?;
    products.iter().zip(outs).map(|(&(_, buf, _), out)| wrap(out, shape_of(x, buf.rows))).collect()
}

/// `act(x gate^T) * (x up^T)` for W8A8 gate and up weights in one tensor-core launch.
fn mma_gated(x: &Tensor, xs: &CudaStorage, m: usize, g: &Fp8Buf, u: &Fp8Buf, act: Activation) -> Result<Tensor> {
    let dev = xs.device();
    let (qx, sx) = quantize_input(xs, m, g)?;
    let out = CudaStorage::alloc(dev, DType::BF16, m * g.rows)?;
    let launch = Fp8MmaGated {
        qx: qx.ptr(),
        sx: sx.ptr(),
        m: int(m)?,
        k: int(g.cols)?,
        wg: g.codes_ptr(dev),
        sg: dptr(&g.scales, dev),
        wu: u.codes_ptr(dev),
        su: dptr(&u.scales, dev),
        y: out.ptr(),
        n: int(g.rows)?,
        act: activation_code(act),
    };
    let f = dev.function(FP8, "fp8_mma_gated")?;
    launch.launch_with(dev, &f, mma_cfg(g.rows.div_ceil(FP8_MMA_ROWS)))?;
    wrap(out, shape_of(x, g.rows))
}

/// The weight as a bf16 matrix (for products the FP8 kernels do not take).
fn dequantize(dev: &Arc<CudaDevice>, buf: &Fp8Buf) -> Result<CudaStorage> {
    let (n, k) = (buf.rows, buf.cols);
    let out = CudaStorage::alloc(dev, DType::BF16, n * k)?;
    let launch = Fp8Dequant {
        wq: buf.codes_ptr(dev),
        sc: dptr(&buf.scales, dev),
        w: out.ptr(),
        n: int(n)?,
        k: int(k)?,
        scale_cols: int(buf.scale_cols())?,
        block_rows: int(buf.block_rows)?,
        block_cols: int(buf.block_cols)?,
    };
    let f = dev.function(FP8, "fp8_dequant_bf16")?;
    launch.launch_with(dev, &f, flat_cfg(dev, n * k / 4))?;
    Ok(out)
}

/// cuBLASLt's handle and workspace for a device, and the descriptors and algorithm of each GEMM
/// shape `(m, n, k)` (`None` where it has no algorithm: that shape dequantizes instead).
#[derive(Default)]
struct Lt {
    state: Option<std::result::Result<LtHandle, String>>,
    gemms: HashMap<(usize, usize, usize), Option<(GemmDesc, lt_sys::cublasLtMatmulAlgo_t)>>,
}

struct LtHandle {
    handle: lt_sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: the handle is only used behind the per-device mutex.
unsafe impl Send for Lt {}

static LT: PerDevice<Lt> = PerDevice::new();
const LT_WORKSPACE: usize = 32 << 20;

/// The FP8 GEMM `out[m, n] = (qx[m, k] sx[m]) (qw[n, k] sw[n])^T (+ bias)` in bf16, `x`
/// quantized per row on the way; `None` where cuBLASLt is missing or has no algorithm for the
/// shape.
fn fp8_gemm(xs: &CudaStorage, m: usize, buf: &Fp8Buf, bias: Option<&Tensor>) -> Result<Option<CudaStorage>> {
    let dev = xs.device();
    let (n, k) = (buf.rows, buf.cols);
    lt_ready(dev)?;
    let mut guard = LT.of(dev).lock().map_err(|_| dev_err("cuBLASLt state poisoned"))?;
    let lt = &mut *guard;
    let Some(Ok(handle)) = &lt.state else { return Ok(None) };
    let (h, workspace) = (handle.handle, dptr(&handle.workspace, dev));
    let gemm = match lt.gemms.entry((m, n, k)) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(e) => {
            let desc = GemmDesc::new(m, n, k).map_err(|e| dev_err(format!("cuBLASLt FP8 descriptors: {e:?}")))?;
            // SAFETY: the descriptors are live; the heuristic only reads them.
            let found = unsafe { desc.heuristic(h) };
            if found.is_none() {
                tracing::warn!("cuBLASLt has no FP8 GEMM for {m}x{n}x{k}; that product dequantizes to bf16");
            }
            e.insert(found.map(|algo| (desc, algo)))
        }
    };
    let Some((desc, algo)) = gemm.as_ref() else { return Ok(None) };
    let (q, sx) = quantize_input(xs, m, buf)?;
    let out = CudaStorage::alloc(dev, DType::BF16, m * n)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: every pointer addresses a live device buffer of the size the layouts give; the
    // handle, workspace and stream belong to this device.
    unsafe {
        dev.stream().context().bind_to_thread().map_err(dev_err)?;
        lt_result::matmul(
            h,
            desc.matmul,
            &alpha as *const f32 as *const _,
            &beta as *const f32 as *const _,
            buf.codes_ptr(dev) as *const _,
            desc.a,
            q.ptr() as *const _,
            desc.b,
            out.ptr() as *const _,
            desc.d,
            out.ptr() as *mut _,
            desc.d,
            algo,
            workspace as *mut _,
            LT_WORKSPACE,
            dev.stream().cu_stream() as _,
        )
        .map_err(|e| dev_err(format!("cuBLASLt FP8 GEMM {m}x{n}x{k}: {e:?}")))?;
    }
    drop(guard);
    let bias = bias.map(|b| cuda_of("matmul_t", b).map(|b| b.ptr())).transpose()?.unwrap_or(0);
    let scale = Fp8GemmScale { y: out.ptr(), sx: sx.ptr(), sw: dptr(&buf.scales, dev), bias, m: int(m)?, n: int(n)? };
    let f = dev.function(FP8, "fp8_gemm_scale")?;
    scale.launch_with(dev, &f, flat_cfg(dev, m * n))?;
    Ok(Some(out))
}

/// Opens the device's cuBLASLt handle and workspace once (or records why not: the FP8 GEMMs then
/// dequantize).
fn lt_ready(dev: &CudaDevice) -> Result<()> {
    let mut lt = LT.of(dev).lock().map_err(|_| dev_err("cuBLASLt state poisoned"))?;
    if lt.state.is_none() {
        let opened = open_lt(dev);
        if let Err(why) = &opened {
            tracing::warn!("FP8 GEMMs dequantize to bf16 instead: {why}");
        }
        lt.state = Some(opened);
    }
    Ok(())
}

fn open_lt(dev: &CudaDevice) -> std::result::Result<LtHandle, String> {
    if dev.compute_capability() < (8, 9) {
        return Err(format!(
            "FP8 tensor cores need compute capability 8.9 (this GPU is {:?})",
            dev.compute_capability()
        ));
    }
    // SAFETY: only probes whether the library loads.
    if !unsafe { lt_sys::is_culib_present() } {
        return Err("libcublasLt was not found".into());
    }
    dev.stream().context().bind_to_thread().map_err(|e| e.to_string())?;
    let handle = lt_result::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
    let workspace = dev.stream().alloc_zeros::<u8>(LT_WORKSPACE).map_err(|e| e.to_string())?;
    Ok(LtHandle { handle, workspace })
}

/// The descriptors of one FP8 GEMM: row-major `out[m, n] = x[m, k] w[n, k]^T` is column-major
/// `out^T[n, m] = w[n, k] (as k x n, transposed) x^T[k, m]`, the TN form FP8 GEMMs require.
struct GemmDesc {
    matmul: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    d: lt_sys::cublasLtMatrixLayout_t,
}

impl GemmDesc {
    fn new(m: usize, n: usize, k: usize) -> std::result::Result<GemmDesc, lt_result::CublasError> {
        use lt_sys::cudaDataType_t::{CUDA_R_16BF, CUDA_R_32F, CUDA_R_8F_E4M3};
        let matmul = lt_result::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)?;
        let desc = GemmDesc {
            matmul,
            a: lt_result::create_matrix_layout(CUDA_R_8F_E4M3, k as u64, n as u64, k as i64)?,
            b: lt_result::create_matrix_layout(CUDA_R_8F_E4M3, k as u64, m as u64, k as i64)?,
            d: lt_result::create_matrix_layout(CUDA_R_16BF, n as u64, m as u64, n as i64)?,
        };
        let set = |attr, value: &[u8]| {
            // SAFETY: `value` is the attribute's documented type, by bytes.
            unsafe { lt_result::set_matmul_desc_attribute(desc.matmul, attr, value.as_ptr() as *const _, value.len()) }
        };
        use lt_sys::cublasLtMatmulDescAttributes_t as A;
        let op_t = (cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32).to_ne_bytes();
        let op_n = (cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32).to_ne_bytes();
        set(A::CUBLASLT_MATMUL_DESC_TRANSA, &op_t)?;
        set(A::CUBLASLT_MATMUL_DESC_TRANSB, &op_n)?;
        Ok(desc)
    }

    /// cuBLASLt's first choice for these descriptors, if it has one.
    unsafe fn heuristic(&self, handle: lt_sys::cublasLtHandle_t) -> Option<lt_sys::cublasLtMatmulAlgo_t> {
        let pref = lt_result::create_matmul_pref().ok()?;
        let ws = LT_WORKSPACE.to_ne_bytes();
        let found = lt_result::set_matmul_pref_attribute(
            pref,
            lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            ws.as_ptr() as *const _,
            ws.len(),
        )
        .and_then(|()| lt_result::get_matmul_algo_heuristic(handle, self.matmul, self.a, self.b, self.d, self.d, pref));
        let _ = lt_result::destroy_matmul_pref(pref);
        found.ok().map(|h| h.algo)
    }
}

impl Drop for GemmDesc {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; cuBLASLt copies what it needs at enqueue.
        unsafe {
            let _ = lt_result::destroy_matrix_layout(self.a);
            let _ = lt_result::destroy_matrix_layout(self.b);
            let _ = lt_result::destroy_matrix_layout(self.d);
            let _ = lt_result::destroy_matmul_desc(self.matmul);
        }
    }
}
