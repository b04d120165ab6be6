//! Sizing a GPU's KV cache the way vLLM does: run the largest step the scheduler may issue on a
//! throwaway cache, read how much device memory is then in use (weights, the context, and the
//! activation peak the stream-ordered pool keeps), and give the KV cache what is left of
//! `gpu_memory_utilization` of the card.

use ferrite_models::{CausalLM, ForwardInput};
use ferrite_tensor::{AttnMetadata, AttnSeq, Device};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};

/// Bytes for the KV cache of `model`: `config.kv_cache_memory`, unless the model is on a GPU and
/// `config.gpu_memory_utilization` is set.
pub fn kv_budget(model: &dyn CausalLM, config: &EngineConfig, max_model_len: usize) -> Result<usize> {
    let (Device::Cuda(ordinal), Some(util)) = (config.device, config.gpu_memory_utilization) else {
        return Ok(config.kv_cache_memory);
    };
    if !(util > 0.0 && util <= 1.0) {
        return Err(EngineError::Config(format!("gpu_memory_utilization must be in (0, 1], got {util}")));
    }
    let dev = ferrite_tensor::cuda::device(ordinal)?;
    let started = std::time::Instant::now();
    let tokens = config.max_num_batched_tokens.min(max_model_len).max(1);
    let rows = config.max_num_seqs.min(tokens);
    let block_size = config.block_size;
    let blocks = tokens.div_ceil(block_size);
    let mut scratch = model.info().allocate_caches(config.device, config.kv_cache_dtype, blocks, block_size, 1)?;
    let seq = AttnSeq { q_start: 0, q_len: tokens, ctx_len: tokens, block_table: (0..blocks as u32).collect() };
    let meta = AttnMetadata::new(vec![seq], block_size)?.with_state_slots(vec![0])?;
    let ids = vec![0u32; tokens];
    let logit_rows: Vec<usize> = (tokens - rows..tokens).collect();
    let logits = model
        .forward(&ForwardInput { tokens: &ids, meta: &meta, logit_rows: &logit_rows, embeds: None }, &mut scratch)?;
    drop(logits);
    drop(scratch);
    dev.synchronize()?;
    let (free, total) = dev.memory_info()?;
    let used = total - free;
    let budget = (total as f64 * f64::from(util)) as usize;
    tracing::info!(
        total_gib = total as f64 / (1u64 << 30) as f64,
        used_gib = used as f64 / (1u64 << 30) as f64,
        profiled_tokens = tokens,
        // The first step also waits for the kernels it uses to compile.
        seconds = started.elapsed().as_secs_f64(),
        "device memory after the profiling step"
    );
    budget.checked_sub(used).filter(|&b| b > 0).ok_or_else(|| {
        EngineError::Config(format!(
            "no device memory left for the KV cache: {used} of {total} bytes are in use after loading and a \
             {tokens}-token step, above gpu_memory_utilization {util} ({budget} bytes); raise \
             --gpu-memory-utilization or lower --max-num-batched-tokens"
        ))
    })
}
