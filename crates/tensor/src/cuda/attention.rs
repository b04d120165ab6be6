//! The paged KV cache on CUDA: attention over block tables (kernels/attention_*.cu).
//!
//! Every layer of a step sees the same metadata, so the device copies of it (work items, block
//! tables) are kept from one call to the next and re-uploaded only when it changes.

use std::sync::Arc;

use cudarc::driver::{sys as drv_sys, CudaSlice, CudaStream, DeviceRepr, LaunchConfig};

use super::device::{dev_err, dptr, int, kernel_params, CudaDevice, PerDevice};
use super::graph;
use super::kernels::{self, KernelSource, ATTENTION};
use super::ops::{cuda_of, wrap};
use super::storage::{dtype_suffix, CudaStorage};
use crate::error::{Result, TensorError};
use crate::kv::{AttnMetadata, AttnSeq, Fp8KvScales, KvStorage, PagedKvLayer};
use crate::ops::AttentionParams;
use crate::tensor::Tensor;
use crate::DType;

// The kernels are compiled with these (kernels.rs passes them as defines).
/// Query vectors (rows x heads) one prefill block serves.
pub(crate) const QV_MAX: usize = 16;
/// Keys per shared-memory tile of the CUDA-core prefill kernel.
pub(crate) const TILE: usize = 32;
/// Warps of a prefill block (either kernel).
pub(crate) const NWARPS: usize = 4;
/// Query vectors per warp of the CUDA-core prefill kernel.
pub(crate) const QPW: usize = 4;
/// The prefill kernel keeps a value row in DV_REGS registers per lane.
pub(crate) const DV_REGS: usize = 8;
/// Keys a decode block scores per round (one per thread).
pub(crate) const DEC_SUB: usize = 128;
/// Warps of a decode block: DEC_SUB threads.
pub(crate) const DEC_WARPS: usize = DEC_SUB / 32;
/// Keys per tile of the tensor-core prefill kernel.
pub(crate) const MMA_TK: usize = 64;
/// Query vectors a tensor-core (FlashAttention-2-style) prefill block serves: 16 (one MMA row
/// block) per warp.
pub(crate) const FA2_QV: usize = 16 * NWARPS;
/// Key/value tiles in flight in that block: one multiplied, one loading.
pub(crate) const FA2_STAGES: usize = 2;

const MAX_V_DIM: usize = 32 * DV_REGS;
/// Fewest keys a split of a decode row's key range is given. A decode block's time is mostly its
/// chain of dependent loads (table, keys, values, partials), so at one token short splits over
/// many blocks beat a few blocks walking whole rounds of 128 keys.
const DEC_MIN_KEYS: usize = 64;
/// Most splits a decode launch merges itself (its last block per work item; more go to the
/// `attn_combine` launch). On the H200 the kernel's own merge won at 3 splits (32 sequences: +5 %
/// output throughput) and lost at 9 and 64 (8 and 1 sequences: -3 % and -1 %), where one block
/// reads every split's partials that the combine launch spreads over many.
const DEC_SELF_MERGE_MAX_SPLITS: usize = 4;
/// Most query heads per decode block (the largest HM instantiated, attention_decode.cu).
const DEC_HMAX: usize = 8;
/// Fewest keys a split of a prefill item's key range is given, so that staging q and merging pay off.
const MIN_KEYS_PER_SPLIT: usize = 64;
/// Head dims of the tensor-core prefill kernel (INST_FA2 in attention_fa2.cu).
pub(crate) const MMA_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Which kernel runs the prefill rows; the work items are cut to its block's query vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefillKernel {
    /// `paged_attn`: any dtype and head dims, and FP8 caches.
    CudaCores,
    /// `paged_attn_fa2`: bf16, equal head dims of `MMA_HEAD_DIMS`, 16-byte rows (of bf16; an FP8
    /// cache's rows of as many elements are read 8 bytes at a time).
    TensorCores,
}

impl PrefillKernel {
    fn choose(dtype: DType, fp8_cache: bool, p: &AttentionParams, k_dim: usize, v_dim: usize) -> Self {
        let rows_of_16_bytes = [p.head_dim, k_dim, v_dim].iter().all(|x| x % 8 == 0);
        if dtype != DType::BF16
            || (fp8_cache && !fp8_cache_tensor_core_prefill())
            || !rows_of_16_bytes
            || p.head_dim != p.v_head_dim
            || !MMA_HEAD_DIMS.contains(&p.head_dim)
        {
            PrefillKernel::CudaCores
        } else {
            PrefillKernel::TensorCores
        }
    }

    fn query_vectors(self) -> usize {
        match self {
            PrefillKernel::CudaCores => QV_MAX,
            PrefillKernel::TensorCores => FA2_QV,
        }
    }
}

/// `FERRITE_FP8_KV_TC_PREFILL=1`: prefill from an FP8 cache on the tensor-core kernel, which
/// stages its e4m3 tiles as bf16 but has not yet run on a GPU (the CUDA-core kernel's path has);
/// read once per process.
fn fp8_cache_tensor_core_prefill() -> bool {
    static REQUESTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REQUESTED.get_or_init(|| std::env::var("FERRITE_FP8_KV_TC_PREFILL").is_ok_and(|v| v == "1"))
}

/// Attention metadata variants kept per device: layers of one step differ only by their
/// attention parameters (sliding-window layers interleaved with global ones, say).
const META_CACHE_ENTRIES: usize = 4;

static META_CACHE: PerDevice<Vec<MetaCache>> = PerDevice::new();

/// A prefill work item as `paged_attn` and `paged_attn_fa2` read it (`AttnItem` in
/// attention_common.cuh): `nrows` rows from `row0` (at positions from `pos0`) times `nheads` query
/// heads from `h0`, over keys `[k_lo, k_hi)` of the block table at `bt_off`; `local0` numbers the
/// first row among the kernel's rows, for its partial results.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AttnItem {
    pub(crate) row0: i32,
    pub(crate) nrows: i32,
    pub(crate) pos0: i32,
    pub(crate) h0: i32,
    pub(crate) nheads: i32,
    pub(crate) bt_off: i32,
    pub(crate) k_lo: i32,
    pub(crate) k_hi: i32,
    pub(crate) local0: i32,
    /// Every row sees the keys up to here even past its own position: the last key of a
    /// bidirectional sequence (see `AttnMetadata::bidirectional`), else -1.
    pub(crate) last: i32,
}

/// A decode work item as `paged_decode` reads it (`DecodeItem` in attention_common.cuh): row
/// `row` (the kernel's row `local`) times `nheads` query heads from `h0`, over keys
/// `[k_lo, k_hi)` of the block table at `bt_off`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DecodeItem {
    pub(crate) row: i32,
    pub(crate) local: i32,
    pub(crate) h0: i32,
    pub(crate) nheads: i32,
    pub(crate) bt_off: i32,
    pub(crate) k_lo: i32,
    pub(crate) k_hi: i32,
    pub(crate) pad: i32,
}

// SAFETY: plain `int`s laid out as the kernels' structs, which the NVRTC unit test checks.
unsafe impl DeviceRepr for AttnItem {}
unsafe impl DeviceRepr for DecodeItem {}

/// Work items of one kernel, how many ways each item's key range is split, and the output row
/// of each row the kernel serves, in the order of its partials. A decode launch of 2 to
/// `DEC_SELF_MERGE_MAX_SPLITS` splits also has a counter per item of its blocks done, which the
/// last one to finish sets back to zero as it merges the item's splits.
struct Launch<I> {
    items: CudaSlice<I>,
    splits: usize,
    rows: usize,
    row_ids: CudaSlice<u32>,
    done: Option<CudaSlice<u32>>,
}

pub(crate) struct MetaCache {
    key: Vec<u32>,
    tables: CudaSlice<u32>,
    prefill: Option<Launch<AttnItem>>,
    decode: Option<Launch<DecodeItem>>,
}

/// A zeroed cache of `dtype` elements, or of e4m3 bytes for `DType::Fp8`.
pub fn new_cache(dev: &Arc<CudaDevice>, dtype: DType, k_len: usize, v_len: usize) -> Result<KvStorage> {
    if dtype == DType::Fp8 {
        let s = dev.stream();
        let k = s.alloc_zeros::<u8>(k_len.max(1)).map_err(dev_err)?;
        let v = s.alloc_zeros::<u8>(v_len.max(1)).map_err(dev_err)?;
        return Ok(KvStorage::CudaFp8 { k, v });
    }
    Ok(KvStorage::Cuda { k: CudaStorage::zeros(dev, dtype, k_len)?, v: CudaStorage::zeros(dev, dtype, v_len)? })
}

/// An FP8 cache's key and value bytes, copied to the host (to check what the kernels wrote).
pub fn download_fp8_cache(cache: &PagedKvLayer) -> Result<(Vec<u8>, Vec<u8>)> {
    let KvStorage::CudaFp8 { k, v } = &cache.storage else {
        return Err(dev_err("download_fp8_cache: not an FP8 CUDA cache"));
    };
    let s = k.stream();
    Ok((s.clone_dtoh(k).map_err(dev_err)?, s.clone_dtoh(v).map_err(dev_err)?))
}

/// A layer's cache as the kernels take it: the device addresses of its keys and values, and
/// its scales where it holds e4m3 bytes.
pub(crate) struct CachePtrs {
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) fp8: Option<Fp8KvScales>,
}

/// The kernel name suffix of a cache's element type: none for the activations' type, `_fp8` for
/// e4m3 bytes (see INST_DECODE).
pub(crate) fn cache_suffix(fp8: Option<Fp8KvScales>) -> &'static str {
    if fp8.is_some() {
        "_fp8"
    } else {
        ""
    }
}

/// The cache of a layer whose activations are `dtype`: an FP8 cache takes f32 or bf16 ones.
pub(crate) fn cache_ptrs(op: &'static str, cache: &PagedKvLayer, dtype: DType, dev: &CudaDevice) -> Result<CachePtrs> {
    match (&cache.storage, cache.fp8) {
        (KvStorage::Cuda { k, v }, None) if k.dtype() == dtype => Ok(CachePtrs { k: k.ptr(), v: v.ptr(), fp8: None }),
        (KvStorage::Cuda { k, .. }, None) => {
            Err(TensorError::Unsupported { op, detail: format!("{} activations with a {} cache", dtype, k.dtype()) })
        }
        (KvStorage::CudaFp8 { k, v }, Some(scales)) => {
            Ok(CachePtrs { k: dptr(k, dev), v: dptr(v, dev), fp8: Some(scales) })
        }
        (KvStorage::Cpu { .. }, _) => Err(dev_err(format!("{op}: CUDA activations with a CPU KV cache"))),
        _ => Err(dev_err(format!("{op}: an FP8 cache's bytes and scales disagree"))),
    }
}

/// Everything the work items depend on, in a form cheap to compare against the cached copy.
fn meta_key(meta: &AttnMetadata, p: &AttentionParams, causal: bool, prefill: PrefillKernel) -> Vec<u32> {
    let mut key = vec![
        prefill.query_vectors() as u32,
        meta.block_size as u32,
        p.num_heads as u32,
        p.num_kv_heads as u32,
        p.sliding_window.unwrap_or(0) as u32,
        p.attention_chunk.unwrap_or(0) as u32,
        causal as u32,
        meta.seqs.len() as u32,
    ];
    for (i, s) in meta.seqs.iter().enumerate() {
        key.extend([s.q_start as u32, s.q_len as u32, s.ctx_len as u32, s.block_table.len() as u32]);
        key.push(meta.is_bidirectional(i) as u32);
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

/// Builds the work items: single-token rows go to the decode kernel, multi-token chunks to the
/// prefill kernel. Without `causal` every row sees its sequence's whole context (encoders). With
/// `fixed_shape` (graph capture and replay) the block tables are laid out at their full length
/// and the split counts follow that capacity rather than the keys in use, so that every step of
/// one padded shape gets work of the same shape.
pub(crate) fn plan_meta(
    dev: &CudaDevice,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
    prefill: PrefillKernel,
    fixed_shape: bool,
) -> Result<MetaPlan> {
    let group = p.num_heads / p.num_kv_heads;
    let i = |v: usize| i32::try_from(v).map_err(|_| dev_err(format!("paged_attention: {v} beyond 32 bits")));
    // A row block's keys start where its first (earliest) row's do; the kernels mask the rest
    // of each later row's window or chunk.
    let key_range = |pos: usize, last: usize, ctx: usize| {
        let hi = if causal { last + 1 } else { ctx };
        let lo = if causal { p.first_key(pos) } else { 0 };
        (lo, hi)
    };
    let qv_max = prefill.query_vectors();
    let (pre_heads, dec_heads) = (group.min(qv_max), group.min(DEC_HMAX));
    let pre_rows = (qv_max / pre_heads).max(1);
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
    for (si, s) in meta.seqs.iter().enumerate() {
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
                    dec.push(DecodeItem {
                        row: i(s.q_start)?,
                        local: i(dec_rows_ids.len())?,
                        h0: i(h0)?,
                        nheads: i(nheads)?,
                        bt_off: i(bt_off)?,
                        k_lo: i(lo)?,
                        k_hi: i(hi)?,
                        pad: 0,
                    });
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
            let bidirectional = meta.is_bidirectional(si);
            let last = if bidirectional { s.ctx_len - 1 } else { pos0 + nrows - 1 };
            let (lo, hi) = key_range(pos0, last, s.ctx_len);
            pre_keys = pre_keys.max(capacity(s, hi - lo));
            for g in 0..p.num_kv_heads {
                for hc in (0..group).step_by(pre_heads) {
                    let h0 = g * group + hc;
                    let nheads = pre_heads.min(group - hc);
                    pre.push(AttnItem {
                        row0: i(s.q_start + r0)?,
                        nrows: i(nrows)?,
                        pos0: i(pos0)?,
                        h0: i(h0)?,
                        nheads: i(nheads)?,
                        bt_off: i(bt_off)?,
                        k_lo: i(lo)?,
                        k_hi: i(hi)?,
                        local0: i(local0 + r0)?,
                        last: if bidirectional { i(last)? } else { -1 },
                    });
                }
            }
        }
    }
    // Causal items of later rows walk more keys: launched first, they leave the short ones to
    // fill the last wave (the tensor-core kernel's items are 4 times longer than the others').
    if prefill == PrefillKernel::TensorCores {
        pre.sort_by_key(|it| std::cmp::Reverse(it.k_hi - it.k_lo));
    }
    let sms = dev.multiprocessors();
    // Decode blocks are short-lived and memory-bound: aim for four waves of them.
    let decode = launch_plan(dec, dec_rows_ids, 4 * sms, dec_keys, DEC_MIN_KEYS);
    let prefill = launch_plan(pre, pre_rows_ids, 2 * sms, pre_keys, MIN_KEYS_PER_SPLIT);
    if tables.is_empty() {
        tables.push(0);
    }
    Ok(MetaPlan { tables, prefill, decode })
}

fn launch_plan<I>(
    items: Vec<I>,
    row_ids: Vec<u32>,
    target: usize,
    max_keys: usize,
    min_keys: usize,
) -> Option<LaunchPlan<I>> {
    (!items.is_empty()).then(|| LaunchPlan {
        splits: split_count(items.len(), target, max_keys, min_keys),
        items,
        row_ids,
    })
}

/// The host side of a [`MetaCache`].
pub(crate) struct MetaPlan {
    tables: Vec<u32>,
    prefill: Option<LaunchPlan<AttnItem>>,
    decode: Option<LaunchPlan<DecodeItem>>,
}

struct LaunchPlan<I> {
    items: Vec<I>,
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
    Ok(MetaCache {
        key: Vec::new(),
        // SAFETY: every replay rewrites the whole buffer before the graph reads it.
        tables: unsafe { stream.alloc::<u32>(plan.tables.len()) }.map_err(dev_err)?,
        prefill: plan.prefill.as_ref().map(|l| alloc_launch(stream, l, false)).transpose()?,
        decode: plan
            .decode
            .as_ref()
            .map(|l| alloc_launch(stream, l, (2..=DEC_SELF_MERGE_MAX_SPLITS).contains(&l.splits)))
            .transpose()?,
    })
}

fn alloc_launch<I: DeviceRepr>(stream: &Arc<CudaStream>, l: &LaunchPlan<I>, self_merge: bool) -> Result<Launch<I>> {
    let done = self_merge.then(|| stream.alloc_zeros::<u32>(l.items.len()).map_err(dev_err)).transpose()?;
    // SAFETY (both): every replay rewrites the whole buffer before the graph reads it.
    Ok(Launch {
        items: unsafe { stream.alloc::<I>(l.items.len()) }.map_err(dev_err)?,
        splits: l.splits,
        rows: l.row_ids.len(),
        row_ids: unsafe { stream.alloc::<u32>(l.row_ids.len()) }.map_err(dev_err)?,
        done,
    })
}

/// Writes `plan` into the buffers of `cache`, which a graph captured with a plan of the same
/// shape reads.
pub(crate) fn refill_meta(stream: &Arc<CudaStream>, cache: &MetaCache, plan: &MetaPlan) -> Result<()> {
    graph::write(stream, &cache.tables, &plan.tables)?;
    refill_launch(stream, &cache.prefill, &plan.prefill)?;
    refill_launch(stream, &cache.decode, &plan.decode)
}

fn refill_launch<I: DeviceRepr>(
    stream: &Arc<CudaStream>,
    launch: &Option<Launch<I>>,
    plan: &Option<LaunchPlan<I>>,
) -> Result<()> {
    match (launch, plan) {
        (None, None) => Ok(()),
        (Some(l), Some(p)) if l.items.len() == p.items.len() && l.splits == p.splits => {
            graph::write(stream, &l.items, &p.items)?;
            graph::write(stream, &l.row_ids, &p.row_ids)
        }
        _ => Err(dev_err("graph replay: attention work of another shape than the captured step's")),
    }
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

/// `sinks`: an f32 attention-sink logit per query head (see [`crate::ops::paged_attention_sinks`]).
pub fn paged_attention(
    q: &Tensor,
    cache: &PagedKvLayer,
    meta: &AttnMetadata,
    p: &AttentionParams,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let qs = cuda_of("paged_attention", q)?;
    let sinks = sinks.map(|s| cuda_of("paged_attention", s).map(CudaStorage::ptr)).transpose()?.unwrap_or(0);
    let c = cache_ptrs("paged_attention", cache, qs.dtype(), qs.device())?;
    if cache.num_slots() > i32::MAX as usize {
        return Err(TensorError::Unsupported {
            op: "paged_attention",
            detail: format!("{} cache slots", cache.num_slots()),
        });
    }
    let kv = KvView { k: c.k, v: c.v, k_dim: cache.k_dim, v_dim: cache.v_dim, fp8: c.fp8 };
    attend("paged_attention", qs, &kv, meta, p, true, sinks)
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
    let kv = KvView { k: ks.ptr(), v: vs.ptr(), k_dim: p.head_dim, v_dim: p.v_head_dim, fp8: None };
    attend(op, qs, &kv, &meta, p, causal, 0)
}

/// Keys `[slots, kv_heads * k_dim]` and values `[slots, kv_heads * v_dim]` in device memory, in
/// the activations' dtype or, with scales, as e4m3 bytes.
struct KvView {
    k: u64,
    v: u64,
    k_dim: usize,
    v_dim: usize,
    fp8: Option<Fp8KvScales>,
}

impl KvView {
    /// Bytes of one cached element.
    fn elem(&self, activations: DType) -> usize {
        if self.fp8.is_some() {
            1
        } else {
            activations.size_in_bytes()
        }
    }
}

fn attend(
    op: &'static str,
    qs: &CudaStorage,
    kv: &KvView,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
    sinks: u64,
) -> Result<Tensor> {
    let dtype = qs.dtype();
    let dev = qs.device();
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let unsupported = |detail: String| TensorError::Unsupported { op, detail };
    if d % 2 != 0 || dv % 2 != 0 || dv > MAX_V_DIM || d > kv.k_dim || dv > kv.v_dim {
        return Err(unsupported(format!("head dims {d}/{dv} with cache dims {}/{}", kv.k_dim, kv.v_dim)));
    }
    if p.sliding_window == Some(0) || p.attention_chunk == Some(0) {
        return Err(unsupported("a sliding window or attention chunk of 0 keys".into()));
    }
    let tokens = meta.num_tokens();
    let out = CudaStorage::alloc(dev, dtype, tokens * p.num_heads * dv)?;
    if tokens == 0 {
        return wrap(out, vec![0, p.num_heads * dv]);
    }
    let prefill = PrefillKernel::choose(dtype, kv.fp8.is_some(), p, kv.k_dim, kv.v_dim);
    let run = |mc: &MetaCache| launch_attention(op, qs, kv, meta, p, causal, prefill, sinks, mc, &out);
    if dev.with_step_attention(meta, p, causal, prefill, run)?.is_none() {
        let key = meta_key(meta, p, causal, prefill);
        let mut meta_cache = META_CACHE.of(dev).lock().map_err(|_| dev_err("attention metadata cache poisoned"))?;
        let mc = match meta_cache.iter().position(|c| c.key == key) {
            Some(i) => &meta_cache[i],
            None => {
                if meta_cache.len() == META_CACHE_ENTRIES {
                    meta_cache.remove(0);
                }
                let plan = plan_meta(dev, meta, p, causal, prefill, false)?;
                meta_cache.push(upload_meta(dev.stream(), &plan, key)?);
                meta_cache.last().expect("pushed above")
            }
        };
        run(mc)?;
    }
    wrap(out, vec![tokens, p.num_heads * dv])
}

kernel_params! {
    /// `paged_attn_<t>` (attention_prefill.cu): prefill on CUDA cores, any dtype and head dims.
    struct PagedAttn {
        q: u64,
        k_cache: u64,
        v_cache: u64,
        tables: u64,
        items: u64,
        out: u64,
        part_acc: u64,
        part_ml: u64,
        hq: i32,
        hkv: i32,
        d: i32,
        dv: i32,
        k_dim: i32,
        v_dim: i32,
        block_size: i32,
        scale: f32,
        softcap: f32,
        window: i32,
        attn_chunk: i32,
        causal: i32,
        splits: i32,
        n_rows: i32,
        kpitch: i32,
        vpitch: i32,
        vec: i32,
        sinks: u64,
        vscale: f32,
    }
}

impl PagedAttn {
    /// `cache`: the cache's kernel name suffix, `elem` the bytes of one cached element.
    fn launch(
        &self,
        dev: &CudaDevice,
        op: &'static str,
        t: DType,
        cache: &str,
        elem: usize,
        n_items: usize,
    ) -> Result<()> {
        let (d, kpitch, vpitch) = (self.d as usize, self.kpitch as usize, self.vpitch as usize);
        // `paged_attn`'s layout: q_s, p_s, slot_s (4-byte words), then the key and value tiles.
        let smem = 4 * (QV_MAX * d + NWARPS * QPW * TILE + TILE) + elem * TILE * (kpitch + vpitch);
        let f = kernel(dev, Some(ATTENTION), &format!("paged_attn_{}{cache}", dtype_suffix(t)?), smem, op)?;
        self.launch_with(dev, &f, grid(n_items, self.splits, NWARPS, smem))
    }
}

kernel_params! {
    /// `paged_attn_fa2_bf16[_fp8]_d<D>` (attention_fa2.cu): bf16 prefill on tensor cores, for
    /// equal head dims of `MMA_HEAD_DIMS`, from a bf16 or an FP8 cache.
    struct PagedAttnFa2 {
        q: u64,
        k_cache: u64,
        v_cache: u64,
        tables: u64,
        items: u64,
        out: u64,
        part_acc: u64,
        part_ml: u64,
        hq: i32,
        hkv: i32,
        k_dim: i32,
        v_dim: i32,
        block_size: i32,
        scale: f32,
        softcap: f32,
        window: i32,
        attn_chunk: i32,
        causal: i32,
        splits: i32,
        n_rows: i32,
        sinks: u64,
        vscale: f32,
    }
}

impl PagedAttnFa2 {
    /// `cache`: the cache's kernel name suffix.
    fn launch(&self, dev: &CudaDevice, op: &'static str, cache: &str, n_items: usize, d: usize) -> Result<()> {
        // `paged_attn_fa2`'s layout: the queries, then each stage's key and value tiles, bf16
        // rows padded by 8 (an FP8 cache's converted as they are staged).
        let smem = 2 * (FA2_QV + FA2_STAGES * 2 * MMA_TK) * (d + 8);
        let f = kernel(dev, kernels::attention_fa2(d), &format!("paged_attn_fa2_bf16{cache}_d{d}"), smem, op)?;
        self.launch_with(dev, &f, grid(n_items, self.splits, NWARPS, smem))
    }
}

kernel_params! {
    /// `paged_decode_<t>_h<HM>_v<DVR>` (attention_decode.cu): single-token rows. A non-null
    /// `done` has the kernel merge the splits itself.
    struct PagedDecode {
        q: u64,
        k_cache: u64,
        v_cache: u64,
        tables: u64,
        items: u64,
        out: u64,
        part_acc: u64,
        part_ml: u64,
        hq: i32,
        hkv: i32,
        d: i32,
        dv: i32,
        k_dim: i32,
        v_dim: i32,
        block_size: i32,
        scale: f32,
        softcap: f32,
        splits: i32,
        n_rows: i32,
        vec: i32,
        done: u64,
        sinks: u64,
        vscale: f32,
    }
}

impl PagedDecode {
    /// `cache`: the cache's kernel name suffix.
    fn launch(&self, dev: &CudaDevice, op: &'static str, t: DType, cache: &str, n_items: usize) -> Result<()> {
        let (d, dv, splits) = (self.d as usize, self.dv as usize, self.splits as usize);
        // The instantiation for this group size and value width (INST_DECODE).
        let hm = (self.hq as usize / self.hkv as usize).min(DEC_HMAX).next_power_of_two();
        let dvr = if dv <= 128 { 4 } else { 8 };
        // `paged_decode`'s layout: q_s, s_s, m_s, l_s, corr_s, slot_s, red_s, and the merge's
        // weights w_s where the kernel merges.
        let merge_weights = if self.done != 0 { hm * splits } else { 0 };
        let smem = 4 * (hm * d + hm * DEC_SUB + 3 * hm + DEC_SUB + DEC_WARPS * hm * dv + merge_weights);
        let t = dtype_suffix(t)?;
        let name = format!("paged_decode_{t}{cache}_h{hm}_v{dvr}");
        let f = kernel(dev, kernels::attention_decode(t, cache, dvr), &name, smem, op)?;
        self.launch_with(dev, &f, grid(n_items, self.splits, DEC_WARPS, smem))
    }
}

kernel_params! {
    /// `attn_combine_<t>` (attention_combine.cu): merges the splits' partials of `n_rows` rows,
    /// partial row `i` into output row `rows[i]`.
    struct AttnCombine {
        part_acc: u64,
        part_ml: u64,
        out: u64,
        rows: u64,
        splits: i32,
        n_rows: i32,
        hq: i32,
        dv: i32,
        sinks: u64,
    }
}

impl AttnCombine {
    fn launch(&self, dev: &CudaDevice, t: DType) -> Result<()> {
        let f = dev.function(ATTENTION, &format!("attn_combine_{}", dtype_suffix(t)?))?;
        let cfg = LaunchConfig {
            grid_dim: ((self.n_rows as usize * self.hq as usize) as u32, 1, 1),
            block_dim: (128, 1, 1),
            // scale_s and live_s: a float and an int per split.
            shared_mem_bytes: (self.splits as usize * 8) as u32,
        };
        self.launch_with(dev, &f, cfg)
    }
}

#[allow(clippy::too_many_arguments)]
fn launch_attention(
    op: &'static str,
    qs: &CudaStorage,
    kv: &KvView,
    meta: &AttnMetadata,
    p: &AttentionParams,
    causal: bool,
    prefill: PrefillKernel,
    sinks: u64,
    mc: &MetaCache,
    out: &CudaStorage,
) -> Result<()> {
    let dtype = qs.dtype();
    let dev = qs.device();
    let (d, dv) = (p.head_dim, p.v_head_dim);
    let elem = kv.elem(dtype);
    let chunk = 16 / elem;
    let vec = [d, dv, kv.k_dim, kv.v_dim].iter().all(|x| x % chunk == 0) as i32;
    let (q, k_cache, v_cache, tables) = (qs.ptr(), kv.k, kv.v, dptr(&mc.tables, dev));
    let (hq, hkv, block_size) = (int(p.num_heads)?, int(p.num_kv_heads)?, int(meta.block_size)?);
    let (k_dim, v_dim) = (int(kv.k_dim)?, int(kv.v_dim)?);
    // An FP8 cache's key scale multiplies every score, so it joins the softmax scale; its value
    // scale multiplies each value as the kernel reads it.
    let fp8 = kv.fp8.unwrap_or_default();
    let (scale, softcap, vscale) = (p.scale * fp8.k, p.softcap.unwrap_or(0.0), fp8.v);
    let cache = cache_suffix(kv.fp8);

    // A launch's splits write partials, which `attn_combine` merges, except where the decode
    // kernel merges them itself (`Launch::done`).
    if let Some(l) = &mc.prefill {
        let parts = Partials::new(dev, l.splits, l.rows, p.num_heads, dv)?;
        let [part_acc, part_ml] = parts.ptrs(dev);
        let (items, out) = (dptr(&l.items, dev), out.ptr());
        let (window, causal) = (int(p.sliding_window.unwrap_or(0))?, causal as i32);
        let attn_chunk = int(p.attention_chunk.unwrap_or(0))?;
        let (splits, n_rows) = (int(l.splits)?, int(l.rows)?);
        if prefill == PrefillKernel::TensorCores {
            let launch = PagedAttnFa2 {
                q,
                k_cache,
                v_cache,
                tables,
                items,
                out,
                part_acc,
                part_ml,
                hq,
                hkv,
                k_dim,
                v_dim,
                block_size,
                scale,
                softcap,
                window,
                attn_chunk,
                causal,
                splits,
                n_rows,
                sinks,
                vscale,
            };
            launch.launch(dev, op, cache, l.items.len(), d)?;
        } else {
            let launch = PagedAttn {
                q,
                k_cache,
                v_cache,
                tables,
                items,
                out,
                part_acc,
                part_ml,
                hq,
                hkv,
                d: int(d)?,
                dv: int(dv)?,
                k_dim,
                v_dim,
                block_size,
                scale,
                softcap,
                window,
                attn_chunk,
                causal,
                splits,
                n_rows,
                kpitch: int(pitch(d, elem))?,
                vpitch: int(pitch(dv, elem))?,
                vec,
                sinks,
                vscale,
            };
            launch.launch(dev, op, dtype, cache, elem, l.items.len())?;
        }
        parts.combine(dev, out, &l.row_ids, p.num_heads, dv, dtype, sinks)?;
    }
    if let Some(l) = &mc.decode {
        let parts = Partials::new(dev, l.splits, l.rows, p.num_heads, dv)?;
        let [part_acc, part_ml] = parts.ptrs(dev);
        let launch = PagedDecode {
            q,
            k_cache,
            v_cache,
            tables,
            items: dptr(&l.items, dev),
            out: out.ptr(),
            part_acc,
            part_ml,
            hq,
            hkv,
            d: int(d)?,
            dv: int(dv)?,
            k_dim,
            v_dim,
            block_size,
            scale,
            softcap,
            splits: int(l.splits)?,
            n_rows: int(l.rows)?,
            vec,
            done: l.done.as_ref().map_or(0, |d| dptr(d, dev)),
            sinks,
            vscale,
        };
        launch.launch(dev, op, dtype, cache, l.items.len())?;
        if l.done.is_none() {
            parts.combine(dev, out.ptr(), &l.row_ids, p.num_heads, dv, dtype, sinks)?;
        }
    }
    Ok(())
}

/// An attention kernel, allowed the dynamic shared memory it needs past the default 48 KiB.
fn kernel(
    dev: &CudaDevice,
    source: Option<KernelSource>,
    name: &str,
    smem: usize,
    op: &'static str,
) -> Result<cudarc::driver::CudaFunction> {
    let source = source.ok_or_else(|| dev_err(format!("{op}: no kernel module instantiates {name}")))?;
    if smem > dev.max_shared_per_block() {
        return Err(TensorError::Unsupported {
            op,
            detail: format!("{name} would need {smem} bytes of shared memory"),
        });
    }
    let f = dev.function(source, name)?;
    if smem > 48 * 1024 {
        f.set_attribute(drv_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(dev_err)?;
    }
    Ok(f)
}

/// A block per work item and split.
fn grid(n_items: usize, splits: i32, warps: usize, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n_items as u32, splits as u32, 1),
        block_dim: (warps as u32 * 32, 1, 1),
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
    fn new(dev: &CudaDevice, splits: usize, rows: usize, heads: usize, dv: usize) -> Result<Partials> {
        let bufs = if splits > 1 {
            let per = splits * rows * heads;
            // SAFETY: every (split, row, head) partial is written by its block before the merge.
            let acc = unsafe { dev.stream().alloc::<f32>(per * dv) }.map_err(dev_err)?;
            let ml = unsafe { dev.stream().alloc::<f32>(per * 2) }.map_err(dev_err)?;
            Some((acc, ml))
        } else {
            None
        };
        Ok(Partials { bufs, splits, rows })
    }

    fn ptrs(&self, dev: &CudaDevice) -> [u64; 2] {
        match &self.bufs {
            Some((acc, ml)) => [dptr(acc, dev), dptr(ml, dev)],
            None => [0, 0],
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn combine(
        &self,
        dev: &CudaDevice,
        out: u64,
        rows: &CudaSlice<u32>,
        heads: usize,
        dv: usize,
        t: DType,
        sinks: u64,
    ) -> Result<()> {
        if self.bufs.is_none() {
            return Ok(());
        }
        let [part_acc, part_ml] = self.ptrs(dev);
        let launch = AttnCombine {
            part_acc,
            part_ml,
            out,
            rows: dptr(rows, dev),
            splits: int(self.splits)?,
            n_rows: int(self.rows)?,
            hq: int(heads)?,
            dv: int(dv)?,
            sinks,
        };
        launch.launch(dev, t)
    }
}
