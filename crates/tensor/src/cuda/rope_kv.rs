//! Rotary embeddings and KV-cache writes on CUDA (kernels/rope_kv.cu): the attention input of a
//! step, alone or in one launch.
//!
//! Every layer of a step writes its keys and values to the same slots, so the device copy of the
//! slot mapping is kept from one call to the next and re-uploaded only when it changes.

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::attention::{cache_ptrs, cache_suffix};
use super::device::{dev_err, dptr, int, kernel_params, CudaDevice, PerDevice};
use super::graph::{u32_slots, StepIndex};
use super::kernels::ELEMENTWISE;
use super::ops::{cuda_of, wrap};
use super::storage::{dtype_suffix, flat_cfg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::kv::{AttnMetadata, PagedKvLayer};
use crate::ops::RopeStyle;
use crate::tensor::Tensor;
use crate::DType;

struct SlotCache {
    key: Vec<usize>,
    slots: CudaSlice<u32>,
}

/// The device copy of the last slot mapping a launch used.
static SLOT_CACHE: PerDevice<Option<SlotCache>> = PerDevice::new();

fn interleaved(style: RopeStyle) -> i32 {
    matches!(style, RopeStyle::Interleaved) as i32
}

kernel_params! {
    /// `rope_<t>_<w>`: the first `2 * half` dims of each head of `x [rows, cols]` rotated.
    struct Rope { x: u64, cos: u64, sin: u64, y: u64, rows: i32, cols: i32, head_dim: i32, half: i32, interleaved: i32 }
}

impl Rope {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("rope_{}_{}", dtype_suffix(t)?, dtype_suffix(w)?))?;
        self.launch_with(dev, &f, flat_cfg(dev, self.rows as usize * self.cols as usize))
    }
}

pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize, style: RopeStyle) -> Result<Tensor> {
    let (xs, cs, ss) = (cuda_of("rope", x)?, cuda_of("rope", cos)?, cuda_of("rope", sin)?);
    let ss = ss.as_dtype(cs.dtype())?;
    let dev = xs.device();
    let (rows, cols) = (x.rows(), x.last_dim());
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if rows > 0 && cols > 0 {
        let launch = Rope {
            x: xs.ptr(),
            cos: cs.ptr(),
            sin: ss.ptr(),
            y: out.ptr(),
            rows: int(rows)?,
            cols: int(cols)?,
            head_dim: int(head_dim)?,
            half: int(cos.last_dim())?,
            interleaved: interleaved(style),
        };
        launch.launch(dev, xs.dtype(), cs.dtype())?;
    }
    wrap(out, x.shape().to_vec())
}

kernel_params! {
    /// `write_kv_<t>[_fp8]`: one block per token copies its key and value rows (`kw` and `vw`
    /// wide) into its cache slot, an FP8 cache's divided by its scales.
    struct WriteKv {
        k: u64,
        v: u64,
        slots: u64,
        k_cache: u64,
        v_cache: u64,
        kw: i32,
        vw: i32,
        k_scale: f32,
        v_scale: f32,
    }
}

impl WriteKv {
    fn launch(&self, dev: &CudaDevice, t: DType, cache: &str, tokens: usize) -> Result<()> {
        let f = dev.function(ELEMENTWISE, &format!("write_kv_{}{cache}", dtype_suffix(t)?))?;
        let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        self.launch_with(dev, &f, cfg)
    }
}

pub fn write_kv(cache: &mut PagedKvLayer, k: &Tensor, v: &Tensor, meta: &AttnMetadata) -> Result<()> {
    let (ks, vs) = (cuda_of("write_kv", k)?, cuda_of("write_kv", v)?);
    if ks.dtype() != vs.dtype() {
        return Err(TensorError::Unsupported { op: "write_kv", detail: "keys and values of different dtypes".into() });
    }
    let dev = ks.device();
    let c = cache_ptrs("write_kv", cache, ks.dtype(), dev)?;
    let [k_scale, v_scale] = write_scales(&c);
    let tokens = meta.num_tokens();
    if tokens == 0 {
        return Ok(());
    }
    let (kw, vw) = (cache.num_kv_heads * cache.k_dim, cache.num_kv_heads * cache.v_dim);
    with_slots(dev, meta, |slots| {
        let launch = WriteKv {
            k: ks.ptr(),
            v: vs.ptr(),
            slots,
            k_cache: c.k,
            v_cache: c.v,
            kw: int(kw)?,
            vw: int(vw)?,
            k_scale,
            v_scale,
        };
        launch.launch(dev, ks.dtype(), cache_suffix(c.fp8), tokens)
    })
}

kernel_params! {
    /// `rope_write_kv_<t>_<w>[_fp8]`: rotated queries into `qo`; rotated keys and the values
    /// into their cache slots (as `WriteKv` stores them).
    struct RopeWriteKv {
        q: u64,
        qo: u64,
        qcols: i32,
        k: u64,
        v: u64,
        slots: u64,
        k_cache: u64,
        v_cache: u64,
        kcols: i32,
        vcols: i32,
        cos: u64,
        sin: u64,
        rows: i32,
        head_dim: i32,
        half: i32,
        interleaved: i32,
        k_scale: f32,
        v_scale: f32,
    }
}

impl RopeWriteKv {
    fn launch(&self, dev: &CudaDevice, t: DType, w: DType, cache: &str) -> Result<()> {
        let name = format!("rope_write_kv_{}_{}{cache}", dtype_suffix(t)?, dtype_suffix(w)?);
        let f = dev.function(ELEMENTWISE, &name)?;
        let cols = self.qcols as usize + self.kcols as usize + self.vcols as usize;
        self.launch_with(dev, &f, flat_cfg(dev, self.rows as usize * cols))
    }
}

/// Rotated queries out; rotated keys and the values into their cache slots; one launch.
#[allow(clippy::too_many_arguments)]
pub fn rope_write_kv(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    head_dim: usize,
    style: RopeStyle,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
) -> Result<Tensor> {
    let op = "rope_write_kv";
    let (qs, cs, ss) = (cuda_of(op, q)?, cuda_of(op, cos)?, cuda_of(op, sin)?);
    let (ks, vs) = (cuda_of(op, k)?.as_dtype(qs.dtype())?, cuda_of(op, v)?.as_dtype(qs.dtype())?);
    let ss = ss.as_dtype(cs.dtype())?;
    let dev = qs.device();
    let c = cache_ptrs(op, cache, qs.dtype(), dev)?;
    let [k_scale, v_scale] = write_scales(&c);
    let rows = meta.num_tokens();
    let (qcols, kcols, vcols) = (q.last_dim(), k.last_dim(), v.last_dim());
    let out = CudaStorage::alloc(dev, qs.dtype(), qs.len())?;
    if rows > 0 {
        with_slots(dev, meta, |slots| {
            let launch = RopeWriteKv {
                q: qs.ptr(),
                qo: out.ptr(),
                qcols: int(qcols)?,
                k: ks.ptr(),
                v: vs.ptr(),
                slots,
                k_cache: c.k,
                v_cache: c.v,
                kcols: int(kcols)?,
                vcols: int(vcols)?,
                cos: cs.ptr(),
                sin: ss.ptr(),
                rows: int(rows)?,
                head_dim: int(head_dim)?,
                half: int(cos.last_dim())?,
                interleaved: interleaved(style),
                k_scale,
                v_scale,
            };
            launch.launch(dev, qs.dtype(), cs.dtype(), cache_suffix(c.fp8))
        })?;
    }
    wrap(out, q.shape().to_vec())
}

/// An FP8 cache's scales, which the write kernels divide by (1 for other caches, unused).
fn write_scales(c: &super::attention::CachePtrs) -> [f32; 2] {
    c.fp8.map_or([1.0, 1.0], |s| [s.k, s.v])
}

/// Runs `launch` with the device address of this step's slot mapping: the graph's input while
/// a capture runs, else a copy kept for the other layers of the step.
fn with_slots(dev: &CudaDevice, meta: &AttnMetadata, launch: impl FnOnce(u64) -> Result<()>) -> Result<()> {
    if let Some(p) = dev.step_index(&StepIndex::Slots(meta))? {
        return launch(p);
    }
    let mut slot_cache = SLOT_CACHE.of(dev).lock().map_err(|_| dev_err("slot cache poisoned"))?;
    if slot_cache.as_ref().is_none_or(|c| c.key != meta.slot_mapping) {
        let slots = dev.stream().clone_htod(&u32_slots(meta)?).map_err(dev_err)?;
        *slot_cache = Some(SlotCache { key: meta.slot_mapping.clone(), slots });
    }
    launch(dptr(&slot_cache.as_ref().expect("filled above").slots, dev))
}
