//! The paged KV cache of one attention layer and the batch metadata attention reads it through.
//!
//! The cache is a pool of fixed-size blocks; a sequence owns a block table (block ids in order),
//! and every token of a forward batch has a slot (`block * block_size + offset`) its key and value
//! are written to. Prefill chunks and decode tokens of many sequences share one flattened batch.

use crate::cuda::CudaStorage;
use crate::error::{shape_err, Result};
use crate::tensor::Device;
use crate::DType;

#[derive(Debug, Clone)]
pub struct AttnSeq {
    /// First row of this sequence's query tokens in the flattened batch.
    pub q_start: usize,
    /// Number of query tokens this step (prefill chunk length, or 1 for decode).
    pub q_len: usize,
    /// Tokens in the cache once this step's keys are written (cached prefix + `q_len`).
    pub ctx_len: usize,
    pub block_table: Vec<u32>,
}

impl AttnSeq {
    /// Absolute position of query row `i` of this sequence.
    pub fn query_position(&self, i: usize) -> usize {
        self.ctx_len - self.q_len + i
    }
}

/// `seq` cut into the pieces attention treats apart where its tokens include runs that attend
/// both ways (an image's tokens in Gemma 3; `runs` are positions in the sequence): each run the
/// step computes becomes a piece of its own, marked bidirectional (see
/// [`AttnMetadata::bidirectional`]), and the tokens between runs causal pieces; all share the
/// block table. A run that starts before the step (its first tokens cached) makes a piece from
/// the step's first token. A run the step ends inside is an error: its later keys would not exist
/// yet.
pub fn attention_pieces(seq: AttnSeq, mut runs: Vec<std::ops::Range<usize>>) -> Result<Vec<(AttnSeq, bool)>> {
    let start = seq.query_position(0);
    runs.retain(|run| run.start < seq.ctx_len && start < run.end);
    if runs.is_empty() {
        return Ok(vec![(seq, false)]);
    }
    runs.sort_by_key(|run| run.start);
    let piece = |range: std::ops::Range<usize>| AttnSeq {
        q_start: seq.q_start + range.start - start,
        q_len: range.len(),
        ctx_len: range.end,
        block_table: seq.block_table.clone(),
    };
    let mut pieces = Vec::with_capacity(2 * runs.len() + 1);
    let mut cursor = start;
    for run in runs {
        if run.end > seq.ctx_len {
            return Err(shape_err(
                "attention_pieces",
                format!("tokens {start}..{} end inside the bidirectional run {run:?}", seq.ctx_len),
            ));
        }
        let from = run.start.max(cursor);
        if from > cursor {
            pieces.push((piece(cursor..from), false));
        }
        pieces.push((piece(from..run.end), true));
        cursor = run.end;
    }
    if cursor < seq.ctx_len {
        pieces.push((piece(cursor..seq.ctx_len), false));
    }
    Ok(pieces)
}

/// A slot mapping entry whose key and value are not stored: the padding rows that fill a
/// batch up to the size of a captured graph.
pub const PAD_SLOT: usize = u32::MAX as usize;

#[derive(Debug, Clone)]
pub struct AttnMetadata {
    pub seqs: Vec<AttnSeq>,
    pub block_size: usize,
    /// One cache slot per flattened query token.
    pub slot_mapping: Vec<usize>,
    /// Per sequence, the length of its whole prompt where a step holds a chunk of it (empty: the
    /// sequences' `ctx_len`s). See [`AttnMetadata::schedule_len`].
    pub prompt_lens: Vec<usize>,
    /// Per sequence, its slot in the models' recurrent-state layers (empty for models without).
    pub state_slots: Vec<usize>,
    /// `(from, to)` state-slot copies each recurrent layer makes before this step (a prefix-cache
    /// hit restoring a cached state into a sequence's slot) and after it (a sequence's state at a
    /// block boundary kept for later hits).
    pub state_copies: StateCopies,
    /// Per flattened query token, its (temporal, height, width) rotary positions for models with
    /// multimodal rotary embeddings (MRoPE); empty: every token's three positions are its
    /// position in the sequence.
    pub mrope_positions: Vec<[usize; 3]>,
    /// Per sequence, whether every query row attends to all `ctx_len` keys (within its sliding
    /// window) instead of those up to its own position: one image's tokens in a model that attends
    /// bidirectionally within an image (Gemma 3). The engine makes such a run of tokens a sequence
    /// of its own, sharing its request's block table. Empty: every sequence is causal.
    pub bidirectional: Vec<bool>,
}

/// Whether sequence `i` of `meta` computes prompt tokens (with `prompt_lens` known: every token it
/// computes lies within its prompt), else whether it is a multi-token or first step.
pub fn is_prefill(meta: &AttnMetadata, i: usize) -> bool {
    let s = &meta.seqs[i];
    match meta.prompt_lens.get(i) {
        Some(&prompt) => s.ctx_len <= prompt,
        None => s.q_len > 1 || s.ctx_len == s.q_len,
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCopies {
    pub before: Vec<(usize, usize)>,
    pub after: Vec<(usize, usize)>,
}

impl AttnMetadata {
    /// Builds the slot mapping from each sequence's block table.
    pub fn new(seqs: Vec<AttnSeq>, block_size: usize) -> Result<AttnMetadata> {
        let total: usize = seqs.iter().map(|s| s.q_len).sum();
        let mut slot_mapping = vec![0usize; total];
        for s in &seqs {
            if s.q_len > s.ctx_len {
                return Err(shape_err("attn_metadata", format!("q_len {} > ctx_len {}", s.q_len, s.ctx_len)));
            }
            if s.block_table.len() * block_size < s.ctx_len {
                return Err(shape_err(
                    "attn_metadata",
                    format!("{} blocks of {block_size} cannot hold {} tokens", s.block_table.len(), s.ctx_len),
                ));
            }
            for i in 0..s.q_len {
                let pos = s.query_position(i);
                let block = s.block_table[pos / block_size] as usize;
                let row = s.q_start + i;
                if row >= total {
                    return Err(shape_err("attn_metadata", "q_start + q_len beyond the batch"));
                }
                slot_mapping[row] = block * block_size + pos % block_size;
            }
        }
        Ok(AttnMetadata {
            seqs,
            block_size,
            slot_mapping,
            prompt_lens: Vec::new(),
            state_slots: Vec::new(),
            state_copies: StateCopies::default(),
            mrope_positions: Vec::new(),
            bidirectional: Vec::new(),
        })
    }

    /// Records each sequence's whole prompt length (for chunked prefill).
    pub fn with_prompt_lens(mut self, prompt_lens: Vec<usize>) -> Result<AttnMetadata> {
        if prompt_lens.len() != self.seqs.len() {
            return Err(shape_err(
                "attn_metadata",
                format!("{} prompt lengths, {} seqs", prompt_lens.len(), self.seqs.len()),
            ));
        }
        self.prompt_lens = prompt_lens;
        Ok(self)
    }

    /// Gives each sequence its recurrent-state slot.
    pub fn with_state_slots(mut self, state_slots: Vec<usize>) -> Result<AttnMetadata> {
        if state_slots.len() != self.seqs.len() {
            return Err(shape_err(
                "attn_metadata",
                format!("{} state slots, {} seqs", state_slots.len(), self.seqs.len()),
            ));
        }
        self.state_slots = state_slots;
        Ok(self)
    }

    /// Sets the state-slot copies around this step (see [`AttnMetadata::state_copies`]).
    pub fn with_state_copies(mut self, copies: StateCopies) -> AttnMetadata {
        self.state_copies = copies;
        self
    }

    /// Gives each query token its MRoPE positions (see [`AttnMetadata::mrope_positions`]).
    pub fn with_mrope_positions(mut self, positions: Vec<[usize; 3]>) -> Result<AttnMetadata> {
        if positions.len() != self.num_tokens() {
            return Err(shape_err(
                "attn_metadata",
                format!("{} MRoPE positions for {} tokens", positions.len(), self.num_tokens()),
            ));
        }
        self.mrope_positions = positions;
        Ok(self)
    }

    /// Marks the sequences whose query rows see every key of their context (see
    /// [`AttnMetadata::bidirectional`]).
    pub fn with_bidirectional(mut self, bidirectional: Vec<bool>) -> Result<AttnMetadata> {
        if bidirectional.len() != self.seqs.len() {
            return Err(shape_err(
                "attn_metadata",
                format!("{} bidirectional flags, {} seqs", bidirectional.len(), self.seqs.len()),
            ));
        }
        self.bidirectional = bidirectional;
        Ok(self)
    }

    /// Whether sequence `i`'s query rows see all its keys (see [`AttnMetadata::bidirectional`]).
    pub fn is_bidirectional(&self, i: usize) -> bool {
        self.bidirectional.get(i).copied().unwrap_or(false)
    }

    /// The last key position query row `i` of sequence `seq` attends to.
    pub fn last_key(&self, seq: usize, i: usize) -> usize {
        let s = &self.seqs[seq];
        if self.is_bidirectional(seq) {
            s.ctx_len - 1
        } else {
            s.query_position(i)
        }
    }

    /// The sequence length that length-dependent rotary schedules (dynamic NTK, LongRoPE) see for
    /// sequence `i`: transformers runs a prompt in one forward and picks the schedule by its whole
    /// length, so every chunk of a prompt uses that, and decode steps their own length.
    pub fn schedule_len(&self, i: usize) -> usize {
        self.seqs[i].ctx_len.max(self.prompt_lens.get(i).copied().unwrap_or(0))
    }

    pub fn num_tokens(&self) -> usize {
        self.slot_mapping.len()
    }

    /// Absolute position of every flattened query token.
    pub fn positions(&self) -> Vec<usize> {
        let mut positions = vec![0usize; self.num_tokens()];
        for s in &self.seqs {
            for i in 0..s.q_len {
                positions[s.q_start + i] = s.query_position(i);
            }
        }
        positions
    }
}

/// The per-tensor scales of an FP8 (e4m3) KV cache, vLLM's `--kv-cache-dtype fp8`: a key is
/// stored as `e4m3(clamp(key / k, ±448))` and read back as that value times `k` (values alike).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8KvScales {
    pub k: f32,
    pub v: f32,
}

impl Default for Fp8KvScales {
    /// vLLM's scales where the checkpoint has none.
    fn default() -> Self {
        Fp8KvScales { k: 1.0, v: 1.0 }
    }
}

#[derive(Debug)]
pub enum KvStorage {
    /// f32 on the CPU also for an FP8 cache, whose writes keep the values e4m3 can hold.
    Cpu { k: Vec<f32>, v: Vec<f32> },
    /// In the dtype of the activations written to it (f32 or bf16).
    Cuda { k: CudaStorage, v: CudaStorage },
    /// e4m3 bytes, whatever the activations' dtype.
    CudaFp8 { k: cudarc::driver::CudaSlice<u8>, v: cudarc::driver::CudaSlice<u8> },
}

/// Keys and values of one layer: `[num_blocks, block_size, num_kv_heads, dim]`.
#[derive(Debug)]
pub struct PagedKvLayer {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub storage: KvStorage,
    /// Set for an FP8 cache.
    pub fp8: Option<Fp8KvScales>,
}

impl PagedKvLayer {
    pub fn new_cpu(num_blocks: usize, block_size: usize, num_kv_heads: usize, k_dim: usize, v_dim: usize) -> Self {
        let slots = num_blocks * block_size * num_kv_heads;
        PagedKvLayer {
            num_blocks,
            block_size,
            num_kv_heads,
            k_dim,
            v_dim,
            storage: KvStorage::Cpu { k: vec![0.0; slots * k_dim], v: vec![0.0; slots * v_dim] },
            fp8: None,
        }
    }

    /// A zeroed cache on `device` holding `dtype` (f32 or bf16 for CUDA; the CPU cache is f32),
    /// or an FP8 cache with scales 1.0 for `DType::Fp8` (see [`PagedKvLayer::with_fp8_scales`]).
    pub fn new_on(
        device: Device,
        dtype: DType,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        k_dim: usize,
        v_dim: usize,
    ) -> Result<Self> {
        let fp8 = (dtype == DType::Fp8).then(Fp8KvScales::default);
        let Device::Cuda(ordinal) = device else {
            return Ok(PagedKvLayer { fp8, ..Self::new_cpu(num_blocks, block_size, num_kv_heads, k_dim, v_dim) });
        };
        let slots = num_blocks * block_size * num_kv_heads;
        let dev = crate::cuda::device(ordinal)?;
        let storage = crate::cuda::attention::new_cache(&dev, dtype, slots * k_dim, slots * v_dim)?;
        Ok(PagedKvLayer { num_blocks, block_size, num_kv_heads, k_dim, v_dim, storage, fp8 })
    }

    /// An FP8 cache's scales from the checkpoint (its `k_scale` and `v_scale` of this layer).
    pub fn with_fp8_scales(mut self, scales: Fp8KvScales) -> Result<Self> {
        if self.fp8.is_none() {
            return Err(shape_err("kv cache", "FP8 scales for a cache that is not FP8"));
        }
        if !(scales.k.is_finite() && scales.k > 0.0 && scales.v.is_finite() && scales.v > 0.0) {
            return Err(shape_err("kv cache", format!("FP8 scales {scales:?} (each must be finite and positive)")));
        }
        self.fp8 = Some(scales);
        Ok(self)
    }

    pub fn num_slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Bytes one token occupies in this layer (keys + values, all heads), as f32.
    pub fn bytes_per_token(num_kv_heads: usize, k_dim: usize, v_dim: usize) -> usize {
        num_kv_heads * (k_dim + v_dim) * 4
    }

    /// Bytes one token occupies in a cache of `dtype`.
    pub fn bytes_per_token_as(num_kv_heads: usize, k_dim: usize, v_dim: usize, dtype: DType) -> usize {
        num_kv_heads * (k_dim + v_dim) * dtype.size_in_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces of a step over positions `q` with bidirectional `runs` (start, end).
    fn pieces(q: std::ops::Range<usize>, runs: &[(usize, usize)]) -> Result<Vec<(usize, usize, usize, bool)>> {
        let seq = AttnSeq { q_start: 100, q_len: q.len(), ctx_len: q.end, block_table: vec![7, 3] };
        Ok(attention_pieces(seq, runs.iter().map(|&(start, end)| start..end).collect())?
            .into_iter()
            .map(|(s, bidirectional)| {
                assert_eq!(s.block_table, [7, 3]);
                (s.q_start, s.q_len, s.ctx_len, bidirectional)
            })
            .collect())
    }

    #[test]
    fn a_step_splits_into_text_and_whole_image_pieces() {
        // Text, an image, text, an image that ends the step.
        assert_eq!(
            pieces(0..20, &[(12, 20), (3, 8)]).unwrap(),
            [(100, 3, 3, false), (103, 5, 8, true), (108, 4, 12, false), (112, 8, 20, true)]
        );
        // A step that starts inside an image (its first tokens a prefix hit): the rest of the
        // image sees the whole image.
        assert_eq!(pieces(5..10, &[(3, 8)]).unwrap(), [(100, 3, 8, true), (103, 2, 10, false)]);
        // Images outside the step, or none (a decode step): one causal piece.
        assert_eq!(pieces(20..21, &[(3, 8)]).unwrap(), [(100, 1, 21, false)]);
        assert_eq!(pieces(0..2, &[(3, 8)]).unwrap(), [(100, 2, 2, false)]);
        // The step ends inside an image: refused.
        assert!(pieces(0..5, &[(3, 8)]).unwrap_err().to_string().contains("3..8"));
    }

    #[test]
    fn bidirectional_rows_see_their_whole_piece() {
        let seqs = vec![
            AttnSeq { q_start: 0, q_len: 3, ctx_len: 3, block_table: vec![0] },
            AttnSeq { q_start: 3, q_len: 4, ctx_len: 7, block_table: vec![0] },
        ];
        let meta = AttnMetadata::new(seqs, 16).unwrap().with_bidirectional(vec![false, true]).unwrap();
        assert_eq!(meta.last_key(0, 1), 1);
        assert_eq!((0..4).map(|i| meta.last_key(1, i)).collect::<Vec<_>>(), [6, 6, 6, 6]);
        assert!(AttnMetadata::new(vec![], 16).unwrap().with_bidirectional(vec![true]).is_err());
    }
}
