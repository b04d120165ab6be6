//! The offline API: load a checkpoint, run a batch of prompts to completion.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_models::{load_eagle_head, load_model, LoadOptions};
use ferrite_tensor::DType;
use ferrite_tokenizer::Tokenizer;

use crate::config::EngineConfig;
use crate::engine::{Engine, EngineClient, LoadedDrafter, PromptInput};
use crate::error::{EngineError, Result};
use crate::output::RequestOutput;
use crate::params::SamplingParams;
use crate::spec_decode::SpeculativeMethod;

pub struct LLM {
    engine: Engine,
}

/// What to use instead of the checkpoint's own tokenizer files (vLLM's `--tokenizer` and
/// `--chat-template`).
#[derive(Debug, Clone, Default)]
pub struct TokenizerOverrides {
    /// A directory with `tokenizer.json` (and `tokenizer_config.json`, ...).
    pub tokenizer_dir: Option<PathBuf>,
    /// A Jinja chat template.
    pub chat_template: Option<String>,
}

impl LLM {
    /// Loads a checkpoint directory (config.json, safetensors, tokenizer.json) or a GGUF file
    /// (which carries its own tokenizer) and starts an engine on it.
    pub fn new(model_path: impl AsRef<Path>, dtype: DType, config: EngineConfig) -> Result<LLM> {
        LLM::with_tokenizer(model_path, dtype, config, &TokenizerOverrides::default())
    }

    /// [`LLM::new`] with another tokenizer or chat template than the checkpoint's.
    pub fn with_tokenizer(
        model_path: impl AsRef<Path>,
        dtype: DType,
        config: EngineConfig,
        overrides: &TokenizerOverrides,
    ) -> Result<LLM> {
        let path = model_path.as_ref();
        let method = config.speculative.as_ref().map(|s| &s.method);
        let opts = LoadOptions {
            dtype,
            device: config.device,
            progress: true,
            quantization: config.quantization.clone(),
            dequantize_weights: config.dequantize_weights,
            load_mtp: method == Some(&SpeculativeMethod::Mtp),
            fp8_kernels: ferrite_models::loading::loader::fp8_kernels_from_env(),
        };
        let draft_opts = |d: &crate::spec_decode::DraftModelConfig| LoadOptions {
            quantization: d.quantization.clone(),
            progress: false,
            load_mtp: false,
            ..opts.clone()
        };
        let loading = |d: &crate::spec_decode::DraftModelConfig, e: ferrite_models::ModelError| {
            EngineError::Config(format!(
                "--speculative-config: loading the draft checkpoint {}: {e}",
                d.model.display()
            ))
        };
        let draft = match method {
            Some(SpeculativeMethod::DraftModel(d)) => {
                let draft = load_model(&d.model, &draft_opts(d)).map_err(|e| loading(d, e))?;
                Some(LoadedDrafter::Model(draft.model))
            }
            _ => None,
        };
        let loaded = load_model(path, &opts)?;
        let draft = match method {
            Some(SpeculativeMethod::Eagle(version, d)) => {
                let head = load_eagle_head(&d.model, loaded.model.as_ref(), &draft_opts(d), *version)
                    .map_err(|e| loading(d, e))?;
                Some(LoadedDrafter::Head(head))
            }
            _ => draft,
        };
        let mut tokenizer = match (&overrides.tokenizer_dir, &loaded.gguf_tokenizer) {
            (Some(dir), _) => Tokenizer::from_dir(dir)?,
            (None, Some((json, tokenizer_config))) => Tokenizer::from_parts(json, tokenizer_config, None, None)?,
            (None, None) => Tokenizer::from_dir(path)?,
        };
        if let Some(template) = &overrides.chat_template {
            tokenizer = tokenizer.with_chat_template(template.clone())?;
        }
        let engine = Engine::with_drafter(loaded.model, draft, Arc::new(tokenizer), config)?;
        Ok(LLM { engine })
    }

    pub fn from_engine(engine: Engine) -> LLM {
        LLM { engine }
    }

    pub fn client(&self) -> EngineClient {
        self.engine.client()
    }

    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.engine.client().tokenizer()
    }

    /// Runs every prompt (all submitted at once, batched by the scheduler) and returns their
    /// final, cumulative outputs in prompt order; a request the engine failed fails the call.
    /// Must not be called from an async runtime.
    pub fn generate(&self, prompts: Vec<PromptInput>, params: &SamplingParams) -> Result<Vec<RequestOutput>> {
        let client = self.engine.client();
        let mut streams = Vec::with_capacity(prompts.len());
        for (i, prompt) in prompts.into_iter().enumerate() {
            streams.push(client.add_request(format!("generate-{i}"), prompt, params.clone())?);
        }
        streams
            .iter_mut()
            .map(|stream| {
                let mut acc: Option<RequestOutput> = None;
                while let Some(delta) = stream.blocking_next() {
                    match &mut acc {
                        Some(a) => a.merge(delta),
                        None => acc = Some(delta),
                    }
                }
                let out = acc.filter(|a| a.finished).ok_or(EngineError::EngineStopped)?;
                match &out.error {
                    Some(message) => {
                        Err(EngineError::Internal(format!("request {} failed: {message}", out.request_id)))
                    }
                    None => Ok(out),
                }
            })
            .collect()
    }
}
