//! The CUDA backend: f32 and bf16 tensors in device memory, kernels compiled at run time.
//!
//! Nothing CUDA is needed to build: `cudarc` loads `libcuda`, `libnvrtc` and `libcublas` when a
//! device is first opened, and [`is_available`] says whether that can work without trying
//! anything that could panic. Each device has one context, one stream and one cuBLAS handle for
//! the process ([`device`]); kernel sources are compiled by NVRTC for the device's compute
//! capability on first use and cached.
//!
//! Activations may be f32 (the path judged against the CPU reference: fp32 GEMMs without TF32)
//! or bf16 (for speed: every kernel accumulates in f32 and rounds once on store). An op returns
//! its input activation's dtype; parameter tensors (weights, norms, cos/sin) may be either dtype.

pub(crate) mod attention;
mod device;
mod fp8;
pub(crate) mod graph;
mod int4;
mod kernels;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod ops;
pub(crate) mod recurrent;
pub(crate) mod rope_kv;
pub(crate) mod sampling;
mod storage;
mod upload;

pub use attention::download_fp8_cache;
pub use device::{device, device_count, is_available, CudaDevice};
pub use graph::{HostFill, StepGraph, StepInput};
pub use storage::CudaStorage;
pub use upload::Uploader;
