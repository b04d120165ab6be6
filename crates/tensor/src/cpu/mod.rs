//! The CPU backend: f32 activations, f32/bf16/f16 weights widened on the fly (ggml blocks
//! multiplied as they are), rayon across cores.

pub mod attention;
pub mod elementwise;
pub mod ggml;
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

/// Runs `f` on a thread of the CPU backend's pool. The ops' parallel loops then start on a
/// thread that takes part in them, instead of handing each loop to the pool and sleeping until it
/// is done: a decode step of a small model runs a few hundred such loops, and on a 2-core machine
/// that hand-off (futex wake-ups, a third thread competing for the cores) cost more time than the
/// matrix products themselves. A no-op when already on a pool thread.
pub fn on_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}
