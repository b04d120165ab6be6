//! The CUDA C kernels, compiled by NVRTC once per process and device (see `device.rs`), and the
//! constants they share with Rust.
//!
//! Each op family's kernels are one file under `kernels/`, launched from one Rust file:
//! `elementwise.cu` from `ops.rs`, `rope_kv.cu` from `rope_kv.rs`, `norm.cu` from `norm.rs`,
//! `gemv.cu` from `matmul.rs`, `int4.cu` from `int4.rs`, `fp8.cu` from `fp8.rs`, `attention_*.cu` from `attention.rs`, `sampling.cu` from
//! `sampling.rs`, `recurrent.cu` from `recurrent.rs`. The files are embedded in the binary, so the build still needs no CUDA. A module
//! (an NVRTC compile unit, compiled on the first use of any of its kernels) is `common.cuh`
//! followed by one or more of those files.
//!
//! A constant that both sides use is defined once, in Rust, and given to NVRTC as a `-D` define
//! ([`defines`]); the kernel files do not define it, so a missing one fails the compile.

use super::{attention, int4, ops, recurrent, sampling};

/// One NVRTC compile unit. The name keys the module cache.
#[derive(Clone, Copy)]
pub(crate) struct KernelSource {
    pub name: &'static str,
    pub src: &'static str,
}

macro_rules! module {
    ($name:literal: $($file:literal),+) => {
        KernelSource {
            name: $name,
            src: concat!(include_str!("kernels/common.cuh"), $(include_str!(concat!("kernels/", $file))),+),
        }
    };
}

pub(crate) const ELEMENTWISE: KernelSource = module!("elementwise": "elementwise.cu", "rope_kv.cu");
pub(crate) const NORM: KernelSource = module!("norm": "norm.cu");
pub(crate) const ATTENTION: KernelSource = module!(
    "attention": "attention_common.cuh",
    "attention_prefill.cu",
    "attention_decode.cu",
    "attention_fa2.cu",
    "attention_combine.cu"
);
pub(crate) const GEMV: KernelSource = module!("gemv": "gemv.cu", "int4.cu", "fp8.cu");
pub(crate) const SAMPLING: KernelSource = module!("sampling": "sampling.cu");
pub(crate) const RECURRENT: KernelSource = module!("recurrent": "recurrent.cu");

pub(crate) const MODULES: [KernelSource; 6] = [ELEMENTWISE, NORM, ATTENTION, GEMV, SAMPLING, RECURRENT];

/// The `-D` options every module is compiled with: the constants the kernels share with their
/// launchers, from the Rust side.
pub(crate) fn defines() -> Vec<String> {
    let ints: &[(&str, i64)] = &[
        ("ACT_SILU", ops::ACT_SILU.into()),
        ("ACT_GELU", ops::ACT_GELU.into()),
        ("ACT_GELU_TANH", ops::ACT_GELU_TANH.into()),
        ("ACT_RELU", ops::ACT_RELU.into()),
        ("ACT_RELU2", ops::ACT_RELU2.into()),
        ("ACT_SIGMOID", ops::ACT_SIGMOID.into()),
        ("ACT_QUICK_GELU", ops::ACT_QUICK_GELU.into()),
        ("UNARY_SCALE", ops::UNARY_SCALE.into()),
        ("UNARY_SOFTCAP", ops::UNARY_SOFTCAP.into()),
        ("UNARY_ACTIVATION", ops::UNARY_ACTIVATION.into()),
        ("BINARY_ADD", ops::BINARY_ADD.into()),
        ("BINARY_MUL", ops::BINARY_MUL.into()),
        ("BINARY_ACT_MUL", ops::BINARY_ACT_MUL.into()),
        ("QUANT_CHUNKS", super::norm::QUANT_CHUNKS as i64),
        ("QV_MAX", attention::QV_MAX as i64),
        ("TILE", attention::TILE as i64),
        ("NWARPS", attention::NWARPS as i64),
        ("QPW", attention::QPW as i64),
        ("DV_REGS", attention::DV_REGS as i64),
        ("DEC_SUB", attention::DEC_SUB as i64),
        ("DEC_WARPS", attention::DEC_WARPS as i64),
        ("MMA_TK", attention::MMA_TK as i64),
        ("FA2_QV", attention::FA2_QV as i64),
        ("FA2_STAGES", attention::FA2_STAGES as i64),
        ("SAMPLE_THREADS", sampling::SAMPLE_THREADS.into()),
        ("INT4_WARPS", int4::INT4_WARPS as i64),
        ("INT4_UNROLL", int4::INT4_UNROLL as i64),
        ("CONV_KERNEL_MAX", recurrent::CONV_KERNEL_MAX as i64),
        ("GDN_DK_MAX", recurrent::GDN_DK_MAX as i64),
        ("SSM_STATE_MAX", recurrent::SSM_STATE_MAX as i64),
    ];
    let mut defines: Vec<String> = ints.iter().map(|(name, v)| format!("-D{name}={v}")).collect();
    // An unsigned literal, as the kernels compare it with an unsigned slot.
    defines.push(format!("-DPAD_SLOT={:#x}u", crate::kv::PAD_SLOT));
    defines
}
