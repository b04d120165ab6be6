//! The engine on a CUDA GPU: the oracle battery batched by the scheduler, greedy, with tokens
//! chosen on the device (no logprobs asked) and on the host (logprobs asked), both token-exact
//! against transformers in f32. Without a GPU (CI) each test prints SKIP and passes.

mod common;

use common::*;
use ferrite_engine::{EngineConfig, SamplingParams, LLM};
use ferrite_tensor::{DType, Device};

fn cuda_llm(name: &str, dtype: DType) -> Option<LLM> {
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return None;
    }
    let config = EngineConfig { device: Device::Cuda(0), kv_cache_dtype: dtype, ..config() };
    Some(LLM::new(fixture(name), dtype, config).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn battery_on_cuda(name: &str, logprobs: Option<usize>) {
    let Some(llm) = cuda_llm(name, DType::F32) else { return };
    let oracle = oracle(name);
    let params = SamplingParams { logprobs, ..greedy(oracle.cases[0].output_ids.len()) };
    let outputs = llm.generate(battery(name), &params).unwrap();
    for (case, out) in oracle.cases.iter().zip(&outputs) {
        assert_eq!(out.outputs[0].token_ids, case.output_ids, "{name}/{}: tokens differ on cuda", case.name);
        assert_eq!(out.outputs[0].logprobs.is_some(), logprobs.is_some());
    }
    println!("{name} on cuda (logprobs {logprobs:?}): {} cases token-exact", outputs.len());
}

#[test]
fn llama_battery_sampled_on_the_device() {
    battery_on_cuda("llama", None);
}

#[test]
fn qwen3_battery_with_logprobs_sampled_on_the_host() {
    battery_on_cuda("qwen3", Some(5));
}

#[test]
fn mistral_sliding_window_battery_on_cuda() {
    battery_on_cuda("mistral", None);
}

/// The KV cache sized from free device memory: the profiling step runs and leaves room.
#[test]
fn kv_cache_sized_from_gpu_memory() {
    if !ferrite_tensor::cuda::is_available() {
        println!("SKIP: no CUDA device");
        return;
    }
    let model = ferrite_models::load_model(
        &fixture("llama"),
        &ferrite_models::LoadOptions { dtype: DType::BF16, device: Device::Cuda(0), progress: false },
    )
    .unwrap()
    .model;
    let config = EngineConfig {
        device: Device::Cuda(0),
        kv_cache_dtype: DType::BF16,
        gpu_memory_utilization: Some(0.05),
        ..config()
    };
    let bytes = ferrite_engine::memory::kv_budget(model.as_ref(), &config, 2048).unwrap();
    let (free, total) = ferrite_tensor::cuda::device(0).unwrap().memory_info().unwrap();
    println!("kv budget {bytes} bytes of {total} (free {free})");
    assert!(bytes > 0 && bytes < total / 20);
    let too_small = EngineConfig { gpu_memory_utilization: Some(1e-6), ..config };
    assert!(ferrite_engine::memory::kv_budget(model.as_ref(), &too_small, 2048).is_err());
}

/// Sampling on the device: a seeded request draws the same tokens alone and batched with
/// unseeded ones, and another seed draws others.
#[test]
fn seeded_device_sampling_is_reproducible_whatever_the_batch() {
    let Some(llm) = cuda_llm("llama", DType::BF16) else { return };
    assert_seeded_sampling_is_batch_independent(&llm);
}
