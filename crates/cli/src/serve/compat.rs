//! `vllm serve` flags that ferrite accepts so that a vLLM command line runs unchanged: those whose
//! meaning ferrite already has (chunked prefill is always on; remote code never runs), and those
//! for features not built yet, which fail at start naming the feature instead of being ignored.

use anyhow::{bail, Result};
use clap::Args;
use ferrite_engine::{DType, Device, JsonOptions};
use ferrite_parsers::{reasoning, tool};
use ferrite_server::ChatOptions;

/// The `--load-format` that dequantizes a GGUF file's matrices at load.
pub const GGUF_DEQUANTIZED: &str = "gguf-dequantized";
/// ferrite's load format that dequantizes every quantized matrix at load (GGUF blocks, 4-bit
/// packed weights), as transformers computes.
pub const DEQUANTIZED: &str = "dequantized";

/// Whether `--load-format` asks for quantized matrices dequantized at load.
pub fn dequantizes(load_format: &str) -> bool {
    load_format == DEQUANTIZED || load_format == GGUF_DEQUANTIZED
}

#[derive(Args, Debug, Default)]
pub struct VllmFlags {
    /// GPUs to shard each layer over (tensor parallelism); only 1 is built yet.
    #[arg(long, default_value_t = 1, help_heading = "ParallelConfig")]
    pub tensor_parallel_size: usize,
    /// Pipeline stages; only 1 is built yet.
    #[arg(long, default_value_t = 1, help_heading = "ParallelConfig")]
    pub pipeline_parallel_size: usize,
    /// Data-parallel replicas; only 1 is built yet.
    #[arg(long, default_value_t = 1, help_heading = "ParallelConfig")]
    pub data_parallel_size: usize,
    /// Expert parallelism for MoE models (not built yet).
    #[arg(long, help_heading = "ParallelConfig")]
    pub enable_expert_parallel: bool,
    /// Quantization method: the checkpoint's own (compressed-tensors, fp8, mxfp4; read from its
    /// config.json when left out), or fp8 to quantize an unquantized checkpoint as it loads.
    #[arg(long, short = 'q', help_heading = "ModelConfig")]
    pub quantization: Option<String>,
    /// Accepted for compatibility: ferrite never runs code from a checkpoint.
    #[arg(long, help_heading = "ModelConfig")]
    pub trust_remote_code: bool,
    /// auto, safetensors (a checkpoint directory), gguf (a .gguf file; on CPU its quantized
    /// matrices stay in their blocks), or ferrite's dequantized (quantized matrices, GGUF blocks
    /// or 4-bit packed weights, dequantized at load, as transformers computes; gguf-dequantized
    /// is its spelling for a GGUF file).
    #[arg(long, default_value = "auto", help_heading = "LoadConfig")]
    pub load_format: String,
    /// KV-cache element type: auto (the model's --dtype), bfloat16 (the same for a bf16 model), or
    /// fp8 / fp8_e4m3 (e4m3 with the checkpoint's per-layer k_scale / v_scale, else 1.0: half a
    /// bf16 cache's bytes, so twice the tokens).
    #[arg(long, default_value = "auto", help_heading = "CacheConfig")]
    pub kv_cache_dtype: String,
    /// Chunked prefill is always on in ferrite; the flag is accepted.
    #[arg(long, overrides_with = "no_enable_chunked_prefill", help_heading = "SchedulerConfig")]
    pub enable_chunked_prefill: bool,
    /// Turning chunked prefill off is not built.
    #[arg(long, overrides_with = "enable_chunked_prefill", help_heading = "SchedulerConfig")]
    pub no_enable_chunked_prefill: bool,
    /// Never end a prefill chunk inside an image's or video's tokens: the item is computed in
    /// one step (always so for models whose image tokens attend to one another both ways).
    #[arg(long, help_heading = "SchedulerConfig")]
    pub disable_chunked_mm_input: bool,
    /// Speculative decoding as JSON, e.g. '{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}' (methods built: ngram, suffix).
    #[arg(long, help_heading = "SpeculativeConfig")]
    pub speculative_config: Option<String>,
    /// LoRA adapters (not built yet).
    #[arg(long, help_heading = "LoRAConfig")]
    pub enable_lora: bool,
    #[arg(long, num_args = 1.., help_heading = "LoRAConfig")]
    pub lora_modules: Vec<String>,
    /// Structured outputs' defaults as JSON, e.g. '{"backend": "guidance",
    /// "disable_any_whitespace": true}'; the backend is always guidance (llguidance).
    #[arg(long, help_heading = "StructuredOutputsConfig")]
    pub structured_outputs_config: Option<String>,
    /// Serve `tool_choice: "auto"`: tool calls are parsed out of the output by --tool-call-parser.
    #[arg(long, help_heading = "Frontend")]
    pub enable_auto_tool_choice: bool,
    /// The model's tool-call format: hermes, llama3_json, mistral, qwen3_coder, deepseek_v3, pythonic,
    /// openai (gpt-oss harmony).
    #[arg(long, help_heading = "Frontend")]
    pub tool_call_parser: Option<String>,
    /// Split the output into `reasoning_content` and `content`: deepseek_r1, qwen3, granite, gpt_oss.
    #[arg(long, help_heading = "Frontend")]
    pub reasoning_parser: Option<String>,
    /// Render a request's own `chat_template` (off: such a request is refused).
    #[arg(long, help_heading = "Frontend")]
    pub trust_request_chat_template: bool,
    /// With `tool_choice: "none"`, leave the tools out of the prompt.
    #[arg(long, help_heading = "Frontend")]
    pub exclude_tools_when_tool_choice_none: bool,
    /// Images and videos per prompt (see `ferrite_server::media::MediaLimits`).
    #[arg(long, help_heading = "MultiModalConfig")]
    pub limit_mm_per_prompt: Option<String>,
    /// Python ASGI middleware (it cannot run in ferrite).
    #[arg(long, num_args = 1.., help_heading = "Frontend")]
    pub middleware: Vec<String>,
    /// No log line per request.
    #[arg(long, help_heading = "Frontend")]
    pub disable_log_requests: bool,
    /// Accepted: ferrite logs no periodic statistics (they are on /metrics).
    #[arg(long, help_heading = "Frontend")]
    pub disable_log_stats: bool,
}

/// vLLM's two-letter single-dash spellings (`-tp 2`), which clap's short options (one letter)
/// cannot express, as their long names.
pub fn expand_short_aliases(args: impl IntoIterator<Item = String>) -> Vec<String> {
    args.into_iter()
        .map(|a| match a.as_str() {
            "-tp" => "--tensor-parallel-size".to_owned(),
            "-pp" => "--pipeline-parallel-size".to_owned(),
            "-dp" => "--data-parallel-size".to_owned(),
            _ => a,
        })
        .collect()
}

impl VllmFlags {
    pub fn chat_options(&self) -> ChatOptions {
        ChatOptions {
            enable_auto_tool_choice: self.enable_auto_tool_choice,
            tool_call_parser: self.tool_call_parser.clone(),
            reasoning_parser: self.reasoning_parser.clone(),
            trust_request_chat_template: self.trust_request_chat_template,
            exclude_tools_when_tool_choice_none: self.exclude_tools_when_tool_choice_none,
        }
    }

    /// The JSON schema compiler's defaults from `--structured-outputs-config`.
    pub fn structured_outputs(&self) -> Result<JsonOptions> {
        const FLAG: &str = "--structured-outputs-config";
        let Some(text) = &self.structured_outputs_config else {
            return Ok(JsonOptions::default());
        };
        let config: serde_json::Value =
            serde_json::from_str(text).map_err(|e| anyhow::anyhow!("{FLAG}: not a JSON object: {e}"))?;
        let Some(config) = config.as_object() else { bail!("{FLAG}: not a JSON object: {text}") };
        let mut options = JsonOptions::default();
        for (key, value) in config {
            let flag = || value.as_bool().ok_or_else(|| anyhow::anyhow!("{FLAG}: `{key}` must be true or false"));
            match key.as_str() {
                "backend" => match value.as_str() {
                    Some("auto" | "guidance") => {}
                    _ => bail!("{FLAG}: backend {value} is not built; ferrite's backend is guidance (llguidance)"),
                },
                "disable_any_whitespace" => options.disable_any_whitespace = flag()?,
                "disable_additional_properties" => options.disable_additional_properties = flag()?,
                // With one backend there is nothing to fall back to.
                "disable_fallback" => {
                    flag()?;
                }
                other => bail!("{FLAG}: `{other}` is not supported (supported: backend, disable_any_whitespace, disable_additional_properties, disable_fallback)"),
            }
        }
        Ok(options)
    }

    /// The KV cache's element type for a model whose activations are `model_dtype` on `device`
    /// (`check` has refused the names not built).
    pub fn kv_cache_dtype(&self, model_dtype: DType, device: Device) -> Result<DType> {
        match self.kv_cache_dtype.as_str() {
            "fp8" | "fp8_e4m3" => Ok(DType::Fp8),
            "bfloat16" if model_dtype != DType::BF16 && device != Device::Cpu => {
                bail!("--kv-cache-dtype bfloat16: a bf16 cache under {model_dtype} activations is not built (use auto)")
            }
            _ => Ok(model_dtype),
        }
    }

    /// The first flag that asks for something ferrite has not built, as an error naming it.
    pub fn check(&self, model: &std::path::Path) -> Result<()> {
        let not_built = |flag: &str, feature: &str| -> Result<()> {
            bail!("{flag}: {feature} is not built in ferrite yet; remove the flag")
        };
        for (flag, n, feature) in [
            ("--tensor-parallel-size", self.tensor_parallel_size, "tensor parallelism"),
            ("--pipeline-parallel-size", self.pipeline_parallel_size, "pipeline parallelism"),
            ("--data-parallel-size", self.data_parallel_size, "data parallelism"),
        ] {
            if n != 1 {
                return not_built(flag, &format!("{feature} ({n} GPUs; ferrite serves on one)"));
            }
        }
        let set = |on: bool, flag: &'static str, feature: &'static str| on.then_some((flag, feature));
        let first = [
            set(self.enable_expert_parallel, "--enable-expert-parallel", "expert parallelism"),
            set(self.no_enable_chunked_prefill, "--no-enable-chunked-prefill", "prefill without chunking"),
            set(self.enable_lora || !self.lora_modules.is_empty(), "--enable-lora/--lora-modules", "LoRA"),
            set(!self.middleware.is_empty(), "--middleware", "Python ASGI middleware"),
        ]
        .into_iter()
        .flatten()
        .next();
        if let Some((flag, feature)) = first {
            return not_built(flag, feature);
        }
        match self.kv_cache_dtype.as_str() {
            "auto" | "bfloat16" | "fp8" | "fp8_e4m3" => {}
            "fp8_e5m2" | "fp8_inc" | "fp8_ds_mla" => {
                return not_built(
                    "--kv-cache-dtype",
                    &format!("a {} KV cache (fp8 / fp8_e4m3 is)", self.kv_cache_dtype),
                )
            }
            other => bail!("--kv-cache-dtype {other}: not a KV-cache dtype (auto, bfloat16, fp8, fp8_e4m3)"),
        }
        if self.enable_auto_tool_choice && self.tool_call_parser.is_none() {
            bail!("--enable-auto-tool-choice needs --tool-call-parser (one of {})", tool::PARSERS.join(", "));
        }
        for (flag, name, known) in [
            ("--tool-call-parser", &self.tool_call_parser, tool::PARSERS),
            ("--reasoning-parser", &self.reasoning_parser, reasoning::PARSERS),
        ] {
            if let Some(name) = name.as_deref().filter(|n| !known.contains(n)) {
                bail!("{flag} {name}: no such parser; the parsers are {}", known.join(", "));
            }
        }
        let gguf = model.extension().is_some_and(|e| e == "gguf");
        match self.load_format.as_str() {
            "auto" | DEQUANTIZED => {}
            "safetensors" if !gguf => {}
            "gguf" | GGUF_DEQUANTIZED if gguf => {}
            "safetensors" | "gguf" | GGUF_DEQUANTIZED => {
                bail!("--load-format {} does not match {}", self.load_format, model.display())
            }
            other => not_built("--load-format", &format!("the {other:?} load format"))?,
        }
        if self.trust_remote_code {
            tracing::info!("--trust-remote-code: accepted; ferrite never runs code from a checkpoint");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        flags: VllmFlags,
    }

    fn check(args: &[&str], model: &str) -> std::result::Result<(), String> {
        let argv = expand_short_aliases(std::iter::once("serve").chain(args.iter().copied()).map(String::from));
        let cmd = Cmd::try_parse_from(argv).map_err(|e| e.to_string())?;
        cmd.flags.check(Path::new(model)).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_ferrite_has_are_accepted() {
        let ok = ["-tp", "1", "--enable-chunked-prefill", "--trust-remote-code", "--disable-log-stats"];
        assert_eq!(check(&ok, "dir"), Ok(()));
        assert_eq!(check(&["--load-format", "gguf"], "m.gguf"), Ok(()));
        assert_eq!(check(&["--load-format", "gguf-dequantized"], "m.gguf"), Ok(()));
        assert_eq!(check(&["--load-format", "dequantized"], "m.gguf"), Ok(()));
        assert_eq!(check(&["--load-format", "dequantized"], "dir"), Ok(()));
        for kv in ["auto", "bfloat16", "fp8", "fp8_e4m3"] {
            assert_eq!(check(&["--kv-cache-dtype", kv], "dir"), Ok(()));
        }
        let argv = ["serve", "--disable-chunked-mm-input"];
        assert!(Cmd::try_parse_from(argv).unwrap().flags.disable_chunked_mm_input);
        assert!(!Cmd::try_parse_from(["serve"]).unwrap().flags.disable_chunked_mm_input);
    }

    #[test]
    fn flags_for_unbuilt_features_name_the_feature() {
        for (args, feature) in [
            (&["-tp", "2"][..], "tensor parallelism"),
            (&["--tensor-parallel-size=4"], "tensor parallelism"),
            (&["-dp", "2"], "data parallelism"),
            (&["--enable-expert-parallel"], "expert parallelism"),
            (&["--lora-modules", "a=/x"], "LoRA"),
            (&["--enable-chunked-prefill", "--no-enable-chunked-prefill"], "prefill without chunking"),
            (&["--load-format", "pt"], "load format"),
            (&["--kv-cache-dtype", "fp8_e5m2"], "fp8_e5m2 KV cache"),
        ] {
            let err = check(args, "dir").expect_err("must be refused");
            assert!(err.contains(feature) && err.contains("not built"), "{args:?}: {err}");
        }
        let err = check(&["--kv-cache-dtype", "int8"], "dir").unwrap_err();
        assert!(err.contains("int8") && err.contains("fp8_e4m3"), "{err}");
        let err = check(&["--load-format", "safetensors"], "m.gguf").unwrap_err();
        assert!(err.contains("does not match"), "{err}");
        let err = check(&["--load-format", "gguf-dequantized"], "dir").unwrap_err();
        assert!(err.contains("does not match"), "{err}");
    }

    #[test]
    fn kv_cache_dtype_maps_to_the_cache_element() {
        let kv = |name: &str, dtype, device| {
            Cmd::try_parse_from(["serve", "--kv-cache-dtype", name]).unwrap().flags.kv_cache_dtype(dtype, device)
        };
        let gpu = Device::Cuda(0);
        assert_eq!(kv("auto", DType::BF16, gpu).unwrap(), DType::BF16);
        assert_eq!(kv("fp8", DType::BF16, gpu).unwrap(), DType::Fp8);
        assert_eq!(kv("fp8_e4m3", DType::F32, Device::Cpu).unwrap(), DType::Fp8);
        assert_eq!(kv("bfloat16", DType::BF16, gpu).unwrap(), DType::BF16);
        assert_eq!(kv("bfloat16", DType::F32, Device::Cpu).unwrap(), DType::F32);
        assert!(kv("bfloat16", DType::F32, gpu).unwrap_err().to_string().contains("f32 activations"));
    }

    #[test]
    fn structured_outputs_config_sets_the_schema_defaults() {
        let flags = |json: &str| Cmd::try_parse_from(["serve", "--structured-outputs-config", json]).unwrap().flags;
        let options = flags(r#"{"backend": "guidance", "disable_any_whitespace": true}"#).structured_outputs().unwrap();
        assert!(options.disable_any_whitespace && !options.disable_additional_properties);
        for (bad, needle) in [
            (r#"{"backend": "xgrammar"}"#, "xgrammar"),
            (r#"{"disable_any_whitespace": "yes"}"#, "disable_any_whitespace"),
            (r#"{"reasoning_parser": "qwen3"}"#, "reasoning_parser"),
            ("[1]", "not a JSON object"),
        ] {
            let err = flags(bad).structured_outputs().unwrap_err().to_string();
            assert!(err.contains(needle) && err.contains("--structured-outputs-config"), "{bad}: {err}");
        }
    }
}
