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
        let credentials = self.allow_credentials;
        let origin = allowed(
            ("--allowed-origins", "a valid origin"),
            &self.allowed_origins,
            credentials,
            (AllowOrigin::mirror_request, AllowOrigin::any, AllowOrigin::list),
            |o| HeaderValue::from_str(o).ok(),
        )?;
        let methods = allowed(
            ("--allowed-methods", "an HTTP method"),
            &self.allowed_methods,
            credentials,
            (AllowMethods::mirror_request, AllowMethods::any, AllowMethods::list),
            |m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).ok(),
        )?;
        let headers = allowed(
            ("--allowed-headers", "a valid header name"),
            &self.allowed_headers,
            credentials,
            (AllowHeaders::mirror_request, AllowHeaders::any, AllowHeaders::list),
            |h| HeaderName::from_bytes(h.as_bytes()).ok(),
        )?;
        Ok(CorsLayer::new()
            .allow_origin(origin)
            .allow_methods(methods)
            .allow_headers(headers)
            .allow_credentials(credentials))
    }
}

/// The mirroring, any-value and listing constructors of one of tower-http's `Allow*` types.
type Constructors<T, V> = (fn() -> T, fn() -> T, fn(Vec<V>) -> T);

/// One of the lists: `*` is any (mirrored under credentials), else each value parsed, or an
/// error naming the `(flag, what a value must be)` and the value.
fn allowed<T, V>(
    (flag, what): (&str, &str),
    list: &[String],
    credentials: bool,
    (mirror, any, of): Constructors<T, V>,
    parse: impl Fn(&str) -> Option<V>,
) -> Result<T, String> {
    match (list.iter().any(|v| v == "*"), credentials) {
        (true, true) => Ok(mirror()),
        (true, false) => Ok(any()),
        (false, _) => {
            let parsed = list.iter().map(|v| parse(v).ok_or_else(|| format!("{flag}: {v:?} is not {what}")));
            Ok(of(parsed.collect::<Result<Vec<_>, _>>()?))
        }
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
