//! Request fields -> engine `SamplingParams`, with vLLM's checks and messages for the integer
//! fields (which must be caught before they become unsigned). Everything else is the engine's
//! to validate, once, when the request is processed; [`engine_error`] maps its errors to HTTP.

use ferrite_engine::{EngineError, SamplingParams};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::protocol::SamplingFields;

/// Sampling defaults a model's creator recommends in its `generation_config.json`, used for the
/// fields a request leaves out, as vLLM does under `--generation-config auto`. Like vLLM, which
/// reads the file through transformers' `GenerationConfig.to_diff_dict()`, a value equal to
/// transformers' own default (temperature 1, top-p 1, top-k 50, repetition penalty 1) does not
/// count as a recommendation. `max_new_tokens` becomes the default `max_tokens` of chat requests
/// (completions keep the OpenAI default of 16, as in vLLM, whose completion requests always carry
/// one).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_tokens: Option<usize>,
}

impl SamplingDefaults {
    /// The recommendations in a parsed `generation_config.json`; `file` names it in errors.
    pub fn from_generation_config(config: &serde_json::Value, file: &str) -> Result<SamplingDefaults, String> {
        let number = |key: &str, hf_default: Option<f64>| -> Result<Option<f64>, String> {
            match config.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => {
                    let x = v.as_f64().ok_or_else(|| format!("{file}: `{key}` must be a number, got {v}"))?;
                    Ok((Some(x) != hf_default).then_some(x))
                }
            }
        };
        let top_k = number("top_k", Some(50.0))?
            .map(|k| {
                if k.fract() == 0.0 && k >= i32::MIN as f64 && k <= i32::MAX as f64 {
                    Ok(k as i32)
                } else {
                    Err(format!("{file}: `top_k` must be an integer, got {k}"))
                }
            })
            .transpose()?;
        let max_tokens = number("max_new_tokens", None)?
            .map(|m| {
                if m.fract() == 0.0 && m >= 1.0 && m <= u32::MAX as f64 {
                    Ok(m as usize)
                } else {
                    Err(format!("{file}: `max_new_tokens` must be a positive integer, got {m}"))
                }
            })
            .transpose()?;
        Ok(SamplingDefaults {
            temperature: number("temperature", Some(1.0))?.map(|v| v as f32),
            top_p: number("top_p", Some(1.0))?.map(|v| v as f32),
            top_k,
            min_p: number("min_p", None)?.map(|v| v as f32),
            repetition_penalty: number("repetition_penalty", Some(1.0))?.map(|v| v as f32),
            max_tokens,
        })
    }

    pub fn is_empty(&self) -> bool {
        *self == SamplingDefaults::default()
    }

    /// Engine defaults with these recommendations on top.
    fn params(&self) -> SamplingParams {
        let base = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_p: self.top_p.unwrap_or(base.top_p),
            top_k: self.top_k.unwrap_or(base.top_k),
            min_p: self.min_p.unwrap_or(base.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(base.repetition_penalty),
            ..base
        }
    }
}

/// OpenAI's own cap on `n`. The engine allows vLLM's 16384, but over HTTP a request for that
/// many choices is far more likely a mistake than a workload.
pub const MAX_N: i64 = 128;

/// What the endpoint decided beyond the shared sampling fields.
pub struct Requested {
    /// `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    pub logprobs: Option<usize>,
    pub prompt_logprobs: Option<usize>,
}

pub fn check_logprobs(param: &str, value: i64, max: usize) -> Result<usize, ApiError> {
    if value < 0 {
        return Err(ApiError::invalid(param, format!("{param} must be non-negative, got {value}.")));
    }
    if value as u64 > max as u64 {
        return Err(ApiError::invalid(param, format!("{param} must be at most {max}, got {value}.")));
    }
    Ok(value as usize)
}

/// The request's `prompt_logprobs`, checked against the server's `--max-logprobs`.
pub fn prompt_logprobs(fields: &SamplingFields, max: usize) -> Result<Option<usize>, ApiError> {
    fields.prompt_logprobs.map(|v| check_logprobs("prompt_logprobs", v, max)).transpose()
}

pub fn check_max_tokens(param: &str, value: i64) -> Result<usize, ApiError> {
    if value < 1 {
        return Err(ApiError::invalid(param, format!("max_tokens must be at least 1, got {value}.")));
    }
    usize::try_from(value).map_err(|_| ApiError::invalid(param, format!("max_tokens is too large: {value}")))
}

/// A chat request's `max_tokens`, as vLLM resolves it: the request's own value (already checked
/// against the context), else the model's recommended `max_new_tokens` cut to the room the prompt
/// leaves, else `None` (up to the end of the context). A prompt that leaves no room gets 1, for
/// the engine to refuse with vLLM's message.
pub fn chat_max_tokens(
    requested: Option<usize>,
    recommended: Option<usize>,
    prompt_len: usize,
    max_model_len: usize,
) -> Option<usize> {
    requested.or_else(|| recommended.map(|m| m.min(max_model_len.saturating_sub(prompt_len)).max(1)))
}

/// The number of choices per prompt, checked.
pub fn choices(fields: &SamplingFields) -> Result<usize, ApiError> {
    let n = fields.n.unwrap_or(1);
    if n < 1 {
        return Err(ApiError::invalid("n", format!("n must be at least 1, got {n}.")));
    }
    if n > MAX_N {
        return Err(ApiError::invalid("n", format!("n must be at most {MAX_N}, got {n}.")));
    }
    Ok(n as usize)
}

/// vLLM request fields ferrite has not built, with the value that means "off" (a request may
/// send that, or null): any other value is refused naming the field, never silently ignored.
fn unsupported_field(key: &str) -> Option<Value> {
    Some(match key {
        "use_beam_search" | "return_token_offsets" | "return_prompt_text" | "return_mm_kwargs" | "echo" => json!(false),
        "spaces_between_special_tokens" => json!(true),
        "length_penalty" => json!(1.0),
        "priority" => json!(0),
        "prompt_embeds"
        | "logits_processors"
        | "logprob_token_ids"
        | "documents"
        | "mm_processor_kwargs"
        | "media_io_kwargs"
        | "cache_salt"
        | "kv_transfer_params"
        | "ec_transfer_params"
        | "vllm_xargs"
        | "thinking_token_budget"
        | "repetition_detection"
        | "stream_interval"
        | "watermarking"
        | "routed_experts_prompt_start"
        | "structural_tag"
        | "request_id"
        | "session_id" => Value::Null,
        _ => return None,
    })
}

/// vLLM's `truncate_prompt_tokens`: a prompt cut to its last (or first) k tokens before it is
/// checked against the context; the text of a cut prompt is its kept tokens' text.
pub fn truncate_prompt(
    prompt: &mut crate::generate::Prompt,
    fields: &SamplingFields,
    max_model_len: usize,
    tokenizer: &ferrite_tokenizer::Tokenizer,
) -> Result<(), ApiError> {
    let Some(k) = fields.truncate_prompt_tokens else { return Ok(()) };
    let keep = match k {
        -1 => max_model_len,
        k if k >= 1 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return Err(ApiError::invalid(
                "truncate_prompt_tokens",
                format!("truncate_prompt_tokens must be -1 or at least 1, got {k}"),
            ))
        }
    };
    let left = match fields.truncation_side.as_deref() {
        None | Some("left") => true,
        Some("right") => false,
        Some(other) => {
            return Err(ApiError::invalid(
                "truncation_side",
                format!("truncation_side must be left or right, got {other:?}"),
            ))
        }
    };
    if prompt.ids.len() > keep {
        let cut = prompt.ids.len() - keep;
        prompt.ids = if left { prompt.ids.split_off(cut) } else { prompt.ids[..keep].to_vec() };
        prompt.tokenized_with_special_tokens = None;
        if prompt.text.is_some() {
            prompt.text = Some(tokenizer.decode(&prompt.ids, false).map_err(|e| ApiError::internal(e.to_string()))?);
        }
    }
    Ok(())
}

/// Refuses a vLLM field ferrite has not built (unless it carries its "off" value); fields vLLM
/// does not know either are ignored with a debug line, as vLLM does.
pub fn check_unsupported(other: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    for (key, value) in other {
        match unsupported_field(key) {
            Some(off)
                if value.is_null() || value == &off || value.as_f64().is_some_and(|v| off.as_f64() == Some(v)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    key,
                    format!("`{key}` is not supported by this server (ferrite has not built it); omit the field"),
                ))
            }
            None => tracing::debug!(field = %key, "request field ignored"),
        }
    }
    Ok(())
}

pub fn build(
    fields: &SamplingFields,
    requested: Requested,
    model_defaults: &SamplingDefaults,
) -> Result<SamplingParams, ApiError> {
    check_unsupported(&fields.other)?;
    if fields
        .other
        .get("guided_decoding_backend")
        .and_then(Value::as_str)
        .is_some_and(|b| !matches!(b, "auto" | "guidance"))
    {
        return Err(ApiError::invalid(
            "guided_decoding_backend",
            "guided_decoding_backend: ferrite's structured-output backend is guidance (llguidance)",
        ));
    }
    let n = choices(fields)?;
    if let Some(best_of) = fields.best_of {
        if best_of != n as i64 {
            return Err(ApiError::invalid("best_of", "best_of is not supported; leave it unset or equal to n."));
        }
    }
    let logit_bias = fields
        .logit_bias
        .iter()
        .flatten()
        .map(|(id, bias)| {
            let id = id.trim().parse::<u32>().map_err(|_| {
                ApiError::invalid("logit_bias", format!("logit_bias keys must be token ids, got {id:?}"))
            })?;
            let bias = bias.as_f64().ok_or_else(|| {
                ApiError::invalid("logit_bias", format!("logit_bias values must be numbers, got {bias}"))
            })?;
            // OpenAI's range; vLLM clamps to it.
            Ok((id, bias.clamp(-100.0, 100.0) as f32))
        })
        .collect::<Result<std::collections::BTreeMap<u32, f32>, ApiError>>()?
        // Keys that name one id twice ("1" and "01") keep the last, as a Python dict would; the
        // list then holds at most one entry per vocabulary id.
        .into_iter()
        .collect::<Vec<_>>();
    let allowed_token_ids = fields
        .allowed_token_ids
        .as_ref()
        .map(|ids| {
            ids.iter()
                .map(|&id| {
                    u32::try_from(id).map_err(|_| {
                        ApiError::invalid("allowed_token_ids", format!("Token id {id} is out of vocabulary"))
                    })
                })
                .collect::<Result<std::collections::BTreeSet<u32>, _>>()
                .map(|ids| ids.into_iter().collect::<Vec<u32>>())
        })
        .transpose()?;
    let min_tokens = match fields.min_tokens.unwrap_or(0) {
        m if m < 0 => {
            return Err(ApiError::invalid(
                "min_tokens",
                format!("min_tokens must be greater than or equal to 0, got {m}."),
            ))
        }
        m => usize::try_from(m).unwrap_or(usize::MAX),
    };
    let stop_token_ids = fields
        .stop_token_ids
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|&id| {
            u32::try_from(id)
                .map_err(|_| ApiError::invalid("stop_token_ids", format!("Token id {id} is out of vocabulary")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = model_defaults.params();
    Ok(SamplingParams {
        n,
        temperature: fields.temperature.map_or(defaults.temperature, |v| v as f32),
        top_p: fields.top_p.map_or(defaults.top_p, |v| v as f32),
        // Out-of-range values saturate; the engine then rejects them with its own message.
        top_k: fields.top_k.map_or(defaults.top_k, |k| k.clamp(i32::MIN as i64, i32::MAX as i64) as i32),
        min_p: fields.min_p.map_or(defaults.min_p, |v| v as f32),
        repetition_penalty: fields.repetition_penalty.map_or(defaults.repetition_penalty, |v| v as f32),
        presence_penalty: fields.presence_penalty.map_or(defaults.presence_penalty, |v| v as f32),
        frequency_penalty: fields.frequency_penalty.map_or(defaults.frequency_penalty, |v| v as f32),
        // Any 64-bit pattern is a valid seed; negative seeds stay distinct and deterministic.
        seed: fields.seed.map(|s| s as u64),
        max_tokens: requested.max_tokens,
        min_tokens,
        stop: fields.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_token_ids,
        ignore_eos: fields.ignore_eos.unwrap_or(false),
        logprobs: requested.logprobs,
        prompt_logprobs: requested.prompt_logprobs,
        skip_special_tokens: fields.skip_special_tokens.unwrap_or(true),
        include_stop_str_in_output: fields.include_stop_str_in_output.unwrap_or(false),
        logit_bias,
        allowed_token_ids,
        bad_words: fields.bad_words.clone().unwrap_or_default(),
        structured_outputs: crate::structured::from_request(fields)?,
        structured_outputs_after: None,
    })
}

/// Engine errors as HTTP errors: what the request caused is the client's fault (400), a stopped
/// or overloaded engine is a 503, anything else a 500.
pub fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidParameter { param, message } => ApiError::invalid(param, format!("{param} {message}")),
        EngineError::EngineStopped | EngineError::Overloaded { .. } => ApiError::unavailable(e.to_string()),
        e if e.is_request_error() => ApiError::bad_request(e.to_string()),
        e => ApiError::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requested() -> Requested {
        Requested { max_tokens: Some(8), logprobs: None, prompt_logprobs: None }
    }

    #[test]
    fn generation_config_recommendations_skip_transformers_defaults() {
        let config = serde_json::json!({
            "temperature": 0.6, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.0,
            "do_sample": true, "eos_token_id": [1, 2], "max_new_tokens": 100
        });
        let d = SamplingDefaults::from_generation_config(&config, "generation_config.json").unwrap();
        assert_eq!(
            d,
            SamplingDefaults { temperature: Some(0.6), top_p: Some(0.9), max_tokens: Some(100), ..Default::default() }
        );
        for bad in [serde_json::json!(0), serde_json::json!(-3), serde_json::json!(2.5)] {
            let err = SamplingDefaults::from_generation_config(&serde_json::json!({"max_new_tokens": bad}), "gen.json")
                .unwrap_err();
            assert!(err.contains("gen.json") && err.contains("max_new_tokens"), "{err}");
        }
        let none = SamplingDefaults::from_generation_config(&serde_json::json!({"eos_token_id": 2}), "g").unwrap();
        assert!(none.is_empty());
        let k =
            SamplingDefaults::from_generation_config(&serde_json::json!({"top_k": 20, "min_p": 0.05}), "g").unwrap();
        assert_eq!((k.top_k, k.min_p), (Some(20), Some(0.05)));
        let err = SamplingDefaults::from_generation_config(&serde_json::json!({"top_k": 2.5}), "gen.json").unwrap_err();
        assert!(err.contains("gen.json") && err.contains("top_k"), "{err}");
        let err = SamplingDefaults::from_generation_config(&serde_json::json!({"temperature": "hot"}), "gen.json")
            .unwrap_err();
        assert!(err.contains("temperature"), "{err}");
    }

    #[test]
    fn model_defaults_fill_only_the_fields_a_request_leaves_out() {
        let defaults = SamplingDefaults { temperature: Some(0.6), top_k: Some(20), ..Default::default() };
        let omitted = SamplingFields::default();
        let p = build(&omitted, requested(), &defaults).unwrap();
        assert_eq!((p.temperature, p.top_k, p.top_p), (0.6, 20, 1.0));
        let explicit = SamplingFields { temperature: Some(0.0), top_k: Some(-1), ..Default::default() };
        let p = build(&explicit, requested(), &defaults).unwrap();
        assert_eq!((p.temperature, p.top_k), (0.0, -1));
        let p = build(&omitted, requested(), &SamplingDefaults::default()).unwrap();
        assert_eq!(p.temperature, SamplingParams::default().temperature);
    }

    #[test]
    fn chat_max_tokens_prefers_the_request_then_the_model_cut_to_the_context() {
        assert_eq!(chat_max_tokens(Some(7), Some(5), 10, 100), Some(7));
        assert_eq!(chat_max_tokens(None, Some(5), 10, 100), Some(5));
        assert_eq!(chat_max_tokens(None, Some(500), 10, 100), Some(90));
        assert_eq!(chat_max_tokens(None, None, 10, 100), None);
    }

    /// Hostile bodies (issue 34): any JSON object over the sampling fields' names (and a few
    /// unknown ones), with values of any JSON type, is either refused by serde, or built into
    /// engine parameters (or a 400) without a panic.
    mod hostile {
        use proptest::prelude::*;
        use serde_json::{Map, Value};

        use super::*;

        const KEYS: &[&str] = &[
            "n",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "min_tokens",
            "logit_bias",
            "allowed_token_ids",
            "bad_words",
            "best_of",
            "response_format",
            "structured_outputs",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "guided_whitespace_pattern",
            "truncate_prompt_tokens",
            "truncation_side",
            "return_token_ids",
            "prompt_logprobs",
            "use_beam_search",
            "priority",
            "length_penalty",
            "guided_decoding_backend",
            "no_such_field",
        ];

        fn json(depth: u32) -> BoxedStrategy<Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                prop_oneof![Just(0i64), Just(-1), Just(1), Just(i64::MAX), Just(i64::MIN)].prop_map(Value::from),
                any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(Value::from),
                "[a-z0-9 {}\\[\\]\"]{0,12}".prop_map(Value::from),
            ];
            if depth == 0 {
                return leaf.boxed();
            }
            prop_oneof![
                3 => leaf,
                1 => proptest::collection::vec(json(depth - 1), 0..4).prop_map(Value::from),
                1 => proptest::collection::vec(("[a-z_]{1,8}", json(depth - 1)), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
            ]
            .boxed()
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(3000), ..ProptestConfig::default() })]
            /// A checkpoint's `generation_config.json` is read or refused with a message naming
            /// the file, whatever its values.
            #[test]
            fn any_generation_config_is_read_or_refused(fields in proptest::collection::vec((
                proptest::sample::select(&["temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                    "max_new_tokens", "eos_token_id", "do_sample", "bos_token_id"][..]),
                json(1),
            ), 0..6)) {
                let config = Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
                if let Err(e) = SamplingDefaults::from_generation_config(&config, "generation_config.json") {
                    prop_assert!(e.starts_with("generation_config.json: "), "{}", e);
                }
            }

            #[test]
            fn any_body_builds_or_is_refused(fields in proptest::collection::vec((proptest::sample::select(KEYS), json(2)), 0..8)) {
                let body = Value::Object(fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
                if let Ok(fields) = serde_json::from_value::<SamplingFields>(body) {
                    let _ = build(&fields, requested(), &SamplingDefaults::default());
                }
            }
        }
    }
}
