use std::sync::Arc;

use super::ReqId;
use crate::output::{FinishReason, StopReason};
use crate::params::RequestSampling;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
    /// Blocks taken back; waits to recompute its prompt and output so far.
    Preempted,
    Finished(FinishReason),
}

/// The scheduler's view of one sequence.
#[derive(Debug)]
pub struct Request {
    pub id: ReqId,
    pub sampling: Arc<RequestSampling>,
    /// Prompt followed by the tokens generated so far.
    pub all_token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Tokens whose keys and values are in the cache (advanced when a step is scheduled).
    pub num_computed_tokens: usize,
    pub status: RequestStatus,
    pub stop_reason: Option<StopReason>,
    /// Prompt tokens the prefix cache served at first scheduling.
    pub num_cached_tokens: Option<usize>,
    /// The sequence was prefilled (or recomputed) longer than the model's rotary switch, so its
    /// cached keys carry the long-sequence rotation (see `SchedulerConfig::recompute_at`).
    pub recomputed_past_switch: bool,
    /// Drafts proposed for the next step (speculative decoding), verified when it runs.
    pub spec_token_ids: Vec<u32>,
    /// A hybrid model's verify step rejected a draft after its recurrent state had taken every
    /// draft in: the state saved before that step is restored and the accepted tokens computed
    /// again (with the next drafts) in the request's next step.
    pub restore_state: bool,
}

impl Request {
    pub fn new(id: ReqId, prompt: &[u32], sampling: Arc<RequestSampling>) -> Request {
        Request {
            id,
            sampling,
            all_token_ids: prompt.to_vec(),
            num_prompt_tokens: prompt.len(),
            num_computed_tokens: 0,
            status: RequestStatus::Waiting,
            stop_reason: None,
            num_cached_tokens: None,
            recomputed_past_switch: false,
            spec_token_ids: Vec::new(),
            restore_state: false,
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.all_token_ids.len()
    }

    pub fn num_output_tokens(&self) -> usize {
        self.all_token_ids.len() - self.num_prompt_tokens
    }

    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.all_token_ids[..self.num_prompt_tokens]
    }

    /// Prompt logprobs need every prompt position computed, so such requests skip cache reads.
    pub fn skips_prefix_cache(&self) -> bool {
        self.sampling.params.prompt_logprobs.is_some()
    }

    /// vLLM's `check_stop` after a token was appended: length first, then (past `min_tokens`)
    /// EOS and stop token ids. Stop strings are the detokenizer's business.
    pub fn check_stop(&mut self, max_model_len: usize) -> bool {
        if self.num_tokens() >= max_model_len || self.num_output_tokens() >= self.sampling.max_tokens {
            self.status = RequestStatus::Finished(FinishReason::Length);
            return true;
        }
        if self.num_output_tokens() < self.sampling.params.min_tokens {
            return false;
        }
        let Some(&last) = self.all_token_ids.last() else {
            return false;
        };
        if self.sampling.eos_token_id == Some(last) {
            self.status = RequestStatus::Finished(FinishReason::Stop);
            return true;
        }
        if self.sampling.stop_token_ids.contains(&last) {
            self.status = RequestStatus::Finished(FinishReason::Stop);
            self.stop_reason = Some(StopReason::TokenId(last));
            return true;
        }
        false
    }
}
