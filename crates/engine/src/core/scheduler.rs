//! Continuous batching as vLLM's V1 scheduler does it: each step spends a token budget on the
//! running requests first (decodes and unfinished prefill chunks, oldest first), then admits
//! waiting requests with chunked prefill into what is left. When the pool runs dry the newest
//! running request is preempted: its blocks are freed and it recomputes later.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::kv_cache_manager::KvCacheManager;
use super::request::{Request, RequestStatus};
use super::{BlockId, ReqId};
use crate::encoder_cache::{EncoderCache, EncoderKey, SharedEncoderCache};
use crate::output::{FinishReason, StopReason, TokenLogprob};
use crate::params::RequestSampling;
use crate::spec_decode::{Drafter, SpecDecodeStats, SpeculativeConfig};

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub max_model_len: usize,
    pub block_size: usize,
    pub num_blocks: usize,
    pub enable_prefix_caching: bool,
    /// [`ferrite_models::CausalLM::rotary_recompute_at`]: a running sequence that grows past this
    /// length is computed again from its first token, as transformers does.
    pub recompute_at: Option<usize>,
    /// Recurrent-state slots (hybrid models; 0 for the others): one per running request.
    pub num_state_slots: usize,
    /// Recurrent states kept at block boundaries for prefix hits (hybrid models with prefix
    /// caching), in the slots after the working ones.
    pub num_state_snapshots: usize,
    /// A hybrid model speculates: each working slot has a backup slot (after the snapshots),
    /// where the state is saved before a verify step, to be restored if a draft is rejected.
    pub state_backups: bool,
    /// vLLM's `disable_chunked_mm_input`: a prefill chunk never ends inside an image's or video's
    /// placeholder run. Set for models whose image tokens attend to one another both ways
    /// ([`ferrite_models::VisionInfo::bidirectional`]), which need the whole run in one forward.
    pub disable_chunked_mm_input: bool,
    /// vLLM's `max_num_encoder_input_tokens`: the image and video tokens one step may encode
    /// (items whose encodings are at hand do not count; one item longer than this still goes,
    /// alone in its step).
    pub max_num_encoder_input_tokens: usize,
    /// Slots allocated past each step's tokens, where a draft model writes its drafts' keys
    /// (vLLM's `num_lookahead_tokens`; 0 without one).
    pub num_lookahead_tokens: usize,
}

/// A request the runner has not seen: everything it needs to run and sample it.
#[derive(Debug, Clone)]
pub struct NewRequestData {
    pub req_id: ReqId,
    pub prompt_token_ids: Vec<u32>,
    pub sampling: Arc<RequestSampling>,
    pub block_ids: Vec<BlockId>,
    /// Tokens already in the cache (prefix-cache hits).
    pub num_computed_tokens: usize,
    /// Its slot in the recurrent-state layers (hybrid models).
    pub state_slot: Option<usize>,
}

/// A request the runner already holds.
#[derive(Debug, Clone)]
pub struct CachedRequestData {
    pub req_id: ReqId,
    /// Back from preemption: `new_block_ids` replaces the block table instead of extending it.
    pub resumed_from_preemption: bool,
    pub new_block_ids: Vec<BlockId>,
    pub num_computed_tokens: usize,
    /// Its recurrent-state slot (a request back from preemption may hold another one).
    pub state_slot: Option<usize>,
}

/// One step's plan, consumed by the model runner.
#[derive(Debug, Clone, Default)]
pub struct SchedulerOutput {
    pub scheduled_new_reqs: Vec<NewRequestData>,
    pub scheduled_cached_reqs: Vec<CachedRequestData>,
    /// Tokens to compute per request, in batch order (running requests first).
    pub num_scheduled_tokens: Vec<(ReqId, usize)>,
    pub total_num_scheduled_tokens: usize,
    /// Requests finished since the previous step, whose runner state can go.
    pub finished_req_ids: Vec<ReqId>,
    /// Drafts to verify, per request: its scheduled tokens are its last token and these.
    pub scheduled_spec_decode_tokens: HashMap<ReqId, Vec<u32>>,
    /// Recurrent-state copies `(from, to)` before the step (a kept state into the working slot of
    /// a request admitted on a prefix hit) and after it (a working slot at a block boundary into a
    /// snapshot slot).
    pub state_copies: ferrite_tensor::StateCopies,
}

#[derive(Debug, Clone)]
pub struct SampledToken {
    pub token_id: u32,
    pub logprob: Option<TokenLogprob>,
}

/// What the runner computed for a [`SchedulerOutput`].
#[derive(Debug, Clone, Default)]
pub struct ModelRunnerOutput {
    /// Requests whose scheduled tokens reached the end of their known tokens: the tokens to
    /// append (more than one when drafts were accepted).
    pub sampled: HashMap<ReqId, Vec<SampledToken>>,
    /// Logprobs of prompt tokens covered by this step's chunk, in prompt order.
    pub prompt_logprobs: HashMap<ReqId, Vec<TokenLogprob>>,
    /// A draft model's or an MTP head's proposals for the next step, per request that sampled.
    pub draft_token_ids: HashMap<ReqId, Vec<u32>>,
}

/// What one sequence produced in a step.
#[derive(Debug, Clone)]
pub struct EngineCoreOutput {
    pub req_id: ReqId,
    pub new_token_ids: Vec<u32>,
    /// One per new token, for requests that asked for logprobs.
    pub new_logprobs: Vec<TokenLogprob>,
    pub new_prompt_logprobs: Option<Vec<TokenLogprob>>,
    pub finish_reason: Option<FinishReason>,
    pub stop_reason: Option<StopReason>,
    pub num_cached_tokens: usize,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<ReqId, Request>,
    waiting: VecDeque<ReqId>,
    running: Vec<ReqId>,
    finished_req_ids: Vec<ReqId>,
    num_preemptions: u64,
    spec_stats: SpecDecodeStats,
    drafter: Option<Drafter>,
    /// The runner's encodings, which the encoder budget does not charge for.
    encoder_cache: Option<SharedEncoderCache>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Scheduler {
        Scheduler {
            kv: KvCacheManager::new(
                config.num_blocks,
                config.block_size,
                config.max_model_len,
                config.enable_prefix_caching,
            )
            .with_state_slots(config.num_state_slots)
            .with_state_snapshots(config.num_state_snapshots)
            .with_lookahead_tokens(config.num_lookahead_tokens),
            config,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished_req_ids: Vec::new(),
            num_preemptions: 0,
            spec_stats: SpecDecodeStats::default(),
            drafter: None,
            encoder_cache: None,
        }
    }

    /// Lets the encoder budget see which encodings the runner holds.
    pub fn share_encoder_cache(&mut self, cache: SharedEncoderCache) {
        self.encoder_cache = Some(cache);
    }

    pub fn add_request(&mut self, req: Request) {
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, req);
    }

    pub fn kv_cache(&self) -> &KvCacheManager {
        &self.kv
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn spec_decode_stats(&self) -> SpecDecodeStats {
        self.spec_stats
    }

    /// Drafts from now on (and counts them) with the drafter `spec` describes; a draft model's
    /// drafts come from the runner (see [`Scheduler::propose_drafts`]).
    pub fn enable_speculation(&mut self, spec: &SpeculativeConfig) {
        self.spec_stats.num_speculative_tokens = spec.num_speculative_tokens;
        self.drafter = spec.drafter();
    }

    /// Sets the next step's drafts for every running request that is decoding: the host
    /// drafter's, else the draft model's (`model_drafts`, from the step just run), as many as the
    /// request may still generate after the token the step draws itself. A structured-output
    /// request whose grammar waits for the end of a reasoning section gets none: the runner
    /// starts its grammar one token at a time.
    pub fn propose_drafts(&mut self, mut model_drafts: HashMap<ReqId, Vec<u32>>) {
        if self.drafter.is_none() && model_drafts.is_empty() {
            return;
        }
        for id in &self.running {
            let Some(req) = self.requests.get_mut(id) else { continue };
            let decoding = req.num_computed_tokens + 1 == req.num_tokens() || req.restore_state;
            let after_reasoning = req.sampling.params.structured_outputs_after.as_ref().is_some_and(|m| !m.is_empty());
            if !decoding || (req.sampling.grammar.is_some() && after_reasoning) {
                continue;
            }
            let room = (req.sampling.max_tokens.saturating_sub(req.num_output_tokens()))
                .min(self.config.max_model_len.saturating_sub(req.num_tokens()))
                .saturating_sub(1);
            req.spec_token_ids = match &mut self.drafter {
                Some(drafter) => drafter.propose(*id, &req.all_token_ids, req.num_prompt_tokens, room),
                None => {
                    let mut drafts = model_drafts.remove(id).unwrap_or_default();
                    drafts.truncate(room);
                    drafts
                }
            };
        }
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Every request not yet finished, waiting ones included.
    pub fn unfinished_request_ids(&self) -> Vec<ReqId> {
        self.running.iter().chain(self.waiting.iter()).copied().collect()
    }

    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut budget = self.config.max_num_batched_tokens;
        let mut encoder = EncoderBudget::new(self.config.max_num_encoder_input_tokens);
        let mut out =
            SchedulerOutput { finished_req_ids: std::mem::take(&mut self.finished_req_ids), ..Default::default() };
        self.kv.commit_state_snapshots();
        let mut preempted = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let recompute = self.needs_recompute(id);
            if recompute {
                self.kv.free(id);
            }
            let Some(req) = self.requests.get_mut(&id) else {
                i += 1;
                continue;
            };
            if recompute {
                req.num_computed_tokens = 0;
                req.recomputed_past_switch = true;
                req.restore_state = false;
            }
            let known = req.num_tokens() - req.num_computed_tokens;
            let drafts =
                if known == 1 || req.restore_state { std::mem::take(&mut req.spec_token_ids) } else { Vec::new() };
            let (computed, wanted) = (req.num_computed_tokens, (known + drafts.len()).min(budget));
            let num_new = self.cut_at_media(id, computed, self.cut_at_snapshot(id, computed, wanted), &mut encoder);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let drafts = &drafts[..num_new.saturating_sub(known).min(drafts.len())];
            let scheduled = loop {
                let req = &self.requests[&id];
                if let Some(new_blocks) =
                    self.kv.allocate_slots(id, &req.all_token_ids, req.num_computed_tokens, num_new, &[])
                {
                    break Some(new_blocks);
                }
                // The newest running request makes room; it may be this one.
                let Some(victim) = self.running.pop() else {
                    break None;
                };
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    break None;
                }
            };
            let Some(new_block_ids) = scheduled else {
                break;
            };
            self.plan_state_snapshot(id, self.requests[&id].num_computed_tokens + num_new, &mut out);
            self.plan_state_backup(id, !drafts.is_empty(), &mut out);
            out.scheduled_cached_reqs.push(CachedRequestData {
                req_id: id,
                // A recomputed sequence starts over in fresh blocks, as one back from preemption.
                resumed_from_preemption: recompute,
                new_block_ids,
                num_computed_tokens: self.requests[&id].num_computed_tokens,
                state_slot: self.kv.state_slot(id),
            });
            out.num_scheduled_tokens.push((id, num_new));
            if !drafts.is_empty() {
                out.scheduled_spec_decode_tokens.insert(id, drafts.to_vec());
            }
            budget -= num_new;
            i += 1;
        }

        // A step that had to preempt admits nobody: the pool is already short.
        while !preempted && budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let req = &self.requests[&id];
            if let Some(mm) = &req.sampling.multimodal {
                self.kv.set_cache_keys(id, mm.cache_keys());
            }
            let (hits, num_hit_tokens) = self.kv.get_computed_blocks(id, &req.all_token_ids, req.skips_prefix_cache());
            let wanted = (req.num_tokens() - num_hit_tokens).min(budget);
            let num_new =
                self.cut_at_media(id, num_hit_tokens, self.cut_at_snapshot(id, num_hit_tokens, wanted), &mut encoder);
            if num_new == 0 {
                // Its next image does not fit this step's budget: it waits, and so does the queue.
                break;
            }
            let req = &self.requests[&id];
            let Some(_) = self.kv.allocate_slots(id, &req.all_token_ids, 0, num_new, &hits) else {
                break;
            };
            if let (Some(kept), Some(slot)) = (self.kv.take_state_restore(id), self.kv.state_slot(id)) {
                out.state_copies.before.push((kept, slot));
            }
            self.plan_state_snapshot(id, num_hit_tokens + num_new, &mut out);
            self.waiting.pop_front();
            let block_ids = self.kv.block_ids(id).to_vec();
            let Some(req) = self.requests.get_mut(&id) else {
                break;
            };
            if req.status == RequestStatus::Preempted {
                out.scheduled_cached_reqs.push(CachedRequestData {
                    req_id: id,
                    resumed_from_preemption: true,
                    new_block_ids: block_ids,
                    num_computed_tokens: num_hit_tokens,
                    state_slot: self.kv.state_slot(id),
                });
            } else {
                out.scheduled_new_reqs.push(NewRequestData {
                    req_id: id,
                    prompt_token_ids: req.prompt_token_ids().to_vec(),
                    sampling: req.sampling.clone(),
                    block_ids,
                    num_computed_tokens: num_hit_tokens,
                    state_slot: self.kv.state_slot(id),
                });
            }
            // Its prefill (or recompute) already covers the whole sequence: no recompute later.
            req.recomputed_past_switch |= self.config.recompute_at.is_some_and(|s| req.num_tokens() > s);
            req.num_cached_tokens.get_or_insert(num_hit_tokens);
            req.num_computed_tokens = num_hit_tokens;
            req.status = RequestStatus::Running;
            self.running.push(id);
            out.num_scheduled_tokens.push((id, num_new));
            budget -= num_new;
        }

        // Scheduled tokens count as computed from here on (the runner computes them this step).
        for &(id, n) in &out.num_scheduled_tokens {
            if let Some(req) = self.requests.get_mut(&id) {
                req.num_computed_tokens += n;
            }
        }
        out.total_num_scheduled_tokens = self.config.max_num_batched_tokens - budget;
        out
    }

    /// Where a hybrid model keeps a request's state for prefix hits: the end of its last full
    /// block before its last token (the last token is never a hit), once per prefill.
    fn snapshot_point(&self, id: ReqId) -> Option<usize> {
        if !self.kv.snapshots_states() {
            return None;
        }
        let n = self.requests.get(&id)?.num_tokens();
        let point = (n - 1) / self.config.block_size * self.config.block_size;
        (point > 0).then_some(point)
    }

    /// `num_new` tokens after `computed`, cut so that the chunk ends at the request's snapshot
    /// point when it would cross it: the state exists only at the end of a step.
    fn cut_at_snapshot(&self, id: ReqId, computed: usize, num_new: usize) -> usize {
        match self.snapshot_point(id) {
            Some(point) if computed < point && computed + num_new > point => point - computed,
            _ => num_new,
        }
    }

    /// `num_new` tokens after `computed`, cut for the request's images and videos as vLLM's
    /// `_try_schedule_encoder_inputs` cuts them: before an item whose encoding is not at hand and
    /// does not fit what is left of the step's encoder budget, and (with
    /// [`SchedulerConfig::disable_chunked_mm_input`]) before an item the chunk would end inside.
    /// A chunk that starts within or at such an item takes nothing this step.
    fn cut_at_media(&self, id: ReqId, computed: usize, num_new: usize, encoder: &mut EncoderBudget) -> usize {
        let Some(mm) = self.requests.get(&id).and_then(|r| r.sampling.multimodal.as_ref()) else {
            return num_new;
        };
        let cache = self.encoder_cache.as_ref().map(|c| c.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let mut runs: Vec<MediaRun> = mm
            .items
            .iter()
            .map(|(item, at)| {
                let key = EncoderCache::key(item);
                let at_hand = encoder.charged.contains(&key) || cache.as_ref().is_some_and(|c| c.contains(&key));
                MediaRun { at: at.clone(), needs_encoding: !at_hand, key }
            })
            .collect();
        runs.sort_by_key(|run| run.at.start);
        let (num_new, encoded) =
            plan_media_chunk(&runs, computed, num_new, self.config.disable_chunked_mm_input, encoder);
        encoder.charged.extend(encoded.into_iter().map(|i| runs[i].key));
        num_new
    }

    /// Keeps the request's state after this step when the step ends at its snapshot point.
    fn plan_state_snapshot(&mut self, id: ReqId, end: usize, out: &mut SchedulerOutput) {
        if self.snapshot_point(id) != Some(end) {
            return;
        }
        if let (Some(slot), Some(kept)) = (self.kv.state_slot(id), self.kv.reserve_state_snapshot(id, end)) {
            out.state_copies.after.push((slot, kept));
        }
    }

    /// A hybrid request's state copies around speculation, before its step: the state saved
    /// before a rejected verify step back into its working slot, then (for a step that verifies
    /// drafts) the working state into the backup slot.
    fn plan_state_backup(&mut self, id: ReqId, verifies: bool, out: &mut SchedulerOutput) {
        let (Some(slot), true) = (self.kv.state_slot(id), self.config.state_backups) else {
            return;
        };
        let backup = slot + self.config.num_state_slots + self.config.num_state_snapshots;
        if let Some(req) = self.requests.get_mut(&id) {
            if std::mem::take(&mut req.restore_state) {
                out.state_copies.before.push((backup, slot));
            }
        }
        if verifies {
            out.state_copies.before.push((slot, backup));
        }
    }

    /// Whether a running sequence has just grown past the rotary switch with its cache computed
    /// below it (see [`SchedulerConfig::recompute_at`]).
    fn needs_recompute(&self, id: ReqId) -> bool {
        match (self.config.recompute_at, self.requests.get(&id)) {
            (Some(switch), Some(req)) => !req.recomputed_past_switch && req.num_tokens() > switch,
            _ => false,
        }
    }

    fn preempt(&mut self, id: ReqId) {
        self.kv.free(id);
        if let Some(req) = self.requests.get_mut(&id) {
            req.status = RequestStatus::Preempted;
            req.num_computed_tokens = 0;
            req.spec_token_ids.clear();
            req.restore_state = false;
        }
        self.num_preemptions += 1;
        self.waiting.push_front(id);
        tracing::debug!(req = id, "preempted");
    }

    /// Appends sampled tokens, applies the token-level stop rules and retires finished requests.
    pub fn update_from_output(&mut self, so: &SchedulerOutput, mut out: ModelRunnerOutput) -> Vec<EngineCoreOutput> {
        let mut outputs = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut finished = Vec::new();
        for &(id, num_scheduled) in &so.num_scheduled_tokens {
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            let sampled = out.sampled.remove(&id).unwrap_or_default();
            let new_prompt_logprobs = out.prompt_logprobs.remove(&id);
            if sampled.is_empty() && new_prompt_logprobs.is_none() {
                continue;
            }
            let mut o = EngineCoreOutput {
                req_id: id,
                new_token_ids: Vec::new(),
                new_logprobs: Vec::new(),
                new_prompt_logprobs,
                finish_reason: None,
                stop_reason: None,
                num_cached_tokens: req.num_cached_tokens.unwrap_or(0),
            };
            if let Some(drafts) = so.scheduled_spec_decode_tokens.get(&id).filter(|_| !sampled.is_empty()) {
                // The step computed every draft's position; those past the first rejection are
                // computed again from the token drawn in its place.
                let accepted = sampled.len() - 1;
                if accepted < drafts.len() && self.config.state_backups && self.kv.state_slot(id).is_some() {
                    // A recurrent state cannot drop the rejected drafts: the step starts over
                    // from the state saved before it.
                    req.num_computed_tokens -= num_scheduled;
                    req.restore_state = true;
                } else {
                    req.num_computed_tokens -= drafts.len() - accepted;
                }
                self.spec_stats.observe(drafts.len(), accepted);
            }
            for s in sampled {
                req.all_token_ids.push(s.token_id);
                o.new_token_ids.push(s.token_id);
                o.new_logprobs.extend(s.logprob);
                if req.check_stop(self.config.max_model_len) {
                    if let RequestStatus::Finished(reason) = req.status {
                        o.finish_reason = Some(reason);
                    }
                    o.stop_reason = req.stop_reason.clone();
                    finished.push(id);
                    break;
                }
            }
            outputs.push(o);
        }
        for id in finished {
            self.retire(id);
        }
        outputs
    }

    /// Ends requests from outside the token loop: aborts, stop strings, failures.
    pub fn finish_requests(&mut self, ids: &[ReqId], reason: FinishReason) {
        for &id in ids {
            if let Some(req) = self.requests.get_mut(&id) {
                req.status = RequestStatus::Finished(reason);
                self.retire(id);
            }
        }
    }

    /// Forgets the content of free cached blocks: a failed step may have half-written them.
    pub fn evict_free_cached_blocks(&mut self) {
        self.kv.evict_free_cached_blocks();
    }

    fn retire(&mut self, id: ReqId) {
        if let Some(drafter) = &mut self.drafter {
            drafter.finish(id);
        }
        self.kv.free(id);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&r| r != id);
        self.requests.remove(&id);
        self.finished_req_ids.push(id);
    }
}

/// One image or video of a request as a step's planning sees it.
struct MediaRun {
    /// Its placeholder positions.
    at: std::ops::Range<usize>,
    /// Its encoding is neither cached nor made by another request this step.
    needs_encoding: bool,
    key: EncoderKey,
}

/// What is left of a step's encoder budget, and the items charged to it so far.
pub(crate) struct EncoderBudget {
    left: usize,
    full: usize,
    charged: std::collections::HashSet<EncoderKey>,
}

impl EncoderBudget {
    fn new(full: usize) -> EncoderBudget {
        EncoderBudget { left: full, full, charged: Default::default() }
    }
}

/// How many of `num_new` tokens after `computed` a chunk takes among `runs` (sorted by position),
/// and which runs it encodes (see [`Scheduler::cut_at_media`]); charges `encoder` for those.
fn plan_media_chunk(
    runs: &[MediaRun],
    computed: usize,
    num_new: usize,
    unsplit: bool,
    encoder: &mut EncoderBudget,
) -> (usize, Vec<usize>) {
    let mut num_new = num_new;
    let mut encoded = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let end = computed + num_new;
        if run.at.start >= end {
            break;
        }
        if run.at.end <= computed {
            continue;
        }
        let stop_before = run.at.start.saturating_sub(computed);
        if unsplit && end < run.at.end {
            num_new = stop_before;
            break;
        }
        if !run.needs_encoding {
            continue;
        }
        // An item longer than the whole budget goes alone, first in its step.
        let fits = run.at.len() <= encoder.left || encoder.left == encoder.full;
        if !fits {
            num_new = stop_before;
            break;
        }
        encoder.left = encoder.left.saturating_sub(run.at.len());
        encoded.push(i);
    }
    (num_new, encoded)
}

#[cfg(test)]
mod media_chunk_tests {
    use super::*;

    fn runs(list: &[(usize, usize, bool)]) -> Vec<MediaRun> {
        list.iter()
            .enumerate()
            .map(|(k, &(start, end, needs_encoding))| MediaRun {
                at: start..end,
                needs_encoding,
                key: (k as u64, [1, 1, 1], "image"),
            })
            .collect()
    }

    #[test]
    fn unsplit_chunks_stop_before_an_image_they_cannot_finish() {
        let images = runs(&[(4, 10, false), (20, 24, false)]);
        let plan =
            |computed, num_new| plan_media_chunk(&images, computed, num_new, true, &mut EncoderBudget::new(99)).0;
        // Ends inside the first run: stops at its start.
        assert_eq!(plan(0, 6), 4);
        // Reaches the end of a run, or stays clear of them: as asked.
        assert_eq!(plan(0, 10), 10);
        assert_eq!(plan(10, 5), 5);
        assert_eq!(plan(2, 2), 2);
        // Starts at or inside a run (a prefix hit inside an image) and cannot finish it: nothing.
        assert_eq!(plan(4, 3), 0);
        assert_eq!(plan(8, 1), 0);
        assert_eq!(plan(8, 2), 2);
        // The second run cut the same way.
        assert_eq!(plan(12, 10), 8);
        // Without the rule a chunk may end anywhere.
        assert_eq!(plan_media_chunk(&images, 0, 6, false, &mut EncoderBudget::new(99)).0, 6);
    }

    #[test]
    fn the_encoder_budget_defers_images_that_do_not_fit() {
        // Three images of 6 tokens, the middle one's encoding at hand; a budget of 8.
        let images = runs(&[(2, 8, true), (10, 16, false), (18, 24, true)]);
        let mut budget = EncoderBudget::new(8);
        // The first image fits and is charged; the third does not: the chunk stops before it.
        assert_eq!(plan_media_chunk(&images, 0, 30, false, &mut budget), (18, vec![0]));
        assert_eq!(budget.left, 2);
        // A later request starting inside that image gets nothing this step.
        let mut budget = EncoderBudget { left: 2, ..EncoderBudget::new(8) };
        assert_eq!(plan_media_chunk(&images, 20, 4, false, &mut budget), (0, vec![]));
        // An image longer than the whole budget goes when nothing else was encoded this step.
        let long = runs(&[(0, 12, true)]);
        let mut budget = EncoderBudget::new(8);
        assert_eq!(plan_media_chunk(&long, 0, 12, false, &mut budget), (12, vec![0]));
        assert_eq!(plan_media_chunk(&long, 0, 12, false, &mut budget), (0, vec![]));
    }
}
