//! vLLM's `/tokenize` (a prompt, or chat messages through the template) and `/detokenize`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;

use crate::chat::{chat_prompt, PromptOptions};
use crate::error::{parse_json, ApiError};
use crate::protocol::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use crate::{off_runtime, AppState};

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let body = body?;
    // A long prompt's tokenization must not stall the async runtime.
    let (tokens, token_strs) = off_runtime({
        let state = state.clone();
        move || {
            let req: TokenizeRequest = parse_json(&body)?;
            state.served.check_model(req.model.as_deref())?;
            let tokens = match (&req.prompt, &req.messages) {
                (Some(prompt), None) => state
                    .tokenizer
                    .encode(prompt, req.add_special_tokens.unwrap_or(true))
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
                // As in vLLM, the chat form adds no special tokens by default: the template has them.
                (None, Some(messages)) => {
                    let options = PromptOptions {
                        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                        add_special_tokens: req.add_special_tokens.unwrap_or(false),
                        ..Default::default()
                    };
                    let rendered = chat_prompt(&state, messages, &options)?;
                    if let Some(item) = rendered.media.first() {
                        return Err(ApiError::invalid(
                            "messages",
                            format!("{}: /tokenize does not expand image input", item.location),
                        ));
                    }
                    rendered.prompt.ids
                }
                _ => return Err(ApiError::bad_request("Either `prompt` or `messages` must be given, not both")),
            };
            let token_strs = req
                .return_token_strs
                .unwrap_or(false)
                .then(|| tokens.iter().map(|&id| state.tokenizer.id_to_token(id).unwrap_or_default()).collect());
            Ok((tokens, token_strs))
        }
    })
    .await?;
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: state.served.max_model_len, tokens, token_strs }))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req: DetokenizeRequest = parse_json(&body?)?;
    state.served.check_model(req.model.as_deref())?;
    let ids = state.served.check_token_ids(&req.tokens, "tokens")?;
    let prompt = state.tokenizer.decode(&ids, false).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
