//! The model runner: keeps each request's tokens and block table, flattens a
//! [`SchedulerOutput`] into one forward batch, and samples the rows that need it. It only talks
//! to the model through [`CausalLM::forward`], so any backend runs under it.

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_models::{CausalLM, Encoded, ForwardInput, InputEmbeds, VisualGrid};
use ferrite_structured::{mask_words, Grammar, TokenConstraint};
use ferrite_tensor::ops;
use ferrite_tensor::{attention_pieces, AttnMetadata, AttnSeq, Device, PagedKvLayer, Tensor};
use rayon::prelude::*;

use crate::config::{CacheConfig, EngineConfig};
use crate::core::scheduler::{ModelRunnerOutput, SchedulerOutput};
use crate::core::{BlockId, ReqId};
use crate::draft_model::DraftModel;
use crate::eagle::{EagleDrafter, EagleRequest};
use crate::encoder_cache::{EncoderCache, EncoderCacheStats, SharedEncoderCache};
use crate::error::{EngineError, Result};
use crate::graphs::{DecodeGraphs, GraphCounts};
use crate::output::TokenLogprob;
use crate::params::RequestSampling;
use crate::sampler::{self, SampleRow};
use crate::spec_decode::DraftTarget;

struct CachedRequestState {
    /// Prompt and every token sampled so far.
    token_ids: Vec<u32>,
    num_prompt_tokens: usize,
    /// Tokens of the prefill under way: the prompt, or prompt + output when the sequence is
    /// computed again (after preemption). Length-dependent rotary schedules read it for every
    /// chunk, as one forward over the whole sequence would.
    prefill_len: usize,
    block_ids: Vec<BlockId>,
    num_computed_tokens: usize,
    /// Its slot in the recurrent-state layers (hybrid models).
    state_slot: Option<usize>,
    sampling: Arc<RequestSampling>,
    /// Prompt positions whose logprobs were already returned (they survive preemption).
    num_prompt_logprobs_done: usize,
    /// MRoPE: each prompt token's (temporal, height, width) position and the offset of later
    /// positions; `None` where a token's three positions are its own (text-only prompts).
    mrope: Option<(Vec<[usize; 3]>, i64)>,
    /// The vision encoder's output per prompt image, held from the step that first reads the
    /// image until the prefill has passed it (the [`EncoderCache`] may keep it longer).
    encoded: Vec<Option<Arc<Encoded>>>,
}

impl CachedRequestState {
    /// Drafts the request may take after its newest token: what it may still generate, within
    /// `max_model_len`, less the token the verify step draws itself.
    fn draft_room(&self, max_model_len: usize) -> usize {
        let len = self.token_ids.len();
        let generated = len - self.num_prompt_tokens;
        self.sampling.max_tokens.saturating_sub(generated).min(max_model_len.saturating_sub(len)).saturating_sub(1)
    }

    /// What a model drafter reads of the request.
    fn draft_target(&self, id: ReqId, room: usize) -> DraftTarget<'_> {
        DraftTarget {
            id,
            tokens: &self.token_ids,
            num_prompt_tokens: self.num_prompt_tokens,
            sampling: &self.sampling,
            block_table: &self.block_ids,
            room,
        }
    }

    /// The rotary positions of sequence positions `range`.
    fn mrope_positions(&self, range: std::ops::Range<usize>) -> Vec<[usize; 3]> {
        range
            .map(|p| match &self.mrope {
                Some((prompt, _)) if p < prompt.len() => prompt[p],
                Some((_, delta)) => [(p as i64 + delta).max(0) as usize; 3],
                None => [p; 3],
            })
            .collect()
    }
}

pub struct ModelRunner {
    model: Box<dyn CausalLM>,
    kv_caches: Vec<PagedKvLayer>,
    /// CPU forwards run on the CPU backend's thread pool (`cpu::on_worker`).
    on_cpu: bool,
    block_size: usize,
    requests: HashMap<ReqId, CachedRequestState>,
    /// Decode steps as CUDA graphs (none on the CPU or with `enforce_eager`).
    graphs: Option<DecodeGraphs>,
    /// Encodings shared by requests that bring the same image or video (and read by the
    /// scheduler's encoder budget).
    encoder_cache: SharedEncoderCache,
    /// The model's image tokens attend to one another both ways
    /// ([`ferrite_models::VisionInfo::bidirectional`]).
    bidirectional_media: bool,
    /// Where each structured-output request is in its grammar.
    constraints: HashMap<ReqId, TokenConstraint>,
    /// Structured-output requests still in their reasoning section: the grammar starts once
    /// the output ends with the marker.
    reasoning: HashMap<ReqId, (Vec<u32>, Arc<Grammar>)>,
    /// The `draft_model` drafter, run after each step for the requests that sampled.
    draft: Option<DraftModel>,
    /// The `mtp`, `eagle` or `eagle3` drafter: a head fed the target's hidden states after every step.
    eagle: Option<EagleDrafter>,
    max_model_len: usize,
}

/// Which logit rows belong to which request.
enum RowUse {
    /// The draw after the request's known tokens and the first `usize` of its drafts.
    Sample(ReqId, usize),
    /// Logits at prompt position `pos` score the prompt token at `pos + 1`.
    PromptLogprob(ReqId, usize),
}

impl ModelRunner {
    pub fn new(
        model: Box<dyn CausalLM>,
        draft: Option<DraftModel>,
        eagle: Option<EagleDrafter>,
        cache: &CacheConfig,
        config: &EngineConfig,
        max_model_len: usize,
    ) -> Result<ModelRunner> {
        let _span = tracing::info_span!("allocate_kv_cache", blocks = cache.num_blocks, block_size = cache.block_size)
            .entered();
        // A hybrid model's state layers get one slot more than the working, kept and backup ones: the
        // slot the padding sequences of a decode graph write (and nothing reads).
        let kept = cache.state_slots + cache.state_snapshots + cache.state_backups;
        let pad_state_slot = (cache.state_slots > 0).then_some(kept);
        let kv_caches = model.info().allocate_caches(
            config.device,
            cache.dtype,
            cache.num_blocks,
            cache.block_size,
            kept + usize::from(pad_state_slot.is_some()),
        )?;
        let graphs = DecodeGraphs::new(config.device, config.enforce_eager, pad_state_slot)?;
        let bidirectional_media = model.info().vision.as_ref().is_some_and(|v| v.bidirectional);
        Ok(ModelRunner {
            // vLLM's encoder cache holds a step's worth of encoder rows at least.
            encoder_cache: Arc::new(std::sync::Mutex::new(EncoderCache::new(config.max_num_batched_tokens))),
            bidirectional_media,
            model,
            kv_caches,
            on_cpu: config.device == Device::Cpu,
            block_size: cache.block_size,
            requests: HashMap::new(),
            graphs,
            constraints: HashMap::new(),
            reasoning: HashMap::new(),
            draft,
            eagle,
            max_model_len,
        })
    }

    /// Encodings made and served from the encoder cache so far.
    pub fn encoder_cache_stats(&self) -> EncoderCacheStats {
        self.encoder_cache().stats
    }

    /// The encodings at hand, for the scheduler's encoder budget.
    pub fn shared_encoder_cache(&self) -> SharedEncoderCache {
        self.encoder_cache.clone()
    }

    fn encoder_cache(&self) -> std::sync::MutexGuard<'_, EncoderCache> {
        self.encoder_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Decode steps captured and replayed as CUDA graphs so far.
    pub fn graph_counts(&self) -> GraphCounts {
        self.graphs.as_ref().map(|g| g.counts).unwrap_or_default()
    }

    /// Forgets every request (after a failure left the bookkeeping in doubt).
    pub fn reset(&mut self) {
        self.requests.clear();
        self.constraints.clear();
        self.reasoning.clear();
        if let Some(draft) = &mut self.draft {
            draft.reset();
        }
    }

    fn update_states(&mut self, so: &SchedulerOutput) -> Result<()> {
        for id in &so.finished_req_ids {
            self.requests.remove(id);
            self.constraints.remove(id);
            self.reasoning.remove(id);
            if let Some(draft) = &mut self.draft {
                draft.forget(*id);
            }
        }
        for new in &so.scheduled_new_reqs {
            if let Some(grammar) = &new.sampling.grammar {
                match &new.sampling.params.structured_outputs_after {
                    Some(marker) if !marker.is_empty() => {
                        self.reasoning.insert(new.req_id, (marker.clone(), grammar.clone()));
                    }
                    _ => {
                        self.constraints.insert(new.req_id, grammar.start());
                    }
                }
            }
            let mrope = match (&new.sampling.multimodal, self.model.vision()) {
                (Some(mm), Some(vision)) => {
                    let grids: Vec<VisualGrid> = mm.items.iter().map(|(item, _)| item.grid()).collect();
                    vision.mrope_positions(&new.prompt_token_ids, &grids)?
                }
                _ => None,
            };
            let items = new.sampling.multimodal.as_ref().map_or(0, |mm| mm.items.len());
            self.requests.insert(
                new.req_id,
                CachedRequestState {
                    mrope,
                    encoded: vec![None; items],
                    token_ids: new.prompt_token_ids.clone(),
                    num_prompt_tokens: new.prompt_token_ids.len(),
                    prefill_len: new.prompt_token_ids.len(),
                    block_ids: new.block_ids.clone(),
                    num_computed_tokens: new.num_computed_tokens,
                    state_slot: new.state_slot,
                    sampling: new.sampling.clone(),
                    num_prompt_logprobs_done: 0,
                },
            );
        }
        for cached in &so.scheduled_cached_reqs {
            let Some(state) = self.requests.get_mut(&cached.req_id) else {
                continue;
            };
            if cached.resumed_from_preemption {
                state.block_ids.clone_from(&cached.new_block_ids);
                state.prefill_len = state.token_ids.len();
                if let Some(draft) = &mut self.draft {
                    draft.forget(cached.req_id);
                }
            } else {
                state.block_ids.extend_from_slice(&cached.new_block_ids);
            }
            state.num_computed_tokens = cached.num_computed_tokens;
            state.state_slot = cached.state_slot;
        }
        Ok(())
    }

    /// The encoder outputs the rows of this step's prompt chunks take: for each scheduled
    /// request whose chunk `[start, end)` covers image placeholders, those rows of the image's
    /// embeddings (encoding an image the first time a chunk reaches it). Only the placeholder
    /// tokens of an item's run take embeddings, in order: the row breaks within an image's run
    /// ([`VisionInfo::row_breaks`](ferrite_models::VisionInfo)) keep their token embeddings.
    fn input_embeds(&mut self, chunks: &[(ReqId, usize, usize, usize)]) -> Result<Option<InputEmbeds>> {
        let (mut rows, mut parts, mut deepstack_parts) = (Vec::new(), Vec::new(), Vec::<Vec<Tensor>>::new());
        for &(id, q_start, start, end) in chunks {
            let Some(state) = self.requests.get_mut(&id) else { continue };
            let Some(mm) = state.sampling.multimodal.clone() else { continue };
            for (k, (item, at)) in mm.items.iter().enumerate() {
                let (from, to) = (at.start.max(start), at.end.min(end));
                if from >= to {
                    continue;
                }
                if state.encoded[k].is_none() {
                    let vision = self.model.vision().ok_or_else(|| {
                        EngineError::Internal(format!("request {id} has images but the model no vision encoder"))
                    })?;
                    let mut cache = self.encoder_cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    state.encoded[k] = Some(cache.get_or_encode(item, || {
                        let _span =
                            tracing::debug_span!("encode", kind = item.visual.modality(), grid = ?item.grid_thw)
                                .entered();
                        vision.encode(&item.pixel_values, item.grid_thw)
                    })?);
                }
                let encoded = state.encoded[k].as_ref().expect("encoded above");
                let placeholder = self.model.info().vision.as_ref().and_then(|v| v.token_id(item.visual));
                let takes = |p: &usize| Some(state.token_ids[*p]) == placeholder;
                let before = (at.start..from).filter(takes).count();
                let positions: Vec<usize> = (from..to).filter(takes).collect();
                // A chunk may cover only the break after a row.
                if !positions.is_empty() {
                    let chunk_rows: Vec<usize> = (before..before + positions.len()).collect();
                    parts.push(ops::gather_rows(&encoded.embeddings, &chunk_rows)?);
                    deepstack_parts.resize_with(encoded.deepstack.len(), Vec::new);
                    for (layer, features) in encoded.deepstack.iter().enumerate() {
                        deepstack_parts[layer].push(ops::gather_rows(features, &chunk_rows)?);
                    }
                    rows.extend(positions.iter().map(|p| q_start + p - start));
                }
                // The prefill has passed the image: its embeddings are not read again.
                if to == at.end {
                    state.encoded[k] = None;
                }
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        let concat = |parts: &[Tensor]| ops::concat_rows(&parts.iter().collect::<Vec<_>>());
        let values = concat(&parts)?;
        let deepstack = deepstack_parts.iter().map(|layer| concat(layer)).collect::<std::result::Result<_, _>>()?;
        Ok(Some(InputEmbeds { rows, values, deepstack }))
    }

    /// Runs one step. On error the step's requests cannot continue (their cache is in doubt).
    pub fn execute_model(&mut self, so: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        self.update_states(so)?;
        let mut out = ModelRunnerOutput::default();
        if so.total_num_scheduled_tokens == 0 {
            return Ok(out);
        }
        let mut tokens = Vec::with_capacity(so.total_num_scheduled_tokens);
        let mut seqs = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut prompt_lens = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut bidirectional = Vec::new();
        let mut state_slots = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut logit_rows = Vec::new();
        let mut row_uses = Vec::new();
        let mut mrope_positions = Vec::new();
        let mut prompt_chunks = Vec::new();
        // (request, first row, first position, tokens) of each request this step.
        let mut spans = Vec::with_capacity(so.num_scheduled_tokens.len());
        let uses_mrope =
            so.num_scheduled_tokens.iter().any(|(id, _)| self.requests.get(id).is_some_and(|s| s.mrope.is_some()));
        for &(id, n) in &so.num_scheduled_tokens {
            let state = self
                .requests
                .get(&id)
                .ok_or_else(|| EngineError::Internal(format!("runner has no state for scheduled request {id}")))?;
            let drafts = so.scheduled_spec_decode_tokens.get(&id).map_or(&[][..], Vec::as_slice);
            let (start, end) = (state.num_computed_tokens, state.num_computed_tokens + n);
            let known_end = end - drafts.len();
            let chunk = state.token_ids.get(start..known_end).ok_or_else(|| {
                EngineError::Internal(format!(
                    "request {id}: scheduled tokens {start}..{known_end} beyond {}",
                    state.token_ids.len()
                ))
            })?;
            let q_start = tokens.len();
            spans.push((id, q_start, start, n));
            tokens.extend_from_slice(chunk);
            tokens.extend_from_slice(drafts);
            let media_runs: Vec<std::ops::Range<usize>> = match &state.sampling.multimodal {
                Some(mm) if self.bidirectional_media && state.state_slot.is_none() => {
                    mm.items.iter().map(|(_, at)| at.clone()).collect()
                }
                _ => Vec::new(),
            };
            let seq = AttnSeq { q_start, q_len: n, ctx_len: end, block_table: state.block_ids.clone() };
            for (piece, sees_run) in attention_pieces(seq, media_runs)? {
                seqs.push(piece);
                bidirectional.push(sees_run);
                prompt_lens.push(state.prefill_len);
            }
            if uses_mrope {
                mrope_positions.extend(state.mrope_positions(start..end));
            }
            if state.sampling.multimodal.is_some() && start < state.num_prompt_tokens {
                prompt_chunks.push((id, q_start, start, known_end.min(state.num_prompt_tokens)));
            }
            state_slots.extend(state.state_slot);
            if state.sampling.params.prompt_logprobs.is_some() {
                let first = start.max(state.num_prompt_logprobs_done);
                for pos in first..end.min(state.num_prompt_tokens - 1) {
                    logit_rows.push(q_start + pos - start);
                    row_uses.push(RowUse::PromptLogprob(id, pos));
                }
            }
            if known_end == state.token_ids.len() {
                for j in 0..=drafts.len() {
                    logit_rows.push(q_start + n - 1 - drafts.len() + j);
                    row_uses.push(RowUse::Sample(id, j));
                }
            }
        }
        if logit_rows.is_empty() {
            // Only mid-prompt chunks this step: their keys still need computing, and one row of
            // logits (discarded) keeps every backend on its usual shapes.
            logit_rows.push(tokens.len() - 1);
        }
        let mut meta = AttnMetadata::new(seqs, self.block_size)?.with_prompt_lens(prompt_lens)?;
        if !state_slots.is_empty() {
            meta = meta.with_state_slots(state_slots)?.with_state_copies(so.state_copies.clone());
        }
        if uses_mrope {
            meta = meta.with_mrope_positions(mrope_positions)?;
        }
        if bidirectional.contains(&true) {
            meta = meta.with_bidirectional(bidirectional)?;
        }
        let embeds = if prompt_chunks.is_empty() {
            None
        } else if self.on_cpu {
            ferrite_tensor::cpu::on_worker(|| self.input_embeds(&prompt_chunks))?
        } else {
            self.input_embeds(&prompt_chunks)?
        };
        let sample_rows_of: Vec<(ReqId, usize)> = row_uses
            .iter()
            .filter_map(|u| match *u {
                RowUse::Sample(id, j) => Some((id, j)),
                RowUse::PromptLogprob(..) => None,
            })
            .collect();
        let started = std::time::Instant::now();
        let vocab = self.model.info().vocab_size;
        let constrained = sample_rows_of.iter().any(|(id, _)| self.constraints.contains_key(id));
        // The grammar masks depend only on tokens already sampled, so CPU threads fill them while
        // the forward runs (on a GPU, while its kernels are queued and executed).
        let mut mask_timing = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        let mut hidden = None;
        let (logits, token_masks) = std::thread::scope(|scope| {
            let masks = constrained.then(|| {
                scope.spawn(|| {
                    let start = std::time::Instant::now();
                    let masks = fill_token_masks(
                        &mut self.constraints,
                        &sample_rows_of,
                        &so.scheduled_spec_decode_tokens,
                        vocab,
                    );
                    (masks, start.elapsed())
                })
            });
            let _span = tracing::debug_span!("forward", tokens = tokens.len(), rows = logit_rows.len()).entered();
            let logits = (|| -> Result<Tensor> {
                // A step that reads encoder outputs runs eagerly: graphs take token ids only. So
                // does one whose hidden states a draft head reads.
                let replayed = match &mut self.graphs {
                    Some(g) if embeds.is_none() && self.eagle.is_none() => {
                        g.forward(self.model.as_ref(), &mut self.kv_caches, &tokens, &meta, &logit_rows)?
                    }
                    _ => None,
                };
                match replayed {
                    Some(logits) => Ok(logits),
                    None => {
                        let input = ForwardInput {
                            tokens: &tokens,
                            meta: &meta,
                            logit_rows: &logit_rows,
                            embeds: embeds.as_ref(),
                        };
                        let (model, caches) = (self.model.as_ref(), &mut self.kv_caches);
                        let tap = self.eagle.as_ref().map(EagleDrafter::hidden_tap);
                        let mut run = || -> Result<(Tensor, Option<Tensor>)> {
                            Ok(if let Some(tap) = &tap {
                                let (logits, h) = model.forward_with_hidden(&input, caches, tap)?;
                                (logits, Some(h))
                            } else {
                                (model.forward(&input, caches)?, None)
                            })
                        };
                        // A CUDA forward stays on the thread its context is current on.
                        let (logits, h) = if self.on_cpu { ferrite_tensor::cpu::on_worker(run)? } else { run()? };
                        hidden = h;
                        Ok(logits)
                    }
                }
            })();
            let waited = std::time::Instant::now();
            let masks = masks.map(|h| match h.join() {
                Ok((masks, filled)) => {
                    mask_timing = (filled, waited.elapsed());
                    Ok(masks)
                }
                Err(_) => Err(EngineError::Internal("a token-mask thread panicked".into())),
            });
            (logits, masks.transpose())
        });
        let (logits, token_masks) = (logits?, token_masks?);
        // On a GPU `forward` returns once its kernels are queued: the gap between the two times
        // says whether a step is bound by the host issuing work or by the device running it.
        let issued = started.elapsed();
        // A graph's logits carry a row for each padding sequence after the batch's own rows.
        if logits.rows() < logit_rows.len() {
            return Err(EngineError::Internal(format!(
                "forward returned {} rows of logits for {} rows",
                logits.rows(),
                logit_rows.len()
            )));
        }
        for &(id, n) in &so.num_scheduled_tokens {
            if let Some(state) = self.requests.get_mut(&id) {
                state.num_computed_tokens += n;
            }
        }
        let _span = tracing::debug_span!("sample", rows = logit_rows.len()).entered();
        let (mut sample_rows, mut prompt_rows) = (Vec::new(), Vec::new());
        for (i, u) in row_uses.iter().enumerate() {
            match *u {
                RowUse::Sample(..) => sample_rows.push(i),
                RowUse::PromptLogprob(..) => prompt_rows.push(i),
            }
        }
        if !prompt_rows.is_empty() {
            let data = ops::gather_rows(&logits, &prompt_rows)?.to_f32_vec();
            let uses: Vec<&RowUse> = prompt_rows.iter().map(|&i| &row_uses[i]).collect();
            self.prompt_logprobs(&uses, &data, logits.last_dim(), &mut out);
        }
        if !sample_rows.is_empty() {
            let logits = ops::gather_rows(&logits, &sample_rows)?;
            self.sample(&logits, &sample_rows_of, &so.scheduled_spec_decode_tokens, token_masks.as_deref(), &mut out)?;
        }
        if self.draft.is_some() && !out.sampled.is_empty() {
            out.draft_token_ids = self.propose_drafts(&out)?;
        }
        if let Some(hidden) = &hidden {
            out.draft_token_ids = self.propose_head_drafts(hidden, &spans, &out)?;
        }
        tracing::debug!(
            tokens = tokens.len(),
            seqs = so.num_scheduled_tokens.len(),
            issue_ms = issued.as_secs_f64() * 1e3,
            // Filling the grammar masks, and the part of it the forward did not hide.
            mask_ms = mask_timing.0.as_secs_f64() * 1e3,
            mask_wait_ms = mask_timing.1.as_secs_f64() * 1e3,
            step_ms = started.elapsed().as_secs_f64() * 1e3,
            "step timing"
        );
        Ok(out)
    }

    /// The draft model's drafts for the requests that sampled this step, except those whose
    /// grammar waits for the end of a reasoning section (they are drafted for by nobody).
    fn propose_drafts(&mut self, out: &ModelRunnerOutput) -> Result<HashMap<ReqId, Vec<u32>>> {
        let _span = tracing::debug_span!("draft", requests = out.sampled.len()).entered();
        let reqs: Vec<DraftTarget> = out
            .sampled
            .keys()
            .filter(|id| !self.reasoning.contains_key(id))
            .filter_map(|&id| {
                let state = self.requests.get(&id)?;
                Some(state.draft_target(id, state.draft_room(self.max_model_len)))
            })
            .collect();
        match &mut self.draft {
            Some(draft) => draft.propose(&reqs),
            None => Ok(HashMap::new()),
        }
    }

    /// The draft head's pass over this step's positions, and its drafts for the requests that
    /// sampled (not those whose grammar waits for the end of a reasoning section).
    fn propose_head_drafts(
        &mut self,
        hidden: &Tensor,
        spans: &[(ReqId, usize, usize, usize)],
        out: &ModelRunnerOutput,
    ) -> Result<HashMap<ReqId, Vec<u32>>> {
        let _span = tracing::debug_span!("draft head", requests = spans.len()).entered();
        let reqs: Vec<EagleRequest> = spans
            .iter()
            .filter_map(|&(id, row, start, computed)| {
                let state = self.requests.get(&id)?;
                let drafts = out.sampled.contains_key(&id) && !self.reasoning.contains_key(&id);
                let room = if drafts { state.draft_room(self.max_model_len) } else { 0 };
                Some(EagleRequest { target: state.draft_target(id, room), start, computed, row })
            })
            .collect();
        match &mut self.eagle {
            Some(eagle) => eagle.propose(self.model.as_ref(), hidden, &reqs),
            None => Ok(HashMap::new()),
        }
    }

    fn prompt_logprobs(&mut self, row_uses: &[&RowUse], data: &[f32], vocab: usize, out: &mut ModelRunnerOutput) {
        let jobs: Vec<(ReqId, usize, &[f32], u32, usize)> = row_uses
            .iter()
            .zip(data.chunks(vocab))
            .filter_map(|(u, row)| match **u {
                RowUse::PromptLogprob(id, pos) => {
                    let state = self.requests.get(&id)?;
                    let top = state.sampling.params.prompt_logprobs.unwrap_or(0);
                    Some((id, pos, row, state.token_ids[pos + 1], top))
                }
                RowUse::Sample(..) => None,
            })
            .collect();
        let computed: Vec<(ReqId, usize, TokenLogprob)> = jobs
            .into_par_iter()
            .map(|(id, pos, row, next, top)| (id, pos, sampler::token_logprob(&sampler::log_softmax(row), next, top)))
            .collect();
        for (id, pos, lp) in computed {
            out.prompt_logprobs.entry(id).or_default().push(lp);
            if let Some(state) = self.requests.get_mut(&id) {
                state.num_prompt_logprobs_done = pos + 1;
            }
        }
    }

    /// Samples the rows of `logits`, one per `(request, drafts before it)` of `rows`, and
    /// appends each request's tokens: the first draw, or with drafts the accepted ones and the
    /// draw after them (see [`crate::spec_decode`]).
    fn sample(
        &mut self,
        logits: &Tensor,
        rows: &[(ReqId, usize)],
        drafts: &HashMap<ReqId, Vec<u32>>,
        token_masks: Option<&[u32]>,
        out: &mut ModelRunnerOutput,
    ) -> Result<()> {
        // A row after `j` drafts sees them as output, as the step that drew them one by one would;
        // the first row of a request reads its output in place.
        let outputs: Vec<std::borrow::Cow<[u32]>> = rows
            .iter()
            .map(|&(id, j)| {
                let state = self.requests.get(&id)?;
                let output = &state.token_ids[state.num_prompt_tokens..];
                Some(match drafts.get(&id) {
                    Some(d) if j > 0 => std::borrow::Cow::Owned([output, &d[..j]].concat()),
                    _ => std::borrow::Cow::Borrowed(output),
                })
            })
            .collect::<Option<_>>()
            .ok_or_else(|| EngineError::Internal("a sampled row lost its request".into()))?;
        let sample_rows: Vec<SampleRow> = rows
            .iter()
            .zip(&outputs)
            .map(|(&(id, _), output)| {
                let state = &self.requests[&id];
                SampleRow { sampling: &state.sampling, prompt: &state.token_ids[..state.num_prompt_tokens], output }
            })
            .collect();
        let mut sampled = sampler::sample(logits, &sample_rows, token_masks)?.into_iter();
        let mut i = 0;
        while i < rows.len() {
            let id = rows[i].0;
            let drafts = drafts.get(&id).map_or(&[][..], Vec::as_slice);
            let draws: Vec<_> = sampled.by_ref().take(drafts.len() + 1).collect();
            i += drafts.len() + 1;
            let ids: Vec<u32> = draws.iter().map(|s| s.token_id).collect();
            let accepted = crate::spec_decode::accepted_drafts(drafts, &ids);
            let kept: Vec<_> = draws.into_iter().take(accepted + 1).collect();
            let mut reasoning_ended = false;
            if let Some(state) = self.requests.get_mut(&id) {
                state.token_ids.extend(kept.iter().map(|s| s.token_id));
                // Keys were written for every draft; those past the first rejection are stale.
                state.num_computed_tokens -= drafts.len() - accepted;
                let output = &state.token_ids[state.num_prompt_tokens..];
                reasoning_ended = self.reasoning.get(&id).is_some_and(|(marker, _)| output.ends_with(marker));
            }
            if reasoning_ended {
                // The marker is the reasoning's; the grammar governs what follows it.
                if let Some((_, grammar)) = self.reasoning.remove(&id) {
                    self.constraints.insert(id, grammar.start());
                }
            } else if let Some(c) = self.constraints.get_mut(&id) {
                kept.iter().for_each(|t| c.accept(t.token_id));
            }
            out.sampled.insert(id, kept);
        }
        Ok(())
    }
}

/// The token bitmask of a step's sampled rows, in `rows` order: each constrained request's rows
/// from its grammar (after each row's drafts), every other row all ones.
fn fill_token_masks(
    constraints: &mut HashMap<ReqId, TokenConstraint>,
    rows: &[(ReqId, usize)],
    drafts: &HashMap<ReqId, Vec<u32>>,
    vocab: usize,
) -> Vec<u32> {
    let words = mask_words(vocab);
    // A request's rows are consecutive: its first row and how many.
    let mut span: HashMap<ReqId, (usize, usize)> = HashMap::new();
    for (row, &(id, _)) in rows.iter().enumerate() {
        span.entry(id).or_insert((row, 0)).1 += 1;
    }
    let mut bitmask = vec![u32::MAX; rows.len() * words];
    let mut jobs: Vec<(usize, usize, &mut TokenConstraint, &[u32])> = constraints
        .iter_mut()
        .filter_map(|(id, c)| {
            let &(first, n) = span.get(id)?;
            Some((first, n, c, drafts.get(id).map_or(&[][..], Vec::as_slice)))
        })
        .collect();
    jobs.sort_by_key(|j| j.0);
    // Carve each job's rows out of the bitmask so the jobs run in parallel.
    let mut rest = bitmask.as_mut_slice();
    let mut taken = 0;
    let mut slices = Vec::with_capacity(jobs.len());
    for (first, n, c, d) in jobs {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((first - taken) * words);
        let (mine, tail) = tail.split_at_mut(n * words);
        rest = tail;
        taken = first + n;
        slices.push((mine, c, d));
    }
    slices.into_par_iter().for_each(|(mine, c, d)| c.fill_masks_along(d, mine, words));
    bitmask
}
