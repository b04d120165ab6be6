//! Request fields -> engine `SamplingParams`, with vLLM's checks and messages for the integer
//! fields (which must be caught before they become unsigned) and the engine's own `validate`
//! for the rest.

use ferrite_engine::params::MAX_LOGPROBS;
use ferrite_engine::{EngineError, SamplingParams};

use crate::error::ApiError;
use crate::protocol::SamplingFields;

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

pub fn check_logprobs(param: &str, value: i64) -> Result<usize, ApiError> {
    if value < 0 {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be non-negative, got {value}."),
        ));
    }
    if value > MAX_LOGPROBS as i64 {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be at most {MAX_LOGPROBS}, got {value}."),
        ));
    }
    Ok(value as usize)
}

pub fn check_max_tokens(param: &str, value: i64) -> Result<usize, ApiError> {
    if value < 1 {
        return Err(ApiError::invalid(
            param,
            format!("max_tokens must be at least 1, got {value}."),
        ));
    }
    usize::try_from(value)
        .map_err(|_| ApiError::invalid(param, format!("max_tokens is too large: {value}")))
}

/// The number of choices per prompt, checked.
pub fn choices(fields: &SamplingFields) -> Result<usize, ApiError> {
    let n = fields.n.unwrap_or(1);
    if n < 1 {
        return Err(ApiError::invalid(
            "n",
            format!("n must be at least 1, got {n}."),
        ));
    }
    if n > MAX_N {
        return Err(ApiError::invalid(
            "n",
            format!("n must be at most {MAX_N}, got {n}."),
        ));
    }
    Ok(n as usize)
}

pub fn build(
    fields: &SamplingFields,
    requested: Requested,
    vocab_bound: usize,
) -> Result<SamplingParams, ApiError> {
    let n = choices(fields)?;
    if let Some(best_of) = fields.best_of {
        if best_of != n as i64 {
            return Err(ApiError::invalid(
                "best_of",
                "best_of is not supported; leave it unset or equal to n.",
            ));
        }
    }
    if fields.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::invalid(
            "logit_bias",
            "logit_bias is not supported yet.",
        ));
    }
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
        .map(|&id| match u32::try_from(id) {
            Ok(v) if (v as usize) < vocab_bound => Ok(v),
            _ => Err(ApiError::invalid(
                "stop_token_ids",
                format!("Token id {id} is out of vocabulary"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        n,
        temperature: fields
            .temperature
            .map_or(defaults.temperature, |v| v as f32),
        top_p: fields.top_p.map_or(defaults.top_p, |v| v as f32),
        // Out-of-range values saturate; the engine then rejects them with its own message.
        top_k: fields.top_k.map_or(defaults.top_k, |k| {
            k.clamp(i32::MIN as i64, i32::MAX as i64) as i32
        }),
        min_p: fields.min_p.map_or(defaults.min_p, |v| v as f32),
        repetition_penalty: fields
            .repetition_penalty
            .map_or(defaults.repetition_penalty, |v| v as f32),
        presence_penalty: fields
            .presence_penalty
            .map_or(defaults.presence_penalty, |v| v as f32),
        frequency_penalty: fields
            .frequency_penalty
            .map_or(defaults.frequency_penalty, |v| v as f32),
        // Any 64-bit pattern is a valid seed; negative seeds stay distinct and deterministic.
        seed: fields.seed.map(|s| s as u64),
        max_tokens: requested.max_tokens,
        min_tokens,
        stop: fields
            .stop
            .clone()
            .map(|s| s.into_vec())
            .unwrap_or_default(),
        stop_token_ids,
        ignore_eos: fields.ignore_eos.unwrap_or(false),
        logprobs: requested.logprobs,
        prompt_logprobs: requested.prompt_logprobs,
        skip_special_tokens: fields.skip_special_tokens.unwrap_or(true),
        include_stop_str_in_output: fields.include_stop_str_in_output.unwrap_or(false),
    };
    // Temperatures, probabilities, penalties and the cross-field rules are checked where they
    // are defined.
    params.validate().map_err(engine_error)?;
    Ok(params)
}

/// Engine errors as HTTP errors: what the request caused is the client's fault (400), a stopped
/// engine is a 503, anything else a 500.
pub fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::InvalidParameter { param, message } => {
            ApiError::invalid(param, format!("{param} {message}"))
        }
        EngineError::EngineStopped => ApiError::unavailable(e.to_string()),
        e if e.is_request_error() => ApiError::bad_request(e.to_string()),
        e => ApiError::internal(e.to_string()),
    }
}
