//! The paged KV cache on CUDA: slot writes and attention over block tables.
//!
//! Every layer of a step sees the same metadata, so the device copies of it (slot mapping, work
//! items, block tables) are kept from one call to the next and re-uploaded only when it changes.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaSlice, DevicePtr, LaunchConfig};

use super::device::{dev_err, CudaDevice, ATTENTION, ELEMENTWISE};
use super::ops::{cuda_of, wrap};
use super::storage::{dtype_suffix, int, Arg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::kv::{AttnMetadata, KvStorage, PagedKvLayer};
use crate::ops::AttentionParams;
use crate::tensor::Tensor;
use crate::DType;

/// Query vectors (rows x heads) one attention block serves; mirrors QV_MAX in the kernel.
const QV_MAX: usize = 16;
/// Keys per shared-memory tile; mirrors TILE.
const TILE: usize = 32;
const WARPS: usize = 4;
/// Query vectors per warp; mirrors QPW.
const QPW: usize = 4;
/// The kernel keeps a value row in 8 registers per lane.
const MAX_V_DIM: usize = 8 * 32;
/// Fewest keys a split of the key range is given, so that staging q and merging pay off.
const MIN_KEYS_PER_SPLIT: usize = 64;

pub(crate) struct SlotCache {
    key: Vec<usize>,
    slots: CudaSlice<u32>,
}

pub(crate) struct MetaCache {
    key: Vec<u32>,
    items: CudaSlice<i32>,
    tables: CudaSlice<u32>,
    n_items: usize,
    splits: usize,
}

fn dptr<T>(s: &CudaSlice<T>, dev: &CudaDevice) -> Arg {
    Arg::Ptr(s.device_ptr(dev.stream()).0)
}

pub fn new_cache(dev: &Arc<CudaDevice>, dtype: DType, k_len: usize, v_len: usize) -> Result<KvStorage> {
    Ok(KvStorage::Cuda { k: CudaStorage::zeros(dev, dtype, k_len)?, v: CudaStorage::zeros(dev, dtype, v_len)? })
}

fn cache_buffers<'a>(op: &'static str, cache: &'a PagedKvLayer, dtype: DType) -> Result<(&'a CudaStorage, &'a CudaStorage)> {
    let KvStorage::Cuda { k, v } = &cache.storage else {
        return Err(dev_err(format!("{op}: CUDA activations with a CPU KV cache")));
    };
    if k.dtype() != dtype {
        return Err(TensorError::Unsupported {
            op,
            detail: format!("{} activations with a {} cache", dtype, k.dtype()),
        });
    }
    Ok((k, v))
}

pub fn write_kv(cache: &mut PagedKvLayer, k: &Tensor, v: &Tensor, meta: &AttnMetadata) -> Result<()> {
    let (ks, vs) = (cuda_of("write_kv", k)?, cuda_of("write_kv", v)?);
    if ks.dtype() != vs.dtype() {
        return Err(TensorError::Unsupported { op: "write_kv", detail: "keys and values of different dtypes".into() });
    }
    let (kc, vc) = cache_buffers("write_kv", cache, ks.dtype())?;
    let dev = ks.device();
    let tokens = meta.num_tokens();
    if tokens == 0 {
        return Ok(());
    }
    let mut slot_cache = dev.slot_meta.lock().map_err(|_| dev_err("slot cache poisoned"))?;
    if slot_cache.as_ref().is_none_or(|c| c.key != meta.slot_mapping) {
        let slots = meta
            .slot_mapping
            .iter()
            .map(|&s| u32::try_from(s).map_err(|_| dev_err(format!("write_kv: slot {s} beyond 32 bits"))))
            .collect::<Result<Vec<u32>>>()?;
        let slots = dev.stream().clone_htod(&slots).map_err(dev_err)?;
        *slot_cache = Some(SlotCache { key: meta.slot_mapping.clone(), slots });
    }
    let slots = &slot_cache.as_ref().expect("filled above").slots;
    let f = dev.function(ELEMENTWISE, &format!("write_kv_{}", dtype_suffix(ks.dtype())?))?;
    let (kw, vw) = (cache.num_kv_heads * cache.k_dim, cache.num_kv_heads * cache.v_dim);
    let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    dev.launch(&f, cfg, &[ks.ptr(), vs.ptr(), dptr(slots, dev), kc.ptr(), vc.ptr(), int(kw)?, int(vw)?])
}

/// Everything the work items depend on, in a form cheap to compare against the cached copy.
fn meta_key(meta: &AttnMetadata, p: &AttentionParams) -> Vec<u32> {
    let mut key = vec![
        meta.block_size as u32,
        p.num_heads as u32,
        p.num_kv_heads as u32,
        p.sliding_window.unwrap_or(0) as u32,
        meta.seqs.len() as u32,
    ];
    for s in &meta.seqs {
        key.extend([s.q_start as u32, s.q_len as u32, s.ctx_len as u32, s.block_table.len() as u32]);
        key.extend_from_slice(&s.block_table);
    }
    key
}

/// Splits the batch into work items (mirrors `AttnItem` in the kernel: row0, nrows, pos0, h0,
/// nheads, bt_off, k_lo, k_hi) and picks how many ways to split each item's key range.
fn build_meta(dev: &CudaDevice, meta: &AttnMetadata, p: &AttentionParams, key: Vec<u32>) -> Result<MetaCache> {
    let group = p.num_heads / p.num_kv_heads;
    let heads_per_item = group.min(QV_MAX);
    let rows_per_item = (QV_MAX / heads_per_item).max(1);
    let mut items: Vec<i32> = Vec::new();
    let mut tables: Vec<u32> = Vec::new();
    let mut max_keys = 0usize;
    let i = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("paged_attention: {v} beyond 32 bits")));
    for s in &meta.seqs {
        let bt_off = tables.len();
        tables.extend_from_slice(&s.block_table);
        for r0 in (0..s.q_len).step_by(rows_per_item) {
            let nrows = rows_per_item.min(s.q_len - r0);
            let pos0 = s.query_position(r0);
            let k_hi = pos0 + nrows;
            let k_lo = p.sliding_window.map(|w| (pos0 + 1).saturating_sub(w)).unwrap_or(0);
            max_keys = max_keys.max(k_hi - k_lo);
            for g in 0..p.num_kv_heads {
                for hc in (0..group).step_by(heads_per_item) {
                    let nheads = heads_per_item.min(group - hc);
                    let h0 = g * group + hc;
                    items.extend([i(s.q_start + r0)?, i(nrows)?, i(pos0)?, i(h0)?, i(nheads)?, i(bt_off)?, i(k_lo)?, i(k_hi)?]);
                }
            }
        }
    }
    let n_items = items.len() / 8;
    // Flash-decoding: with fewer items than two waves of blocks, split the key ranges.
    let target = 2 * dev.multiprocessors();
    let splits = if n_items == 0 || n_items >= target {
        1
    } else {
        target.div_ceil(n_items).min(max_keys.div_ceil(MIN_KEYS_PER_SPLIT)).max(1)
    };
    if tables.is_empty() {
        tables.push(0);
    }
    if items.is_empty() {
        items.extend([0; 8]);
    }
    let stream = dev.stream();
    Ok(MetaCache {
        key,
        items: stream.clone_htod(&items).map_err(dev_err)?,
        tables: stream.clone_htod(&tables).map_err(dev_err)?,
        n_items,
        splits,
    })
}

/// Row pitch (in elements) of a shared-memory tile: an odd number of 4-byte words, so that the
/// 32 lanes reading one column of 32 different keys hit 32 different banks.
fn pitch(width: usize, elem: usize) -> usize {
    let mut words = (width * elem).div_ceil(4);
    if words % 2 == 0 {
        words += 1;
    }
    words * 4 / elem
}

pub fn paged_attention(q: &Tensor, cache: &PagedKvLayer, meta: &AttnMetadata, p: &AttentionParams) -> Result<Tensor> {
    let qs = cuda_of("paged_attention", q)?;
    let dtype = qs.dtype();
    let (kc, vc) = cache_buffers("paged_attention", cache, dtype)?;
    let dev = qs.device();
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let unsupported = |detail: String| TensorError::Unsupported { op: "paged_attention", detail };
    if d % 2 != 0 || dv % 2 != 0 || dv > MAX_V_DIM || d > cache.k_dim || dv > cache.v_dim {
        return Err(unsupported(format!("head dims {d}/{dv} with cache dims {}/{}", cache.k_dim, cache.v_dim)));
    }
    if p.sliding_window == Some(0) {
        return Err(unsupported("a sliding window of 0 keys".into()));
    }
    if cache.num_slots() > i32::MAX as usize {
        return Err(unsupported(format!("{} cache slots", cache.num_slots())));
    }
    let tokens = meta.num_tokens();
    let out = CudaStorage::alloc(dev, dtype, tokens * p.num_heads * dv)?;
    if tokens == 0 {
        return wrap(out, vec![0, p.num_heads * dv]);
    }

    let elem = dtype.size_in_bytes();
    let (kpitch, vpitch) = (pitch(d, elem), pitch(dv, elem));
    let smem = 4 * (QV_MAX * d + WARPS * QPW * TILE + TILE) + elem * TILE * (kpitch + vpitch);
    if smem > dev.max_shared_per_block() {
        return Err(unsupported(format!("head dims {d}/{dv} need {smem} bytes of shared memory per block")));
    }
    let chunk = 16 / elem;
    let vec = [d, dv, cache.k_dim, cache.v_dim].iter().all(|x| x % chunk == 0) as i32;

    let key = meta_key(meta, p);
    let mut meta_cache = dev.attn_meta.lock().map_err(|_| dev_err("attention metadata cache poisoned"))?;
    if meta_cache.as_ref().is_none_or(|c| c.key != key) {
        *meta_cache = Some(build_meta(dev, meta, p, key)?);
    }
    let mc = meta_cache.as_ref().expect("filled above");
    let splits = mc.splits;

    let sfx = dtype_suffix(dtype)?;
    let f = dev.function(ATTENTION, &format!("paged_attn_{sfx}"))?;
    if smem > 48 * 1024 {
        f.set_attribute(drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(dev_err)?;
    }
    let (part_acc, part_ml) = if splits > 1 {
        let per = splits * tokens * p.num_heads;
        // SAFETY: every (split, token, head) partial is written by its block before the merge.
        let acc = unsafe { dev.stream().alloc::<f32>(per * dv) }.map_err(dev_err)?;
        let ml = unsafe { dev.stream().alloc::<f32>(per * 2) }.map_err(dev_err)?;
        (Some(acc), Some(ml))
    } else {
        (None, None)
    };
    let opt_ptr = |s: &Option<CudaSlice<f32>>| s.as_ref().map(|s| dptr(s, dev)).unwrap_or(Arg::Ptr(0));
    let cfg = LaunchConfig {
        grid_dim: (mc.n_items as u32, splits as u32, 1),
        block_dim: (WARPS as u32 * 32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    let args = [
        qs.ptr(),
        kc.ptr(),
        vc.ptr(),
        dptr(&mc.tables, dev),
        dptr(&mc.items, dev),
        out.ptr(),
        opt_ptr(&part_acc),
        opt_ptr(&part_ml),
        int(p.num_heads)?,
        int(p.num_kv_heads)?,
        int(d)?,
        int(dv)?,
        int(cache.k_dim)?,
        int(cache.v_dim)?,
        int(meta.block_size)?,
        Arg::F32(p.scale),
        Arg::F32(p.softcap.unwrap_or(0.0)),
        int(p.sliding_window.unwrap_or(0))?,
        int(splits)?,
        int(tokens)?,
        int(kpitch)?,
        int(vpitch)?,
        Arg::I32(vec),
    ];
    dev.launch(&f, cfg, &args)?;
    if splits > 1 {
        let f = dev.function(ATTENTION, &format!("attn_combine_{sfx}"))?;
        let cfg = LaunchConfig {
            grid_dim: ((tokens * p.num_heads) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            opt_ptr(&part_acc),
            opt_ptr(&part_ml),
            out.ptr(),
            int(splits)?,
            int(tokens)?,
            int(p.num_heads)?,
            int(dv)?,
        ];
        dev.launch(&f, cfg, &args)?;
    }
    wrap(out, vec![tokens, p.num_heads * dv])
}
