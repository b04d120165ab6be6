//! Decode steps replayed from CUDA graphs, as vLLM does. A decode step of a large model issues
//! hundreds of small kernels, and launching them one by one costs the host more time than the
//! GPU needs to run them; a captured graph goes to the device in one call. A graph is fixed in
//! its shapes, so a decode batch is padded up to the next capture size, and each sequence's block
//! table up to a power of two of blocks; the padding rows write no keys (their slot is
//! [`PAD_SLOT`]), a hybrid model's padding sequences keep their recurrent state in a slot of their
//! own, and their logits are ignored. Prefill and mixed steps run eagerly, and so do steps that
//! copy recurrent states (prefix-cache restores and snapshots).

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_models::{CausalLM, ForwardInput};
use ferrite_tensor::cuda::{CudaDevice, StepGraph, StepInput};
use ferrite_tensor::kv::PAD_SLOT;
use ferrite_tensor::{AttnMetadata, AttnSeq, Device, PagedKvLayer, Tensor};

use crate::error::Result;

/// Batch sizes a decode step is padded to (vLLM's capture sizes up to 256).
pub const CAPTURE_SIZES: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];
/// Block tables of a captured step hold a power of two of blocks, at least this many, so that a
/// sequence growing by a token rarely needs a new graph.
const MIN_TABLE_BLOCKS: usize = 16;

/// A decode step padded to the shape of a graph.
#[derive(Debug)]
pub(crate) struct PaddedStep {
    pub tokens: Vec<u32>,
    pub meta: AttnMetadata,
    pub logit_rows: Vec<usize>,
    /// (batch size, blocks per table): the graph this step replays.
    pub shape: (usize, usize),
}

/// The padded form of a step that is pure decode (one new token per sequence, each sampled, no
/// recurrent-state copies) and fits the largest capture size; `None` for any other step. The
/// padding sequences of a hybrid model use `pad_state_slot`.
pub(crate) fn pad_decode(
    tokens: &[u32],
    meta: &AttnMetadata,
    logit_rows: &[usize],
    pad_state_slot: Option<usize>,
) -> Result<Option<PaddedStep>> {
    let batch = meta.seqs.len();
    let copies = &meta.state_copies;
    let pure_decode = batch > 0
        && copies.before.is_empty()
        && copies.after.is_empty()
        && tokens.len() == batch
        && meta.seqs.iter().enumerate().all(|(i, s)| s.q_len == 1 && s.q_start == i)
        && logit_rows.iter().copied().eq(0..batch);
    let Some(&padded) = CAPTURE_SIZES.iter().find(|&&size| size >= batch) else {
        return Ok(None);
    };
    if !pure_decode {
        return Ok(None);
    }
    let longest = meta.seqs.iter().map(|s| s.block_table.len()).max().unwrap_or(0);
    let blocks = longest.next_power_of_two().max(MIN_TABLE_BLOCKS);
    let widen = |table: &[u32]| {
        let mut t = table.to_vec();
        t.resize(blocks, 0);
        t
    };
    let mut seqs: Vec<AttnSeq> =
        meta.seqs.iter().map(|s| AttnSeq { block_table: widen(&s.block_table), ..s.clone() }).collect();
    seqs.extend((batch..padded).map(|row| AttnSeq {
        q_start: row,
        q_len: 1,
        ctx_len: 1,
        block_table: vec![0; blocks],
    }));
    let mut padded_meta = AttnMetadata::new(seqs, meta.block_size)?;
    padded_meta.slot_mapping[batch..].fill(PAD_SLOT);
    if !meta.prompt_lens.is_empty() {
        padded_meta.prompt_lens = meta.prompt_lens.iter().copied().chain((batch..padded).map(|_| 1)).collect();
    }
    if !meta.mrope_positions.is_empty() {
        // A padding row is a one-token sequence at position 0.
        padded_meta.mrope_positions =
            meta.mrope_positions.iter().copied().chain((batch..padded).map(|_| [0; 3])).collect();
    }
    if !meta.state_slots.is_empty() {
        let Some(pad) = pad_state_slot else { return Ok(None) };
        padded_meta.state_slots = meta.state_slots.iter().copied().chain((batch..padded).map(|_| pad)).collect();
    }
    let mut padded_tokens = tokens.to_vec();
    padded_tokens.resize(padded, 0);
    Ok(Some(PaddedStep {
        tokens: padded_tokens,
        meta: padded_meta,
        logit_rows: (0..padded).collect(),
        shape: (padded, blocks),
    }))
}

/// How often decode steps were captured and replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphCounts {
    pub captured: u64,
    pub replayed: u64,
}

/// The graphs of one model runner, by padded shape.
pub(crate) struct DecodeGraphs {
    device: Arc<CudaDevice>,
    graphs: HashMap<(usize, usize), StepGraph>,
    /// The recurrent-state slot of padding sequences (hybrid models).
    pad_state_slot: Option<usize>,
    /// Set when a capture failed: the model does something a graph cannot replay (a host
    /// round trip, a gather of its own), so every step of this runner runs eagerly.
    disabled: bool,
    pub counts: GraphCounts,
}

impl DecodeGraphs {
    /// Graphs for a model on `device`; `None` on the CPU or when `enforce_eager` asks for none.
    pub(crate) fn new(
        device: Device,
        enforce_eager: bool,
        pad_state_slot: Option<usize>,
    ) -> Result<Option<DecodeGraphs>> {
        let Device::Cuda(ordinal) = device else {
            return Ok(None);
        };
        if enforce_eager {
            return Ok(None);
        }
        let device = ferrite_tensor::cuda::device(ordinal)?;
        Ok(Some(DecodeGraphs {
            device,
            graphs: HashMap::new(),
            pad_state_slot,
            disabled: false,
            counts: GraphCounts::default(),
        }))
    }

    /// The logits of `step` from its graph (captured on first use), with one row per padded
    /// sequence; `None` when the step is not a decode step a graph serves, or graphs are off.
    pub(crate) fn forward(
        &mut self,
        model: &dyn CausalLM,
        kv_caches: &mut [PagedKvLayer],
        tokens: &[u32],
        meta: &AttnMetadata,
        logit_rows: &[usize],
    ) -> Result<Option<Tensor>> {
        if self.disabled {
            return Ok(None);
        }
        let Some(step) = pad_decode(tokens, meta, logit_rows, self.pad_state_slot)? else {
            return Ok(None);
        };
        let input = StepInput { tokens: &step.tokens, meta: &step.meta, logit_rows: &step.logit_rows };
        if !self.graphs.contains_key(&step.shape) {
            let _span = tracing::debug_span!("capture", batch = step.shape.0, blocks = step.shape.1).entered();
            let forward = || {
                model.forward(
                    &ForwardInput {
                        tokens: input.tokens,
                        meta: input.meta,
                        logit_rows: input.logit_rows,
                        embeds: None,
                    },
                    kv_caches,
                )
            };
            match StepGraph::capture(&self.device, input, forward) {
                Ok(graph) => {
                    self.graphs.insert(step.shape, graph);
                    self.counts.captured += 1;
                }
                Err(e) => {
                    tracing::info!(reason = %e, "CUDA graphs off for this model: decode runs eagerly");
                    self.disabled = true;
                    self.graphs.clear();
                    return Ok(None);
                }
            }
        }
        let graph = &self.graphs[&step.shape];
        let logits = graph.replay(input)?;
        self.counts.replayed += 1;
        Ok(Some(logits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_tensor::StateCopies;

    fn decode_meta(ctx_lens: &[usize], block_size: usize) -> AttnMetadata {
        let mut next_block = 0u32;
        let seqs = ctx_lens
            .iter()
            .enumerate()
            .map(|(i, &ctx)| {
                let n = ctx.div_ceil(block_size) as u32;
                let table = (next_block..next_block + n).collect();
                next_block += n;
                AttnSeq { q_start: i, q_len: 1, ctx_len: ctx, block_table: table }
            })
            .collect();
        AttnMetadata::new(seqs, block_size).unwrap()
    }

    #[test]
    fn decode_batches_pad_to_the_next_capture_size() {
        let meta = decode_meta(&[5, 40, 17], 16);
        let step = pad_decode(&[7, 8, 9], &meta, &[0, 1, 2], None).unwrap().unwrap();
        assert_eq!(step.shape, (4, 16));
        assert_eq!(step.tokens, vec![7, 8, 9, 0]);
        assert_eq!(step.logit_rows, vec![0, 1, 2, 3]);
        assert_eq!(&step.meta.slot_mapping[..3], &meta.slot_mapping[..]);
        assert_eq!(step.meta.slot_mapping[3], PAD_SLOT);
        assert!(step.meta.seqs.iter().all(|s| s.block_table.len() == 16));
        assert_eq!(&step.meta.seqs[1].block_table[..3], &meta.seqs[1].block_table[..]);
        assert_eq!(step.meta.seqs[3].ctx_len, 1);
        for &(batch, padded) in &[(1, 1), (2, 2), (5, 8), (33, 64), (200, 256)] {
            let meta = decode_meta(&vec![3; batch], 16);
            let rows: Vec<usize> = (0..batch).collect();
            let step = pad_decode(&vec![1; batch], &meta, &rows, None).unwrap().unwrap();
            assert_eq!(step.shape.0, padded, "batch {batch}");
        }
    }

    #[test]
    fn block_tables_pad_to_a_power_of_two() {
        let meta = decode_meta(&[16 * 17 + 1], 16);
        let step = pad_decode(&[1], &meta, &[0], None).unwrap().unwrap();
        assert_eq!(step.shape, (1, 32));
    }

    #[test]
    fn only_pure_decode_steps_fit_a_graph() {
        let too_many = decode_meta(&vec![2; 257], 16);
        let rows: Vec<usize> = (0..257).collect();
        assert!(pad_decode(&vec![1; 257], &too_many, &rows, None).unwrap().is_none());
        let prefill =
            AttnMetadata::new(vec![AttnSeq { q_start: 0, q_len: 3, ctx_len: 3, block_table: vec![0] }], 16).unwrap();
        assert!(pad_decode(&[1, 2, 3], &prefill, &[2], None).unwrap().is_none());
        let meta = decode_meta(&[4, 4], 16);
        assert!(pad_decode(&[1, 2], &meta, &[1], None).unwrap().is_none(), "a row without logits");
    }

    /// A hybrid model's padding sequences keep their state in the pad slot; a step that restores
    /// or keeps a recurrent state runs eagerly (a graph would replay without the copy).
    #[test]
    fn hybrid_decode_pads_into_its_own_state_slot() {
        let meta = decode_meta(&[5, 40, 17], 16).with_state_slots(vec![3, 0, 1]).unwrap();
        let step = pad_decode(&[7, 8, 9], &meta, &[0, 1, 2], Some(9)).unwrap().unwrap();
        assert_eq!(step.meta.state_slots, vec![3, 0, 1, 9]);
        assert!(pad_decode(&[7, 8, 9], &meta, &[0, 1, 2], None).unwrap().is_none(), "no pad slot");
        for copies in
            [StateCopies { before: vec![(5, 0)], after: vec![] }, StateCopies { before: vec![], after: vec![(0, 5)] }]
        {
            let copying = meta.clone().with_state_copies(copies);
            assert!(pad_decode(&[7, 8, 9], &copying, &[0, 1, 2], Some(9)).unwrap().is_none());
        }
    }
}
