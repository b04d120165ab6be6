//! The flags `ferrite serve` takes (and `ferrite generate` shares: device and dtype), and what
//! both servers build from them alike: the CORS layer and the shutdown signal.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use ferrite_engine::{DType, Device, EngineConfig};
use ferrite_server::connections::{ConnectionLimits, DEFAULT_KEEP_ALIVE};
use ferrite_server::content_format::ContentFormatOption;
use ferrite_server::cors::{Cors, CorsLayer};
use ferrite_server::media::{MediaLimits, MediaOptions, ModelMedia};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DTypeArg {
    /// float32 on the CPU (the reference precision).
    Auto,
    #[value(alias = "float", alias = "f32")]
    Float32,
    #[value(alias = "bf16")]
    Bfloat16,
    #[value(alias = "half", alias = "f16")]
    Float16,
}

impl DTypeArg {
    /// `auto` is float32 on the CPU (the reference precision) and bfloat16 on a GPU.
    pub(crate) fn dtype_on(self, device: Device) -> DType {
        match self {
            DTypeArg::Auto if device == Device::Cpu => DType::F32,
            DTypeArg::Auto | DTypeArg::Bfloat16 => DType::BF16,
            DTypeArg::Float32 => DType::F32,
            DTypeArg::Float16 => DType::F16,
        }
    }

    pub(crate) fn dtype(self) -> DType {
        self.dtype_on(Device::Cpu)
    }
}

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
pub(crate) fn parse_device(text: &str) -> std::result::Result<Device, String> {
    match text.trim() {
        "cpu" => Ok(Device::Cpu),
        "cuda" | "gpu" => Ok(Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Device::Cuda)
            .ok_or_else(|| format!("unknown device {text:?} (expected cpu, cuda or cuda:N)")),
    }
}

/// Where the model runs, shared by `serve` and `generate`.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_parser = parse_device, help_heading = "DeviceConfig")]
    pub device: Device,
    /// On a GPU: the share of its memory for weights, activations and the KV cache (the KV
    /// cache gets what the weights and a profiled largest step leave).
    #[arg(long, default_value_t = 0.9, help_heading = "CacheConfig")]
    pub gpu_memory_utilization: f32,
    /// On a GPU: run decode steps kernel by kernel instead of replaying CUDA graphs.
    #[arg(long, help_heading = "ModelConfig")]
    pub enforce_eager: bool,
}

impl DeviceArgs {
    /// The engine settings that follow from the device, on top of `config`; on a GPU the KV
    /// cache is sized from free memory unless `explicit_kv` says how large it is.
    pub(crate) fn apply(&self, dtype: DType, explicit_kv: bool, config: EngineConfig) -> EngineConfig {
        let on_gpu = self.device != Device::Cpu;
        EngineConfig {
            device: self.device,
            kv_cache_dtype: dtype,
            gpu_memory_utilization: (on_gpu && !explicit_kv).then_some(self.gpu_memory_utilization),
            enforce_eager: self.enforce_eager,
            ..config
        }
    }
}

/// `--chat-template-content-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ContentFormatArg {
    /// Detected from the chat template, as vLLM detects it.
    Auto,
    /// One string: text parts joined with newlines, the model's placeholder for each image.
    String,
    /// A list of `{"type": "text", ...}` and `{"type": "image"}` parts.
    Openai,
}

impl From<ContentFormatArg> for ContentFormatOption {
    fn from(arg: ContentFormatArg) -> ContentFormatOption {
        match arg {
            ContentFormatArg::Auto => ContentFormatOption::Auto,
            ContentFormatArg::String => ContentFormatOption::String,
            ContentFormatArg::Openai => ContentFormatOption::Openai,
        }
    }
}

/// What `ferrite serve` runs the model for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    /// Text generation (/v1/completions, /v1/chat/completions).
    Generate,
    /// Sentence embeddings (/v1/embeddings; /score and /rerank by cosine).
    Embed,
    /// Class probabilities (/classify).
    Classify,
    /// Pair relevance from a cross-encoder (/score, /rerank).
    Score,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json) or a .gguf file; without
    /// one, SmolLM2-135M-Instruct (downloaded on first use).
    #[arg(value_name = "MODEL", help_heading = "ModelConfig")]
    pub model_tag: Option<PathBuf>,
    /// The same as MODEL.
    #[arg(long = "model", value_name = "MODEL", conflicts_with = "model_tag", help_heading = "ModelConfig")]
    pub model_flag: Option<PathBuf>,
    /// The snapshot of a model id to serve: a branch, tag or commit in the Hugging Face cache.
    #[arg(long, help_heading = "ModelConfig")]
    pub revision: Option<String>,
    /// The Hugging Face cache to find model ids in (default: HF_HUB_CACHE, HF_HOME/hub or
    /// ~/.cache/huggingface/hub).
    #[arg(long, help_heading = "LoadConfig")]
    pub download_dir: Option<PathBuf>,
    /// A tokenizer other than the model's: a directory with tokenizer.json, or a model id in the
    /// Hugging Face cache.
    #[arg(long, help_heading = "ModelConfig")]
    pub tokenizer: Option<PathBuf>,
    /// A chat template other than the checkpoint's: a file, or the Jinja template itself.
    #[arg(long, help_heading = "Frontend")]
    pub chat_template: Option<String>,
    /// Most logprobs a request may ask for per token; -1 is no limit.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, help_heading = "ModelConfig")]
    pub max_logprobs: i64,
    /// MODEL as given (a path or a model id): the default served name.
    #[arg(skip)]
    pub model_id: String,
    /// MODEL resolved to files (see [`ServeArgs::resolve_model`]).
    #[arg(skip)]
    pub model: PathBuf,
    /// Address to listen on; every interface by default, as vLLM.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Frontend")]
    pub host: String,
    #[arg(long, default_value_t = 8000, help_heading = "Frontend")]
    pub port: u16,
    /// Names clients may use in `model` (the first is reported); defaults to MODEL.
    #[arg(long, num_args = 1.., help_heading = "ModelConfig")]
    pub served_model_name: Vec<String>,
    /// Longest prompt + completion in tokens; defaults to the model's max_position_embeddings.
    #[arg(long, help_heading = "ModelConfig")]
    pub max_model_len: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1/* routes (also from VLLM_API_KEY or
    /// FERRITE_API_KEY).
    #[arg(long, env = "VLLM_API_KEY", hide_env_values = true, help_heading = "Frontend")]
    pub api_key: Option<String>,
    #[arg(long, value_enum, default_value = "auto", help_heading = "ModelConfig")]
    pub dtype: DTypeArg,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Sequences the engine runs at once.
    #[arg(long, default_value_t = 256, help_heading = "SchedulerConfig")]
    pub max_num_seqs: usize,
    /// Tokens one engine step may compute (decodes plus prefill chunks).
    #[arg(long, default_value_t = 2048, help_heading = "SchedulerConfig")]
    pub max_num_batched_tokens: usize,
    /// KV-cache size, in bytes or with a unit: 512MiB, 4GiB, 2G.
    /// KV cache size; default 4GiB on the CPU, and on a GPU what --gpu-memory-utilization leaves.
    #[arg(long, value_parser = parse_bytes, help_heading = "CacheConfig")]
    pub kv_cache_memory: Option<usize>,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16, help_heading = "CacheConfig")]
    pub block_size: usize,
    /// Reuse the KV cache of shared prompt prefixes (on by default).
    #[arg(long, overrides_with = "no_enable_prefix_caching", help_heading = "CacheConfig")]
    pub enable_prefix_caching: bool,
    #[arg(long, overrides_with = "enable_prefix_caching", help_heading = "CacheConfig")]
    pub no_enable_prefix_caching: bool,
    /// Sequences that may wait beyond --max-num-seqs before new requests get 503.
    #[arg(long, default_value_t = 1024, help_heading = "Frontend")]
    pub max_queue: usize,
    /// Connections served at once; more wait in the accept backlog. A connection with no
    /// request in flight is closed after VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (5 by default).
    #[arg(long, default_value_t = 4096, help_heading = "Frontend")]
    pub max_connections: usize,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30.0, help_heading = "Frontend")]
    pub shutdown_timeout: f64,
    /// Origins browsers may call the API from (CORS), a JSON list; `*` is any.
    #[arg(long, default_value = r#"["*"]"#, help_heading = "Frontend")]
    pub allowed_origins: String,
    /// Allow credentialed cross-origin requests (cookies, HTTP authentication).
    #[arg(long, help_heading = "Frontend")]
    pub allow_credentials: bool,
    /// Methods cross-origin requests may use, a JSON list.
    #[arg(long, default_value = r#"["*"]"#, help_heading = "Frontend")]
    pub allowed_methods: String,
    /// Headers cross-origin requests may send, a JSON list.
    #[arg(long, default_value = r#"["*"]"#, help_heading = "Frontend")]
    pub allowed_headers: String,
    /// Serve HTTPS with this PEM certificate chain (and --ssl-keyfile).
    #[arg(long, requires = "ssl_keyfile", help_heading = "Frontend")]
    pub ssl_certfile: Option<PathBuf>,
    /// The PEM private key of --ssl-certfile.
    #[arg(long, requires = "ssl_certfile", help_heading = "Frontend")]
    pub ssl_keyfile: Option<PathBuf>,
    /// Log level (vLLM's uvicorn log level): critical, error, warning, info, debug or trace.
    #[arg(long, visible_alias = "uvicorn-log-level", value_parser = ["critical", "error", "warning", "info", "debug", "trace"], default_value = "info", help_heading = "Frontend")]
    pub log_level: String,
    /// The path prefix a proxy in front of the server strips (FastAPI's root_path): the routes
    /// stay where they are, as in vLLM.
    #[arg(long, help_heading = "Frontend")]
    pub root_path: Option<String>,
    /// Put `X-Request-Id` on every response: the request's own, else a fresh id.
    #[arg(long, help_heading = "Frontend")]
    pub enable_request_id_headers: bool,
    /// How message content reaches the chat template: auto (detected from the template, as
    /// vLLM does), string (text parts joined, the model's placeholder for each image) or openai
    /// (a list of text and image parts).
    #[arg(long, value_enum, default_value = "auto", help_heading = "Frontend")]
    pub chat_template_content_format: ContentFormatArg,
    /// A directory whose files requests may name as `file://` image URLs (none without it).
    #[arg(long, help_heading = "ModelConfig")]
    pub allowed_local_media_path: Option<PathBuf>,
    /// The hosts http(s) media URLs may name, every redirect hop included (any host without it).
    #[arg(long, num_args = 1.., help_heading = "ModelConfig")]
    pub allowed_media_domains: Vec<String>,
    /// The largest image a request may bring (fetched, decoded from a data URI, or read), in
    /// bytes or with a unit. Fetches also stop after VLLM_IMAGE_FETCH_TIMEOUT seconds (5; 30 for
    /// VLLM_VIDEO_FETCH_TIMEOUT) and follow redirects unless VLLM_MEDIA_URL_ALLOW_REDIRECTS=0.
    #[arg(long, default_value = "20MiB", value_parser = parse_bytes, help_heading = "MultiModalConfig")]
    pub max_media_bytes: usize,
    /// generate, or a pooling task (embed, classify, score); inferred from the architecture
    /// when omitted (encoders such as BertModel are pooling models).
    #[arg(long, value_enum, help_heading = "ModelConfig")]
    pub task: Option<TaskArg>,
    /// Sampling defaults for the fields a request leaves out: `auto` takes the recommendations
    /// in the model's generation_config.json (temperature, top_p, top_k, min_p,
    /// repetition_penalty, and max_new_tokens as the default max_tokens of chat requests), as
    /// vLLM does; `vllm` keeps the engine's own; anything else is a directory holding a
    /// generation_config.json.
    #[arg(long, default_value = "auto", help_heading = "ModelConfig")]
    pub generation_config: String,
    /// Seeds the seeds of requests that bring none, so that a restarted server samples them alike.
    #[arg(long, help_heading = "ModelConfig")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub vllm: super::compat::VllmFlags,
}

impl ServeArgs {
    /// MODEL or `--model` (a path, or a model id in the Hugging Face cache), else the default
    /// model (downloaded on first use).
    pub(crate) fn resolve_model(&mut self) -> Result<()> {
        let given = match self.model_flag.take().or(self.model_tag.take()) {
            Some(model) => model,
            None => crate::default_model::resolve()?,
        };
        self.model = crate::hub::resolve(&given, self.revision.as_deref(), self.download_dir.as_deref())?;
        self.model_id = given.display().to_string();
        Ok(())
    }

    /// The tokenizer and chat template `--tokenizer` and `--chat-template` ask for.
    pub(crate) fn tokenizer_overrides(&self) -> Result<ferrite_engine::TokenizerOverrides> {
        let tokenizer_dir = self
            .tokenizer
            .as_deref()
            .map(|t| crate::hub::resolve(t, None, self.download_dir.as_deref()))
            .transpose()?;
        let chat_template = match self.chat_template.as_deref() {
            None => None,
            Some(t) if std::path::Path::new(t).is_file() => {
                Some(std::fs::read_to_string(t).map_err(|e| anyhow::anyhow!("--chat-template {t}: {e}"))?)
            }
            // Not a file: the template itself, as vLLM takes it.
            Some(t) => Some(t.to_owned()),
        };
        Ok(ferrite_engine::TokenizerOverrides { tokenizer_dir, chat_template })
    }

    /// The tracing filter `--log-level` asks for.
    pub(crate) fn log_filter(&self) -> String {
        let level = match self.log_level.as_str() {
            "critical" | "error" => "error",
            "warning" => "warn",
            other => other,
        };
        // A target matches every module path it begins: ferrite_server, ferrite_engine, ...
        format!("warn,ferrite={level}")
    }

    /// `--max-logprobs`, -1 meaning no limit.
    pub(crate) fn max_logprobs(&self) -> Result<usize> {
        match self.max_logprobs {
            -1 => Ok(usize::MAX),
            n if n >= 0 => Ok(n as usize),
            n => anyhow::bail!("--max-logprobs must be -1 (no limit) or at least 0, got {n}"),
        }
    }

    /// `--max-connections` and vLLM's keep-alive (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, seconds).
    pub(crate) fn connection_limits(&self) -> Result<ConnectionLimits> {
        anyhow::ensure!(self.max_connections > 0, "--max-connections must be at least 1");
        let keep_alive = match std::env::var("VLLM_HTTP_TIMEOUT_KEEP_ALIVE") {
            Err(_) => DEFAULT_KEEP_ALIVE,
            Ok(v) => {
                let secs: f64 = v.trim().parse().ok().filter(|s: &f64| s.is_finite() && *s > 0.0).ok_or_else(|| {
                    anyhow::anyhow!("VLLM_HTTP_TIMEOUT_KEEP_ALIVE must be a positive number of seconds, got {v:?}")
                })?;
                Duration::from_secs_f64(secs.min(86_400.0))
            }
        };
        Ok(ConnectionLimits { max_connections: self.max_connections, keep_alive })
    }

    /// How chat requests' media are read: `--limit-mm-per-prompt`, `--allowed-local-media-path`,
    /// `--max-media-bytes`, `--chat-template-content-format` and vLLM's fetch variables. The
    /// model's own media support is the loader's to fill in.
    pub(crate) fn media_options(&self) -> Result<MediaOptions> {
        let limits = match &self.vllm.limit_mm_per_prompt {
            Some(text) => MediaLimits::parse(text).map_err(|e| anyhow::anyhow!("--limit-mm-per-prompt: {e}"))?,
            None => MediaLimits::default(),
        };
        let allowed_local_media_path = match &self.allowed_local_media_path {
            None => None,
            // vLLM's checks and words.
            Some(path) => {
                let resolved = path.canonicalize().map_err(|e| {
                    anyhow::anyhow!(
                        "Invalid `--allowed-local-media-path`: The path {} does not exist ({e}).",
                        path.display()
                    )
                })?;
                anyhow::ensure!(
                    resolved.is_dir(),
                    "Invalid `--allowed-local-media-path`: The path {} must be a directory.",
                    resolved.display()
                );
                Some(resolved)
            }
        };
        let env = |name: &str| std::env::var(name).ok();
        Ok(MediaOptions {
            limits,
            allowed_local_media_path,
            image_fetch_timeout: seconds("VLLM_IMAGE_FETCH_TIMEOUT", env("VLLM_IMAGE_FETCH_TIMEOUT"), 5)?,
            video_fetch_timeout: seconds("VLLM_VIDEO_FETCH_TIMEOUT", env("VLLM_VIDEO_FETCH_TIMEOUT"), 30)?,
            allow_redirects: switch("VLLM_MEDIA_URL_ALLOW_REDIRECTS", env("VLLM_MEDIA_URL_ALLOW_REDIRECTS"), true)?,
            allowed_media_domains: (!self.allowed_media_domains.is_empty())
                .then(|| self.allowed_media_domains.iter().map(|d| d.to_ascii_lowercase()).collect()),
            max_bytes: self.max_media_bytes,
            content_format: self.chat_template_content_format.into(),
            model: ModelMedia::default(),
        })
    }

    /// `--api-key`, else VLLM_API_KEY, else FERRITE_API_KEY; an empty key is none.
    pub(crate) fn api_key(&self) -> Option<String> {
        let env = || std::env::var("FERRITE_API_KEY").ok();
        self.api_key.clone().filter(|k| !k.is_empty()).or_else(env).filter(|k| !k.is_empty())
    }
}

/// A time limit from an environment variable (`value`), in seconds, else `default` seconds.
fn seconds(name: &str, value: Option<String>, default: u64) -> Result<Duration> {
    let Some(v) = value else { return Ok(Duration::from_secs(default)) };
    let secs: f64 = v
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .ok_or_else(|| anyhow::anyhow!("{name} must be a positive number of seconds, got {v:?}"))?;
    Ok(Duration::from_secs_f64(secs.min(86_400.0)))
}

/// An on/off environment variable as vLLM reads it (`bool(int(value))`), else `default`.
fn switch(name: &str, value: Option<String>, default: bool) -> Result<bool> {
    let Some(v) = value else { return Ok(default) };
    let n: i64 = v.trim().parse().map_err(|_| anyhow::anyhow!("{name} must be an integer (0 or 1), got {v:?}"))?;
    Ok(n != 0)
}

/// Sizes like `4GiB`, `512MiB`, `2G` (binary and decimal units are both powers of 1024, as
/// vLLM's memory flags read them) or plain bytes.
fn parse_bytes(text: &str) -> std::result::Result<usize, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("not a size: {text:?} (try 4GiB or 536870912)"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > usize::MAX as f64 {
        return Err(format!("size out of range: {text:?}"));
    }
    Ok(bytes as usize)
}

/// The CORS layer the `--allowed-*` and `--allow-credentials` flags ask for.
pub(crate) fn cors_layer(args: &ServeArgs) -> Result<CorsLayer> {
    let list = |flag: &str, text: &str| -> Result<Vec<String>> {
        serde_json::from_str(text)
            .map_err(|_| anyhow::anyhow!("--{flag} must be a JSON list of strings, such as '[\"*\"]'; got {text:?}"))
    };
    let cors = Cors {
        allowed_origins: list("allowed-origins", &args.allowed_origins)?,
        allow_credentials: args.allow_credentials,
        allowed_methods: list("allowed-methods", &args.allowed_methods)?,
        allowed_headers: list("allowed-headers", &args.allowed_headers)?,
    };
    cors.layer().map_err(anyhow::Error::msg)
}

pub(crate) async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); only SIGINT stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use std::time::Duration;

    use super::{parse_bytes, seconds, switch, ServeArgs};
    use ferrite_server::content_format::ContentFormatOption;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        Cmd::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map(|c| c.serve)
    }

    #[test]
    fn model_is_positional_or_a_flag_not_both() {
        assert_eq!(parse(&["m"]).unwrap().model_tag.unwrap().to_str(), Some("m"));
        assert_eq!(parse(&["--model", "m"]).unwrap().model_flag.unwrap().to_str(), Some("m"));
        assert!(parse(&["a", "--model", "b"]).is_err());
        let none = parse(&[]).unwrap();
        assert!(none.model_tag.is_none() && none.model_flag.is_none());
    }

    #[test]
    fn prefix_caching_flags_take_the_last_word() {
        assert!(!parse(&["m"]).unwrap().no_enable_prefix_caching);
        assert!(
            parse(&["m", "--enable-prefix-caching", "--no-enable-prefix-caching"]).unwrap().no_enable_prefix_caching
        );
        assert!(
            !parse(&["m", "--no-enable-prefix-caching", "--enable-prefix-caching"]).unwrap().no_enable_prefix_caching
        );
    }

    #[test]
    fn log_levels_map_onto_tracing() {
        assert_eq!(parse(&["m"]).unwrap().log_filter(), "warn,ferrite=info");
        assert_eq!(parse(&["m", "--uvicorn-log-level", "warning"]).unwrap().log_filter(), "warn,ferrite=warn");
        assert_eq!(parse(&["m", "--log-level", "critical"]).unwrap().log_filter(), "warn,ferrite=error");
        assert!(parse(&["m", "--log-level", "loud"]).is_err());
    }

    #[test]
    fn host_defaults_to_every_interface_as_vllm() {
        assert_eq!(parse(&["m"]).unwrap().host, "0.0.0.0");
    }

    #[test]
    fn media_flags_build_the_media_options() {
        let options = parse(&["m"]).unwrap().media_options().unwrap();
        assert_eq!(options.max_bytes, 20 << 20);
        assert_eq!(options.content_format, ContentFormatOption::Auto);
        assert_eq!(options.limits.get("image"), 999);
        assert!(options.allowed_local_media_path.is_none() && !options.model.accepts_images);

        let dir = std::env::temp_dir();
        let mut args = parse(&[
            "m",
            "--chat-template-content-format",
            "openai",
            "--max-media-bytes",
            "1MiB",
            "--allowed-local-media-path",
            dir.to_str().unwrap(),
        ])
        .unwrap();
        args.vllm.limit_mm_per_prompt = Some(r#"{"image": 2, "video": 0}"#.into());
        let options = args.media_options().unwrap();
        assert_eq!((options.max_bytes, options.content_format), (1 << 20, ContentFormatOption::Openai));
        assert_eq!((options.limits.get("image"), options.limits.get("video")), (2, 0));
        assert_eq!(options.allowed_local_media_path, Some(dir.canonicalize().unwrap()));

        args.vllm.limit_mm_per_prompt = Some("image=2".into());
        let err = args.media_options().unwrap_err().to_string();
        assert!(err.starts_with("--limit-mm-per-prompt: not JSON"), "{err}");
        let mut args = parse(&["m", "--allowed-local-media-path", "/no/such/dir"]).unwrap();
        assert!(args.media_options().unwrap_err().to_string().contains("does not exist"));
        args.allowed_local_media_path = Some(dir.join(format!("ferrite-args-{}", std::process::id())));
        std::fs::write(args.allowed_local_media_path.as_ref().unwrap(), b"").unwrap();
        let err = args.media_options().unwrap_err().to_string();
        std::fs::remove_file(args.allowed_local_media_path.as_ref().unwrap()).unwrap();
        assert!(err.contains("must be a directory"), "{err}");
        assert!(parse(&["m", "--chat-template-content-format", "json"]).is_err());
    }

    #[test]
    fn fetch_variables_read_as_vllm_reads_them() {
        assert_eq!(seconds("T", None, 5).unwrap(), Duration::from_secs(5));
        assert_eq!(seconds("T", Some("2".into()), 5).unwrap(), Duration::from_secs(2));
        assert_eq!(seconds("T", Some("0.5".into()), 5).unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "soon"] {
            assert!(seconds("T", Some(bad.into()), 5).unwrap_err().to_string().starts_with("T must be"), "{bad}");
        }
        assert!(switch("R", None, true).unwrap());
        assert!(!switch("R", Some("0".into()), true).unwrap());
        assert!(switch("R", Some("1".into()), false).unwrap());
        assert!(switch("R", Some("yes".into()), true).is_err());
    }

    #[test]
    fn sizes_take_binary_units_or_plain_bytes() {
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5k"), Ok(1536));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
        assert!(parse_bytes("0").is_err());
    }
}
