use ferrite_models::ModelInfo;
use ferrite_structured::JsonOptions;
use ferrite_tensor::{DType, Device, PagedKvLayer};

use crate::error::{EngineError, Result};

/// How the engine sizes its KV cache and batches. Defaults follow vLLM's CPU backend.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Bytes for the KV cache across all layers; the block count is derived from it.
    pub kv_cache_memory: usize,
    /// Tokens one step may compute (decodes plus prefill chunks).
    pub max_num_batched_tokens: usize,
    /// vLLM's `--disable-chunked-mm-input`: a prefill chunk never ends inside an image's or
    /// video's tokens (always so for models whose image tokens attend both ways).
    pub disable_chunked_mm_input: bool,
    /// Sequences one step may hold.
    pub max_num_seqs: usize,
    /// Longest prompt + completion; `None` takes the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Where the KV cache lives: the device the model's weights were loaded to.
    pub device: Device,
    /// Element type of a device KV cache (the CPU cache is always f32); `DType::Fp8` for an e4m3
    /// cache (`--kv-cache-dtype fp8`), which the CPU keeps as f32 values e4m3 can hold.
    pub kv_cache_dtype: DType,
    /// On a GPU, the share of the card's memory the engine may fill (weights, activations and
    /// KV cache); when set, `kv_cache_memory` is derived from it instead of read.
    pub gpu_memory_utilization: Option<f32>,
    /// On a GPU, run decode steps kernel by kernel instead of replaying CUDA graphs.
    pub enforce_eager: bool,
    /// Seeds the seeds given to requests that bring none (vLLM's `--seed`); `None`: from the OS.
    pub seed: Option<u64>,
    /// Most logprobs a request may ask for per token (vLLM's `--max-logprobs`).
    pub max_logprobs: usize,
    /// The JSON schema compiler's defaults (vLLM's `--structured-outputs-config`).
    pub structured_outputs: JsonOptions,
    /// Outputs a request may have waiting for its reader; past this the client is taken to have
    /// stopped reading and the request is aborted, so a stalled stream cannot hold a sequence
    /// slot and grow its queue while the engine generates. `None` (the offline API, which reads
    /// its streams one after another) never aborts; the server sets
    /// [`EngineConfig::SERVER_MAX_UNREAD_OUTPUTS`].
    pub max_unread_outputs: Option<usize>,
    /// vLLM's `--quantization`: the checkpoint's own method, or `fp8` to quantize the weights of
    /// an unquantized checkpoint as it loads. `None` takes the checkpoint's.
    pub quantization: Option<String>,
    /// Dequantize quantized matrices at load instead of keeping them quantized (GGUF blocks on
    /// CPU, 4-bit packed weights on CUDA).
    pub dequantize_weights: bool,
    /// vLLM's `--speculative-config`: drafts verified per step (`None`: no speculation).
    pub speculative: Option<crate::SpeculativeConfig>,
}

impl EngineConfig {
    /// A stream stalled this many steps behind is a client that stopped reading.
    pub const SERVER_MAX_UNREAD_OUTPUTS: usize = 4096;
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            // vLLM's VLLM_CPU_KVCACHE_SPACE default.
            kv_cache_memory: 4 << 30,
            max_num_batched_tokens: 2048,
            disable_chunked_mm_input: false,
            max_num_seqs: 256,
            max_model_len: None,
            enable_prefix_caching: true,
            device: Device::Cpu,
            kv_cache_dtype: DType::F32,
            gpu_memory_utilization: None,
            enforce_eager: false,
            seed: None,
            max_logprobs: crate::params::MAX_LOGPROBS,
            structured_outputs: JsonOptions::default(),
            max_unread_outputs: None,
            quantization: None,
            dequantize_weights: false,
            speculative: None,
        }
    }
}

/// The cache geometry derived from an [`EngineConfig`] and a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub block_size: usize,
    pub num_blocks: usize,
    pub dtype: DType,
    pub bytes_per_token: usize,
    /// Recurrent-state slots of a hybrid model (one per request that may run, `max_num_seqs`;
    /// 0 for models without recurrent layers), taken out of the KV cache memory first.
    pub state_slots: usize,
    /// Further slots keeping states at block boundaries for prefix hits (with prefix caching).
    pub state_snapshots: usize,
    /// Slots saving each working state before a verify step (with speculative decoding), one per
    /// working slot, after the snapshots.
    pub state_backups: usize,
}

impl CacheConfig {
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks * self.block_size
    }
}

impl EngineConfig {
    /// The effective `max_model_len`: `--max-model-len`, checked against the model, else the
    /// model's own.
    pub fn max_model_len(&self, info: &ModelInfo) -> Result<usize> {
        match self.max_model_len {
            Some(0) => Err(EngineError::Config("max_model_len must be at least 1".into())),
            Some(len) if len > info.max_position_embeddings => Err(EngineError::Config(format!(
                "max_model_len {len} exceeds the model's max_position_embeddings {}",
                info.max_position_embeddings
            ))),
            Some(len) => Ok(len),
            None => Ok(info.max_position_embeddings),
        }
    }

    /// Checks the configuration against the model and derives the cache geometry and the
    /// effective `max_model_len`.
    pub fn resolve(&self, info: &ModelInfo) -> Result<(CacheConfig, usize)> {
        if self.block_size == 0 {
            return Err(EngineError::Config("block_size must be at least 1".into()));
        }
        if self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 {
            return Err(EngineError::Config("max_num_batched_tokens and max_num_seqs must be at least 1".into()));
        }
        if info.kv_layers.is_empty() && info.state_layers.is_empty() {
            return Err(EngineError::Config("the model has no KV cache or recurrent-state layers".into()));
        }
        let max_model_len = self.max_model_len(info)?;
        let on_cpu = self.device == Device::Cpu;
        let dtype = if on_cpu && self.kv_cache_dtype != DType::Fp8 { DType::F32 } else { self.kv_cache_dtype };
        let stored = if on_cpu { DType::F32 } else { dtype };
        let bytes_per_token: usize = info
            .kv_layers
            .iter()
            .map(|l| PagedKvLayer::bytes_per_token_as(l.num_kv_heads, l.k_dim, l.v_dim, stored))
            .sum();
        let block_bytes = bytes_per_token * self.block_size;
        let state_slots = if info.state_layers.is_empty() { 0 } else { self.max_num_seqs };
        // As many states kept for prefix hits as may run at once.
        let state_snapshots = if self.enable_prefix_caching { state_slots } else { 0 };
        let state_backups = if self.speculative.is_some() { state_slots } else { 0 };
        let state_bytes = (state_slots + state_snapshots + state_backups) * info.state_bytes_per_sequence();
        let Some(kv_memory) = self.kv_cache_memory.checked_sub(state_bytes) else {
            return Err(EngineError::Config(format!(
                "kv_cache_memory of {} bytes cannot hold {state_slots} recurrent states, {state_snapshots} kept for \
                 prefix caching and {state_backups} saved for speculative decoding ({} bytes each, {state_bytes} in \
                 all); lower max_num_seqs, turn prefix caching off or raise the cache memory",
                self.kv_cache_memory,
                info.state_bytes_per_sequence()
            )));
        };
        let num_blocks = match block_bytes {
            // A model of recurrent layers alone stores nothing per token: its blocks only keep the
            // scheduler's books (and prefix-cache hashes), as many as every sequence at full length.
            0 => self.max_num_seqs * max_model_len.div_ceil(self.block_size),
            _ => kv_memory / block_bytes,
        };
        if num_blocks == 0 {
            return Err(EngineError::Config(format!(
                "kv_cache_memory of {} bytes is smaller than one block ({block_bytes} bytes = {} tokens x \
                 {bytes_per_token} bytes)",
                self.kv_cache_memory, self.block_size
            )));
        }
        if num_blocks > u32::MAX as usize {
            return Err(EngineError::Config(format!("{num_blocks} KV blocks exceed the u32 block id range")));
        }
        let cache = CacheConfig {
            block_size: self.block_size,
            num_blocks,
            dtype,
            bytes_per_token,
            state_slots,
            state_snapshots,
            state_backups,
        };
        if cache.capacity_tokens() < max_model_len {
            tracing::warn!(
                capacity_tokens = cache.capacity_tokens(),
                max_model_len,
                "the KV cache holds fewer tokens than max_model_len; longer requests are rejected at admission"
            );
        }
        Ok((cache, max_model_len))
    }
}

#[cfg(test)]
mod tests {
    use ferrite_models::KvLayerSpec;

    use super::*;

    #[test]
    fn an_fp8_cache_holds_twice_the_tokens_of_a_bf16_one_on_a_gpu() {
        let info = ModelInfo {
            architecture: "LlamaForCausalLM".into(),
            vocab_size: 100,
            max_position_embeddings: 1024,
            kv_layers: vec![KvLayerSpec { num_kv_heads: 8, k_dim: 128, v_dim: 128 }; 4],
            kv_scales: Vec::new(),
            state_layers: Vec::new(),
            num_layers: 4,
            weight_bytes: 0,
            vision: None,
        };
        let resolve = |device, kv_cache_dtype| {
            let config = EngineConfig { device, kv_cache_dtype, kv_cache_memory: 64 << 20, ..EngineConfig::default() };
            config.resolve(&info).unwrap().0
        };
        let (bf16, fp8) = (resolve(Device::Cuda(0), DType::BF16), resolve(Device::Cuda(0), DType::Fp8));
        assert_eq!((bf16.dtype, fp8.dtype), (DType::BF16, DType::Fp8));
        assert_eq!(bf16.bytes_per_token, 2 * fp8.bytes_per_token);
        assert_eq!(fp8.num_blocks, 2 * bf16.num_blocks);
        // The CPU keeps an FP8 cache's values as f32: the same capacity as its f32 cache.
        let (f32_cpu, fp8_cpu) = (resolve(Device::Cpu, DType::F32), resolve(Device::Cpu, DType::Fp8));
        assert_eq!((fp8_cpu.dtype, fp8_cpu.num_blocks), (DType::Fp8, f32_cpu.num_blocks));
    }
}
