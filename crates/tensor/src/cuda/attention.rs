//! The paged KV cache on CUDA: slot writes and attention over block tables.
//!
//! Every layer of a step sees the same metadata, so the device copies of it (slot mapping, work
//! items, block tables) are kept from one call to the next and re-uploaded only when it changes.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaSlice, CudaStream, DevicePtr, LaunchConfig};

use super::device::{dev_err, CudaDevice, ATTENTION, ELEMENTWISE};
use super::graph::{self, u32_slots, StepIndex};
use super::ops::{cuda_of, interleaved, wrap};
use super::storage::{dtype_suffix, flat_cfg, int, Arg, CudaStorage};
use crate::error::{Result, TensorError};
use crate::kv::{AttnMetadata, AttnSeq, KvStorage, PagedKvLayer};
use crate::ops::{AttentionParams, RopeStyle};
use crate::tensor::Tensor;
use crate::DType;

/// Query vectors (rows x heads) one prefill block serves; mirrors QV_MAX in the kernel.
const QV_MAX: usize = 16;
/// Keys per shared-memory tile of the prefill kernel; mirrors TILE.
const TILE: usize = 32;
const WARPS: usize = 4;
/// Query vectors per warp; mirrors QPW.
const QPW: usize = 4;
/// The kernels keep a value row in 8 registers per lane.
const MAX_V_DIM: usize = 8 * 32;
/// Keys a decode block scores per round (one per thread); mirrors DEC_SUB.
const DEC_SUB: usize = 128;
/// Fewest keys a split of a decode row's key range is given. A decode block's time is mostly its
/// chain of dependent loads (table, keys, values, partials), so at one token short splits over
/// many blocks beat a few blocks walking whole rounds of 128 keys.
const DEC_MIN_KEYS: usize = 64;
/// Most splits a decode launch merges itself (its last block per work item; more go to the
/// `attn_combine` launch). On the H200 the kernel's own merge won at 3 splits (32 sequences: +5 %
/// output throughput) and lost at 9 and 64 (8 and 1 sequences: -3 % and -1 %), where one block
/// reads every split's partials that the combine launch spreads over many.
const DEC_SELF_MERGE_MAX_SPLITS: usize = 4;
/// Most query heads per decode block (the largest HM instantiated).
const DEC_HMAX: usize = 8;
/// Fewest keys a split of a prefill item's key range is given, so that staging q and merging pay off.
const MIN_KEYS_PER_SPLIT: usize = 64;
/// Keys per tile and head dims of the tensor-core prefill kernel (kernels::ATTENTION, INST_MMA).
const MMA_TILE: usize = 64;
const MMA_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Attention metadata variants kept per device: layers of one step differ only by their
/// attention parameters (sliding-window layers interleaved with global ones, say).
const META_CACHE_ENTRIES: usize = 4;

pub(crate) struct SlotCache {
    key: Vec<usize>,
    slots: CudaSlice<u32>,
}

/// Work items of one kernel (`AttnItem`s or `DecodeItem`s), how many ways each item's key range
/// is split, and the output row of each row the kernel serves, in the order of its partials.
/// A decode launch of 2 to `DEC_SELF_MERGE_MAX_SPLITS` splits also has a counter per item of its
/// blocks done, which the last one to finish sets back to zero as it merges the item's splits.
struct Launch {
    items: CudaSlice<i32>,
    n_items: usize,
    splits: usize,
    rows: usize,
    row_ids: CudaSlice<u32>,
    done: Option<CudaSlice<u32>>,
}

pub(crate) struct MetaCache {
    key: Vec<u32>,
    tables: CudaSlice<u32>,
    prefill: Option<Launch>,
    decode: Option<Launch>,
}

pub(crate) fn dptr<T>(s: &CudaSlice<T>, dev: &CudaDevice) -> Arg {
    Arg::Ptr(s.device_ptr(dev.stream()).0)
}

pub fn new_cache(dev: &Arc<CudaDevice>, dtype: DType, k_len: usize, v_len: usize) -> Result<KvStorage> {
    Ok(KvStorage::Cuda { k: CudaStorage::zeros(dev, dtype, k_len)?, v: CudaStorage::zeros(dev, dtype, v_len)? })
}

fn cache_buffers<'a>(
    op: &'static str,
    cache: &'a PagedKvLayer,
    dtype: DType,
) -> Result<(&'a CudaStorage, &'a CudaStorage)> {
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
    let f = dev.function(ELEMENTWISE, &format!("write_kv_{}", dtype_suffix(ks.dtype())?))?;
    let (kw, vw) = (cache.num_kv_heads * cache.k_dim, cache.num_kv_heads * cache.v_dim);
    let cfg = LaunchConfig { grid_dim: (tokens as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    with_slots(dev, meta, |slots| {
        dev.launch(&f, cfg, &[ks.ptr(), vs.ptr(), slots, kc.ptr(), vc.ptr(), int(kw)?, int(vw)?])
    })
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
    let (kc, vc) = cache_buffers(op, cache, qs.dtype())?;
    let dev = qs.device();
    let rows = meta.num_tokens();
    let (qcols, kcols, vcols) = (q.last_dim(), k.last_dim(), v.last_dim());
    let out = CudaStorage::alloc(dev, qs.dtype(), qs.len())?;
    if rows > 0 {
        let name = format!("rope_write_kv_{}_{}", dtype_suffix(qs.dtype())?, dtype_suffix(cs.dtype())?);
        let f = dev.function(ELEMENTWISE, &name)?;
        let cfg = flat_cfg(dev, rows * (qcols + kcols + vcols));
        with_slots(dev, meta, |slots| {
            let args = [
                qs.ptr(),
                out.ptr(),
                int(qcols)?,
                ks.ptr(),
                vs.ptr(),
                slots,
                kc.ptr(),
                vc.ptr(),
                int(kcols)?,
                int(vcols)?,
                cs.ptr(),
                ss.ptr(),
                int(rows)?,
                int(head_dim)?,
                int(cos.last_dim())?,
                Arg::I32(interleaved(style)),
            ];
            dev.launch(&f, cfg, &args)
        })?;
    }
    wrap(out, q.shape().to_vec())
}

/// Runs `launch` with the device address of this step's slot mapping: the graph's input while
/// a capture runs, else a copy kept for the other layers of the step.
fn with_slots(dev: &CudaDevice, meta: &AttnMetadata, launch: impl FnOnce(Arg) -> Result<()>) -> Result<()> {
    if let Some(p) = dev.step_index(&StepIndex::Slots(meta))? {
        return launch(Arg::Ptr(p));
    }
    let mut slot_cache = dev.slot_meta.lock().map_err(|_| dev_err("slot cache poisoned"))?;
    if slot_cache.as_ref().is_none_or(|c| c.key != meta.slot_mapping) {
        let slots = dev.stream().clone_htod(&u32_slots(meta)?).map_err(dev_err)?;
        *slot_cache = Some(SlotCache { key: meta.slot_mapping.clone(), slots });
    }
    launch(dptr(&slot_cache.as_ref().expect("filled above").slots, dev))
}

/// Everything the work items depend on, in a form cheap to compare against the cached copy.
fn meta_key(meta: &AttnMetadata, p: &AttentionParams, causal: bool) -> Vec<u32> {
    let mut key = vec![
        meta.block_size as u32,
        p.num_heads as u32,
        p.num_kv_heads as u32,
        p.sliding_window.unwrap_or(0) as u32,
        causal as u32,
        meta.seqs.len() as u32,
    ];
    for s in &meta.seqs {
        key.extend([s.q_start as u32, s.q_len as u32, s.ctx_len as u32, s.block_table.len() as u32]);
        key.extend_from_slice(&s.block_table);
    }
    key
}

/// How many ways to split key ranges so that `items` blocks become about `target`, giving each
/// split at least `min_keys` of the longest range.
fn split_count(items: usize, target: usize, max_keys: usize, min_keys: usize) -> usize {
    if items == 0 || items >= target {
        1
    } else {
        target.div_ceil(items).min(max_keys.div_ceil(min_keys)).max(1)
    }
}

/// Builds the work items: single-token rows go to the decode kernel (mirrors `DecodeItem`: row,
/// local, h0, nheads, bt_off, k_lo, k_hi, pad), multi-token chunks to the prefill kernel (mirrors
/// `AttnItem`: row0, nrows, pos0, h0, nheads, bt_off, k_lo, k_hi, local0). `local` numbers a
/// kernel's rows for its partial results. Without `causal` every row sees its sequence's whole
/// context (encoders). With `fixed_shape` (graph capture and replay) the block tables are laid
/// out at their full length and the split counts follow that capacity rather than the keys in
/// use, so that every step of one padded shape gets work of the same shape.
pub(crate) fn plan_meta(
    dev: &CudaDevice,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
    fixed_shape: bool,
) -> Result<MetaPlan> {
    let group = p.num_heads / p.num_kv_heads;
    let i = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("paged_attention: {v} beyond 32 bits")));
    let window = if causal { p.sliding_window } else { None };
    let key_range = |pos: usize, last: usize, ctx: usize| {
        let hi = if causal { last + 1 } else { ctx };
        let lo = window.map(|w| (pos + 1).saturating_sub(w)).unwrap_or(0);
        (lo, hi)
    };
    let (pre_heads, dec_heads) = (group.min(QV_MAX), group.min(DEC_HMAX));
    let pre_rows = (QV_MAX / pre_heads).max(1);
    let (mut pre, mut dec, mut tables) = (Vec::new(), Vec::new(), Vec::new());
    let (mut pre_rows_ids, mut dec_rows_ids) = (Vec::<u32>::new(), Vec::<u32>::new());
    let (mut pre_keys, mut dec_keys) = (0usize, 0usize);
    let capacity = |s: &AttnSeq, used: usize| {
        if fixed_shape {
            s.block_table.len() * meta.block_size
        } else {
            used
        }
    };
    for s in &meta.seqs {
        let bt_off = tables.len();
        tables.extend_from_slice(&s.block_table);
        if s.q_len == 1 {
            let pos = s.query_position(0);
            let (lo, hi) = key_range(pos, pos, s.ctx_len);
            dec_keys = dec_keys.max(capacity(s, hi - lo));
            for g in 0..p.num_kv_heads {
                for hc in (0..group).step_by(dec_heads) {
                    let h0 = g * group + hc;
                    let nheads = dec_heads.min(group - hc);
                    dec.extend([
                        i(s.q_start)?,
                        i(dec_rows_ids.len())?,
                        i(h0)?,
                        i(nheads)?,
                        i(bt_off)?,
                        i(lo)?,
                        i(hi)?,
                        0,
                    ]);
                }
            }
            dec_rows_ids.push(s.q_start as u32);
            continue;
        }
        let local0 = pre_rows_ids.len();
        pre_rows_ids.extend((s.q_start..s.q_start + s.q_len).map(|r| r as u32));
        for r0 in (0..s.q_len).step_by(pre_rows) {
            let nrows = pre_rows.min(s.q_len - r0);
            let pos0 = s.query_position(r0);
            let (lo, hi) = key_range(pos0, pos0 + nrows - 1, s.ctx_len);
            pre_keys = pre_keys.max(capacity(s, hi - lo));
            for g in 0..p.num_kv_heads {
                for hc in (0..group).step_by(pre_heads) {
                    let h0 = g * group + hc;
                    let nheads = pre_heads.min(group - hc);
                    pre.extend([
                        i(s.q_start + r0)?,
                        i(nrows)?,
                        i(pos0)?,
                        i(h0)?,
                        i(nheads)?,
                        i(bt_off)?,
                        i(lo)?,
                        i(hi)?,
                        i(local0 + r0)?,
                    ]);
                }
            }
        }
    }
    let sms = dev.multiprocessors();
    let launch = |items: Vec<i32>, ints: usize, row_ids: Vec<u32>, target: usize, max_keys: usize, min_keys: usize| {
        (!items.is_empty()).then(|| {
            let n_items = items.len() / ints;
            LaunchPlan { splits: split_count(n_items, target, max_keys, min_keys), n_items, items, row_ids }
        })
    };
    // Decode blocks are short-lived and memory-bound: aim for four waves of them.
    let decode = launch(dec, 8, dec_rows_ids, 4 * sms, dec_keys, DEC_MIN_KEYS);
    let prefill = launch(pre, 9, pre_rows_ids, 2 * sms, pre_keys, MIN_KEYS_PER_SPLIT);
    if tables.is_empty() {
        tables.push(0);
    }
    Ok(MetaPlan { tables, prefill, decode })
}

/// The host side of a [`MetaCache`].
pub(crate) struct MetaPlan {
    tables: Vec<u32>,
    prefill: Option<LaunchPlan>,
    decode: Option<LaunchPlan>,
}

struct LaunchPlan {
    items: Vec<i32>,
    n_items: usize,
    splits: usize,
    row_ids: Vec<u32>,
}

fn upload_meta(stream: &Arc<CudaStream>, plan: &MetaPlan, key: Vec<u32>) -> Result<MetaCache> {
    let cache = alloc_meta(stream, plan)?;
    refill_meta(stream, &cache, plan)?;
    Ok(MetaCache { key, ..cache })
}

/// Device buffers shaped for `plan`, left for [`refill_meta`] to fill.
pub(crate) fn alloc_meta(stream: &Arc<CudaStream>, plan: &MetaPlan) -> Result<MetaCache> {
    // SAFETY (all three): every replay rewrites the whole buffer before the graph reads it.
    let alloc_u32 = |n: usize| unsafe { stream.alloc::<u32>(n) }.map_err(dev_err);
    let launch = |l: &LaunchPlan, self_merge: bool| {
        let done = self_merge.then(|| stream.alloc_zeros::<u32>(l.n_items).map_err(dev_err)).transpose()?;
        Ok::<_, TensorError>(Launch {
            items: unsafe { stream.alloc::<i32>(l.items.len()) }.map_err(dev_err)?,
            n_items: l.n_items,
            splits: l.splits,
            rows: l.row_ids.len(),
            row_ids: alloc_u32(l.row_ids.len())?,
            done,
        })
    };
    Ok(MetaCache {
        key: Vec::new(),
        tables: alloc_u32(plan.tables.len())?,
        prefill: plan.prefill.as_ref().map(|l| launch(l, false)).transpose()?,
        decode: plan
            .decode
            .as_ref()
            .map(|l| launch(l, (2..=DEC_SELF_MERGE_MAX_SPLITS).contains(&l.splits)))
            .transpose()?,
    })
}

/// Writes `plan` into the buffers of `cache`, which a graph captured with a plan of the same
/// shape reads.
pub(crate) fn refill_meta(stream: &Arc<CudaStream>, cache: &MetaCache, plan: &MetaPlan) -> Result<()> {
    graph::write(stream, &cache.tables, &plan.tables)?;
    for (launch, plan) in [(&cache.prefill, &plan.prefill), (&cache.decode, &plan.decode)] {
        match (launch, plan) {
            (None, None) => {}
            (Some(l), Some(p)) if l.n_items == p.n_items && l.splits == p.splits => {
                graph::write(stream, &l.items, &p.items)?;
                graph::write(stream, &l.row_ids, &p.row_ids)?;
            }
            _ => return Err(dev_err("graph replay: attention work of another shape than the captured step's")),
        }
    }
    Ok(())
}

/// Row pitch (in elements) of a shared-memory tile: an odd number of 4-byte words, so that the
/// 32 lanes reading one column of 32 different keys hit 32 different banks.
fn pitch(width: usize, elem: usize) -> usize {
    let mut words = (width * elem).div_ceil(4);
    if words & 1 == 0 {
        words += 1;
    }
    words * 4 / elem
}

pub fn paged_attention(q: &Tensor, cache: &PagedKvLayer, meta: &AttnMetadata, p: &AttentionParams) -> Result<Tensor> {
    let qs = cuda_of("paged_attention", q)?;
    let (kc, vc) = cache_buffers("paged_attention", cache, qs.dtype())?;
    if cache.num_slots() > i32::MAX as usize {
        return Err(TensorError::Unsupported {
            op: "paged_attention",
            detail: format!("{} cache slots", cache.num_slots()),
        });
    }
    let kv = KvView { k: kc, v: vc, k_dim: cache.k_dim, v_dim: cache.v_dim };
    attend("paged_attention", qs, &kv, meta, p, true)
}

/// Attention within each contiguous sequence of a batch: the keys and values are read in place
/// as a cache of one-token blocks whose block table is the sequence's rows.
pub fn attention_dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttentionParams,
    seq_lens: &[usize],
    causal: bool,
) -> Result<Tensor> {
    let op = "attention_dense";
    let (qs, ks, vs) = (cuda_of(op, q)?, cuda_of(op, k)?, cuda_of(op, v)?);
    if ks.dtype() != qs.dtype() || vs.dtype() != qs.dtype() {
        return Err(TensorError::Unsupported { op, detail: "q, k and v of different dtypes".into() });
    }
    let tokens: usize = seq_lens.iter().sum();
    if tokens > i32::MAX as usize {
        return Err(TensorError::Unsupported { op, detail: format!("{tokens} tokens") });
    }
    let mut seqs = Vec::with_capacity(seq_lens.len());
    let mut start = 0;
    for &len in seq_lens {
        if len > 0 {
            let block_table = (start as u32..(start + len) as u32).collect();
            seqs.push(AttnSeq { q_start: start, q_len: len, ctx_len: len, block_table });
        }
        start += len;
    }
    let meta = AttnMetadata::new(seqs, 1)?;
    let kv = KvView { k: ks, v: vs, k_dim: p.head_dim, v_dim: p.v_head_dim };
    attend(op, qs, &kv, &meta, p, causal)
}

/// Keys `[slots, kv_heads * k_dim]` and values `[slots, kv_heads * v_dim]` in device memory.
struct KvView<'a> {
    k: &'a CudaStorage,
    v: &'a CudaStorage,
    k_dim: usize,
    v_dim: usize,
}

fn attend(
    op: &'static str,
    qs: &CudaStorage,
    kv: &KvView<'_>,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
) -> Result<Tensor> {
    let dtype = qs.dtype();
    let dev = qs.device();
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let unsupported = |detail: String| TensorError::Unsupported { op, detail };
    if d % 2 != 0 || dv % 2 != 0 || dv > MAX_V_DIM || d > kv.k_dim || dv > kv.v_dim {
        return Err(unsupported(format!("head dims {d}/{dv} with cache dims {}/{}", kv.k_dim, kv.v_dim)));
    }
    if p.sliding_window == Some(0) {
        return Err(unsupported("a sliding window of 0 keys".into()));
    }
    let tokens = meta.num_tokens();
    let out = CudaStorage::alloc(dev, dtype, tokens * p.num_heads * dv)?;
    if tokens == 0 {
        return wrap(out, vec![0, p.num_heads * dv]);
    }
    let run = |mc: &MetaCache| launch_attention(op, qs, kv, meta, p, causal, mc, &out);
    if dev.with_step_attention(meta, p, causal, run)?.is_none() {
        let key = meta_key(meta, p, causal);
        let mut meta_cache = dev.attn_meta.lock().map_err(|_| dev_err("attention metadata cache poisoned"))?;
        let mc = match meta_cache.iter().position(|c| c.key == key) {
            Some(i) => &meta_cache[i],
            None => {
                if meta_cache.len() == META_CACHE_ENTRIES {
                    meta_cache.remove(0);
                }
                let plan = plan_meta(dev, meta, p, causal, false)?;
                meta_cache.push(upload_meta(dev.stream(), &plan, key)?);
                meta_cache.last().expect("pushed above")
            }
        };
        run(mc)?;
    }
    wrap(out, vec![tokens, p.num_heads * dv])
}

#[allow(clippy::too_many_arguments)]
fn launch_attention(
    op: &'static str,
    qs: &CudaStorage,
    kv: &KvView<'_>,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
    mc: &MetaCache,
    out: &CudaStorage,
) -> Result<()> {
    let dtype = qs.dtype();
    let dev = qs.device();
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let elem = dtype.size_in_bytes();
    let chunk = 16 / elem;
    let vec = [d, dv, kv.k_dim, kv.v_dim].iter().all(|x| x % chunk == 0) as i32;
    let sfx = dtype_suffix(dtype)?;
    let common = || -> Result<[Arg; 7]> {
        Ok([
            int(p.num_heads)?,
            int(p.num_kv_heads)?,
            int(d)?,
            int(dv)?,
            int(kv.k_dim)?,
            int(kv.v_dim)?,
            int(meta.block_size)?,
        ])
    };

    // Every attention kernel takes q, the caches, the block tables, its work items, the output and
    // the split partials first; `tail` is the rest of its parameters, in the kernel's order. The
    // decode kernel merges a few splits itself (`Launch::done`); other merges are a launch.
    let run = |l: &Launch, name: String, smem: usize, tail: Vec<Arg>| -> Result<()> {
        let f = kernel(dev, &name, smem, op)?;
        let parts = Partials::new(dev, l, p.num_heads, dv)?;
        let mut args = vec![qs.ptr(), kv.k.ptr(), kv.v.ptr(), dptr(&mc.tables, dev), dptr(&l.items, dev), out.ptr()];
        args.extend(parts.ptrs(dev));
        args.extend(tail);
        dev.launch(&f, grid(l, smem), &args)?;
        match l.done {
            Some(_) => Ok(()),
            None => parts.combine(dev, out, &l.row_ids, p.num_heads, dv, sfx),
        }
    };

    if let Some(l) = &mc.prefill {
        let masking = [
            Arg::F32(p.scale),
            Arg::F32(p.softcap.unwrap_or(0.0)),
            int(p.sliding_window.unwrap_or(0))?,
            Arg::I32(causal as i32),
            int(l.splits)?,
            int(l.rows)?,
        ];
        if dtype == DType::BF16 && vec == 1 && d == dv && MMA_HEAD_DIMS.contains(&d) {
            // Tensor cores (kernels::ATTENTION, INST_MMA): smem mirrors `paged_attn_mma`'s layout.
            let smem = 2 * MMA_TILE * (2 * d + 16) + 4 * MMA_TILE + 4 * (WARPS * 16 + 16 + 16 * dv);
            let mut tail =
                vec![int(p.num_heads)?, int(p.num_kv_heads)?, int(kv.k_dim)?, int(kv.v_dim)?, int(meta.block_size)?];
            tail.extend(masking);
            run(l, format!("paged_attn_mma_bf16_d{d}_v{dv}"), smem, tail)?;
        } else {
            let (kpitch, vpitch) = (pitch(d, elem), pitch(dv, elem));
            let smem = 4 * (QV_MAX * d + WARPS * QPW * TILE + TILE) + elem * TILE * (kpitch + vpitch);
            let mut tail = common()?.to_vec();
            tail.extend(masking);
            tail.extend([int(kpitch)?, int(vpitch)?, Arg::I32(vec)]);
            run(l, format!("paged_attn_{sfx}"), smem, tail)?;
        }
    }
    if let Some(l) = &mc.decode {
        // The instantiation for this group size and value width (kernels::ATTENTION, INST_DECODE).
        let hm = (p.num_heads / p.num_kv_heads).min(DEC_HMAX).next_power_of_two();
        let dvr = if dv <= 128 { 4 } else { 8 };
        let merge_weights = if l.done.is_some() { hm * l.splits } else { 0 };
        let smem = 4 * (hm * d + hm * DEC_SUB + 3 * hm + DEC_SUB + WARPS * hm * dv + merge_weights);
        let mut tail = common()?.to_vec();
        tail.extend([
            Arg::F32(p.scale),
            Arg::F32(p.softcap.unwrap_or(0.0)),
            int(l.splits)?,
            int(l.rows)?,
            Arg::I32(vec),
            l.done.as_ref().map_or(Arg::Ptr(0), |d| dptr(d, dev)),
        ]);
        run(l, format!("paged_decode_{sfx}_h{hm}_v{dvr}"), smem, tail)?;
    }
    Ok(())
}

/// An attention kernel, allowed the dynamic shared memory it needs past the default 48 KiB.
fn kernel(dev: &CudaDevice, name: &str, smem: usize, op: &'static str) -> Result<cudarc::driver::CudaFunction> {
    if smem > dev.max_shared_per_block() {
        return Err(TensorError::Unsupported {
            op,
            detail: format!("{name} would need {smem} bytes of shared memory"),
        });
    }
    let f = dev.function(ATTENTION, name)?;
    if smem > 48 * 1024 {
        f.set_attribute(drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(dev_err)?;
    }
    Ok(f)
}

fn grid(l: &Launch, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (l.n_items as u32, l.splits as u32, 1),
        block_dim: (WARPS as u32 * 32, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

/// The partial results of a launch whose key ranges are split (none when they are not).
struct Partials {
    bufs: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    splits: usize,
    rows: usize,
}

impl Partials {
    fn new(dev: &CudaDevice, l: &Launch, heads: usize, dv: usize) -> Result<Partials> {
        let bufs = if l.splits > 1 {
            let per = l.splits * l.rows * heads;
            // SAFETY: every (split, row, head) partial is written by its block before the merge.
            let acc = unsafe { dev.stream().alloc::<f32>(per * dv) }.map_err(dev_err)?;
            let ml = unsafe { dev.stream().alloc::<f32>(per * 2) }.map_err(dev_err)?;
            Some((acc, ml))
        } else {
            None
        };
        Ok(Partials { bufs, splits: l.splits, rows: l.rows })
    }

    fn ptrs(&self, dev: &CudaDevice) -> [Arg; 2] {
        match &self.bufs {
            Some((acc, ml)) => [dptr(acc, dev), dptr(ml, dev)],
            None => [Arg::Ptr(0), Arg::Ptr(0)],
        }
    }

    fn combine(
        &self,
        dev: &CudaDevice,
        out: &CudaStorage,
        rows: &CudaSlice<u32>,
        heads: usize,
        dv: usize,
        sfx: &str,
    ) -> Result<()> {
        if self.bufs.is_none() {
            return Ok(());
        }
        let f = dev.function(ATTENTION, &format!("attn_combine_{sfx}"))?;
        let cfg = LaunchConfig {
            grid_dim: ((self.rows * heads) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: (self.splits * 8) as u32,
        };
        let [acc, ml] = self.ptrs(dev);
        let rows = dptr(rows, dev);
        dev.launch(&f, cfg, &[acc, ml, out.ptr(), rows, int(self.splits)?, int(self.rows)?, int(heads)?, int(dv)?])
    }
}
