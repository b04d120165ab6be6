//! Loading a model from a Hugging Face checkpoint directory or a GGUF file.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use ferrite_tensor::{DType, Device};

use crate::config::RawConfig;
use crate::gguf::{self, GgufFile};
use crate::model::CausalLM;
use crate::registry;
use crate::weights::{GgufWeights, SafetensorsWeights, WeightSource, Weights};
use crate::{ModelError, Result};

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub dtype: DType,
    /// Where the weights are placed; CUDA holds f32 and bf16 tensors.
    pub device: Device,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { dtype: DType::F32, device: Device::Cpu, progress: true }
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
        (config, Box::new(GgufWeights::new(file, path)), CheckpointKind::Gguf(path.to_path_buf()), Some(tokenizer))
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
    let weights = Weights::new(source, opts.dtype, bar.clone()).on_device(opts.device);
    let span = tracing::info_span!("load", arch = %arch, path = %path.display());
    let _guard = span.enter();
    let model = constructor(&config, &weights)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    tracing::info!(tensors = weights.loaded_count(), weight_bytes = model.info().weight_bytes, "model loaded");
    Ok(LoadedModel { model, config, kind, gguf_tokenizer })
}
