//! The model runner: keeps each request's tokens, block table and generator, flattens a
//! [`SchedulerOutput`] into one forward batch, and samples the rows that need it. It only talks
//! to the model through [`CausalLM::forward`], so any backend runs under it.

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_models::{CausalLM, ForwardInput};
use ferrite_tensor::ops::{self, RowSampling};
use ferrite_tensor::{AttnMetadata, AttnSeq, Device, PagedKvLayer, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use crate::config::{CacheConfig, EngineConfig};
use crate::core::scheduler::{ModelRunnerOutput, SampledToken, SchedulerOutput};
use crate::core::{BlockId, ReqId};
use crate::error::{EngineError, Result};
use crate::graphs::{DecodeGraphs, GraphCounts};
use crate::output::TokenLogprob;
use crate::params::RequestSampling;
use crate::sampler::{self, SampleRow};

/// Whether a request's next token can be chosen on the device from the logits alone.
fn samples_on_device(sampling: &RequestSampling, output_len: usize) -> bool {
    let p = &sampling.params;
    p.logprobs.is_none() && !p.has_penalties() && (output_len >= p.min_tokens || sampling.min_tokens_mask.is_empty())
}

/// The device sampler's view of a request's parameters. Its draws are named by the request's
/// seed and the index of the token being drawn, so a request samples the same tokens whatever
/// it is batched with, and again after a preemption.
fn row_sampling(sampling: &RequestSampling, output_len: usize) -> RowSampling {
    let p = &sampling.params;
    RowSampling {
        temperature: if p.is_greedy() { 0.0 } else { p.temperature },
        top_k: u32::try_from(p.top_k).unwrap_or(0),
        top_p: p.top_p,
        min_p: p.min_p,
        seed: sampling.seed,
        step: output_len as u64,
    }
}

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
    sampling: Arc<RequestSampling>,
    generator: ChaCha20Rng,
    /// Prompt positions whose logprobs were already returned (they survive preemption).
    num_prompt_logprobs_done: usize,
}

pub struct ModelRunner {
    model: Box<dyn CausalLM>,
    kv_caches: Vec<PagedKvLayer>,
    block_size: usize,
    requests: HashMap<ReqId, CachedRequestState>,
    /// Decode steps as CUDA graphs (none on the CPU or with `enforce_eager`).
    graphs: Option<DecodeGraphs>,
}

/// Which logit rows belong to which request.
enum RowUse {
    Sample(ReqId),
    /// Logits at prompt position `pos` score the prompt token at `pos + 1`.
    PromptLogprob(ReqId, usize),
}

impl CachedRequestState {
    fn output_len(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }
}

impl ModelRunner {
    pub fn new(model: Box<dyn CausalLM>, cache: &CacheConfig, config: &EngineConfig) -> Result<ModelRunner> {
        let _span = tracing::info_span!("allocate_kv_cache", blocks = cache.num_blocks, block_size = cache.block_size)
            .entered();
        let kv_caches = model
            .info()
            .kv_layers
            .iter()
            .map(|l| {
                PagedKvLayer::new_on(
                    config.device,
                    cache.dtype,
                    cache.num_blocks,
                    cache.block_size,
                    l.num_kv_heads,
                    l.k_dim,
                    l.v_dim,
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let graphs = DecodeGraphs::new(config.device, config.enforce_eager)?;
        Ok(ModelRunner { model, kv_caches, block_size: cache.block_size, requests: HashMap::new(), graphs })
    }

    /// Decode steps captured and replayed as CUDA graphs so far.
    pub fn graph_counts(&self) -> GraphCounts {
        self.graphs.as_ref().map(|g| g.counts).unwrap_or_default()
    }

    /// Forgets every request (after a failure left the bookkeeping in doubt).
    pub fn reset(&mut self) {
        self.requests.clear();
    }

    fn update_states(&mut self, so: &SchedulerOutput) {
        for id in &so.finished_req_ids {
            self.requests.remove(id);
        }
        for new in &so.scheduled_new_reqs {
            self.requests.insert(
                new.req_id,
                CachedRequestState {
                    token_ids: new.prompt_token_ids.clone(),
                    num_prompt_tokens: new.prompt_token_ids.len(),
                    prefill_len: new.prompt_token_ids.len(),
                    block_ids: new.block_ids.clone(),
                    num_computed_tokens: new.num_computed_tokens,
                    sampling: new.sampling.clone(),
                    generator: ChaCha20Rng::seed_from_u64(new.sampling.seed),
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
            } else {
                state.block_ids.extend_from_slice(&cached.new_block_ids);
            }
            state.num_computed_tokens = cached.num_computed_tokens;
        }
    }

    /// Runs one step. On error the step's requests cannot continue (their cache is in doubt).
    pub fn execute_model(&mut self, so: &SchedulerOutput) -> Result<ModelRunnerOutput> {
        self.update_states(so);
        let mut out = ModelRunnerOutput::default();
        if so.total_num_scheduled_tokens == 0 {
            return Ok(out);
        }
        let mut tokens = Vec::with_capacity(so.total_num_scheduled_tokens);
        let mut seqs = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut prompt_lens = Vec::with_capacity(so.num_scheduled_tokens.len());
        let mut logit_rows = Vec::new();
        let mut row_uses = Vec::new();
        for &(id, n) in &so.num_scheduled_tokens {
            let state = self
                .requests
                .get(&id)
                .ok_or_else(|| EngineError::Internal(format!("runner has no state for scheduled request {id}")))?;
            let (start, end) = (state.num_computed_tokens, state.num_computed_tokens + n);
            let chunk = state.token_ids.get(start..end).ok_or_else(|| {
                EngineError::Internal(format!(
                    "request {id}: scheduled tokens {start}..{end} beyond {}",
                    state.token_ids.len()
                ))
            })?;
            let q_start = tokens.len();
            tokens.extend_from_slice(chunk);
            seqs.push(AttnSeq { q_start, q_len: n, ctx_len: end, block_table: state.block_ids.clone() });
            prompt_lens.push(state.prefill_len);
            if state.sampling.params.prompt_logprobs.is_some() {
                let first = start.max(state.num_prompt_logprobs_done);
                for pos in first..end.min(state.num_prompt_tokens - 1) {
                    logit_rows.push(q_start + pos - start);
                    row_uses.push(RowUse::PromptLogprob(id, pos));
                }
            }
            if end == state.token_ids.len() {
                logit_rows.push(q_start + n - 1);
                row_uses.push(RowUse::Sample(id));
            }
        }
        if logit_rows.is_empty() {
            // Only mid-prompt chunks this step: their keys still need computing, and one row of
            // logits (discarded) keeps every backend on its usual shapes.
            logit_rows.push(tokens.len() - 1);
        }
        let meta = AttnMetadata::new(seqs, self.block_size)?.with_prompt_lens(prompt_lens)?;
        let started = std::time::Instant::now();
        let logits = {
            let _span = tracing::debug_span!("forward", tokens = tokens.len(), rows = logit_rows.len()).entered();
            let replayed = match &mut self.graphs {
                Some(g) => g.forward(self.model.as_ref(), &mut self.kv_caches, &tokens, &meta, &logit_rows)?,
                None => None,
            };
            match replayed {
                Some(logits) => logits,
                None => self.model.forward(
                    &ForwardInput { tokens: &tokens, meta: &meta, logit_rows: &logit_rows },
                    &mut self.kv_caches,
                )?,
            }
        };
        // On a GPU `forward` returns once its kernels are queued: the gap between the two times
        // says whether a step is bound by the host issuing work or by the device running it.
        let issued = started.elapsed();
        let vocab = logits.last_dim();
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
        // On a GPU, rows whose sampler needs nothing but the logits are sampled there, so only
        // their token ids cross to the host; the rest (logprobs, penalties, min-tokens masks)
        // copy their rows back.
        let on_device: Vec<bool> = row_uses
            .iter()
            .map(|u| match *u {
                RowUse::Sample(id) if logits.device() != Device::Cpu => {
                    self.requests.get(&id).is_some_and(|s| samples_on_device(&s.sampling, s.output_len()))
                }
                _ => false,
            })
            .collect();
        let (device_rows, host_rows): (Vec<usize>, Vec<usize>) = (0..row_uses.len()).partition(|&i| on_device[i]);
        if !device_rows.is_empty() {
            self.sample_on_device(&logits, &row_uses, &device_rows, &mut out)?;
        }
        if !host_rows.is_empty() {
            let all_rows = device_rows.is_empty() && logits.rows() == row_uses.len();
            let host = if all_rows { logits } else { ops::gather_rows(&logits, &host_rows)? };
            let mut data = host.to_f32_vec();
            let host_uses: Vec<&RowUse> = host_rows.iter().map(|&i| &row_uses[i]).collect();
            self.prompt_logprobs(&host_uses, &data, vocab, &mut out);
            self.sample(&host_uses, &mut data, vocab, &mut out);
        }
        tracing::debug!(
            tokens = tokens.len(),
            seqs = so.num_scheduled_tokens.len(),
            issue_ms = issued.as_secs_f64() * 1e3,
            step_ms = started.elapsed().as_secs_f64() * 1e3,
            "step timing"
        );
        Ok(out)
    }

    /// Rows sampled by the device; the sampled token has no logprob (none was asked).
    fn sample_on_device(
        &mut self,
        logits: &Tensor,
        row_uses: &[RowUse],
        rows: &[usize],
        out: &mut ModelRunnerOutput,
    ) -> Result<()> {
        let all_rows = rows.len() == row_uses.len() && logits.rows() == rows.len();
        let picked = if all_rows { logits.clone() } else { ops::gather_rows(logits, rows)? };
        let params: Vec<RowSampling> = rows
            .iter()
            .map(|&row| match row_uses[row] {
                RowUse::Sample(id) => self.requests.get(&id).map(|s| row_sampling(&s.sampling, s.output_len())),
                RowUse::PromptLogprob(..) => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| EngineError::Internal("a device-sampled row lost its request".into()))?;
        let ids = if params.iter().all(|p| p.temperature == 0.0) {
            ops::argmax_rows(&picked)?
        } else {
            ops::sample_rows(&picked, &params)?
        };
        for (&row, token_id) in rows.iter().zip(ids) {
            let RowUse::Sample(id) = row_uses[row] else {
                continue;
            };
            if let Some(state) = self.requests.get_mut(&id) {
                state.token_ids.push(token_id);
            }
            out.sampled.insert(id, SampledToken { token_id, logprob: None });
        }
        Ok(())
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
                RowUse::Sample(_) => None,
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

    fn sample(&mut self, row_uses: &[&RowUse], data: &mut [f32], vocab: usize, out: &mut ModelRunnerOutput) {
        let mut states: HashMap<ReqId, &mut CachedRequestState> =
            self.requests.iter_mut().map(|(k, v)| (*k, v)).collect();
        let mut ids = Vec::new();
        let mut rows = Vec::new();
        for (u, row) in row_uses.iter().zip(data.chunks_mut(vocab)) {
            let RowUse::Sample(id) = **u else { continue };
            let Some(state) = states.remove(&id) else {
                continue;
            };
            let (prompt, output) = state.token_ids.split_at(state.num_prompt_tokens);
            ids.push(id);
            rows.push(SampleRow { logits: row, sampling: &state.sampling, prompt, output, rng: &mut state.generator });
        }
        let sampled = sampler::sample(rows);
        for (id, s) in ids.into_iter().zip(sampled) {
            if let Some(state) = self.requests.get_mut(&id) {
                state.token_ids.push(s.token_id);
            }
            out.sampled.insert(id, s);
        }
    }
}
