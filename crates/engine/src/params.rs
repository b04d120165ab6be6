//! Per-request sampling parameters with vLLM's `SamplingParams` meaning and limits.

use std::sync::Arc;

use ferrite_models::{Visual, VisualGrid};
use ferrite_structured::{Grammar, StructuredOutputs};

use crate::error::{EngineError, Result};

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub const SAMPLING_EPS: f32 = 1e-5;
/// Positive temperatures are raised to this to keep `logits / t` finite (vLLM's `_MAX_TEMP`).
pub const MIN_TEMPERATURE: f32 = 1e-2;
/// Most logprobs a request may ask for per token, unless the engine is configured otherwise
/// (vLLM's default `max_logprobs`).
pub const MAX_LOGPROBS: usize = 20;
/// Most sequences one request may ask for (vLLM's `VLLM_MAX_N_SEQUENCES`).
pub const MAX_N: usize = 16384;
/// Most stop strings and bad words a request may carry, and their longest: every step checks
/// the new text against each stop string, and every sampled row against each bad word, so their
/// size is work per token that a client would otherwise set without limit.
pub const MAX_WORD_LISTS: usize = 256;
pub const MAX_WORD_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Completions to generate from the prompt; they share its KV blocks.
    pub n: usize,
    /// 0 is greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 or -1 keeps all.
    pub top_k: i32,
    /// Drop tokens less likely than `min_p` times the most likely one.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the prompt or output.
    pub repetition_penalty: f32,
    /// Subtracted from logits of tokens present in the output.
    pub presence_penalty: f32,
    /// Subtracted from logits once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Makes sampling reproducible per request, whatever else is batched with it.
    pub seed: Option<u64>,
    /// Completion tokens per sequence; `None` runs to `max_model_len`.
    pub max_tokens: Option<usize>,
    /// EOS and stop token ids are masked until this many tokens are generated.
    pub min_tokens: usize,
    /// Strings that end generation; trimmed from the text unless `include_stop_str_in_output`.
    pub stop: Vec<String>,
    /// Token ids that end generation (kept in `token_ids`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Per generated token, this many top logprobs (plus the sampled token's).
    pub logprobs: Option<usize>,
    /// Per prompt token, this many top logprobs (plus the prompt token's).
    pub prompt_logprobs: Option<usize>,
    pub skip_special_tokens: bool,
    pub include_stop_str_in_output: bool,
    /// Added to the logits of these token ids (OpenAI's `logit_bias`, clamped to [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
    /// Only these tokens may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Words the output may not contain: the last token of each word's tokenization is banned
    /// where it would complete the word.
    pub bad_words: Vec<String>,
    /// Constrains the output to a JSON schema, regex, choice or grammar (vLLM's
    /// `structured_outputs`).
    pub structured_outputs: Option<StructuredOutputs>,
    /// The constraint starts after these tokens appear in the output (the end of a reasoning
    /// section, as vLLM's reasoning parsers mark it); before them the output is free.
    pub structured_outputs_after: Option<Vec<u32>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: Some(16),
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            skip_special_tokens: true,
            include_stop_str_in_output: false,
            logit_bias: Vec::new(),
            allowed_token_ids: None,
            bad_words: Vec::new(),
            structured_outputs: None,
            structured_outputs_after: None,
        }
    }
}

fn finite(param: &'static str, v: f32) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(EngineError::invalid(param, format!("must be a finite number, got {v}")))
    }
}

impl SamplingParams {
    /// Greedy decoding with the given completion length (the parity gate's setting).
    pub fn greedy(max_tokens: usize) -> SamplingParams {
        SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS
    }

    /// The checks of vLLM's `SamplingParams._verify_args`, with its messages.
    pub fn validate(&self, max_logprobs: usize) -> Result<()> {
        if self.n == 0 || self.n > MAX_N {
            return Err(EngineError::invalid("n", format!("must be in [1, {MAX_N}], got {}", self.n)));
        }
        for (param, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            finite(param, v)?;
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(EngineError::invalid(
                "presence_penalty",
                format!("must be in [-2, 2], got {}", self.presence_penalty),
            ));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(EngineError::invalid(
                "frequency_penalty",
                format!("must be in [-2, 2], got {}", self.frequency_penalty),
            ));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(EngineError::invalid(
                "repetition_penalty",
                format!("must be greater than zero, got {}", self.repetition_penalty),
            ));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(EngineError::invalid("temperature", format!("must be in [0, 2], got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::invalid("top_p", format!("must be in (0, 1], got {}", self.top_p)));
        }
        if self.top_k < -1 {
            return Err(EngineError::invalid(
                "top_k",
                format!("must be 0 (disable), or at least 1, got {}", self.top_k),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(EngineError::invalid("min_p", format!("must be in [0, 1], got {}", self.min_p)));
        }
        if let Some(max) = self.max_tokens {
            if max == 0 {
                return Err(EngineError::invalid("max_tokens", "must be at least 1, got 0"));
            }
            if self.min_tokens > max {
                return Err(EngineError::invalid(
                    "min_tokens",
                    format!("must be less than or equal to max_tokens={max}, got {}", self.min_tokens),
                ));
            }
        }
        for (param, v) in [("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)] {
            if let Some(v) = v.filter(|&v| v > max_logprobs) {
                return Err(EngineError::invalid(
                    param,
                    format!("requested {v}, more than the maximum of {max_logprobs}"),
                ));
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(EngineError::invalid("stop", "cannot contain an empty string"));
        }
        for (param, words) in [("stop", &self.stop), ("bad_words", &self.bad_words)] {
            if words.len() > MAX_WORD_LISTS {
                return Err(EngineError::invalid(
                    param,
                    format!("may hold at most {MAX_WORD_LISTS} strings, got {}", words.len()),
                ));
            }
            if let Some(long) = words.iter().find(|w| w.len() > MAX_WORD_BYTES) {
                return Err(EngineError::invalid(
                    param,
                    format!("strings may be at most {MAX_WORD_BYTES} bytes, got one of {}", long.len()),
                ));
            }
        }
        if self.allowed_token_ids.as_ref().is_some_and(Vec::is_empty) {
            return Err(EngineError::invalid("allowed_token_ids", "must contain at least one token id"));
        }
        if self.logit_bias.iter().any(|(_, b)| !b.is_finite()) {
            return Err(EngineError::invalid("logit_bias", "biases must be finite numbers"));
        }
        if self.is_greedy() && self.n > 1 {
            return Err(EngineError::invalid("n", format!("must be 1 when using greedy sampling, got {}", self.n)));
        }
        Ok(())
    }

    /// The parameters as the sampler applies them: greedy clears the truncations, tiny positive
    /// temperatures are raised, `top_k` -1 becomes 0 (as vLLM's `__post_init__` does).
    pub(crate) fn normalized(&self) -> SamplingParams {
        let mut p = self.clone();
        if p.is_greedy() {
            p.temperature = 0.0;
            p.top_p = 1.0;
            p.top_k = 0;
            p.min_p = 0.0;
        } else if p.temperature < MIN_TEMPERATURE {
            p.temperature = MIN_TEMPERATURE;
        }
        if p.top_k < 0 {
            p.top_k = 0;
        }
        let mut seen = std::collections::HashSet::new();
        p.stop_token_ids.retain(|id| seen.insert(*id));
        p
    }

    pub(crate) fn has_token_filters(&self) -> bool {
        !self.logit_bias.is_empty() || self.allowed_token_ids.is_some()
    }

    pub(crate) fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// What one engine-core request (one of the `n` sequences) samples with: the normalized
/// parameters plus everything resolved at admission.
#[derive(Debug, Clone)]
pub struct RequestSampling {
    pub params: SamplingParams,
    pub max_tokens: usize,
    /// The tokenizer's EOS; `None` with `ignore_eos`.
    pub eos_token_id: Option<u32>,
    /// `params.stop_token_ids` plus the generation config's other EOS ids (unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Ids masked until `min_tokens`: every EOS and stop id, even with `ignore_eos`.
    pub min_tokens_mask: Vec<u32>,
    /// Seed of this sequence's generator (drawn at random when the request has none).
    pub seed: u64,
    /// `params.bad_words` as token sequences, as vLLM tokenizes them (with and without a
    /// leading space).
    pub bad_words_token_ids: Vec<Vec<u32>>,
    /// The request's compiled structured-output constraint; each sequence walks its own copy.
    pub grammar: Option<Arc<Grammar>>,
    /// The prompt's images (vision-language models); every sequence of the request shares them.
    pub multimodal: Option<Arc<MultimodalInputs>>,
}

/// One image or video of a prompt as the model's processor made it.
#[derive(Debug, Clone, PartialEq)]
pub struct VisualInput {
    pub visual: Visual,
    /// `[patches, patch_dim]`, row-major.
    pub pixel_values: Arc<[f32]>,
    pub grid_thw: [usize; 3],
    /// Identifies the content: prompts whose blocks cover different images or videos never
    /// share them in the prefix cache.
    pub hash: u64,
}

impl VisualInput {
    pub fn grid(&self) -> VisualGrid {
        VisualGrid { visual: self.visual, grid_thw: self.grid_thw }
    }

    /// A video's temporal patches as one-step videos (its patch rows step by step, each step's
    /// hash drawn from the video's); an image, a one-step video, or a video whose pixels do not
    /// split into its steps (which its encoder then refuses) as it is.
    pub fn temporal_steps(self) -> Vec<VisualInput> {
        let [t, h, w] = self.grid_thw;
        let is_video = matches!(self.visual, Visual::Video { .. });
        if !is_video || t <= 1 || !self.pixel_values.len().is_multiple_of(t) {
            return vec![self];
        }
        let per_step = self.pixel_values.len() / t;
        let step_hash = |step: usize| {
            let mut hasher = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(&(self.hash, step), &mut hasher);
            std::hash::Hasher::finish(&hasher)
        };
        (0..t)
            .map(|step| VisualInput {
                visual: self.visual,
                pixel_values: self.pixel_values[step * per_step..(step + 1) * per_step].into(),
                grid_thw: [1, h, w],
                hash: step_hash(step),
            })
            .collect()
    }
}

/// A prompt's images and videos, each with the prompt positions its placeholder tokens hold.
#[derive(Debug, Clone, Default)]
pub struct MultimodalInputs {
    pub items: Vec<(VisualInput, std::ops::Range<usize>)>,
}

impl MultimodalInputs {
    /// Each item's placeholder positions and content hash: the prefix cache's extra keys.
    pub fn cache_keys(&self) -> Vec<(std::ops::Range<usize>, u64)> {
        self.items.iter().map(|(item, at)| (at.clone(), item.hash)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_video_splits_into_its_temporal_steps() {
        let video = VisualInput {
            visual: Visual::Video { seconds_per_grid: 1.0 },
            pixel_values: (0..24).map(|v| v as f32).collect::<Vec<_>>().into(),
            grid_thw: [3, 2, 2],
            hash: 7,
        };
        let steps = video.clone().temporal_steps();
        assert_eq!(steps.iter().map(|s| s.grid_thw).collect::<Vec<_>>(), [[1, 2, 2]; 3]);
        assert_eq!(&*steps[1].pixel_values, &[8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]);
        let hashes: std::collections::HashSet<u64> = steps.iter().map(|s| s.hash).collect();
        assert_eq!(hashes.len(), 3, "each step is its own content");
        assert_eq!(steps[2].hash, video.clone().temporal_steps()[2].hash, "the same video, the same steps");
        let image = VisualInput { visual: Visual::Image, ..video.clone() };
        assert_eq!(image.clone().temporal_steps(), [image]);
        let ragged = VisualInput { pixel_values: vec![0.0; 23].into(), ..video };
        assert_eq!(ragged.clone().temporal_steps(), [ragged], "left whole for the encoder to refuse");
    }

    #[test]
    fn rejects_out_of_range_values_with_the_parameter_name() {
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { n: 0, ..Default::default() }, "n"),
            (SamplingParams { temperature: -0.1, ..Default::default() }, "temperature"),
            (SamplingParams { temperature: f32::NAN, ..Default::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
            (SamplingParams { top_k: -2, ..Default::default() }, "top_k"),
            (SamplingParams { min_p: 1.5, ..Default::default() }, "min_p"),
            (SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
            (SamplingParams { presence_penalty: 2.5, ..Default::default() }, "presence_penalty"),
            (SamplingParams { max_tokens: Some(0), ..Default::default() }, "max_tokens"),
            (SamplingParams { min_tokens: 20, max_tokens: Some(10), ..Default::default() }, "min_tokens"),
            (SamplingParams { logprobs: Some(21), ..Default::default() }, "logprobs"),
            (SamplingParams { stop: vec![String::new()], ..Default::default() }, "stop"),
            (SamplingParams { stop: vec!["x".into(); MAX_WORD_LISTS + 1], ..Default::default() }, "stop"),
            (SamplingParams { stop: vec!["x".repeat(MAX_WORD_BYTES + 1)], ..Default::default() }, "stop"),
            (SamplingParams { bad_words: vec!["x".into(); MAX_WORD_LISTS + 1], ..Default::default() }, "bad_words"),
            (SamplingParams { n: 2, temperature: 0.0, ..Default::default() }, "n"),
        ];
        for (p, name) in cases {
            match p.validate(MAX_LOGPROBS) {
                Err(EngineError::InvalidParameter { param, .. }) => {
                    assert_eq!(param, name, "{p:?}")
                }
                other => panic!("{p:?}: expected InvalidParameter({name}), got {other:?}"),
            }
        }
        assert!(SamplingParams::default().validate(MAX_LOGPROBS).is_ok());
        assert!(SamplingParams { logprobs: Some(21), ..Default::default() }.validate(21).is_ok());
        assert!(SamplingParams { top_k: -1, ..Default::default() }.validate(MAX_LOGPROBS).is_ok());
    }

    #[test]
    fn normalization_matches_vllm_post_init() {
        let g =
            SamplingParams { temperature: 0.0, top_k: 5, top_p: 0.5, min_p: 0.2, ..Default::default() }.normalized();
        assert_eq!((g.top_k, g.top_p, g.min_p), (0, 1.0, 0.0));
        assert_eq!(
            SamplingParams { temperature: 0.001, ..Default::default() }.normalized().temperature,
            MIN_TEMPERATURE
        );
        assert_eq!(SamplingParams { top_k: -1, ..Default::default() }.normalized().top_k, 0);
        let dedup = SamplingParams { stop_token_ids: vec![3, 1, 3], ..Default::default() }.normalized();
        assert_eq!(dedup.stop_token_ids, vec![3, 1]);
    }
}
