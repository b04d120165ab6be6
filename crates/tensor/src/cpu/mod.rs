//! The CPU backend: f32 activations, f32/bf16/f16 weights widened on the fly, rayon across cores.

pub mod attention;
pub mod elementwise;
pub mod matmul;
pub mod norm;
pub mod recurrent;
pub mod rope;
pub mod sampling;

use crate::tensor::{CpuStorage, Storage, Tensor};

pub(crate) fn f32_tensor(data: Vec<f32>, shape: Vec<usize>) -> Tensor {
    Tensor::from_storage(Storage::Cpu(CpuStorage::F32(data)), shape).expect("op produced a consistent shape")
}

/// Work below this many elements is not worth waking the thread pool for.
pub(crate) const PAR_THRESHOLD: usize = 1 << 14;
