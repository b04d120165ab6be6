//! The `draft_model` drafter: a smaller checkpoint sharing the target's tokenizer proposes each
//! decoding request's next drafts, greedily, after every step (vLLM V1's draft-model proposer).
//!
//! Its KV cache has the target's geometry and is addressed through the target's block tables, so
//! it needs no allocator of its own: the scheduler allocates `k` slots past each step's tokens
//! (its lookahead), where the draft writes the keys of the drafts it feeds back in.
//!
//! Per request the drafter remembers how far its keys hold the request's real tokens. Keys it
//! wrote for drafts stay valid as far as the target accepted them; everything after is computed
//! again in the next proposal's first forward, which also covers the whole prompt on a request's
//! first proposal (after a prefix hit or preemption too: the draft's keys in shared blocks are
//! rewritten with the same values rather than trusted).

use std::collections::HashMap;

use ferrite_models::{CausalLM, ForwardInput};
use ferrite_tensor::{ops, AttnMetadata, AttnSeq, Device, PagedKvLayer};

use crate::core::{BlockId, ReqId};
use crate::error::{EngineError, Result};

pub struct DraftModel {
    model: Box<dyn CausalLM>,
    kv_caches: Vec<PagedKvLayer>,
    on_cpu: bool,
    block_size: usize,
    num_speculative_tokens: usize,
    /// Sequences longer than this get no drafts (the draft's context, or the configured bound).
    max_model_len: usize,
    requests: HashMap<ReqId, Progress>,
}

#[derive(Default)]
struct Progress {
    /// The draft's keys hold the request's tokens `..valid`.
    valid: usize,
    /// Drafts whose keys were written from position `valid` on, in the last proposal.
    written: Vec<u32>,
    /// A token of the request lies outside the draft's vocabulary: it cannot be fed.
    unusable: bool,
}

/// One request to draft for.
pub struct DraftRequest<'a> {
    pub id: ReqId,
    /// Prompt and output so far.
    pub tokens: &'a [u32],
    pub block_table: &'a [BlockId],
    /// At most this many drafts (what the request may still generate after the next draw).
    pub room: usize,
}

impl DraftModel {
    /// `model`'s KV cache, `num_blocks` of `block_size` slots like the target's.
    pub fn new(
        model: Box<dyn CausalLM>,
        device: Device,
        kv_dtype: ferrite_tensor::DType,
        num_blocks: usize,
        block_size: usize,
        num_speculative_tokens: usize,
        max_model_len: usize,
    ) -> Result<DraftModel> {
        let kv_caches = model.info().allocate_caches(device, kv_dtype, num_blocks, block_size, 0)?;
        Ok(DraftModel {
            model,
            kv_caches,
            on_cpu: device == Device::Cpu,
            block_size,
            num_speculative_tokens,
            max_model_len,
            requests: HashMap::new(),
        })
    }

    /// Request `id` ended, or its blocks were taken back (preemption): its keys are gone.
    pub fn forget(&mut self, id: ReqId) {
        self.requests.remove(&id);
    }

    pub fn reset(&mut self) {
        self.requests.clear();
    }

    /// Up to `k` greedy drafts per request: one forward over each request's tokens the draft
    /// has not seen (the newest at least), then one single-token forward per further draft.
    pub fn propose(&mut self, reqs: &[DraftRequest<'_>]) -> Result<HashMap<ReqId, Vec<u32>>> {
        let vocab = self.model.info().vocab_size;
        // (request, drafts wanted, first position the first forward feeds)
        let mut active = Vec::new();
        for r in reqs {
            let len = r.tokens.len();
            // The last draft's key is never written: positions up to len + wanted - 2.
            let wanted = self.num_speculative_tokens.min(r.room).min((self.max_model_len + 1).saturating_sub(len));
            let progress = self.requests.entry(r.id).or_default();
            let accepted = progress
                .written
                .iter()
                .zip(r.tokens.get(progress.valid..).unwrap_or_default())
                .take_while(|(d, t)| d == t)
                .count();
            progress.valid = (progress.valid + accepted).min(len.saturating_sub(1));
            progress.written.clear();
            let unseen = &r.tokens[progress.valid..];
            progress.unusable |= unseen.iter().any(|&t| t as usize >= vocab);
            if wanted == 0 || progress.unusable || len == 0 {
                continue;
            }
            active.push((r, wanted, progress.valid));
        }
        let mut drafts: HashMap<ReqId, Vec<u32>> = HashMap::new();
        if active.is_empty() {
            return Ok(drafts);
        }
        // The first forward: every unseen token, logits at each request's last.
        let (mut tokens, mut seqs, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for &(r, _, from) in &active {
            let q_start = tokens.len();
            tokens.extend_from_slice(&r.tokens[from..]);
            let q_len = tokens.len() - q_start;
            rows.push(tokens.len() - 1);
            seqs.push(AttnSeq { q_start, q_len, ctx_len: r.tokens.len(), block_table: r.block_table.to_vec() });
        }
        let mut next = self.forward(&tokens, seqs, &rows)?;
        for (&(r, _, _), &d) in active.iter().zip(&next) {
            drafts.insert(r.id, vec![d]);
        }
        // Then one token per request still short of its drafts, fed at the position after it.
        for step in 1..self.num_speculative_tokens {
            let (mut tokens, mut seqs, mut rows, mut fed) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for (i, &(r, wanted, _)) in active.iter().enumerate() {
                if wanted <= step {
                    continue;
                }
                let pos = r.tokens.len() + step - 1;
                rows.push(tokens.len());
                seqs.push(AttnSeq {
                    q_start: tokens.len(),
                    q_len: 1,
                    ctx_len: pos + 1,
                    block_table: r.block_table.to_vec(),
                });
                tokens.push(next[i]);
                fed.push(i);
            }
            if fed.is_empty() {
                break;
            }
            let drawn = self.forward(&tokens, seqs, &rows)?;
            for (&i, &d) in fed.iter().zip(&drawn) {
                let r = active[i].0;
                self.requests.get_mut(&r.id).expect("registered above").written.push(next[i]);
                drafts.get_mut(&r.id).expect("first draft above").push(d);
                next[i] = d;
            }
        }
        for &(r, _, _) in &active {
            self.requests.get_mut(&r.id).expect("registered above").valid = r.tokens.len();
        }
        Ok(drafts)
    }

    /// The draft's greedy token after each of `rows`.
    fn forward(&mut self, tokens: &[u32], seqs: Vec<AttnSeq>, rows: &[usize]) -> Result<Vec<u32>> {
        let meta = AttnMetadata::new(seqs, self.block_size)?;
        let input = ForwardInput { tokens, meta: &meta, logit_rows: rows, embeds: None };
        let (model, caches) = (self.model.as_ref(), &mut self.kv_caches);
        let mut run = || -> Result<Vec<u32>> { Ok(ops::argmax_rows(&model.forward(&input, caches)?)?) };
        // A CUDA forward stays on the thread its context is current on.
        let drawn = if self.on_cpu { ferrite_tensor::cpu::on_worker(run)? } else { run()? };
        if drawn.len() < rows.len() {
            return Err(EngineError::Internal(format!("the draft returned {} rows for {}", drawn.len(), rows.len())));
        }
        Ok(drawn)
    }
}
