//! Forward passes recorded once as CUDA graphs and replayed for later steps of the same shape.
//!
//! A decode step issues hundreds of small kernels; launching them one by one costs the host
//! more time than the GPU needs to run them. Captured into a graph they go to the device in one
//! call. A graph replays fixed kernels with fixed pointers, so everything a forward pass uploads
//! from the host must live in buffers the graph owns and that are rewritten before each replay:
//! the token ids, the rows whose logits are wanted, the slot mapping, the attention work items
//! and block tables, the recurrent layers' per-sequence words, and host-computed tables such as
//! rotary cos/sin. While a capture runs, the
//! ops recognise those inputs by address (the step's slices and metadata themselves, not copies)
//! and ask this module for the graph's buffer instead of uploading; any other upload, and any
//! read back to the host, fails the capture, and the caller runs that model eagerly instead.

use std::sync::Arc;

use cudarc::driver::{result as drv_result, sys as drv_sys, CudaGraph, CudaSlice, CudaStream, DevicePtr};

use super::attention::{self, MetaCache};
use super::device::{dev_err, CudaDevice, PerDevice};
use super::storage::CudaStorage;
use crate::error::{Result, TensorError};
use crate::kv::AttnMetadata;
use crate::ops::AttentionParams;
use crate::tensor::{Storage, Tensor};

/// Recomputes a host-side input of a step (rotary tables, say) from its attention metadata.
pub type HostFill = Arc<dyn Fn(&AttnMetadata) -> Vec<f32> + Send + Sync>;

/// What one forward pass is given: the same three things a model's forward input holds.
#[derive(Clone, Copy)]
pub struct StepInput<'a> {
    pub tokens: &'a [u32],
    pub meta: &'a AttnMetadata,
    pub logit_rows: &'a [usize],
}

/// The index data an op would upload, named by what it is so that a capture can tell the
/// step's own inputs from anything else.
#[derive(Clone, Copy)]
pub(crate) enum StepIndex<'a> {
    Tokens(&'a [u32]),
    LogitRows(&'a [usize]),
    Slots(&'a AttnMetadata),
    /// The recurrent ops' `{q_start, q_len, state slot, flags}` per sequence.
    StateSeqs(&'a AttnMetadata),
}

impl StepIndex<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            StepIndex::Tokens(t) => t.len(),
            StepIndex::LogitRows(r) => r.len(),
            StepIndex::Slots(m) => m.slot_mapping.len(),
            StepIndex::StateSeqs(m) => 4 * m.seqs.len(),
        }
    }

    /// The values as the kernels read them.
    pub(crate) fn host(&self) -> Result<Vec<u32>> {
        match self {
            StepIndex::Tokens(t) => Ok(t.to_vec()),
            StepIndex::LogitRows(r) => u32_rows(r),
            StepIndex::Slots(m) => u32_slots(m),
            StepIndex::StateSeqs(m) => super::recurrent::state_seq_words(m),
        }
    }
}

enum Input {
    Tokens(CudaSlice<u32>),
    LogitRows(CudaSlice<u32>),
    Slots(CudaSlice<u32>),
    StateSeqs(CudaSlice<u32>),
    Attention { params: AttentionParams, causal: bool, prefill: attention::PrefillKernel, cache: Box<MetaCache> },
    Host { fill: HostFill, tensor: Tensor },
}

/// The capture in progress on each device, if any.
static RECORDING: PerDevice<Option<Recording>> = PerDevice::new();

/// The capture in progress on a device: the addresses of the step's inputs and the buffers
/// handed out for them so far.
struct Recording {
    tokens: (usize, usize),
    logit_rows: (usize, usize),
    meta: usize,
    /// Buffers that outlive the capture are allocated here: an allocation on the capturing
    /// stream would belong to the graph and be freed by it.
    side: Arc<CudaStream>,
    inputs: Vec<Input>,
}

fn slice_id<T>(s: &[T]) -> (usize, usize) {
    (s.as_ptr() as usize, s.len())
}

fn not_capturable(what: &str) -> TensorError {
    TensorError::Unsupported { op: "graph capture", detail: what.to_string() }
}

fn u32_rows(rows: &[usize]) -> Result<Vec<u32>> {
    rows.iter().map(|&r| u32::try_from(r).map_err(|_| dev_err(format!("row {r} beyond 32 bits")))).collect()
}

/// The slot mapping as the kernels read it; [`crate::kv::PAD_SLOT`] stays the marker it is.
pub(crate) fn u32_slots(meta: &AttnMetadata) -> Result<Vec<u32>> {
    meta.slot_mapping
        .iter()
        .map(|&s| u32::try_from(s).map_err(|_| dev_err(format!("write_kv: slot {s} beyond 32 bits"))))
        .collect()
}

impl Recording {
    fn buffer(&mut self, want: &StepIndex<'_>) -> Result<u64> {
        let len = match want {
            StepIndex::Tokens(t) if slice_id(t) == self.tokens => t.len(),
            StepIndex::LogitRows(r) if slice_id(r) == self.logit_rows => r.len(),
            StepIndex::Slots(m) if std::ptr::eq(*m, self.meta as *const AttnMetadata) => m.slot_mapping.len(),
            StepIndex::StateSeqs(m) if std::ptr::eq(*m, self.meta as *const AttnMetadata) => want.len(),
            StepIndex::Tokens(_) => return Err(not_capturable("token ids other than the step's")),
            StepIndex::LogitRows(_) => return Err(not_capturable("a row gather other than the logit rows")),
            StepIndex::Slots(_) | StepIndex::StateSeqs(_) => {
                return Err(not_capturable("attention metadata other than the step's"))
            }
        };
        let side = &self.side;
        let found = self.inputs.iter().find_map(|i| match (i, want) {
            (Input::Tokens(s), StepIndex::Tokens(_))
            | (Input::LogitRows(s), StepIndex::LogitRows(_))
            | (Input::Slots(s), StepIndex::Slots(_))
            | (Input::StateSeqs(s), StepIndex::StateSeqs(_)) => Some(s.device_ptr(side).0),
            _ => None,
        });
        if let Some(p) = found {
            return Ok(p);
        }
        // SAFETY: every replay rewrites the whole buffer before the graph reads it.
        let buf = unsafe { side.alloc::<u32>(len.max(1)) }.map_err(dev_err)?;
        let p = buf.device_ptr(side).0;
        self.inputs.push(match want {
            StepIndex::Tokens(_) => Input::Tokens(buf),
            StepIndex::LogitRows(_) => Input::LogitRows(buf),
            StepIndex::Slots(_) => Input::Slots(buf),
            StepIndex::StateSeqs(_) => Input::StateSeqs(buf),
        });
        Ok(p)
    }
}

impl CudaDevice {
    /// The device address of `index` during a capture (a graph input), or `None` outside one,
    /// where the caller uploads it as usual.
    pub(crate) fn step_index(&self, index: &StepIndex<'_>) -> Result<Option<u64>> {
        let mut rec = RECORDING.of(self).lock().map_err(|_| dev_err("graph recording poisoned"))?;
        rec.as_mut().map(|r| r.buffer(index)).transpose()
    }

    /// Refuses what a graph cannot replay: data moved between host and device mid-forward.
    pub(crate) fn check_not_capturing(&self, what: &str) -> Result<()> {
        if RECORDING.of(self).lock().map_err(|_| dev_err("graph recording poisoned"))?.is_some() {
            return Err(not_capturable(what));
        }
        Ok(())
    }

    /// Runs `f` with the attention work items of `meta` for `params`: during a capture the
    /// graph's copy (sized for the step's block-table capacity), else `None`.
    pub(crate) fn with_step_attention<R>(
        &self,
        meta: &AttnMetadata,
        params: &AttentionParams,
        causal: bool,
        prefill: attention::PrefillKernel,
        f: impl FnOnce(&MetaCache) -> Result<R>,
    ) -> Result<Option<R>> {
        let mut guard = RECORDING.of(self).lock().map_err(|_| dev_err("graph recording poisoned"))?;
        let Some(rec) = guard.as_mut() else {
            return Ok(None);
        };
        if !std::ptr::eq(meta, rec.meta as *const AttnMetadata) {
            return Err(not_capturable("attention metadata other than the step's"));
        }
        let pos = rec
            .inputs
            .iter()
            .position(|i| matches!(i, Input::Attention { params: p, causal: c, prefill: k, .. } if p == params && *c == causal && *k == prefill));
        let pos = match pos {
            Some(p) => p,
            None => {
                let plan = attention::plan_meta(self, meta, params, causal, prefill, true)?;
                let cache = attention::alloc_meta(&rec.side, &plan)?;
                rec.inputs.push(Input::Attention { params: params.clone(), causal, prefill, cache: Box::new(cache) });
                rec.inputs.len() - 1
            }
        };
        let Input::Attention { cache, .. } = &rec.inputs[pos] else { unreachable!("found as attention above") };
        f(cache).map(Some)
    }

    /// During a capture, a `[rows, cols]` f32 graph input that `fill` recomputes for every
    /// replay; `None` outside one, where the caller uploads the table as usual.
    pub(crate) fn step_tensor(
        self: &Arc<Self>,
        meta: &AttnMetadata,
        cols: usize,
        fill: &HostFill,
    ) -> Result<Option<Tensor>> {
        let rows = meta.num_tokens();
        let mut guard = RECORDING.of(self).lock().map_err(|_| dev_err("graph recording poisoned"))?;
        let Some(rec) = guard.as_mut() else { return Ok(None) };
        if !std::ptr::eq(meta, rec.meta as *const AttnMetadata) {
            return Err(not_capturable("a host table of metadata other than the step's"));
        }
        let storage = CudaStorage::alloc_on(self, &rec.side, crate::DType::F32, rows * cols)?;
        let tensor = Tensor::from_storage(Storage::Cuda(storage), vec![rows, cols])?;
        rec.inputs.push(Input::Host { fill: fill.clone(), tensor: tensor.clone() });
        Ok(Some(tensor))
    }
}

/// One captured forward pass and the inputs it reads.
pub struct StepGraph {
    dev: Arc<CudaDevice>,
    graph: CudaGraph,
    inputs: Vec<Input>,
    output: Tensor,
}

// SAFETY: the driver's graph handles are not tied to a thread: cudarc binds the graph's context
// to the calling thread before each launch and on drop, and replays take `&self` only through
// the one owner (the model runner's thread).
unsafe impl Send for StepGraph {}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepGraph({} inputs, output {:?})", self.inputs.len(), self.output.shape())
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied()).unwrap_or("?")
}

impl StepGraph {
    /// Captures `forward` run on `step`. Nothing runs on the device: replay the graph for this
    /// step too. Fails, leaving the device as it was, when the forward does something a graph
    /// cannot replay (the error says what).
    pub fn capture<E: std::fmt::Display>(
        dev: &Arc<CudaDevice>,
        step: StepInput<'_>,
        forward: impl FnOnce() -> std::result::Result<Tensor, E>,
    ) -> Result<StepGraph> {
        let side = dev.side_stream().clone();
        {
            let mut rec = RECORDING.of(dev).lock().map_err(|_| dev_err("graph recording poisoned"))?;
            *rec = Some(Recording {
                tokens: slice_id(step.tokens),
                logit_rows: slice_id(step.logit_rows),
                meta: step.meta as *const AttnMetadata as usize,
                side: side.clone(),
                inputs: Vec::new(),
            });
        }
        let stream = dev.stream().clone();
        // Relaxed: the graph's own buffers are allocated on the side stream mid-capture.
        let begun = stream.begin_capture(drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
        let recorded = begun.map_err(dev_err).and_then(|()| {
            // A forward that panics mid-capture (an infallible host read, say) must still end
            // the capture, or every later use of the stream fails: the panic becomes the error.
            let logits = std::panic::catch_unwind(std::panic::AssertUnwindSafe(forward))
                .map_err(|panic| dev_err(format!("forward panicked under capture: {}", panic_text(&panic))))?
                .map_err(|e| dev_err(format!("forward under capture: {e}")))?;
            let src = logits.cuda().ok_or_else(|| dev_err("forward returned host logits"))?;
            let output = CudaStorage::alloc_on(dev, &side, src.dtype(), src.len())?;
            // SAFETY: both buffers hold `len` elements of the same dtype; the copy is captured.
            unsafe {
                drv_result::memcpy_dtod_async(
                    output.ptr(),
                    src.ptr(),
                    src.len() * src.dtype().size_in_bytes(),
                    stream.cu_stream(),
                )
            }
            .map_err(dev_err)?;
            Tensor::from_storage(Storage::Cuda(output), logits.shape().to_vec())
        });
        let inputs = RECORDING
            .of(dev)
            .lock()
            .map_err(|_| dev_err("graph recording poisoned"))?
            .take()
            .map(|r| r.inputs)
            .unwrap_or_default();
        let graph = match recorded {
            Ok(output) => stream
                .end_capture(drv_sys::CUgraphInstantiate_flags(0))
                .map_err(dev_err)?
                .ok_or_else(|| dev_err("the capture recorded nothing"))
                .map(|g| (g, output)),
            Err(e) => {
                // End the capture without instantiating what was recorded, then report the cause.
                // SAFETY: the stream is capturing (begin_capture succeeded or this is a no-op
                // error); the partial graph is destroyed right away.
                if let Ok(g) = unsafe { drv_result::stream::end_capture(stream.cu_stream()) } {
                    if !g.is_null() {
                        let _ = unsafe { drv_result::graph::destroy(g) };
                    }
                }
                Err(e)
            }
        };
        let (graph, output) = graph?;
        side.synchronize().map_err(dev_err)?;
        Ok(StepGraph { dev: dev.clone(), graph, inputs, output })
    }

    /// Rewrites the graph's inputs from `step` and launches it; returns the logits, in a
    /// buffer the next replay overwrites (ops queued before that replay see this step's).
    pub fn replay(&self, step: StepInput<'_>) -> Result<Tensor> {
        let stream = self.dev.stream();
        for input in &self.inputs {
            match input {
                Input::Tokens(buf) => write(stream, buf, step.tokens)?,
                Input::LogitRows(buf) => write(stream, buf, &u32_rows(step.logit_rows)?)?,
                Input::Slots(buf) => write(stream, buf, &u32_slots(step.meta)?)?,
                Input::StateSeqs(buf) => write(stream, buf, &super::recurrent::state_seq_words(step.meta)?)?,
                Input::Attention { params, causal, prefill, cache } => {
                    let plan = attention::plan_meta(&self.dev, step.meta, params, *causal, *prefill, true)?;
                    attention::refill_meta(stream, cache, &plan)?;
                }
                Input::Host { fill, tensor } => {
                    let data = fill(step.meta);
                    let storage = tensor.cuda().expect("graph host inputs live on the device");
                    if data.len() != storage.len() {
                        return Err(shape_change("a host table", storage.len(), data.len()));
                    }
                    // SAFETY: the buffer holds `len` f32s; the copy is ordered before the launch.
                    unsafe { drv_result::memcpy_htod_async(storage.ptr(), &data, stream.cu_stream()) }
                        .map_err(dev_err)?;
                }
            }
        }
        self.graph.launch().map_err(dev_err)?;
        Ok(self.output.clone())
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // The inputs are freed on the side stream, which does not wait for replays queued on
        // the main one.
        let _ = self.dev.synchronize();
    }
}

fn shape_change(what: &str, had: usize, got: usize) -> TensorError {
    dev_err(format!("graph replay: {what} of {got} entries where the graph was captured with {had}"))
}

pub(crate) fn write<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<T>,
    data: &[T],
) -> Result<()> {
    if data.len() != buf.len() {
        return Err(shape_change("an input", buf.len(), data.len()));
    }
    // SAFETY: `buf` holds exactly `data.len()` elements; the copy is stream-ordered.
    unsafe { drv_result::memcpy_htod_async(buf.device_ptr(stream).0, data, stream.cu_stream()) }.map_err(dev_err)
}
