//! Tensors and the fixed op set an LLM decoder needs.
//!
//! The op set in [`ops`] is the contract between the model layer and the backends: every op
//! takes and returns contiguous row-major [`Tensor`]s and dispatches on where the data lives.
//! The CPU backend is the reference that the oracle parity tests run against; activations on CPU
//! are always f32, while weights may be stored as f32, bf16 or f16 and are widened on the fly.

mod dtype;
mod error;
mod tensor;

pub mod cpu;
pub mod cuda;
pub mod fp8;
pub mod ggml;
pub mod int4;
pub mod kv;
pub mod ops;

pub use cuda::CudaStorage;
pub use dtype::DType;
pub use error::{Result, TensorError};
pub use fp8::ActivationQuant;
pub use kv::{attention_pieces, AttnMetadata, AttnSeq, PagedKvLayer, StateCopies};
pub use ops::{Activation, AttentionParams, GdnParams, RopeStyle, RowSampling, SelectiveScanParams, Xielu};
pub use tensor::{CpuStorage, Device, Storage, Tensor};
