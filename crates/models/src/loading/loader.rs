//! Loading a model from a Hugging Face checkpoint directory or a GGUF file.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use ferrite_tensor::{DType, Device, Tensor};

use crate::families::eagle3;
use crate::loading::config::RawConfig;
use crate::loading::gguf::{self, GgufFile};
use crate::loading::quant::Quantization;
use crate::loading::weights::{GgufWeights, SafetensorsWeights, WeightSource, Weights};
use crate::model::{CausalLM, DraftHead};
use crate::pooling::{LoadedPoolingModel, PoolerConfig, MAX_FORWARD_TOKENS};
use crate::registry;
use crate::{ModelError, Result};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub dtype: DType,
    /// Where the weights are placed; CUDA holds f32 and bf16 tensors.
    pub device: Device,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// vLLM's `--quantization`: the checkpoint's own method, or `fp8` to quantize an unquantized
    /// checkpoint as it loads.
    pub quantization: Option<String>,
    /// Dequantize quantized matrices at load (`--load-format dequantized`), as transformers
    /// does: by default the CPU keeps a GGUF file's in their blocks and CUDA keeps 4-bit
    /// pack-quantized and symmetric GPTQ weights packed.
    pub dequantize_weights: bool,
    /// Load the checkpoint's multi-token-prediction head too (speculative decoding's `mtp`).
    pub load_mtp: bool,
    /// Keep FP8 linear weights as e4m3 bytes on CUDA and multiply them with the FP8 kernels;
    /// otherwise they are dequantized to the model's dtype at load. Off unless the environment
    /// sets `FERRITE_FP8_KERNELS=1`: the whole FP8 path has not yet passed the CUDA battery on a
    /// GPU (docs/cuda.md, "FP8 weights kept as bytes").
    pub fp8_kernels: bool,
}

/// Whether `FERRITE_FP8_KERNELS=1` asks for the FP8 kernels (see [`LoadOptions::fp8_kernels`]).
pub fn fp8_kernels_from_env() -> bool {
    std::env::var("FERRITE_FP8_KERNELS").is_ok_and(|v| v == "1")
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: DType::F32,
            device: Device::Cpu,
            progress: true,
            quantization: None,
            dequantize_weights: false,
            load_mtp: false,
            fp8_kernels: fp8_kernels_from_env(),
        }
    }
}

/// Where a checkpoint's config and tokenizer come from.
#[derive(Debug, Clone)]
pub enum CheckpointKind {
    /// A directory with `config.json`, safetensors and `tokenizer.json`.
    HfDir(PathBuf),
    /// A GGUF file carrying config, weights, tokenizer and chat template.
    Gguf(PathBuf),
}

pub struct LoadedModel {
    pub model: Box<dyn CausalLM>,
    pub config: RawConfig,
    pub kind: CheckpointKind,
    /// For GGUF checkpoints: the `tokenizer.json` and `tokenizer_config.json` contents built
    /// from the file's metadata.
    pub gguf_tokenizer: Option<(String, serde_json::Value)>,
}

pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    if opts.dtype == DType::F16 && opts.device != Device::Cpu {
        return Err(ModelError::Config {
            path: path.to_path_buf(),
            message: format!(
                "dtype float16 on {:?}: the CUDA backend computes in bfloat16 or float32 (pass --dtype bfloat16)",
                opts.device
            ),
        });
    }
    let is_file = path.is_file();
    if !path.exists() {
        return Err(ModelError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "model path does not exist"),
        });
    }
    type Opened = (RawConfig, Box<dyn WeightSource>, CheckpointKind, Option<(String, serde_json::Value)>);
    let (config, source, kind, gguf_tokenizer): Opened = if is_file && gguf::is_gguf(path) {
        let file = GgufFile::open(path)?;
        let config = RawConfig { path: path.to_path_buf(), value: file.hf_config()? };
        let tokenizer = (file.hf_tokenizer_json()?, file.hf_tokenizer_config_json()?);
        let weights =
            GgufWeights::new(file, path).keeping_blocks(opts.device == Device::Cpu && !opts.dequantize_weights);
        (config, Box::new(weights), CheckpointKind::Gguf(path.to_path_buf()), Some(tokenizer))
    } else if path.is_dir() {
        let config = RawConfig::from_file(&path.join("config.json"))?;
        (config, Box::new(SafetensorsWeights::open(path)?), CheckpointKind::HfDir(path.to_path_buf()), None)
    } else {
        return Err(ModelError::Config {
            path: path.to_path_buf(),
            message: "expected a checkpoint directory (config.json + safetensors) or a .gguf file".into(),
        });
    };
    let arch = config.architecture()?;
    let constructor = registry::constructor(&arch)?;
    let bar = (opts.progress && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(source.tensor_count() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:40}] {pos}/{len} tensors {elapsed}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_message(arch.clone());
        bar
    });
    let quantization = Quantization::resolve(&config, opts.quantization.as_deref())?;
    let weights = Weights::new(source, opts.dtype, bar.clone())
        .on_device(opts.device)
        .with_quantization(quantization)
        .keeping_packed(!opts.dequantize_weights)
        .keeping_fp8(opts.fp8_kernels && !opts.dequantize_weights)
        .loading_mtp(opts.load_mtp);
    let span = tracing::info_span!("load", arch = %arch, path = %path.display());
    let _guard = span.enter();
    let started = std::time::Instant::now();
    let model = constructor(&config, &weights)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    let weight_bytes = model.info().weight_bytes;
    let gib_per_s = weight_bytes as f64 / (1u64 << 30) as f64 / seconds.max(1e-9);
    tracing::info!(tensors = weights.loaded_count(), weight_bytes, seconds, gib_per_s, "model loaded");
    Ok(LoadedModel { model, config, kind, gguf_tokenizer })
}

/// Which EAGLE a draft head is (speculative decoding's `eagle` or `eagle3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagleVersion {
    One,
    Three,
}

/// Loads an EAGLE draft head from its checkpoint directory, with the dtype and device of `opts`,
/// to draft for `target`. A checkpoint whose config names its base architecture
/// (`LlamaForCausalLM`) runs as the head vLLM makes of it (`EagleLlamaForCausalLM`,
/// `Eagle3LlamaForCausalLM`).
pub fn load_eagle_head(
    dir: &Path,
    target: &dyn CausalLM,
    opts: &LoadOptions,
    version: EagleVersion,
) -> Result<Box<dyn DraftHead>> {
    if !dir.is_dir() {
        return Err(ModelError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a checkpoint directory"),
        });
    }
    let config = eagle3::normalize_config(&RawConfig::from_file(&dir.join("config.json"))?)?;
    let quantization = Quantization::resolve(&config, opts.quantization.as_deref())?;
    let weights = Weights::new(Box::new(SafetensorsWeights::open(dir)?), opts.dtype, None)
        .on_device(opts.device)
        .with_quantization(quantization)
        .keeping_packed(!opts.dequantize_weights)
        .keeping_fp8(opts.fp8_kernels && !opts.dequantize_weights);
    let arch = config.architecture()?;
    let prefix = match version {
        EagleVersion::One => "Eagle",
        EagleVersion::Three => "Eagle3",
    };
    let arch = match registry::kinds(&arch).contains(&registry::ModelKind::DraftHead) {
        true => arch,
        false => format!("{prefix}{arch}"),
    };
    let head = registry::draft_head_constructor(&arch)?(&config, &weights, target)?;
    tracing::info!(path = %dir.display(), %arch, "EAGLE head loaded");
    Ok(head)
}

/// Loads a pooling model from a Hugging Face checkpoint directory (config.json, safetensors and,
/// optionally, a sentence-transformers config).
pub fn load_pooling_model(dir: &Path, opts: &LoadOptions) -> Result<LoadedPoolingModel> {
    let config = RawConfig::from_file(&dir.join("config.json"))?;
    let arch = config.architecture()?;
    let constructor = registry::pooling_constructor(&arch)?;
    let mut source: Box<dyn WeightSource> = Box::new(SafetensorsWeights::open(dir)?);
    if !source.contains("model.embed_tokens.weight") && source.contains("embed_tokens.weight") {
        source = Box::new(BaseModelNames(source));
    }
    let weights = Weights::new(source, opts.dtype, None);
    let span = tracing::info_span!("load_pooling", arch = %arch, path = %dir.display());
    let _guard = span.enter();
    let model = constructor(&config, &weights)?;
    let pooler = PoolerConfig::from_dir(dir, &config, model.info().default_pooling)?;
    let max_model_len = pooler.max_seq_length.map_or(model.info().max_tokens, |m| m.min(model.info().max_tokens));
    tracing::info!(
        tensors = weights.loaded_count(),
        pooling = pooler.pooling.as_str(),
        normalize = pooler.normalize,
        max_model_len,
        "pooling model loaded"
    );
    Ok(LoadedPoolingModel {
        model,
        pooler,
        config,
        dir: dir.to_path_buf(),
        max_model_len,
        max_forward_tokens: MAX_FORWARD_TOKENS,
    })
}

/// Serves `model.X` for a checkpoint saved from a decoder's base class (`LlamaModel`, whose
/// tensors are `embed_tokens.weight`, `layers.0...`), so the causal loaders read it unchanged.
struct BaseModelNames(Box<dyn WeightSource>);

impl BaseModelNames {
    fn inner_name<'a>(&self, name: &'a str) -> &'a str {
        match name.strip_prefix("model.") {
            Some(rest) if !self.0.contains(name) => rest,
            _ => name,
        }
    }
}

impl WeightSource for BaseModelNames {
    fn contains(&self, name: &str) -> bool {
        self.0.contains(self.inner_name(name))
    }
    fn load(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        self.0.load(self.inner_name(name), dtype)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn tensor_count(&self) -> usize {
        self.0.tensor_count()
    }
    fn is_fp8(&self, name: &str) -> bool {
        self.0.is_fp8(self.inner_name(name))
    }
    fn load_ints(&self, name: &str) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        self.0.load_ints(self.inner_name(name))
    }
}
