//! The inference engine, shaped like vLLM's V1 engine: a KV block pool with prefix caching,
//! a scheduler doing continuous batching with chunked prefill and preemption by recompute, a
//! device-agnostic model runner, a batched sampler with vLLM's `SamplingParams` semantics, and
//! incremental detokenization with stop strings. [`Engine`] runs the loop on its own thread and
//! serves [`EngineClient`]s (the server, the CLI); [`LLM`] is the offline batch API.
//! [`PoolingEngine`] serves embedding, classification and scoring models to [`PoolingClient`]s.

pub mod config;
pub mod core;
pub mod detokenizer;
pub mod draft_model;
pub mod eagle;
pub mod encoder_cache;
pub mod engine;
pub mod error;
pub mod graphs;
pub mod llm;
pub mod memory;
pub mod output;
pub mod params;
pub mod pooling;
pub mod runner;
pub mod sampler;
pub mod spec_decode;
pub mod suffix_tree;

pub use config::{CacheConfig, EngineConfig};
pub use encoder_cache::EncoderCacheStats;
pub use engine::{
    Engine, EngineClient, EngineStats, IterationTokens, LoadedDrafter, ProcessedRequest, PromptInput, RequestStream,
};
pub use error::{EngineError, Result};
pub use ferrite_models::{VisionInfo, Visual};
pub use graphs::GraphCounts;
pub use llm::{TokenizerOverrides, LLM};
pub use output::{CompletionOutput, FinishReason, RequestMetrics, RequestOutput, StopReason, TokenLogprob};
pub use params::{MultimodalInputs, SamplingParams, VisualInput};
pub use pooling::{PoolingClient, PoolingConfig, PoolingEngine};
pub use spec_decode::{SpecDecodeStats, SpeculativeConfig};
// Value types the server and the CLI name without depending on the tensor or structured crates.
pub use ferrite_structured::{Constraint, JsonOptions, StructuredOutputs};
pub use ferrite_tensor::{DType, Device};
