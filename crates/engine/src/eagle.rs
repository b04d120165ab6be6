//! The drafters that read the target's hidden states (vLLM's EAGLE proposer): `mtp`, the target
//! checkpoint's multi-token-prediction head, and `eagle` (EAGLE-1), a head of its own checkpoint,
//! which both read its final hidden state; and `eagle3`, a head of its own checkpoint, which
//! reads its residual stream at three layers.
//!
//! The head's cache holds, at each position `i`, what it computed from the target's hidden
//! state at `i` and the token at `i + 1`. So every step, after the target's forward and its
//! draws, the head goes over the positions the step computed whose next token is now known: a
//! prompt chunk's, or a verify step's up to the last accepted draft (the rows past it computed
//! rejected drafts). Its last row, for a request that drew a token, predicts the token after
//! that one: the first draft. Each further draft feeds the previous one at the next position,
//! with the head's own output standing in for the target's hidden state there, as vLLM does; the
//! next step's pass rewrites those positions from the target's.
//!
//! Drafts are drawn as the target draws the token at that position (see
//! [`crate::draft_model`]), so the target's tokens are exactly those it draws without
//! speculation. A prefix-cache hit reuses the head's cache of the hit blocks; its last position
//! there was computed with the earlier request's next token, which only shades the drafts.

use std::collections::HashMap;

use ferrite_models::{CausalLM, DraftHead, HiddenTap, KvLayerSpec};
use ferrite_tensor::{ops, AttnMetadata, AttnSeq, Device, PagedKvLayer, Tensor};

use crate::core::ReqId;
use crate::error::{EngineError, Result};
use crate::spec_decode::{draw_drafts, DraftTarget};

pub struct EagleDrafter {
    /// An EAGLE-3 head; `None` for the target's own MTP head.
    own_head: Option<Box<dyn DraftHead>>,
    kv: PagedKvLayer,
    on_cpu: bool,
    block_size: usize,
    num_speculative_tokens: usize,
}

/// One request the step computed (`room` 0: the head only catches up on it).
pub struct EagleRequest<'a> {
    pub target: DraftTarget<'a>,
    /// The step computed positions `start..start + computed`, at rows `row..` of its hidden states.
    pub start: usize,
    pub computed: usize,
    pub row: usize,
}

impl EagleDrafter {
    /// The drafter of `own_head` (`None`: the target's MTP head), its cache (the head's attention
    /// layer `spec`) of `num_blocks` of `block_size` slots like the target's.
    pub fn new(
        own_head: Option<Box<dyn DraftHead>>,
        spec: KvLayerSpec,
        device: Device,
        kv_dtype: ferrite_tensor::DType,
        num_blocks: usize,
        block_size: usize,
        num_speculative_tokens: usize,
    ) -> Result<EagleDrafter> {
        let kv =
            PagedKvLayer::new_on(device, kv_dtype, num_blocks, block_size, spec.num_kv_heads, spec.k_dim, spec.v_dim)?;
        Ok(EagleDrafter { own_head, kv, on_cpu: device == Device::Cpu, block_size, num_speculative_tokens })
    }

    /// Which of the target's hidden states the runner keeps for the head after each step.
    pub fn hidden_tap(&self) -> HiddenTap {
        match &self.own_head {
            Some(head) => head.hidden_tap(),
            None => HiddenTap::Final,
        }
    }

    /// Catches the head up on the step's positions and drafts for the requests that want drafts.
    /// `hidden` is the target's hidden state ([`EagleDrafter::hidden_tap`]) at every row of the step.
    pub fn propose(
        &mut self,
        model: &dyn CausalLM,
        hidden: &Tensor,
        reqs: &[EagleRequest<'_>],
    ) -> Result<HashMap<ReqId, Vec<u32>>> {
        let mut drafts: HashMap<ReqId, Vec<u32>> = HashMap::new();
        // Positions whose next token is known: up to the newest token's predecessor.
        let spans: Vec<(&EagleRequest, usize)> = reqs
            .iter()
            .map(|r| (r, r.computed.min(r.target.tokens.len().saturating_sub(1 + r.start))))
            .filter(|&(_, n)| n > 0)
            .collect();
        if spans.is_empty() {
            return Ok(drafts);
        }
        let (mut next, mut rows, mut seqs, mut logit_rows, mut drafting) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(r, n) in &spans {
            let (q_start, t) = (next.len(), &r.target);
            next.extend_from_slice(&t.tokens[r.start + 1..r.start + n + 1]);
            rows.extend(r.row..r.row + n);
            let ctx_len = r.start + n;
            seqs.push(AttnSeq { q_start, q_len: n, ctx_len, block_table: t.block_table.to_vec() });
            // Its last position is the newest token's predecessor: it predicts the first draft.
            if t.room > 0 && ctx_len + 1 == t.tokens.len() {
                logit_rows.push(next.len() - 1);
                drafting.push(t);
            }
        }
        let hidden = ops::gather_rows(hidden, &rows)?;
        let first: Vec<(&DraftTarget, &[u32])> = drafting.iter().map(|&t| (t, &[][..])).collect();
        let (drawn, mut out) = self.forward(model, &next, &hidden, seqs, &logit_rows, &first)?;
        let mut out_rows = logit_rows;
        for (r, d) in drafting.iter().zip(drawn) {
            drafts.insert(r.id, vec![d]);
        }
        for step in 1..self.num_speculative_tokens {
            let fed: Vec<usize> = (0..drafting.len()).filter(|&i| drafting[i].room > step).collect();
            if fed.is_empty() {
                break;
            }
            let seqs = fed
                .iter()
                .enumerate()
                .map(|(q, &i)| {
                    let r = drafting[i];
                    let position = r.tokens.len() - 2 + step;
                    AttnSeq { q_start: q, q_len: 1, ctx_len: position + 1, block_table: r.block_table.to_vec() }
                })
                .collect();
            let tokens: Vec<u32> =
                fed.iter().map(|&i| *drafts[&drafting[i].id].last().expect("a first draft")).collect();
            let hidden = ops::gather_rows(&out, &fed.iter().map(|&i| out_rows[i]).collect::<Vec<_>>())?;
            let after: Vec<(&DraftTarget, &[u32])> =
                fed.iter().map(|&i| (drafting[i], drafts[&drafting[i].id].as_slice())).collect();
            let rows: Vec<usize> = (0..fed.len()).collect();
            let (new_drawn, new_out) = self.forward(model, &tokens, &hidden, seqs, &rows, &after)?;
            for (j, &i) in fed.iter().enumerate() {
                out_rows[i] = j;
                drafts.get_mut(&drafting[i].id).expect("first draft above").push(new_drawn[j]);
            }
            // Requests not fed this round draft no further, so their rows may go stale.
            out = new_out;
        }
        Ok(drafts)
    }

    /// The head over `next` (each row's next token) and `hidden`, and a draw after each of
    /// `logit_rows` (row `j` continues `draws[j]`'s request after the drafts it has so far).
    fn forward(
        &mut self,
        model: &dyn CausalLM,
        next: &[u32],
        hidden: &Tensor,
        seqs: Vec<AttnSeq>,
        logit_rows: &[usize],
        draws: &[(&DraftTarget<'_>, &[u32])],
    ) -> Result<(Vec<u32>, Tensor)> {
        let head = match &self.own_head {
            Some(head) => head.as_ref(),
            None => model.mtp().ok_or_else(|| EngineError::Internal("the MTP head is gone".into()))?,
        };
        let meta = AttnMetadata::new(seqs, self.block_size)?;
        let kv = &mut self.kv;
        let mut run = || -> Result<(Vec<u32>, Tensor)> {
            // A pass that only catches up still takes one row of logits, discarded.
            let rows = if logit_rows.is_empty() { &[0][..] } else { logit_rows };
            let (logits, out) = head.forward(next, hidden, &meta, rows, kv)?;
            let drawn = if logit_rows.is_empty() { Vec::new() } else { draw_drafts(&logits, draws)? };
            Ok((drawn, out))
        };
        // A CUDA forward stays on the thread its context is current on.
        if self.on_cpu {
            ferrite_tensor::cpu::on_worker(run)
        } else {
            run()
        }
    }
}
