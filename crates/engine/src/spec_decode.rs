//! Speculative decoding: a drafter proposes up to `k` tokens per running request, one target step
//! computes all `k + 1` positions, and the longest prefix of drafts that the target's own sampler
//! would have drawn is kept, plus the target's token after it.
//!
//! Drafts come from the host (n-gram lookup, suffix trees) or from a smaller model that shares
//! the target's tokenizer (`draft_model`, run by [`crate::draft_model`] after each step).
//!
//! Verification draws each position exactly as a step without speculation would (the sampler's
//! Philox stream is keyed by the token's index in the output, and the logits processors see the
//! drafts before it as output), then accepts a draft when the draw equals it. For drafters that
//! propose tokens rather than distributions (n-gram lookup, a draft model's greedy drafts as in
//! vLLM V1: q one-hot) this is the rejection
//! sampler: a draft is accepted with probability p(draft), and after a rejection the drawn token
//! follows p restricted to the other tokens, which is `(p - q)+` normalised. It is also lossless
//! in the strongest sense: a request's tokens, greedy or seeded, are the same with and without
//! speculation.

use std::path::PathBuf;

use serde_json::Value;

use ferrite_models::EagleVersion;
use ferrite_tensor::Tensor;

use crate::core::{BlockId, ReqId};
use crate::error::{EngineError, Result};
use crate::params::RequestSampling;
use crate::sampler::{self, SampleRow};
use crate::suffix_tree::SuffixCache;
pub use crate::suffix_tree::SuffixParams;

/// `--speculative-config`, as vLLM parses it (the methods built so far).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeConfig {
    /// Drafts proposed per request and step (`num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    pub method: SpeculativeMethod,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the longest earlier occurrence of the sequence's
    /// last `prompt_lookup_min..=prompt_lookup_max` tokens.
    Ngram { prompt_lookup_min: usize, prompt_lookup_max: usize },
    /// Suffix decoding over the request's prompt and the responses so far (see
    /// [`crate::suffix_tree`]).
    Suffix(SuffixParams),
    /// A smaller checkpoint sharing the target's tokenizer drafts greedily, with its own KV
    /// cache laid out on the target's block tables.
    DraftModel(DraftModelConfig),
    /// The target checkpoint's multi-token-prediction head (`mtp`, and vLLM's per-family names
    /// such as `qwen3_next_mtp`), fed the target's hidden states.
    Mtp,
    /// An EAGLE head (its checkpoint in `model`): EAGLE-1 (`eagle`) fed the target's final hidden
    /// state, EAGLE-3 (`eagle3`) its residual stream at three layers.
    Eagle(EagleVersion, DraftModelConfig),
}

/// The draft checkpoint of `"method": "draft_model"` (or the head of `"eagle"` / `"eagle3"`).
#[derive(Debug, Clone, PartialEq)]
pub struct DraftModelConfig {
    /// A checkpoint directory or GGUF file (`model`).
    pub model: PathBuf,
    /// Its `quantization` (vLLM's key; `None` reads the checkpoint's own config).
    pub quantization: Option<String>,
    /// Sequences longer than this (`max_model_len`, else the draft's own context) get no drafts.
    pub max_model_len: Option<usize>,
}

impl SpeculativeMethod {
    /// The drafts come from a model the runner runs, not from the host.
    pub fn runs_a_model(&self) -> bool {
        matches!(self, SpeculativeMethod::DraftModel(_) | SpeculativeMethod::Mtp | SpeculativeMethod::Eagle(..))
    }
}

/// Methods vLLM accepts that are not built here: refused by name at start-up.
const NOT_BUILT: &[&str] = &["medusa", "mlp_speculator"];
const BUILT: &str = "ngram, suffix, draft_model, eagle, eagle3, mtp";

/// Most drafts a step verifies per request, as vLLM bounds them.
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

impl SpeculativeConfig {
    /// Parses vLLM's JSON form, e.g. `{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}`. Unknown keys, a missing `num_speculative_tokens`, a method not
    /// built and out-of-range values are errors naming the key.
    pub fn parse(json: &str) -> Result<SpeculativeConfig> {
        let bad = |m: String| EngineError::Config(format!("--speculative-config: {m}"));
        let value: Value = serde_json::from_str(json).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let obj = value.as_object().ok_or_else(|| bad("expected a JSON object".into()))?;
        const KEYS: &[&str] = &[
            "method",
            "num_speculative_tokens",
            "prompt_lookup_min",
            "prompt_lookup_max",
            "model",
            "quantization",
            "max_model_len",
            "draft_tensor_parallel_size",
            "suffix_decoding_max_tree_depth",
            "suffix_decoding_max_cached_requests",
            "suffix_decoding_max_spec_factor",
            "suffix_decoding_min_token_prob",
        ];
        if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(bad(format!("unknown key `{k}` (known: {})", KEYS.join(", "))));
        }
        let count = |key: &str| -> Result<Option<usize>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n >= 1)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| bad(format!("`{key}` must be a positive integer, got {v}"))),
            }
        };
        // Without a method, vLLM infers it from the draft checkpoint: an EAGLE head (its
        // architecture, or a speculators config) or else a draft model.
        let given_model = obj.get("model").and_then(Value::as_str).filter(|m| !m.is_empty());
        let inferred = given_model.map(|m| DraftCheckpoint::peek(std::path::Path::new(m)));
        let method = match obj.get("method").and_then(Value::as_str) {
            Some(m) => m,
            None => match &inferred {
                Some(DraftCheckpoint { head: Some(method), .. }) => method,
                Some(_) => "draft_model",
                None => "",
            },
        };
        let method = match method {
            "ngram" | "[ngram]" => {
                // vLLM's defaults: both 5 when neither is given, else the one given for both.
                let (min, max) = match (count("prompt_lookup_min")?, count("prompt_lookup_max")?) {
                    (None, None) => (5, 5),
                    (Some(min), None) => (min, min),
                    (None, Some(max)) => (max, max),
                    (Some(min), Some(max)) => (min, max),
                };
                if min > max {
                    return Err(bad(format!("prompt_lookup_min {min} is above prompt_lookup_max {max}")));
                }
                SpeculativeMethod::Ngram { prompt_lookup_min: min, prompt_lookup_max: max }
            }
            "suffix" => {
                let defaults = SuffixParams::default();
                let fraction = |key: &str, default: f32, max: f32| -> Result<f32> {
                    match obj.get(key) {
                        None | Some(Value::Null) => Ok(default),
                        Some(v) => v
                            .as_f64()
                            .map(|f| f as f32)
                            .filter(|f| f.is_finite() && *f >= 0.0 && *f <= max)
                            .ok_or_else(|| bad(format!("`{key}` must be a number in [0, {max}], got {v}"))),
                    }
                };
                let max_tree_depth =
                    count("suffix_decoding_max_tree_depth")?.unwrap_or(defaults.max_tree_depth).min(1 << 12);
                let max_cached_requests = match obj.get("suffix_decoding_max_cached_requests") {
                    None | Some(Value::Null) => defaults.max_cached_requests,
                    Some(v) => v.as_u64().map(|n| n as usize).ok_or_else(|| {
                        bad(format!("`suffix_decoding_max_cached_requests` must be a count, got {v}"))
                    })?,
                };
                SpeculativeMethod::Suffix(SuffixParams {
                    max_tree_depth,
                    max_cached_requests,
                    max_spec_factor: fraction("suffix_decoding_max_spec_factor", defaults.max_spec_factor, 1e6)?,
                    min_token_prob: fraction("suffix_decoding_min_token_prob", defaults.min_token_prob, 1.0)?,
                })
            }
            "draft_model" | "eagle" | "eagle3" => {
                let model =
                    given_model.ok_or_else(|| bad(format!("`{method}` needs `model`, the draft checkpoint's path")))?;
                let quantization = match obj.get("quantization") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(q)) => Some(q.clone()),
                    Some(v) => return Err(bad(format!("`quantization` must be a string, got {v}"))),
                };
                let draft = DraftModelConfig {
                    model: PathBuf::from(model),
                    quantization,
                    max_model_len: count("max_model_len")?,
                };
                match method {
                    "eagle" => SpeculativeMethod::Eagle(EagleVersion::One, draft),
                    "eagle3" => SpeculativeMethod::Eagle(EagleVersion::Three, draft),
                    _ => SpeculativeMethod::DraftModel(draft),
                }
            }
            // vLLM's per-family spellings (`qwen3_next_mtp`, `deepseek_mtp`, ...) all mean the
            // checkpoint's own head; whether the model has one is the loader's to say.
            m if m == "mtp" || m.ends_with("_mtp") => SpeculativeMethod::Mtp,
            m if NOT_BUILT.contains(&m) => {
                return Err(bad(format!("method `{m}` is not built in ferrite yet (built: {BUILT})")));
            }
            "" => return Err(bad(format!("`method` is missing (built: {BUILT})"))),
            m => return Err(bad(format!("unknown method `{m}`"))),
        };
        if let Some(tp) = obj.get("draft_tensor_parallel_size").filter(|v| !v.is_null()) {
            if tp.as_u64() != Some(1) {
                return Err(bad(format!("`draft_tensor_parallel_size` {tp}: ferrite runs the draft on one GPU (1)")));
            }
        }
        // Suffix decoding drafts up to its tree depth unless told otherwise, as in vLLM.
        let k = match (count("num_speculative_tokens")?, &method) {
            (Some(k), _) => k,
            (None, SpeculativeMethod::Suffix(p)) => p.max_tree_depth.min(MAX_SPECULATIVE_TOKENS),
            // vLLM's default for MTP: the checkpoint's one prediction layer.
            (None, SpeculativeMethod::Mtp) => 1,
            // A speculators checkpoint says how many its head was trained to propose.
            (None, _) => inferred
                .and_then(|c| c.speculative_tokens)
                .ok_or_else(|| bad("`num_speculative_tokens` is missing".into()))?,
        };
        if k > MAX_SPECULATIVE_TOKENS {
            return Err(bad(format!("num_speculative_tokens {k} is above {MAX_SPECULATIVE_TOKENS}")));
        }
        Ok(SpeculativeConfig { num_speculative_tokens: k, method })
    }

    /// The host drafter this configuration describes, with its own state; `None` for a draft
    /// model, which the runner runs.
    pub fn drafter(&self) -> Option<Drafter> {
        let kind = match &self.method {
            SpeculativeMethod::Ngram { prompt_lookup_min, prompt_lookup_max } => {
                DrafterKind::Ngram { min: *prompt_lookup_min, max: *prompt_lookup_max }
            }
            SpeculativeMethod::Suffix(params) => DrafterKind::Suffix(Box::new(SuffixCache::new(*params))),
            SpeculativeMethod::DraftModel(_) | SpeculativeMethod::Mtp | SpeculativeMethod::Eagle(..) => return None,
        };
        Some(Drafter { k: self.num_speculative_tokens, kind })
    }
}

/// What a draft checkpoint's `config.json` says of how to run it, read before it loads (an
/// unreadable one says nothing: loading it reports the problem).
struct DraftCheckpoint {
    /// The method its head runs by (`eagle`, `eagle3`); `None` for a draft model.
    head: Option<&'static str>,
    /// A speculators config's `speculators_config.proposal_methods[0].speculative_tokens`.
    speculative_tokens: Option<usize>,
}

impl DraftCheckpoint {
    fn peek(dir: &std::path::Path) -> DraftCheckpoint {
        let config: Value = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        let architecture = config.pointer("/architectures/0").and_then(Value::as_str).unwrap_or("");
        let speculators = config.get("speculators_model_type").and_then(Value::as_str);
        DraftCheckpoint {
            head: match architecture {
                _ if speculators == Some("eagle3") => Some("eagle3"),
                "EagleLlamaForCausalLM" => Some("eagle"),
                a if ferrite_models::registry::kinds(a).contains(&ferrite_models::registry::ModelKind::DraftHead) => {
                    Some("eagle3")
                }
                _ => None,
            },
            speculative_tokens: config
                .pointer("/speculators_config/proposal_methods/0/speculative_tokens")
                .and_then(Value::as_u64)
                .map(|k| k as usize)
                .filter(|&k| k >= 1),
        }
    }
}

/// Proposes drafts for the scheduler's running requests.
#[derive(Debug)]
pub struct Drafter {
    k: usize,
    kind: DrafterKind,
}

#[derive(Debug)]
enum DrafterKind {
    Ngram { min: usize, max: usize },
    Suffix(Box<SuffixCache>),
}

impl Drafter {
    pub fn num_speculative_tokens(&self) -> usize {
        self.k
    }

    /// Up to `room` (and `k`) drafts to follow request `id`'s `tokens`, the first `num_prompt`
    /// of which are its prompt.
    pub fn propose(&mut self, id: ReqId, tokens: &[u32], num_prompt: usize, room: usize) -> Vec<u32> {
        let k = room.min(self.k);
        match &mut self.kind {
            DrafterKind::Ngram { min, max } => ngram_lookup(tokens, *min, *max, k),
            DrafterKind::Suffix(cache) => cache.propose(id, tokens, num_prompt, k),
        }
    }

    /// Request `id` is finished (or aborted): a drafter that indexes requests lets it go.
    pub fn finish(&mut self, id: ReqId) {
        if let DrafterKind::Suffix(cache) = &mut self.kind {
            cache.finish(id);
        }
    }
}

/// A request a model drafter (a draft model, an MTP head) drafts for, as the runner holds it
/// after a step's draws.
pub struct DraftTarget<'a> {
    pub id: ReqId,
    /// Prompt and output so far.
    pub tokens: &'a [u32],
    pub num_prompt_tokens: usize,
    pub sampling: &'a RequestSampling,
    pub block_table: &'a [BlockId],
    /// At most this many drafts (what the request may still generate after the next draw).
    pub room: usize,
}

/// A draft per row of `logits`, each drawn as the target would draw the token after `rows[j].0`'s
/// tokens followed by the drafts `rows[j].1`: the request's logits processors, then its sampling
/// with the same Philox uniforms (see [`crate::draft_model`] for why).
pub(crate) fn draw_drafts(logits: &Tensor, rows: &[(&DraftTarget<'_>, &[u32])]) -> Result<Vec<u32>> {
    let outputs: Vec<Vec<u32>> = rows.iter().map(|(r, d)| [&r.tokens[r.num_prompt_tokens..], d].concat()).collect();
    let sample_rows: Vec<SampleRow> = rows
        .iter()
        .zip(&outputs)
        .map(|((r, _), output)| SampleRow { sampling: r.sampling, prompt: &r.tokens[..r.num_prompt_tokens], output })
        .collect();
    sampler::draw_tokens(logits, &sample_rows)
}

/// vLLM's n-gram proposal: the longest suffix of `tokens` of `min..=max` tokens that occurred
/// earlier (the earliest occurrence among the longest), and up to `k` tokens that followed it.
pub fn ngram_lookup(tokens: &[u32], min: usize, max: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || len < min.max(1) {
        return Vec::new();
    }
    for n in (min.max(1)..=max.min(len - 1)).rev() {
        let suffix = &tokens[len - n..];
        if let Some(start) = (0..len - n).find(|&s| &tokens[s..s + n] == suffix) {
            let from = start + n;
            return tokens[from..(from + k).min(len)].to_vec();
        }
    }
    Vec::new()
}

/// How many of `drafts` a step keeps, given the tokens the target drew at each of the
/// `drafts.len() + 1` positions: the drafts up to the first that differs from the draw there.
/// The tokens the step appends are `draws[..=accepted]`.
pub fn accepted_drafts(drafts: &[u32], draws: &[u32]) -> usize {
    drafts.iter().zip(draws).take_while(|(d, t)| d == t).count()
}

/// Speculation counters, as vLLM's `spec_decode` metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecDecodeStats {
    /// Drafts a request may get per step (`num_speculative_tokens`); 0 with speculation off.
    pub num_speculative_tokens: usize,
    /// Verify steps of requests that had drafts.
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    /// Accepted drafts by position in the draft (the first, the second, ...).
    pub num_accepted_tokens_per_pos: [u64; MAX_SPECULATIVE_TOKENS],
}

impl SpecDecodeStats {
    pub fn observe(&mut self, num_drafts: usize, num_accepted: usize) {
        if num_drafts == 0 {
            return;
        }
        self.num_drafts += 1;
        self.num_draft_tokens += num_drafts as u64;
        self.num_accepted_tokens += num_accepted as u64;
        for slot in &mut self.num_accepted_tokens_per_pos[..num_accepted.min(MAX_SPECULATIVE_TOKENS)] {
            *slot += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_lookup_takes_the_longest_then_earliest_match() {
        // vLLM's docstring example: [4, 2, 3] has no earlier match, [2, 3] has, at position 1.
        assert_eq!(ngram_lookup(&[1, 2, 3, 4, 2, 3], 2, 3, 4), [4, 2, 3]);
        // Two occurrences of [7, 8]: the earliest wins; the match may not be the suffix itself.
        assert_eq!(ngram_lookup(&[7, 8, 1, 7, 8, 2, 7, 8], 2, 2, 2), [1, 7]);
        // A longer match beats an earlier shorter one.
        assert_eq!(ngram_lookup(&[5, 9, 0, 6, 5, 9, 1, 6, 5, 9], 1, 3, 1), [1]);
        assert_eq!(ngram_lookup(&[1, 2, 3], 2, 3, 4), Vec::<u32>::new());
        assert_eq!(ngram_lookup(&[3, 3], 1, 1, 4), [3]);
        assert_eq!(ngram_lookup(&[1, 2, 1, 2], 2, 2, 0), Vec::<u32>::new());
    }

    #[test]
    fn config_parses_vllm_json_and_names_what_is_wrong() {
        let c = SpeculativeConfig::parse(r#"{"method": "ngram", "num_speculative_tokens": 3}"#).unwrap();
        assert_eq!(c.method, SpeculativeMethod::Ngram { prompt_lookup_min: 5, prompt_lookup_max: 5 });
        let c = SpeculativeConfig::parse(r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}"#);
        assert_eq!(c.unwrap().method, SpeculativeMethod::Ngram { prompt_lookup_min: 4, prompt_lookup_max: 4 });
        // A `model` without a `method` is a draft model, as vLLM infers it.
        let c = SpeculativeConfig::parse(r#"{"model": "/d", "num_speculative_tokens": 3, "max_model_len": 512}"#);
        let want = DraftModelConfig { model: "/d".into(), quantization: None, max_model_len: Some(512) };
        assert_eq!(c.unwrap().method, SpeculativeMethod::DraftModel(want.clone()));
        let c = SpeculativeConfig::parse(
            r#"{"method": "eagle3", "model": "/d", "num_speculative_tokens": 3, "max_model_len": 512}"#,
        );
        assert_eq!(c.unwrap().method, SpeculativeMethod::Eagle(EagleVersion::Three, want.clone()));
        let c = SpeculativeConfig::parse(
            r#"{"method": "eagle", "model": "/d", "num_speculative_tokens": 3, "max_model_len": 512}"#,
        );
        assert_eq!(c.unwrap().method, SpeculativeMethod::Eagle(EagleVersion::One, want));
        for (json, needle) in [
            (r#"{"method": "medusa", "num_speculative_tokens": 2}"#, "`medusa` is not built"),
            (r#"{"method": "eagle", "num_speculative_tokens": 2}"#, "`eagle` needs `model`"),
            (r#"{"method": "eagle3", "num_speculative_tokens": 2}"#, "`eagle3` needs `model`"),
            (r#"{"method": "suffix", "suffix_decoding_min_token_prob": 2}"#, "suffix_decoding_min_token_prob"),
            (r#"{"method": "draft_model", "num_speculative_tokens": 2}"#, "needs `model`"),
            (r#"{"model": "/d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 2}"#, "one GPU"),
            (r#"{"model": "/d", "num_speculative_tokens": 2, "quantization": 4}"#, "`quantization`"),
            (r#"{"model": "/d", "num_speculative_tokens": 2, "max_model_len": 0}"#, "`max_model_len`"),
            (r#"{"method": "ngram"}"#, "num_speculative_tokens"),
            (r#"{"method": "ngram", "num_speculative_tokens": 0}"#, "positive integer"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
                "above",
            ),
            (r#"{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}"#, "unknown key `typo`"),
            (r#"{"method": "warp", "num_speculative_tokens": 2}"#, "unknown method"),
            ("[1]", "JSON object"),
        ] {
            let err = SpeculativeConfig::parse(json).unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("--speculative-config"), "{json}: {err}");
        }
    }

    /// The tokens a verify step emits follow the target's distribution: over many seeds, the
    /// first emitted token's frequencies match softmax of the first position's logits, and the
    /// token after an accepted draft matches softmax of the second's. Rules that keep drafts the
    /// target would not have drawn fail the same check.
    #[test]
    fn verification_preserves_the_target_distribution() {
        use crate::params::{RequestSampling, SamplingParams};
        use crate::sampler::{sample, SampleRow};
        use ferrite_tensor::Tensor;

        let logits = [[0.3f32, 1.2, -0.4, 0.9], [1.0, -1.0, 0.5, 0.0]];
        let probs = |row: &[f32; 4]| {
            let z: f32 = row.iter().map(|l| l.exp()).sum();
            row.map(|l| l.exp() / z)
        };
        let (p0, p1) = (probs(&logits[0]), probs(&logits[1]));
        let draft = 3u32;
        let trials = 20_000;
        let t = Tensor::from_f32(logits.concat(), &[2, 4]).unwrap();
        let frequencies = |rule: &dyn Fn(&[u32], &[u32]) -> usize| {
            let (mut first, mut second, mut accepted) = ([0f32; 4], [0f32; 4], 0f32);
            for seed in 0..trials {
                let sampling = RequestSampling {
                    params: SamplingParams { temperature: 1.0, ..Default::default() }.normalized(),
                    max_tokens: 8,
                    eos_token_id: None,
                    stop_token_ids: vec![],
                    min_tokens_mask: vec![],
                    seed,
                    bad_words_token_ids: vec![],
                    grammar: None,
                    multimodal: None,
                };
                let rows = [
                    SampleRow { sampling: &sampling, prompt: &[1], output: &[] },
                    SampleRow { sampling: &sampling, prompt: &[1], output: &[draft] },
                ];
                let draws: Vec<u32> = sample(&t, &rows, None).unwrap().iter().map(|s| s.token_id).collect();
                let kept = rule(&[draft], &draws);
                let emitted = [&[draft][..kept], &draws[kept..=kept]].concat();
                first[emitted[0] as usize] += 1.0;
                if kept == 1 {
                    second[emitted[1] as usize] += 1.0;
                    accepted += 1.0;
                }
            }
            let n = trials as f32;
            (first.map(|c| c / n), second.map(|c| c / accepted.max(1.0)), accepted / n)
        };
        // 20,000 draws: a frequency's standard error is at most 0.0035; after the ~25 % of
        // trials that accept, 0.007. The bounds are over four of those.
        let within =
            |got: [f32; 4], want: [f32; 4], bound: f32| got.iter().zip(want).all(|(g, w)| (g - w).abs() < bound);
        let (first, second, rate) = frequencies(&accepted_drafts);
        assert!(within(first, p0, 0.015), "first token {first:?} vs {p0:?}");
        assert!(within(second, p1, 0.03), "after an accepted draft {second:?} vs {p1:?}");
        assert!((rate - p0[draft as usize]).abs() < 0.015, "acceptance rate {rate} vs p(draft) {}", p0[3]);
        // Broken rules: keeping every draft, or judging a draft by the next position's draw.
        let (first, ..) = frequencies(&|d: &[u32], _: &[u32]| d.len());
        assert!(!within(first, p0, 0.015), "always accepting went unnoticed: {first:?}");
        let (first, ..) = frequencies(&|d: &[u32], t: &[u32]| usize::from(d[0] == t[1]));
        assert!(!within(first, p0, 0.015), "an off-by-one acceptance went unnoticed: {first:?}");
    }

    /// `--speculative-config` from a stranger: any JSON is a config within bounds or an error
    /// naming the flag, never a panic.
    mod hostile {
        use proptest::prelude::*;
        use serde_json::{json, Value};

        use super::super::*;

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                (-1e12f64..1e12).prop_map(Value::from),
                Just(json!(f64::MAX)),
                Just(json!(u64::MAX)),
                prop_oneof![
                    Just("ngram"),
                    Just("suffix"),
                    Just("draft_model"),
                    Just("eagle"),
                    Just("eagle3"),
                    Just(""),
                    Just("[ngram]")
                ]
                .prop_map(Value::from),
                Just(json!([1, 2])),
                Just(json!({"a": 1})),
            ]
        }

        fn key() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("method"),
                Just("num_speculative_tokens"),
                Just("prompt_lookup_min"),
                Just("prompt_lookup_max"),
                Just("model"),
                Just("quantization"),
                Just("max_model_len"),
                Just("draft_tensor_parallel_size"),
                Just("suffix_decoding_max_tree_depth"),
                Just("suffix_decoding_max_cached_requests"),
                Just("suffix_decoding_max_spec_factor"),
                Just("suffix_decoding_min_token_prob"),
                Just("bogus"),
            ]
            .prop_map(String::from)
        }

        proptest! {
            #[test]
            fn any_json_is_a_bounded_config_or_an_error(fields in proptest::collection::vec((key(), value()), 0..6)) {
                let obj: serde_json::Map<String, Value> = fields.into_iter().collect();
                match SpeculativeConfig::parse(&Value::Object(obj).to_string()) {
                    Ok(c) => {
                        prop_assert!((1..=MAX_SPECULATIVE_TOKENS).contains(&c.num_speculative_tokens));
                        match &c.method {
                            SpeculativeMethod::Ngram { prompt_lookup_min: a, prompt_lookup_max: b } => prop_assert!(1 <= *a && a <= b),
                            SpeculativeMethod::Suffix(p) => {
                                prop_assert!(p.max_tree_depth >= 1);
                                prop_assert!((0.0..=1.0).contains(&p.min_token_prob));
                                // The drafter it makes runs.
                                let mut d = c.drafter().expect("a host drafter");
                                let _ = d.propose(0, &[1, 2, 3, 1, 2], 2, 4);
                                d.finish(0);
                            }
                            SpeculativeMethod::Mtp => prop_assert!(c.drafter().is_none()),
                            SpeculativeMethod::DraftModel(d) | SpeculativeMethod::Eagle(_, d) => {
                                prop_assert!(!d.model.as_os_str().is_empty());
                                prop_assert!(d.max_model_len.is_none_or(|n| n >= 1));
                                prop_assert!(c.drafter().is_none());
                            }
                        }
                    }
                    Err(e) => prop_assert!(e.to_string().contains("--speculative-config"), "{e}"),
                }
            }
        }
    }

    #[test]
    fn acceptance_stops_at_the_first_differing_draw() {
        assert_eq!(accepted_drafts(&[4, 5, 6], &[4, 5, 6, 7]), 3);
        assert_eq!(accepted_drafts(&[4, 5, 6], &[4, 9, 6, 7]), 1);
        assert_eq!(accepted_drafts(&[4], &[3, 1]), 0);
        assert_eq!(accepted_drafts(&[], &[3]), 0);
        let mut s = SpecDecodeStats::default();
        s.observe(3, 2);
        s.observe(2, 0);
        s.observe(0, 0);
        assert_eq!((s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens), (2, 5, 2));
        assert_eq!(s.num_accepted_tokens_per_pos[..3], [1, 1, 0]);
    }
}
