//! Errors as OpenAI's JSON body `{"error": {"message", "type", "param", "code"}}`, with vLLM's
//! type names (`BadRequestError`, `NotFoundError`, ...) and the HTTP status as `code`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

#[derive(Serialize)]
struct ErrorInfo<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: u16,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorInfo<'a>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 naming the offending request field, as OpenAI's `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body alone, for an error that happens after an SSE stream has started (vLLM
    /// sends it as one `data:` event before `[DONE]`).
    pub fn to_json(&self) -> String {
        let body = ErrorBody {
            error: ErrorInfo {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| String::from(r#"{"error":{"message":"internal error"}}"#))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), message = %self.message, "request failed");
        } else {
            tracing::debug!(status = self.status.as_u16(), message = %self.message, "request rejected");
        }
        (self.status, [(header::CONTENT_TYPE, "application/json")], self.to_json()).into_response()
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(r: axum::extract::rejection::BytesRejection) -> ApiError {
        ApiError::new(r.status(), r.body_text())
    }
}

/// Parses a JSON request body; malformed JSON, bad UTF-8, wrong types and missing fields all
/// become a 400 that quotes serde's reason (which names the field and position).
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_with_vllm_type_names() {
        let e = ApiError::invalid("max_tokens", "max_tokens must be at least 1, got -1.");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["param"], "max_tokens");
        assert_eq!(v["error"]["code"], 400);
        assert_eq!(v["error"]["message"], "max_tokens must be at least 1, got -1.");
    }

    #[test]
    fn malformed_bodies_are_bad_requests() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct R {
            prompt: String,
        }
        for body in [&b"{"[..], b"{}", b"{\"prompt\": 3}", b"{\"prompt\": \"\xff\"}"] {
            let e = parse_json::<R>(body).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{}", e.message);
        }
    }
}
