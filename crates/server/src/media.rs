//! The images and videos a chat request brings, from their URLs to bytes, as vLLM's
//! `MediaConnector` loads them: `data:` URIs (base64) decoded, `http(s)://` URLs fetched under a
//! time limit (`VLLM_IMAGE_FETCH_TIMEOUT`, `VLLM_VIDEO_FETCH_TIMEOUT`) following redirects unless
//! `VLLM_MEDIA_URL_ALLOW_REDIRECTS=0`, and `file://` URLs read from under
//! `--allowed-local-media-path`. Every item is bounded by `--max-media-bytes`, and a request's
//! items are fetched at once. Decoding the bytes into images is the multimodal processor's work.
//!
//! HTTP goes through `ureq` (rustls with the webpki root certificates, already in the build for
//! the Hugging Face downloads), on the blocking pool: its reads block a thread, and a timeout
//! around the blocking task ends the wait even where `ureq` cannot (a slow DNS lookup).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use crate::content_format::ContentFormatOption;
use crate::error::ApiError;

/// A modality a content part brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Image,
    Video,
}

impl MediaKind {
    /// vLLM's name for the modality (`--limit-mm-per-prompt` keys, error messages).
    pub fn modality(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
        }
    }
}

/// A media part of a request, before its bytes are fetched.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRef {
    pub kind: MediaKind,
    pub url: String,
    /// Where the request put it (`messages[1].content[0]`), for error messages.
    pub location: String,
}

/// A media item's bytes as its URL gave them.
#[derive(Debug, Clone)]
pub struct FetchedMedia {
    pub kind: MediaKind,
    /// Where the request put it (`messages[1].content[0]`), for error messages.
    pub location: String,
    /// The encoded pictures: one for an image (or a video file, which is not decoded here), one
    /// per frame for a video sent as vLLM's `data:video/jpeg;base64,<frame>,<frame>,...`. Shared:
    /// prompts are cloned on their way to the engine.
    pub encoded: Vec<Arc<[u8]>>,
    /// The media type the source declared (a data URI's, or the HTTP `Content-Type` without its
    /// parameters), if it declared one.
    pub mime: Option<String>,
}

/// `--limit-mm-per-prompt`: the most items of each modality one prompt may bring.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MediaLimits {
    counts: BTreeMap<String, usize>,
}

impl MediaLimits {
    /// vLLM's limit for a modality the flag leaves out.
    pub const DEFAULT: usize = 999;

    /// The flag's JSON, in the forms vLLM's `MultiModalConfig` takes: `{"image": 2, "video": 0}`,
    /// or per modality an object with a `count` (999 when left out) and the sizes vLLM's memory
    /// profiling gives its dummy inputs (`{"video": {"count": 1, "num_frames": 32}}`). ferrite
    /// profiles no dummy media, so those sizes are checked as vLLM checks them and not used.
    pub fn parse(text: &str) -> Result<MediaLimits, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON ({e}); expected e.g. '{{\"image\": 2}}'"))?;
        let Value::Object(map) = value else {
            return Err(format!("expected a JSON object such as '{{\"image\": 2, \"video\": 0}}', got {text}"));
        };
        let mut counts = BTreeMap::new();
        for (modality, limit) in map {
            let count = match &limit {
                Value::Number(_) => count_of(&modality, "count", &limit, 0)?,
                Value::Object(options) => {
                    let sizes: &[&str] = match modality.as_str() {
                        "image" => &["width", "height"],
                        "video" => &["num_frames", "width", "height"],
                        "audio" => &["length"],
                        _ => &[],
                    };
                    let mut count = MediaLimits::DEFAULT;
                    for (key, value) in options {
                        if key == "count" {
                            count = count_of(&modality, key, value, 0)?;
                        } else if sizes.contains(&key.as_str()) {
                            count_of(&modality, key, value, 1)?;
                        } else {
                            let mut known = vec!["count"];
                            known.extend_from_slice(sizes);
                            return Err(format!("{modality}: unknown option `{key}` (known: {})", known.join(", ")));
                        }
                    }
                    count
                }
                other => return Err(format!("{modality}: expected a count or an object, got {other}")),
            };
            counts.insert(modality, count);
        }
        Ok(MediaLimits { counts })
    }

    /// The most items of `modality` a prompt may bring.
    pub fn get(&self, modality: &str) -> usize {
        self.counts.get(modality).copied().unwrap_or(MediaLimits::DEFAULT)
    }

    /// Refuses a request with more items of a modality than its limit, with vLLM's message.
    pub fn check(&self, media: &[MediaRef]) -> Result<(), ApiError> {
        for kind in [MediaKind::Image, MediaKind::Video] {
            let limit = self.get(kind.modality());
            if media.iter().filter(|m| m.kind == kind).count() > limit {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "At most {limit} {}(s) may be provided in one prompt. Set `--limit-mm-per-prompt` to increase \
                         this limit.",
                        kind.modality()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// A non-negative integer (at least `min`) in the flag's JSON.
fn count_of(modality: &str, key: &str, value: &Value, min: u64) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|&n| n >= min)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{modality}: `{key}` must be an integer of at least {min}, got {value}"))
}

/// What the served model takes besides text; the model's loader says.
#[derive(Debug, Clone, Default)]
pub struct ModelMedia {
    /// Image content parts are served; otherwise they are refused.
    pub accepts_images: bool,
    /// The text that stands for one image in a message's content when the chat template takes
    /// content as a string (Qwen2-VL: `<|vision_start|><|image_pad|><|vision_end|>`); `None` for
    /// a model whose prompt carries no image marker.
    pub image_placeholder: Option<String>,
    /// The same for a video (`<|vision_start|><|video_pad|><|vision_end|>`).
    pub video_placeholder: Option<String>,
    /// The processors and placeholder tokens of a model that accepts images (and videos).
    pub images: Option<std::sync::Arc<crate::images::ImageProcessing>>,
}

/// How requests' media are read and what the model takes.
#[derive(Debug, Clone)]
pub struct MediaOptions {
    /// `--limit-mm-per-prompt`.
    pub limits: MediaLimits,
    /// `--allowed-local-media-path`, canonical: `file://` URLs are read from under it (and
    /// refused without it).
    pub allowed_local_media_path: Option<PathBuf>,
    /// `VLLM_IMAGE_FETCH_TIMEOUT`: the time an image URL gets, connection to last byte.
    pub image_fetch_timeout: Duration,
    /// `VLLM_VIDEO_FETCH_TIMEOUT`.
    pub video_fetch_timeout: Duration,
    /// `VLLM_MEDIA_URL_ALLOW_REDIRECTS`.
    pub allow_redirects: bool,
    /// `--allowed-media-domains`: the hosts http(s) media may come from, every redirect hop
    /// included (any host without it).
    pub allowed_media_domains: Option<Vec<String>>,
    /// `--max-media-bytes`: the largest item (fetched, decoded or read) a request may bring.
    pub max_bytes: usize,
    /// `--chat-template-content-format`: how content parts reach the chat template.
    pub content_format: ContentFormatOption,
    /// What the served model takes.
    pub model: ModelMedia,
}

impl MediaOptions {
    pub const DEFAULT_MAX_BYTES: usize = 20 << 20;
    /// Redirects followed when they are allowed (aiohttp's default, which vLLM's fetches use).
    const MAX_REDIRECTS: u32 = 10;
}

impl Default for MediaOptions {
    /// vLLM's defaults, for a text-only model.
    fn default() -> MediaOptions {
        MediaOptions {
            limits: MediaLimits::default(),
            allowed_local_media_path: None,
            image_fetch_timeout: Duration::from_secs(5),
            video_fetch_timeout: Duration::from_secs(30),
            allow_redirects: true,
            allowed_media_domains: None,
            max_bytes: MediaOptions::DEFAULT_MAX_BYTES,
            content_format: ContentFormatOption::Auto,
            model: ModelMedia::default(),
        }
    }
}

/// Fetches requests' media (one HTTP agent, so connections to a host are reused).
pub struct Fetcher {
    agent: ureq::Agent,
    route: std::sync::Arc<Route>,
    options: MediaOptions,
}

impl Fetcher {
    pub fn new(options: &MediaOptions) -> Fetcher {
        let route = Route {
            domains: options.allowed_media_domains.clone(),
            redirects: if options.allow_redirects { MediaOptions::MAX_REDIRECTS } else { 0 },
        };
        // With allowed domains, redirects are followed by `fetch_http`, which checks every hop.
        let agent = ureq::AgentBuilder::new()
            .redirects(if route.domains.is_some() { 0 } else { route.redirects })
            .user_agent(concat!("ferrite/", env!("CARGO_PKG_VERSION")))
            .build();
        Fetcher { agent, route: route.into(), options: options.clone() }
    }

    /// Every item's bytes, in the order given, fetched concurrently; the first failure is the
    /// request's 400 (naming the part and the problem).
    pub async fn fetch_all(&self, media: Vec<MediaRef>) -> Result<Vec<FetchedMedia>, ApiError> {
        futures::future::try_join_all(media.into_iter().map(|m| self.fetch(m))).await
    }

    async fn fetch(&self, media: MediaRef) -> Result<FetchedMedia, ApiError> {
        let fail = |problem: String| ApiError::invalid("messages", format!("{}: {problem}", media.location));
        let max = self.options.max_bytes;
        let url = media.url.clone();
        let scheme = url.split_once(':').map(|(s, _)| s.to_ascii_lowercase()).unwrap_or_default();
        let (encoded, mime) = match scheme.as_str() {
            // Decoding megabytes of base64, or reading a file, is blocking work.
            "data" => tokio::task::spawn_blocking(move || decode_data_uri(&url, max))
                .await
                .map_err(|e| fail(format!("the read failed: {e}")))?
                .map_err(fail)?,
            "file" => {
                let allowed = self.options.allowed_local_media_path.clone();
                let (bytes, mime) =
                    blocking(move || read_file_url(&url, allowed.as_deref(), max)).await.map_err(fail)?;
                (vec![bytes], mime)
            }
            "http" | "https" => {
                let timeout = match media.kind {
                    MediaKind::Image => self.options.image_fetch_timeout,
                    MediaKind::Video => self.options.video_fetch_timeout,
                };
                let (agent, route) = (self.agent.clone(), self.route.clone());
                let task = tokio::task::spawn_blocking(move || fetch_http(&agent, &url, &route, timeout, max));
                let (bytes, mime) = match tokio::time::timeout(timeout, task).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(e)) => Err(format!("the fetch failed: {e}")),
                    Err(_) => Err(timed_out(timeout)),
                }
                .map_err(|problem| fail(format!("cannot fetch {}: {problem}", shown(&media.url))))?;
                (vec![bytes], mime)
            }
            "" => return Err(fail(format!("{} is not a URL (expected http, https, data or file)", shown(&media.url)))),
            other => {
                return Err(fail(format!(
                    "URLs with the scheme `{other}` are not supported (expected http, https, data or file)"
                )))
            }
        };
        let encoded = encoded.into_iter().map(Arc::from).collect();
        Ok(FetchedMedia { kind: media.kind, location: media.location, encoded, mime })
    }
}

type Loaded = Result<(Vec<u8>, Option<String>), String>;

async fn blocking(work: impl FnOnce() -> Loaded + Send + 'static) -> Loaded {
    tokio::task::spawn_blocking(work).await.map_err(|e| format!("the read failed: {e}"))?
}

/// A URL as error messages show it: a data URI without its payload, a long URL cut.
fn shown(url: &str) -> String {
    const MAX: usize = 100;
    let url = match url.split_once(',') {
        Some((head, _)) if url.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("data:")) => head,
        _ => url,
    };
    match url.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &url[..cut]),
        None => url.to_string(),
    }
}

fn timed_out(timeout: Duration) -> String {
    format!("timed out after {} s", timeout.as_secs_f64())
}

fn too_large(max: usize) -> String {
    let size = if max.is_multiple_of(1 << 20) { format!("{} MiB", max >> 20) } else { format!("{max} bytes") };
    format!("larger than the {size} a media item may have (--max-media-bytes)")
}

/// vLLM's base64 decoding is Python's lenient `b64decode`: padding may be left out, and line
/// breaks (which some clients wrap base64 at) are skipped.
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// RFC 2397 `data:[<media type>][;<param>=<value>]*;base64,<data>`, as vLLM reads it: only the
/// base64 encoding, and for the media type `video/jpeg` (vLLM's frame list) the data is
/// comma-separated base64 frames, each decoded on its own.
fn decode_data_uri(url: &str, max: usize) -> Result<(Vec<Vec<u8>>, Option<String>), String> {
    let Some((spec, payload)) = url[5..].split_once(',') else {
        return Err(format!("the data URI {} has no `,` before its data", shown(url)));
    };
    let (media_type, encoding) = spec.rsplit_once(';').unwrap_or((spec, ""));
    match encoding {
        "base64" => {}
        "" => {
            return Err(
                "data URIs without `;base64` (percent-encoded data) are not supported; only base64 data URIs are"
                    .into(),
            )
        }
        other => {
            return Err(format!("data URIs with the encoding `{other}` are not supported; only base64 data URIs are"))
        }
    }
    // Four base64 characters make three bytes: a payload this long cannot fit.
    if payload.len() / 4 * 3 > max.saturating_add(3) {
        return Err(format!("the data URI's data is {}", too_large(max)));
    }
    let media_type = media_type.split(';').next().unwrap_or("").trim();
    let parts: Vec<&str> =
        if media_type.eq_ignore_ascii_case("video/jpeg") { payload.split(',').collect() } else { vec![payload] };
    let decoded = parts
        .iter()
        .enumerate()
        .map(|(k, part)| {
            let bytes = if part.bytes().any(|b| b.is_ascii_whitespace()) {
                let compact: Vec<u8> = part.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
                BASE64.decode(compact)
            } else {
                BASE64.decode(part)
            };
            let which = if parts.len() > 1 { format!(" (frame {k})") } else { String::new() };
            bytes.map_err(|e| format!("the data URI's base64{which} does not decode: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if decoded.iter().map(Vec::len).sum::<usize>() > max {
        return Err(format!("the data URI's data is {}", too_large(max)));
    }
    Ok((decoded, (!media_type.is_empty()).then(|| media_type.to_string())))
}

/// A `file://` URL's file, which must lie under `allowed` (canonical), as vLLM allows it.
fn read_file_url(url: &str, allowed: Option<&Path>, max: usize) -> Loaded {
    let Some(allowed) = allowed else {
        return Err(format!("cannot read {}: local files are read only with --allowed-local-media-path", shown(url)));
    };
    let Some(rest) = url.get(..7).filter(|p| p.eq_ignore_ascii_case("file://")).and_then(|_| url.get(7..)) else {
        return Err(format!("{} is not a file:// URL", shown(url)));
    };
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let path = PathBuf::from(percent_decode(rest)?);
    let resolved = path.canonicalize().map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !resolved.starts_with(allowed) || resolved == allowed {
        return Err(format!(
            "the file path {} must be a subpath of --allowed-local-media-path {}",
            path.display(),
            allowed.display()
        ));
    }
    let file = std::fs::File::open(&resolved).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() > max {
        return Err(format!("{} is {}", path.display(), too_large(max)));
    }
    Ok((bytes, None))
}

/// `%XX` escapes in a file URL's path (Python's `url2pathname` unquotes them too).
fn percent_decode(text: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex: Vec<u8> = bytes.by_ref().take(2).collect();
        let value = std::str::from_utf8(&hex).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
        out.push(value.ok_or_else(|| format!("the file URL {} has a bad % escape", shown(text)))?);
    }
    String::from_utf8(out).map_err(|_| format!("the file URL {} is not UTF-8 once unescaped", shown(text)))
}

/// One GET, on a blocking thread: the body, at most `max` bytes, and its media type.
/// Where an http(s) fetch may go.
struct Route {
    /// `--allowed-media-domains`; with it the agent does not follow redirects, this does.
    domains: Option<Vec<String>>,
    /// Redirects to follow (0: a redirect is the fetch's error).
    redirects: u32,
}

impl Route {
    /// `url`'s host is one of the allowed domains (vLLM's check and words).
    fn check(&self, url: &url::Url) -> Result<(), String> {
        let Some(domains) = &self.domains else { return Ok(()) };
        let host = url.host_str().unwrap_or_default();
        if domains.iter().any(|d| d == host) {
            return Ok(());
        }
        let listed: Vec<String> = domains.iter().map(|d| format!("'{d}'")).collect();
        Err(format!(
            "The URL must be from one of the allowed domains: [{}]. Input URL domain: {host}",
            listed.join(", ")
        ))
    }
}

fn fetch_http(agent: &ureq::Agent, url: &str, route: &Route, timeout: Duration, max: usize) -> Loaded {
    let mut current = url::Url::parse(url).map_err(|e| format!("not a valid URL: {e}"))?;
    let mut redirects_left = route.redirects;
    let response = loop {
        route.check(&current)?;
        let response = call(agent, current.as_str(), timeout)?;
        let location = response.header("location").filter(|_| (300..400).contains(&response.status()));
        match location {
            // Only an agent that does not follow redirects (allowed domains) hands them back here;
            // with redirects off, `read_response` refuses them.
            Some(to) if route.domains.is_some() && route.redirects > 0 => {
                if redirects_left == 0 {
                    return Err(format!("more than {} redirects", route.redirects));
                }
                current = current.join(to).map_err(|e| format!("HTTP {} redirects to {to}: {e}", response.status()))?;
                redirects_left -= 1;
            }
            _ => break response,
        }
    };
    read_response(response, timeout, max)
}

fn call(agent: &ureq::Agent, url: &str, timeout: Duration) -> Result<ureq::Response, String> {
    match agent.get(url).timeout(timeout).call() {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(code, response)) => Err(format!("HTTP {code} {}", response.status_text())),
        Err(ureq::Error::Transport(t)) => {
            let io_timeout = std::error::Error::source(&t)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(|e| matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock));
            if io_timeout {
                return Err(timed_out(timeout));
            }
            let mut problem = t.kind().to_string();
            if let Some(message) = t.message() {
                problem = format!("{problem}: {message}");
            }
            if let Some(source) = std::error::Error::source(&t) {
                problem = format!("{problem}: {source}");
            }
            Err(problem)
        }
    }
}

fn read_response(response: ureq::Response, timeout: Duration, max: usize) -> Loaded {
    // Only when redirects are off does a redirect come back as the response.
    if (300..400).contains(&response.status()) {
        let to = response.header("location").unwrap_or("(no Location)");
        return Err(format!(
            "HTTP {} redirects to {to}, and VLLM_MEDIA_URL_ALLOW_REDIRECTS=0 forbids following it",
            response.status()
        ));
    }
    if response.header("content-length").and_then(|n| n.trim().parse::<u64>().ok()).is_some_and(|n| n > max as u64) {
        return Err(format!("the response is {}", too_large(max)));
    }
    let mime = response.header("content-type").and_then(|t| t.split(';').next()).map(|t| t.trim().to_string());
    let mut bytes = Vec::new();
    response.into_reader().take(max as u64 + 1).read_to_end(&mut bytes).map_err(|e| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => timed_out(timeout),
        _ => format!("reading the response: {e}"),
    })?;
    if bytes.len() > max {
        return Err(format!("the response is {}", too_large(max)));
    }
    Ok((bytes, mime.filter(|t| !t.is_empty())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// The start of a PNG file: what the tests fetch (nothing here decodes it).
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0";

    fn image(url: &str) -> MediaRef {
        MediaRef { kind: MediaKind::Image, url: url.to_string(), location: "messages[0].content[1]".into() }
    }

    fn options() -> MediaOptions {
        MediaOptions { image_fetch_timeout: Duration::from_millis(300), max_bytes: 1024, ..MediaOptions::default() }
    }

    async fn fetch_one(options: &MediaOptions, url: &str) -> Result<FetchedMedia, String> {
        let mut all = Fetcher::new(options).fetch_all(vec![image(url)]).await.map_err(|e| e.message)?;
        Ok(all.remove(0))
    }

    #[tokio::test]
    async fn data_uris_decode_base64_only() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(PNG);
        let got = fetch_one(&options(), &format!("data:image/png;base64,{b64}")).await.unwrap();
        assert_eq!((&*got.encoded[0], got.mime.as_deref(), got.kind), (PNG, Some("image/png"), MediaKind::Image));
        assert_eq!(got.location, "messages[0].content[1]");

        // Padding left out, line breaks inside, a parameter before the encoding, no media type.
        let wrapped = format!("{}\n{}", &b64[..8], b64[8..].trim_end_matches('='));
        let got = fetch_one(&options(), &format!("data:image/png;name=x.png;base64,{wrapped}")).await.unwrap();
        assert_eq!((&*got.encoded[0], got.mime.as_deref()), (PNG, Some("image/png")));
        assert_eq!(fetch_one(&options(), &format!("data:;base64,{b64}")).await.unwrap().mime, None);

        // vLLM's frame list: each comma-separated part is one frame's base64.
        let other = base64::engine::general_purpose::STANDARD.encode(b"frame two");
        let got = fetch_one(&options(), &format!("data:video/jpeg;base64,{b64},{other}")).await.unwrap();
        let frames: Vec<&[u8]> = got.encoded.iter().map(|f| &**f).collect();
        assert_eq!(frames, [PNG, b"frame two"]);
        let e = fetch_one(&options(), &format!("data:video/jpeg;base64,{b64},@@")).await.unwrap_err();
        assert!(e.contains("base64 (frame 1) does not decode"), "{e}");

        for (url, needle) in [
            ("data:image/png;base64,@@@@".to_string(), "base64 does not decode"),
            ("data:image/png,%89PNG".to_string(), "without `;base64`"),
            ("data:image/png;utf8,abc".to_string(), "the encoding `utf8`"),
            ("data:image/png;base64".to_string(), "no `,`"),
            (format!("data:image/png;base64,{}", "A".repeat(4096)), "larger than the 1024 bytes"),
        ] {
            let e = fetch_one(&options(), &url).await.unwrap_err();
            assert!(e.starts_with("messages[0].content[1]: ") && e.contains(needle), "{url:.40}: {e}");
            assert!(!e.contains("AAAA"), "the payload is not echoed: {e}");
        }
    }

    #[tokio::test]
    async fn other_schemes_are_refused_by_name() {
        let e = fetch_one(&options(), "ftp://host/x.png").await.unwrap_err();
        assert!(e.contains("scheme `ftp`"), "{e}");
        let e = fetch_one(&options(), "just-a-name.png").await.unwrap_err();
        assert!(e.contains("is not a URL"), "{e}");
    }

    #[tokio::test]
    async fn files_are_read_only_under_the_allowed_path() {
        let root = std::env::temp_dir().join(format!("ferrite-media-{}", crate::random_id()));
        let allowed = root.join("allowed dir");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::write(allowed.join("a.png"), PNG).unwrap();
        std::fs::write(root.join("secret.png"), PNG).unwrap();
        std::fs::write(allowed.join("big.png"), vec![0u8; 2048]).unwrap();
        let url = |p: &Path| format!("file://{}", p.display().to_string().replace(' ', "%20"));

        let e = fetch_one(&options(), &url(&allowed.join("a.png"))).await.unwrap_err();
        assert!(e.contains("--allowed-local-media-path"), "{e}");

        let with = MediaOptions { allowed_local_media_path: Some(allowed.canonicalize().unwrap()), ..options() };
        assert_eq!(&*fetch_one(&with, &url(&allowed.join("a.png"))).await.unwrap().encoded[0], PNG);
        for (path, needle) in [
            (allowed.join("../secret.png"), "must be a subpath"),
            (allowed.join("missing.png"), "cannot read"),
            (allowed.join("big.png"), "larger than"),
        ] {
            let e = fetch_one(&with, &url(&path)).await.unwrap_err();
            assert!(e.contains(needle), "{}: {e}", path.display());
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A loopback HTTP server: `/png` (with its type), `/slow` (answers after 2 s), `/delayed`
    /// (after 0.3 s), `/big` (a Content-Length over the limit), `/stream` (an unannounced body
    /// over the limit), `/redirect` (to `/png`) and `/missing` (404).
    async fn serve() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.ends_with(b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let reply = |status: &str, headers: &str, body: &[u8]| {
                        let mut out = format!(
                            "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        out.extend_from_slice(body);
                        out
                    };
                    let out = match path.as_str() {
                        "/png" => reply("200 OK", "Content-Type: image/png; charset=binary\r\n", PNG),
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            reply("200 OK", "", PNG)
                        }
                        "/big" => reply("200 OK", "", &[0u8; 4096]),
                        "/stream" => {
                            let mut out = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec();
                            out.extend_from_slice(&[0u8; 4096]);
                            out
                        }
                        "/redirect" => reply("302 Found", "Location: /png\r\n", b""),
                        "/away" => {
                            let to =
                                format!("Location: http://localhost:{}/png\r\n", socket.local_addr().unwrap().port());
                            reply("302 Found", &to, b"")
                        }
                        "/delayed" => {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            reply("200 OK", "", PNG)
                        }
                        _ => reply("404 Not Found", "", b"no"),
                    };
                    let _ = socket.write_all(&out).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn http_fetches_obey_the_time_size_and_redirect_limits() {
        let base = serve().await;
        let got = fetch_one(&options(), &format!("{base}/png")).await.unwrap();
        assert_eq!((&*got.encoded[0], got.mime.as_deref()), (PNG, Some("image/png")));
        assert_eq!(&*fetch_one(&options(), &format!("{base}/redirect")).await.unwrap().encoded[0], PNG);

        let started = std::time::Instant::now();
        let e = fetch_one(&options(), &format!("{base}/slow")).await.unwrap_err();
        assert_eq!(e, format!("messages[0].content[1]: cannot fetch {base}/slow: timed out after 0.3 s"));
        assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());

        for (path, needle) in [
            ("/big", "the response is larger than the 1024 bytes"),
            ("/stream", "the response is larger than the 1024 bytes"),
            ("/missing", "HTTP 404 Not Found"),
        ] {
            let e = fetch_one(&options(), &format!("{base}{path}")).await.unwrap_err();
            assert!(e.contains(&format!("cannot fetch {base}{path}: {needle}")), "{path}: {e}");
        }

        let no_redirects = MediaOptions { allow_redirects: false, ..options() };
        let e = fetch_one(&no_redirects, &format!("{base}/redirect")).await.unwrap_err();
        assert!(e.contains("HTTP 302 redirects to /png") && e.contains("VLLM_MEDIA_URL_ALLOW_REDIRECTS=0"), "{e}");

        // A request's items come back in order; the first failure fails the request.
        let fetcher = Fetcher::new(&options());
        let both = fetcher.fetch_all(vec![image(&format!("{base}/png")), image("data:image/gif;base64,R0lG")]).await;
        let kinds: Vec<_> = both.unwrap().iter().map(|m| m.mime.clone()).collect();
        assert_eq!(kinds, [Some("image/png".to_string()), Some("image/gif".to_string())]);
        let e = fetcher.fetch_all(vec![image(&format!("{base}/png")), image(&format!("{base}/missing"))]).await;
        assert!(e.unwrap_err().message.contains("404"));

        // Four items that take 0.3 s each arrive together, not one after another.
        let slow = MediaOptions { image_fetch_timeout: Duration::from_secs(5), ..options() };
        let started = std::time::Instant::now();
        let four = Fetcher::new(&slow).fetch_all((0..4).map(|_| image(&format!("{base}/delayed"))).collect()).await;
        assert_eq!(four.unwrap().len(), 4);
        assert!(started.elapsed() < Duration::from_millis(1000), "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn allowed_media_domains_bound_every_hop() {
        let base = serve().await;
        let only = |domains: &[&str]| MediaOptions {
            allowed_media_domains: Some(domains.iter().map(|d| d.to_string()).collect()),
            ..options()
        };
        let got = fetch_one(&only(&["127.0.0.1"]), &format!("{base}/png")).await.unwrap();
        assert_eq!(&*got.encoded[0], PNG);
        // A redirect on the allowed host is followed; one to another host is refused before it is fetched.
        assert_eq!(&*fetch_one(&only(&["127.0.0.1"]), &format!("{base}/redirect")).await.unwrap().encoded[0], PNG);
        let e = fetch_one(&only(&["127.0.0.1"]), &format!("{base}/away")).await.unwrap_err();
        assert!(
            e.contains("The URL must be from one of the allowed domains: ['127.0.0.1']. Input URL domain: localhost"),
            "{e}"
        );
        let e = fetch_one(&only(&["example.com", "localhost"]), &format!("{base}/png")).await.unwrap_err();
        assert!(e.contains("allowed domains: ['example.com', 'localhost']. Input URL domain: 127.0.0.1"), "{e}");
        // Data URIs are not URLs of a host.
        assert!(fetch_one(&only(&["example.com"]), "data:image/gif;base64,R0lG").await.is_ok());
        // With redirects off, a redirect stays the fetch's error.
        let no_redirects = MediaOptions { allow_redirects: false, ..only(&["127.0.0.1"]) };
        let e = fetch_one(&no_redirects, &format!("{base}/redirect")).await.unwrap_err();
        assert!(e.contains("VLLM_MEDIA_URL_ALLOW_REDIRECTS=0"), "{e}");
    }

    #[test]
    fn limits_take_vllms_json_forms() {
        let limits = MediaLimits::parse(r#"{"image": 2, "video": {"count": 0, "num_frames": 32}}"#).unwrap();
        assert_eq!((limits.get("image"), limits.get("video"), limits.get("audio")), (2, 0, MediaLimits::DEFAULT));
        let limits = MediaLimits::parse(r#"{"image": {"width": 512, "height": 512}}"#).unwrap();
        assert_eq!(limits.get("image"), MediaLimits::DEFAULT);
        for (bad, needle) in [
            ("image=2", "not JSON"),
            ("[1]", "expected a JSON object"),
            (r#"{"image": -1}"#, "`count` must be an integer of at least 0"),
            (r#"{"image": 1.5}"#, "`count` must be an integer"),
            (r#"{"image": {"num_frames": 4}}"#, "unknown option `num_frames` (known: count, width, height)"),
            (r#"{"video": {"width": 0}}"#, "`width` must be an integer of at least 1"),
            (r#"{"image": "2"}"#, "expected a count or an object"),
        ] {
            let e = MediaLimits::parse(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_count_each_modality() {
        let limits = MediaLimits::parse(r#"{"image": 1}"#).unwrap();
        assert!(limits.check(&[image("a")]).is_ok());
        let e = limits.check(&[image("a"), image("b")]).unwrap_err();
        assert_eq!(
            e.message,
            "At most 1 image(s) may be provided in one prompt. Set `--limit-mm-per-prompt` to increase this limit."
        );
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
}
