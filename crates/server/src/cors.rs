//! Cross-origin resource sharing as vLLM configures Starlette's `CORSMiddleware`
//! (`--allowed-origins`, `--allow-credentials`, `--allowed-methods`, `--allowed-headers`, every
//! list `["*"]` by default), on `tower-http`'s layer.

use axum::http::{HeaderName, HeaderValue, Method};
pub use tower_http::cors::CorsLayer;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin};

#[derive(Debug, Clone, PartialEq)]
pub struct Cors {
    pub allowed_origins: Vec<String>,
    pub allow_credentials: bool,
    pub allowed_methods: Vec<String>,
    pub allowed_headers: Vec<String>,
}

impl Default for Cors {
    fn default() -> Cors {
        let all = || vec!["*".to_string()];
        Cors { allowed_origins: all(), allow_credentials: false, allowed_methods: all(), allowed_headers: all() }
    }
}

impl Cors {
    /// The layer, or which value of which flag is not a valid origin, method or header name.
    /// A `*` with credentials allowed echoes the request's origin, method or headers, as
    /// Starlette does: browsers refuse a literal `*` on a credentialed response (and tower-http
    /// would refuse to build that layer).
    pub fn layer(&self) -> Result<CorsLayer, String> {
        let any = |list: &[String]| list.iter().any(|v| v == "*");
        let origin = if any(&self.allowed_origins) {
            if self.allow_credentials {
                AllowOrigin::mirror_request()
            } else {
                AllowOrigin::any()
            }
        } else {
            let parsed = self.allowed_origins.iter().map(|o| {
                HeaderValue::from_str(o).map_err(|_| format!("--allowed-origins: {o:?} is not a valid origin"))
            });
            AllowOrigin::list(parsed.collect::<Result<Vec<_>, _>>()?)
        };
        let methods = if any(&self.allowed_methods) {
            if self.allow_credentials {
                AllowMethods::mirror_request()
            } else {
                AllowMethods::any()
            }
        } else {
            let parsed = self.allowed_methods.iter().map(|m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("--allowed-methods: {m:?} is not an HTTP method"))
            });
            AllowMethods::list(parsed.collect::<Result<Vec<_>, _>>()?)
        };
        let headers = if any(&self.allowed_headers) {
            if self.allow_credentials {
                AllowHeaders::mirror_request()
            } else {
                AllowHeaders::any()
            }
        } else {
            let parsed = self.allowed_headers.iter().map(|h| {
                HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("--allowed-headers: {h:?} is not a valid header name"))
            });
            AllowHeaders::list(parsed.collect::<Result<Vec<_>, _>>()?)
        };
        Ok(CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(headers)
            .allow_credentials(self.allow_credentials))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_name_their_flag() {
        let bad_origin = Cors { allowed_origins: vec!["http://a\nb".into()], ..Cors::default() };
        assert!(bad_origin.layer().unwrap_err().contains("--allowed-origins"));
        let bad_method = Cors { allowed_methods: vec!["GE T".into()], ..Cors::default() };
        assert!(bad_method.layer().unwrap_err().contains("--allowed-methods"));
        let bad_header = Cors { allowed_headers: vec!["x y".into()], ..Cors::default() };
        assert!(bad_header.layer().unwrap_err().contains("--allowed-headers"));
        let credentialed = Cors { allow_credentials: true, ..Cors::default() };
        assert!(credentialed.layer().is_ok());
    }
}
