//! Launchers of `recurrent.cu`: the causal conv1d and the gated delta rule of hybrid models.
//! Both walk each sequence's tokens in order (the delta rule one token at a time, not yet the
//! chunked tensor-core form), reading and writing the sequences' f32 state slots.

use cudarc::driver::LaunchConfig;

use super::device::{dev_err, int, kernel_params, CudaDevice, PerDevice};
use super::graph::StepIndex;
use super::kernels::RECURRENT;
use super::ops::{activation_code, cuda_of, same_dtype, wrap};
use super::storage::{dtype_suffix, CudaStorage};
use crate::error::Result;
use crate::kv::{AttnMetadata, KvStorage, PagedKvLayer};
use crate::ops::{Activation, GdnParams, SelectiveScanParams};
use crate::tensor::Tensor;
use crate::DType;

/// Longest conv kernel the window registers hold.
pub(crate) const CONV_KERNEL_MAX: usize = 8;
/// Largest key head dimension a delta-rule thread holds a state column of.
pub(crate) const GDN_DK_MAX: usize = 256;
/// Largest Mamba2 state size a scan thread holds a state row of.
pub(crate) const SSM_STATE_MAX: usize = 256;

kernel_params! {
    /// `causal_conv1d_<t>`: grid (channel blocks, sequences).
    struct Conv1d { x: u64, w: u64, bias: u64, y: u64, state: u64, seqs: u64, channels: i32, kernel: i32, act: i32 }
}

kernel_params! {
    /// `gated_delta_rule_<t>`: grid (value heads, sequences), one thread per value dimension.
    struct DeltaRule {
        q: u64, k: u64, v: u64, a: u64, b: u64, a_log: u64, dt_bias: u64, y: u64, state: u64, seqs: u64,
        hk: i32, hv: i32, dk: i32, dv: i32, q_scale: f32, q_root: f32, beta_scale: f32, channel_decay: i32,
    }
}

fn state_storage<'a>(op: &'static str, cache: &'a PagedKvLayer) -> Result<(&'a CudaStorage, &'a CudaStorage)> {
    match &cache.storage {
        KvStorage::Cuda { k, v } if k.dtype() == DType::F32 && v.dtype() == DType::F32 => Ok((k, v)),
        _ => Err(dev_err(format!("{op}: the state layer is not f32 on the CUDA device"))),
    }
}

fn f32_param<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
    let s = cuda_of(op, t)?;
    if s.dtype() != DType::F32 {
        return Err(dev_err(format!("{op}: parameters must be f32, got {}", s.dtype())));
    }
    Ok(s)
}

/// `int4 {q_start, q_len, slot, flags}` per sequence as the kernels read it: flag 1 a fresh
/// sequence (zero state), flag 2 prompt tokens (see `kv::is_prefill`).
pub(crate) fn state_seq_words(meta: &AttnMetadata) -> Result<Vec<u32>> {
    let mut v = Vec::with_capacity(meta.seqs.len() * 4);
    for (i, (s, &slot)) in meta.seqs.iter().zip(&meta.state_slots).enumerate() {
        let flags = u32::from(s.ctx_len == s.q_len) | (u32::from(crate::kv::is_prefill(meta, i)) << 1);
        let word = |v: usize| u32::try_from(v).map_err(|_| dev_err(format!("{v} beyond 32 bits")));
        v.extend([word(s.q_start)?, word(s.q_len)?, word(slot)?, flags]);
    }
    Ok(v)
}

/// The last per-sequence words uploaded: every recurrent op of every layer of a step reads the
/// same ones, so a step uploads them once.
struct WordsCache {
    key: Vec<u32>,
    words: cudarc::driver::CudaSlice<u32>,
}

static WORDS_CACHE: PerDevice<Option<WordsCache>> = PerDevice::new();

/// Runs `launch` with the device address of the step's per-sequence words: the graph's input
/// while a capture runs, else the copy kept for the other layers of the step.
fn with_state_seqs(
    dev: &std::sync::Arc<CudaDevice>,
    meta: &AttnMetadata,
    launch: impl FnOnce(u64) -> Result<()>,
) -> Result<()> {
    if let Some(p) = dev.step_index(&StepIndex::StateSeqs(meta))? {
        return launch(p);
    }
    let key = state_seq_words(meta)?;
    let mut cache = WORDS_CACHE.of(dev).lock().map_err(|_| dev_err("state words cache poisoned"))?;
    if cache.as_ref().is_none_or(|c| c.key != key) {
        let words = dev.stream().clone_htod(&key).map_err(dev_err)?;
        *cache = Some(WordsCache { key, words });
    }
    launch(super::device::dptr(&cache.as_ref().expect("filled above").words, dev))
}

/// One block per (head, sequence), a thread per element of a head's `width` (whole warps).
fn per_head_cfg(heads: usize, seqs: usize, width: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (heads as u32, seqs as u32, 1),
        block_dim: ((width.div_ceil(32).max(1) * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    act: Option<Activation>,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
) -> Result<Tensor> {
    let xs = cuda_of("causal_conv1d", x)?;
    let ws = f32_param("causal_conv1d", weight)?;
    // A null bias pointer means none.
    let bias = bias.map(|b| f32_param("causal_conv1d", b)).transpose()?.map_or(0, CudaStorage::ptr);
    let (channels, kernel) = (weight.shape()[0], weight.shape()[1]);
    if kernel > CONV_KERNEL_MAX {
        return Err(dev_err(format!("causal_conv1d: kernel {kernel} is longer than {CONV_KERNEL_MAX}")));
    }
    let (state, _) = state_storage("causal_conv1d", cache)?;
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !meta.seqs.is_empty() {
        with_state_seqs(dev, meta, |seqs| {
            let f = dev.function(RECURRENT, &format!("causal_conv1d_{}", dtype_suffix(xs.dtype())?))?;
            let launch = Conv1d {
                x: xs.ptr(),
                w: ws.ptr(),
                bias,
                y: out.ptr(),
                state: state.ptr(),
                seqs,
                channels: int(channels)?,
                kernel: int(kernel)?,
                act: act.map_or(-1, activation_code),
            };
            let threads = 128;
            let cfg = LaunchConfig {
                grid_dim: (channels.div_ceil(threads) as u32, meta.seqs.len() as u32, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch.launch_with(dev, &f, cfg)
        })?;
    }
    wrap(out, x.shape().to_vec())
}

#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    a: &Tensor,
    b: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
    p: &GdnParams,
) -> Result<Tensor> {
    let op = "gated_delta_rule";
    let qs = cuda_of(op, q)?;
    for t in [k, v, a, b] {
        same_dtype(op, qs, cuda_of(op, t)?)?;
    }
    let (a_log, dt_bias) = (f32_param(op, a_log)?, f32_param(op, dt_bias)?);
    if p.k_dim > GDN_DK_MAX || p.v_dim > 1024 {
        return Err(dev_err(format!("{op}: head dims ({}, {}) beyond ({GDN_DK_MAX}, 1024)", p.k_dim, p.v_dim)));
    }
    let (_, state) = state_storage(op, cache)?;
    let dev = qs.device();
    let tokens = q.rows();
    let out = CudaStorage::alloc(dev, qs.dtype(), tokens * p.num_v_heads * p.v_dim)?;
    if !meta.seqs.is_empty() {
        with_state_seqs(dev, meta, |seqs| {
            let f = dev.function(RECURRENT, &format!("gated_delta_rule_{}", dtype_suffix(qs.dtype())?))?;
            let launch = DeltaRule {
                q: qs.ptr(),
                k: cuda_of(op, k)?.ptr(),
                v: cuda_of(op, v)?.ptr(),
                a: cuda_of(op, a)?.ptr(),
                b: cuda_of(op, b)?.ptr(),
                a_log: a_log.ptr(),
                dt_bias: dt_bias.ptr(),
                y: out.ptr(),
                state: state.ptr(),
                seqs,
                hk: int(p.num_k_heads)?,
                hv: int(p.num_v_heads)?,
                dk: int(p.k_dim)?,
                dv: int(p.v_dim)?,
                q_scale: if p.channel_decay {
                    (1.0 / (p.k_dim as f64).sqrt()) as f32
                } else {
                    (p.k_dim as f64).powf(-0.5) as f32
                },
                q_root: (p.k_dim as f32).sqrt(),
                beta_scale: p.beta_scale,
                channel_decay: i32::from(p.channel_decay),
            };
            launch.launch_with(dev, &f, per_head_cfg(p.num_v_heads, meta.seqs.len(), p.v_dim))
        })?;
    }
    wrap(out, vec![tokens, p.num_v_heads * p.v_dim])
}

kernel_params! {
    /// `copy_state_slots`: grid (element blocks, copies).
    struct CopySlots { k: u64, v: u64, pairs: u64, k_len: i32, v_len: i32 }
}

/// Copies slot `from` to slot `to` of a state layer's conv (`k`, `k_len` floats a slot) and
/// recurrent (`v`) buffers, one grid row per copy, in order: a copy's source is never another's
/// target in the same call (restores and saves run in separate calls).
pub(crate) fn copy_state_slots(
    k: &CudaStorage,
    v: &CudaStorage,
    k_len: usize,
    v_len: usize,
    copies: &[(usize, usize)],
) -> Result<()> {
    let dev = k.device();
    dev.check_not_capturing("a state-slot copy")?;
    let f = dev.function(RECURRENT, "copy_state_slots")?;
    // One launch copies its pairs in parallel, so the copies go in waves, in order, where no copy
    // touches a slot another of its wave writes (a restore from the backup slot, then the backup
    // of the restored state, must not race).
    for wave in independent_waves(copies) {
        let pairs: Vec<i32> = wave.iter().flat_map(|&(f, t)| [f as i32, t as i32]).collect();
        let pairs = dev.stream().clone_htod(&pairs).map_err(dev_err)?;
        let launch = CopySlots {
            k: k.ptr(),
            v: v.ptr(),
            pairs: super::device::dptr(&pairs, dev),
            k_len: int(k_len)?,
            v_len: int(v_len)?,
        };
        let threads = 256;
        let cfg = LaunchConfig {
            grid_dim: ((k_len.max(v_len)).div_ceil(threads).max(1) as u32, wave.len() as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch.launch_with(dev, &f, cfg)?;
    }
    Ok(())
}

/// `copies` cut, in order, into runs whose copies read no slot the run writes and write no slot
/// twice: each run's copies may then go in parallel and give what copying one by one gives.
fn independent_waves(copies: &[(usize, usize)]) -> Vec<&[(usize, usize)]> {
    let mut waves = Vec::new();
    let mut start = 0;
    for i in 0..copies.len() {
        let wave = &copies[start..i];
        let (from, to) = copies[i];
        if wave.iter().any(|&(f, t)| t == from || t == to || f == to) {
            waves.push(wave);
            start = i;
        }
    }
    if start < copies.len() {
        waves.push(&copies[start..]);
    }
    waves
}

kernel_params! {
    /// `selective_scan_<t>`: grid (heads, sequences), one thread per head dimension.
    struct SelectiveScan {
        x: u64, dt: u64, b: u64, c: u64, a_log: u64, dt_bias: u64, d: u64, y: u64, state: u64, seqs: u64,
        heads: i32, head_dim: i32, groups: i32, state_size: i32, dt_min: f32, dt_max: f32, per_channel: i32,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn selective_scan(
    x: &Tensor,
    dt: &Tensor,
    b: &Tensor,
    c: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    d: &Tensor,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
    p: &SelectiveScanParams,
) -> Result<Tensor> {
    let op = "selective_scan";
    let xs = cuda_of(op, x)?;
    for t in [dt, b, c] {
        same_dtype(op, xs, cuda_of(op, t)?)?;
    }
    let (a_log, dt_bias, d) = (f32_param(op, a_log)?, f32_param(op, dt_bias)?, f32_param(op, d)?);
    if p.state_size > SSM_STATE_MAX || p.head_dim > 1024 {
        return Err(dev_err(format!(
            "{op}: state {} / head dim {} beyond {SSM_STATE_MAX} / 1024",
            p.state_size, p.head_dim
        )));
    }
    let (_, state) = state_storage(op, cache)?;
    let dev = xs.device();
    let out = CudaStorage::alloc(dev, xs.dtype(), xs.len())?;
    if !meta.seqs.is_empty() {
        with_state_seqs(dev, meta, |seqs| {
            let f = dev.function(RECURRENT, &format!("selective_scan_{}", dtype_suffix(xs.dtype())?))?;
            let launch = SelectiveScan {
                x: xs.ptr(),
                dt: cuda_of(op, dt)?.ptr(),
                b: cuda_of(op, b)?.ptr(),
                c: cuda_of(op, c)?.ptr(),
                a_log: a_log.ptr(),
                dt_bias: dt_bias.ptr(),
                d: d.ptr(),
                y: out.ptr(),
                state: state.ptr(),
                seqs,
                heads: int(p.num_heads)?,
                head_dim: int(p.head_dim)?,
                groups: int(p.num_groups)?,
                state_size: int(p.state_size)?,
                dt_min: p.dt_limit.0,
                dt_max: p.dt_limit.1,
                per_channel: p.per_channel as i32,
            };
            launch.launch_with(dev, &f, per_head_cfg(p.num_heads, meta.seqs.len(), p.head_dim))
        })?;
    }
    wrap(out, x.shape().to_vec())
}

#[cfg(test)]
mod tests {
    use super::independent_waves;

    #[test]
    fn waves_keep_dependent_copies_apart() {
        // Restore slot 0 from its backup 8, then back the restored state up: two waves.
        assert_eq!(independent_waves(&[(8, 0), (0, 8)]), [&[(8, 0)][..], &[(0, 8)][..]]);
        assert_eq!(independent_waves(&[(8, 0), (9, 1), (0, 8)]), [&[(8, 0), (9, 1)][..], &[(0, 8)][..]]);
        // Independent copies, and two reading one slot, share a wave.
        assert_eq!(independent_waves(&[(0, 8), (1, 9), (0, 10)]), [&[(0, 8), (1, 9), (0, 10)][..]]);
        assert_eq!(independent_waves(&[(0, 8), (1, 8)]), [&[(0, 8)][..], &[(1, 8)][..]]);
        assert!(independent_waves(&[]).is_empty());
    }
}
