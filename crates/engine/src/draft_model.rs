//! The `draft_model` drafter: a smaller checkpoint sharing the target's tokenizer proposes each
//! decoding request's next drafts after every step (vLLM V1's draft-model proposer).
//!
//! Each draft is drawn as the target draws the token at that position ([`crate::sampler::draw_tokens`]):
//! the request's logits processors (penalties, bad words, bias, min-tokens), then greedy, or
//! temperature, min-p, top-k and top-p with the same Philox uniforms, keyed by the request's
//! seed and the token's index in the output. Verification keeps a draft where the target's own draw
//! equals it, so the target's tokens are exactly those it draws without speculation, and the
//! shared uniforms couple the two draws (an exponential race, i.e. Gumbel-max): a draft whose
//! distribution is close to the target's agrees with it at temperature > 0 about as often as
//! the rejection sampler's min(1, p/q) accepts, where independent draws would agree only with
//! probability sum(p q).
//!
//! Its KV cache has the target's geometry and is addressed through the target's block tables, so
//! it needs no allocator of its own: the scheduler allocates `k` slots past each step's tokens
//! (its lookahead), where the draft writes the keys of the drafts it feeds back in.
//!
//! Per request the drafter remembers how far its keys hold the request's real tokens. Keys it
//! wrote for drafts stay valid as far as the target accepted them; everything after is computed
//! again in the next proposal's first forward, which also covers the whole prompt on a request's
//! first proposal (after a prefix hit or preemption too: the draft's keys in shared blocks are
//! rewritten with the same values rather than trusted). Tokens past the step's token budget
//! (`max_num_batched_tokens`) go through forwards of their own first, so that a long prompt is
//! caught up in chunks, as the target computes it.

use std::collections::HashMap;

use ferrite_models::{CausalLM, ForwardInput};
use ferrite_tensor::{AttnMetadata, AttnSeq, Device, PagedKvLayer};

use crate::core::ReqId;
use crate::error::{EngineError, Result};
use crate::spec_decode::{draw_drafts, DraftTarget};

pub struct DraftModel {
    model: Box<dyn CausalLM>,
    kv_caches: Vec<PagedKvLayer>,
    on_cpu: bool,
    block_size: usize,
    num_speculative_tokens: usize,
    /// Sequences longer than this get no drafts (the draft's context, or the configured bound).
    max_model_len: usize,
    /// Most tokens one forward computes.
    max_forward_tokens: usize,
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

impl DraftModel {
    /// `model`'s KV cache, `num_blocks` of `block_size` slots like the target's; forwards of at
    /// most `max_forward_tokens` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Box<dyn CausalLM>,
        device: Device,
        kv_dtype: ferrite_tensor::DType,
        num_blocks: usize,
        block_size: usize,
        num_speculative_tokens: usize,
        max_model_len: usize,
        max_forward_tokens: usize,
    ) -> Result<DraftModel> {
        let kv_caches = model.info().allocate_caches(device, kv_dtype, num_blocks, block_size, 0)?;
        Ok(DraftModel {
            model,
            kv_caches,
            on_cpu: device == Device::Cpu,
            block_size,
            num_speculative_tokens,
            max_model_len,
            max_forward_tokens: max_forward_tokens.max(1),
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

    /// Up to `k` drafts per request: one forward over each request's tokens the draft has not
    /// seen (the newest at least), then one single-token forward per further draft.
    pub fn propose(&mut self, reqs: &[DraftTarget<'_>]) -> Result<HashMap<ReqId, Vec<u32>>> {
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
        self.catch_up(&mut active)?;
        // The first forward: every unseen token, logits at each request's last.
        let (mut tokens, mut seqs, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for &(r, _, from) in &active {
            let q_start = tokens.len();
            tokens.extend_from_slice(&r.tokens[from..]);
            let q_len = tokens.len() - q_start;
            rows.push(tokens.len() - 1);
            seqs.push(AttnSeq { q_start, q_len, ctx_len: r.tokens.len(), block_table: r.block_table.to_vec() });
        }
        let first: Vec<(&DraftTarget, &[u32])> = active.iter().map(|&(r, _, _)| (r, &[][..])).collect();
        for (&(r, _, _), d) in active.iter().zip(self.forward(&tokens, seqs, &rows, &first)?) {
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
                tokens.push(*drafts[&r.id].last().expect("a first draft"));
                fed.push(i);
            }
            if fed.is_empty() {
                break;
            }
            let after: Vec<(&DraftTarget, &[u32])> =
                fed.iter().map(|&i| (active[i].0, drafts[&active[i].0.id].as_slice())).collect();
            for (&i, d) in fed.iter().zip(self.forward(&tokens, seqs, &rows, &after)?) {
                drafts.get_mut(&active[i].0.id).expect("first draft above").push(d);
            }
        }
        // Every draft but the last was fed back, its key written after the request's tokens.
        for &(r, _, _) in &active {
            let progress = self.requests.get_mut(&r.id).expect("registered above");
            let fed = &drafts[&r.id];
            progress.valid = r.tokens.len();
            progress.written = fed[..fed.len() - 1].to_vec();
        }
        Ok(drafts)
    }

    /// Feeds the requests' unseen tokens in forwards of at most the token budget until what is
    /// left (at least each request's newest token) fits one, advancing each request's `from`.
    fn catch_up(&mut self, active: &mut [(&DraftTarget<'_>, usize, usize)]) -> Result<()> {
        let unseen = |active: &[(&DraftTarget, usize, usize)]| -> usize {
            active.iter().map(|&(r, _, from)| r.tokens.len() - from).sum()
        };
        while unseen(active) > self.max_forward_tokens {
            let (mut tokens, mut seqs) = (Vec::new(), Vec::new());
            for (r, _, from) in active.iter_mut() {
                let room = self.max_forward_tokens - tokens.len();
                // The newest token stays for the forward that drafts after it.
                let n = (r.tokens.len() - 1 - *from).min(room);
                if n == 0 {
                    continue;
                }
                let q_start = tokens.len();
                tokens.extend_from_slice(&r.tokens[*from..*from + n]);
                *from += n;
                seqs.push(AttnSeq { q_start, q_len: n, ctx_len: *from, block_table: r.block_table.to_vec() });
            }
            // More requests than the budget has tokens: their newest tokens go together anyway.
            if tokens.is_empty() {
                break;
            }
            let meta = AttnMetadata::new(seqs, self.block_size)?;
            // One row of logits, discarded: the forward is for the keys it writes.
            let input = ForwardInput { tokens: &tokens, meta: &meta, logit_rows: &[0], embeds: None };
            let (model, caches) = (self.model.as_ref(), &mut self.kv_caches);
            let mut run = || -> Result<()> { model.forward(&input, caches).map(|_| ()).map_err(Into::into) };
            if self.on_cpu {
                ferrite_tensor::cpu::on_worker(run)?
            } else {
                run()?
            }
        }
        Ok(())
    }

    /// The draft's token after each of `rows`: row `j` continues `draws[j]`'s request after the
    /// drafts it has so far, drawn as the target would draw that token.
    fn forward(
        &mut self,
        tokens: &[u32],
        seqs: Vec<AttnSeq>,
        rows: &[usize],
        draws: &[(&DraftTarget<'_>, &[u32])],
    ) -> Result<Vec<u32>> {
        let meta = AttnMetadata::new(seqs, self.block_size)?;
        let input = ForwardInput { tokens, meta: &meta, logit_rows: rows, embeds: None };
        let (model, caches) = (self.model.as_ref(), &mut self.kv_caches);
        let mut run = || -> Result<Vec<u32>> { draw_drafts(&model.forward(&input, caches)?, draws) };
        // A CUDA forward stays on the thread its context is current on.
        let drawn = if self.on_cpu { ferrite_tensor::cpu::on_worker(run)? } else { run()? };
        if drawn.len() < rows.len() {
            return Err(EngineError::Internal(format!("the draft returned {} rows for {}", drawn.len(), rows.len())));
        }
        Ok(drawn)
    }
}

#[cfg(test)]
mod tests {
    use ferrite_tensor::Tensor;

    use crate::params::{RequestSampling, SamplingParams};
    use crate::sampler::{draw_tokens, SampleRow};

    /// A draft drawn with the target's uniforms agrees with the target's draw far more often
    /// than an independent draw would (sum p q), at least as often as Gumbel-max coupling
    /// guarantees ((1 - TV) / (1 + TV)); drawn at another position's uniforms, it is back to
    /// independent.
    #[test]
    fn shared_uniforms_couple_the_draft_with_the_target() {
        let (target, draft) = ([0.3f32, 1.2, -0.4, 0.9, 0.0], [0.6f32, 1.0, -0.2, 1.1, -0.5]);
        let probs = |l: &[f32; 5]| {
            let z: f32 = l.iter().map(|x| x.exp()).sum();
            l.map(|x| x.exp() / z)
        };
        let (p, q) = (probs(&target), probs(&draft));
        let tv: f32 = p.iter().zip(&q).map(|(a, b)| (a - b).abs()).sum::<f32>() / 2.0;
        let independent: f32 = p.iter().zip(&q).map(|(a, b)| a * b).sum();
        let rate = |step_offset: usize| {
            let trials = 20_000;
            let agreed = (0..trials)
                .filter(|&seed| {
                    let sampling = RequestSampling {
                        multimodal: None,
                        max_tokens: 16,
                        eos_token_id: None,
                        stop_token_ids: vec![],
                        min_tokens_mask: vec![],
                        seed,
                        params: SamplingParams { temperature: 1.0, ..Default::default() }.normalized(),
                        grammar: None,
                        bad_words_token_ids: Vec::new(),
                    };
                    let output = vec![7u32; 3 + step_offset];
                    let draw = |logits: &[f32; 5], output: &[u32]| {
                        let t = Tensor::from_f32(logits.to_vec(), &[1, 5]).unwrap();
                        draw_tokens(&t, &[SampleRow { sampling: &sampling, prompt: &[], output }]).unwrap()[0]
                    };
                    draw(&target, &output[..3]) == draw(&draft, &output)
                })
                .count();
            agreed as f32 / trials as f32
        };
        let (coupled, shifted) = (rate(0), rate(1));
        println!("tv {tv:.3}, independent {independent:.3}, coupled {coupled:.3}, shifted {shifted:.3}");
        assert!(coupled >= (1.0 - tv) / (1.0 + tv) - 0.01, "coupled {coupled} below the Gumbel bound");
        assert!(coupled > independent + 0.3, "coupled {coupled} vs independent {independent}");
        assert!((shifted - independent).abs() < 0.02, "another position's uniforms: {shifted} vs {independent}");
    }
}
