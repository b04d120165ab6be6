//! `x @ w^T (+ bias)` on CUDA through cuBLAS: f32 accumulation in both dtypes, and plain fp32
//! (no TF32) for f32 activations.
//!
//! bf16 products of up to `GEMV_MAX_ROWS` rows (decode) go to the GEMV kernel instead
//! (kernels/gemv.cu): profiled inside a Llama-3.1-8B decode step on the H200, cuBLAS's kernels for
//! those shapes (split-K plus a reduction kernel each) streamed the weights at about 70 % of the
//! copy bandwidth.

use cudarc::cublas::{result as blas_result, sys as blas_sys};

use super::device::{dev_err, int, kernel_params, CudaDevice};
use super::kernels::GEMV;
use super::ops::{act_mul, activation_code, broadcast_row, cuda_of, wrap};
use super::storage::{Converted, CudaStorage};
use crate::error::Result;
use crate::tensor::Tensor;
use crate::{Activation, DType};

/// The most rows `matmul_t` hands to the GEMV kernel (instantiated for 1 to 4).
const GEMV_MAX_ROWS: usize = 4;

/// The output of `x @ w^T (+ bias)`, shaped, with the bias (if any) already in it for the product
/// to accumulate onto (beta = 1 in cuBLAS, `accumulate` in the GEMV): one rounding in bf16.
struct Product<'a> {
    w: Converted<'a>,
    out: CudaStorage,
    shape: Vec<usize>,
    has_bias: bool,
    n: usize,
    x: &'a CudaStorage,
}

impl<'a> Product<'a> {
    fn new(xs: &'a CudaStorage, x: &Tensor, w: &'a Tensor, bias: Option<&Tensor>) -> Result<Product<'a>> {
        let dtype = xs.dtype();
        let dev = xs.device();
        // Mixed dtypes (f32 activations over bf16 weights, say) widen or round the weight per
        // call: correct, but a model that wants speed loads its weights in the activation dtype.
        let ws = cuda_of("matmul_t", w)?.as_dtype(dtype)?;
        let (n, k) = (w.shape()[0], w.shape()[1]);
        let m = rows_of(x);
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank >= 1") = n;
        let out = match bias {
            _ if m * n == 0 => CudaStorage::alloc(dev, dtype, 0)?,
            Some(b) => {
                let out = CudaStorage::alloc(dev, dtype, m * n)?;
                broadcast_row(cuda_of("matmul_t", b)?, &out)?;
                out
            }
            None if k == 0 => CudaStorage::zeros(dev, dtype, m * n)?,
            None => CudaStorage::alloc(dev, dtype, m * n)?,
        };
        Ok(Product { w: ws, out, shape, has_bias: bias.is_some(), n, x: xs })
    }

    fn run_cublas(&self, m: usize, k: usize) -> Result<()> {
        if m * self.n == 0 || k == 0 {
            return Ok(());
        }
        let beta = if self.has_bias { 1.0 } else { 0.0 };
        gemm(&self.out, self.w.ptr(), self.x.ptr(), self.out.ptr(), m, self.n, k, beta)
    }

    fn finish(self) -> Result<Tensor> {
        wrap(self.out, self.shape)
    }
}

/// The packed matrix of a 4-bit CUDA weight.
fn int4_of(w: &Tensor) -> Option<&super::int4::Int4Buf> {
    w.cuda().and_then(CudaStorage::int4)
}

/// The e4m3 matrix of an FP8 CUDA weight.
fn fp8_of(w: &Tensor) -> Option<&super::fp8::Fp8Buf> {
    w.cuda().and_then(CudaStorage::fp8)
}

/// Whether `w` is a weight the products read in its own packed form.
fn packed(w: &Tensor) -> bool {
    int4_of(w).is_some() || fp8_of(w).is_some()
}

/// Not x.rows(), which is 0 when k is: the output still has a row per input row.
fn rows_of(x: &Tensor) -> usize {
    x.shape().iter().rev().skip(1).product()
}

/// Whether the GEMV kernels take an `m x k` product of `dtype`.
fn gemv_fits(dtype: DType, m: usize, k: usize) -> bool {
    dtype == DType::BF16 && (1..=GEMV_MAX_ROWS).contains(&m) && k > 0 && k.is_multiple_of(8)
}

/// One warp per output column over `columns` columns in all (the bf16 and FP8 GEMVs).
pub(crate) fn gemv_cfg(columns: usize) -> cudarc::driver::LaunchConfig {
    let warps_per_block = 8;
    cudarc::driver::LaunchConfig {
        grid_dim: (columns.div_ceil(warps_per_block) as u32, 1, 1),
        block_dim: (32 * warps_per_block as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

kernel_params! {
    /// `gemv_bf16_m<M>`: `y[m, n] (+)= x[m, k] w[n, k]^T`, adding onto `y` where `accumulate`.
    struct Gemv { x: u64, w: u64, y: u64, n: i32, k: i32, accumulate: i32 }
}

impl Gemv {
    fn launch(&self, dev: &CudaDevice, m: usize) -> Result<()> {
        let f = dev.function(GEMV, &format!("gemv_bf16_m{m}"))?;
        self.launch_with(dev, &f, gemv_cfg(self.n as usize))
    }
}

kernel_params! {
    /// `gemv3_bf16_m<M>`: up to three products of one `x`, each as in [`Gemv`]; a product with
    /// `n = 0` (and null pointers) is absent.
    struct Gemv3 {
        x: u64,
        k: i32,
        w0: u64,
        y0: u64,
        n0: i32,
        a0: i32,
        w1: u64,
        y1: u64,
        n1: i32,
        a1: i32,
        w2: u64,
        y2: u64,
        n2: i32,
        a2: i32,
    }
}

impl Gemv3 {
    fn launch(&self, dev: &CudaDevice, m: usize) -> Result<()> {
        let f = dev.function(GEMV, &format!("gemv3_bf16_m{m}"))?;
        self.launch_with(dev, &f, gemv_cfg(self.n0 as usize + self.n1 as usize + self.n2 as usize))
    }
}

kernel_params! {
    /// `gemv_gated_bf16_m<M>`: `y = act(x wg^T) * (x wu^T)`, `act` an activation code.
    struct GemvGated { x: u64, wg: u64, wu: u64, y: u64, n: i32, k: i32, act: i32 }
}

impl GemvGated {
    fn launch(&self, dev: &CudaDevice, m: usize) -> Result<()> {
        let f = dev.function(GEMV, &format!("gemv_gated_bf16_m{m}"))?;
        self.launch_with(dev, &f, gemv_cfg(self.n as usize))
    }
}

pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let xs = cuda_of("matmul_t", x)?;
    if let Some(packed) = int4_of(w) {
        return super::int4::matmul_t(x, w, packed, bias);
    }
    if let Some(codes) = fp8_of(w) {
        return super::fp8::matmul_t(x, w, codes, bias);
    }
    let p = Product::new(xs, x, w, bias)?;
    let (m, k) = (rows_of(x), w.shape()[1]);
    if gemv_fits(xs.dtype(), m, k) && p.n > 0 {
        let launch =
            Gemv { x: xs.ptr(), w: p.w.ptr(), y: p.out.ptr(), n: int(p.n)?, k: int(k)?, accumulate: p.has_bias as i32 };
        launch.launch(xs.device(), m)?;
    } else {
        p.run_cublas(m, k)?;
    }
    p.finish()
}

/// Up to three GEMV products of one input in one launch (`gemv3`); otherwise one product each.
pub fn matmul_t_many(x: &Tensor, weights: &[(&Tensor, Option<&Tensor>)]) -> Result<Vec<Tensor>> {
    let xs = cuda_of("matmul_t_many", x)?;
    if let Some(packed) = weights.iter().map(|&(w, b)| Some((w, int4_of(w)?, b))).collect::<Option<Vec<_>>>() {
        return super::int4::matmul_t_many(x, &packed);
    }
    if let Some(codes) = weights.iter().map(|&(w, b)| Some((w, fp8_of(w)?, b))).collect::<Option<Vec<_>>>() {
        return super::fp8::matmul_t_many(x, &codes);
    }
    if weights.iter().any(|(w, _)| packed(w)) {
        return weights.iter().map(|&(w, b)| matmul_t(x, w, b)).collect();
    }
    let (m, k) = (rows_of(x), x.last_dim());
    let products = weights.iter().map(|&(w, b)| Product::new(xs, x, w, b)).collect::<Result<Vec<_>>>()?;
    if gemv_fits(xs.dtype(), m, k) && (1..=3).contains(&products.len()) {
        let k = int(k)?;
        let product = |i: usize| match products.get(i) {
            Some(p) => Ok::<_, crate::error::TensorError>((p.w.ptr(), p.out.ptr(), int(p.n)?, p.has_bias as i32)),
            None => Ok((0, 0, 0, 0)),
        };
        let ((w0, y0, n0, a0), (w1, y1, n1, a1), (w2, y2, n2, a2)) = (product(0)?, product(1)?, product(2)?);
        let columns: usize = products.iter().map(|p| p.n).sum();
        if columns > 0 {
            let launch = Gemv3 { x: xs.ptr(), k, w0, y0, n0, a0, w1, y1, n1, a1, w2, y2, n2, a2 };
            launch.launch(xs.device(), m)?;
        }
    } else {
        for p in &products {
            p.run_cublas(m, k)?;
        }
    }
    products.into_iter().map(Product::finish).collect()
}

/// `act(x gate^T) * (x up^T)`: one GEMV launch for decode-sized bf16 inputs, else two products
/// and `act_mul`.
pub fn gated_matmul_t(x: &Tensor, gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    let xs = cuda_of("gated_matmul_t", x)?;
    let (m, k, n) = (rows_of(x), x.last_dim(), gate.shape()[0]);
    let dtype = xs.dtype();
    if let (Some(g), Some(u)) = (int4_of(gate), int4_of(up)) {
        let products = super::int4::matmul_t_many(x, &[(gate, g, None), (up, u, None)])?;
        return act_mul(&products[0], &products[1], act);
    }
    if let (Some(g), Some(u)) = (fp8_of(gate), fp8_of(up)) {
        return super::fp8::gated_matmul_t(x, (gate, g), (up, u), act);
    }
    if !gemv_fits(dtype, m, k) || n == 0 || packed(gate) || packed(up) {
        return act_mul(&matmul_t(x, gate, None)?, &matmul_t(x, up, None)?, act);
    }
    let (gs, us) = (cuda_of("gated_matmul_t", gate)?.as_dtype(dtype)?, cuda_of("gated_matmul_t", up)?.as_dtype(dtype)?);
    let out = CudaStorage::alloc(xs.device(), dtype, m * n)?;
    let launch = GemvGated {
        x: xs.ptr(),
        wg: gs.ptr(),
        wu: us.ptr(),
        y: out.ptr(),
        n: int(n)?,
        k: int(k)?,
        act: activation_code(act),
    };
    launch.launch(xs.device(), m)?;
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    wrap(out, shape)
}

/// Grouped `x @ w[e]^T`: one cuBLAS GEMM per expert that has rows.
pub fn grouped_matmul_t(x: &Tensor, w: &Tensor, offsets: &[usize]) -> Result<Tensor> {
    let xs = cuda_of("grouped_matmul_t", x)?;
    let dtype = xs.dtype();
    let dev = xs.device();
    let ws = cuda_of("grouped_matmul_t", w)?.as_dtype(dtype)?;
    let (n, k) = (w.shape()[1], w.shape()[2]);
    let rows: usize = x.shape().iter().rev().skip(1).product();
    let out =
        if k == 0 { CudaStorage::zeros(dev, dtype, rows * n)? } else { CudaStorage::alloc(dev, dtype, rows * n)? };
    if n > 0 && k > 0 {
        let elem = dtype.size_in_bytes() as u64;
        // (rows of the group, weight, input, output) of each expert that has rows.
        let groups: Vec<(usize, u64, u64, u64)> = offsets
            .windows(2)
            .enumerate()
            .filter(|(_, pair)| pair[1] > pair[0])
            .map(|(e, pair)| {
                let r0 = pair[0];
                (
                    pair[1] - r0,
                    ws.ptr() + (e * n * k) as u64 * elem,
                    xs.ptr() + (r0 * k) as u64 * elem,
                    out.ptr() + (r0 * n) as u64 * elem,
                )
            })
            .collect();
        match groups.as_slice() {
            [] => {}
            [(m, wp, xp, op)] => gemm(&out, *wp, *xp, *op, *m, n, k, 0.0)?,
            _ => grouped_gemm(&out, &groups, n, k)?,
        }
    }
    wrap(out, vec![rows, n])
}

/// Every expert's `out_e = x_e w_e^T` in one cuBLAS call (`cublasGemmGroupedBatchedEx`, one group
/// of one problem per expert), instead of a host loop of GEMMs.
fn grouped_gemm(like: &CudaStorage, groups: &[(usize, u64, u64, u64)], n: usize, k: usize) -> Result<()> {
    let dev = like.device();
    let ty = match like.dtype() {
        DType::BF16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
        _ => blas_sys::cudaDataType_t::CUDA_R_32F,
    };
    let dim = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("matmul dimension {v} exceeds cuBLAS's int")));
    let count = groups.len();
    let (ni, ki, count_i) = (dim(n)?, dim(k)?, dim(count)?);
    let ms = groups.iter().map(|g| dim(g.0)).collect::<Result<Vec<i32>>>()?;
    let transa = vec![blas_sys::cublasOperation_t::CUBLAS_OP_T; count];
    let transb = vec![blas_sys::cublasOperation_t::CUBLAS_OP_N; count];
    let (n_arr, k_arr, ones) = (vec![ni; count], vec![ki; count], vec![1i32; count]);
    let (alpha, beta) = (vec![1.0f32; count], vec![0.0f32; count]);
    // The operand pointer arrays must live in device memory: weights, inputs, outputs, in turn.
    let pointers: Vec<u64> =
        groups.iter().map(|g| g.1).chain(groups.iter().map(|g| g.2)).chain(groups.iter().map(|g| g.3)).collect();
    dev.check_not_capturing("a grouped GEMM's pointer table")?;
    let table = dev.stream().clone_htod(&pointers).map_err(dev_err)?;
    let base = {
        use cudarc::driver::DevicePtr;
        table.device_ptr(dev.stream()).0
    };
    let (a, b, c) = (base, base + 8 * count as u64, base + 16 * count as u64);
    let status = dev.with_blas(|handle| unsafe {
        // SAFETY: every host array has `count` entries; the device pointer table holds 3 *
        // `count` pointers into live buffers sized by the dimensions; the handle is bound to the
        // device's stream, and the table is freed stream-ordered after the call.
        blas_sys::cublasGemmGroupedBatchedEx(
            handle,
            transa.as_ptr(),
            transb.as_ptr(),
            n_arr.as_ptr(),
            ms.as_ptr(),
            k_arr.as_ptr(),
            alpha.as_ptr() as *const _,
            a as *const *const _,
            ty,
            k_arr.as_ptr(),
            b as *const *const _,
            ty,
            k_arr.as_ptr(),
            beta.as_ptr() as *const _,
            c as *const *mut _,
            ty,
            n_arr.as_ptr(),
            count_i,
            ones.as_ptr(),
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    })?;
    status.result().map_err(|e| dev_err(format!("cuBLAS grouped gemm of {count} experts ({n}x{k}): {e:?}")))
}

/// Row-major `out[m, n] (+)= x[m, k] w[n, k]^T` on raw device pointers of `like`'s dtype.
#[allow(clippy::too_many_arguments)]
fn gemm(like: &CudaStorage, wp: u64, xp: u64, op: u64, m: usize, n: usize, k: usize, beta: f32) -> Result<()> {
    let alpha: f32 = 1.0;
    let ty = match like.dtype() {
        DType::BF16 => blas_sys::cudaDataType_t::CUDA_R_16BF,
        _ => blas_sys::cudaDataType_t::CUDA_R_32F,
    };
    let dim = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("matmul dimension {v} exceeds cuBLAS's int")));
    let (mi, ni, ki) = (dim(m)?, dim(n)?, dim(k)?);
    // Row-major out[m, n] = x[m, k] w[n, k]^T is column-major out^T[n, m] = (w^T)^T[n, k] x^T[k, m].
    like.device()
        .with_blas(|handle| unsafe {
            // SAFETY: the pointers address live device buffers of at least the sizes implied by
            // the dimensions and leading dimensions; the handle is bound to the device's stream.
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
