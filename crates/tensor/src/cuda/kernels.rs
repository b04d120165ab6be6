//! The CUDA C kernels, compiled by NVRTC once per process and device (see `device.rs`), and the
//! constants they share with Rust.
//!
//! Each op family's kernels are one file under `kernels/`, launched from one Rust file:
//! `elementwise.cu` from `ops.rs`, `rope_kv.cu` from `rope_kv.rs`, `norm.cu` from `norm.rs`,
//! `gemv.cu` from `matmul.rs`, `int4.cu` from `int4.rs`, `fp8.cu` from `fp8.rs`, `attention_*.cu`
//! from `attention.rs`, `sampling.cu` from `sampling.rs`, `recurrent.cu` from `recurrent.rs`.
//! The files are embedded in the binary, so the build still needs no CUDA. A module (an NVRTC
//! compile unit) is `common.cuh` followed by one or more of those files and, for templates that
//! several modules share, the instantiations it makes.
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

/// `common.cuh`, then the files, then (after `;`) the instantiations this module makes of
/// templates that several modules share.
macro_rules! module {
    ($name:literal: $($file:literal),+ $(; $instances:literal)?) => {
        KernelSource {
            name: $name,
            src: concat!(
                include_str!("kernels/common.cuh"),
                $(include_str!(concat!("kernels/", $file)),)+
                $("\n", $instances, "\n")?
            ),
        }
    };
}

// Every module compiles on a thread of its own from the moment the device opens (device.rs),
// NVRTC and then the driver's JIT, so a first start waits for the largest module: the units are
// cut small where the PTX is large (the decode kernels, the GEMVs).

pub(crate) const ELEMENTWISE: KernelSource = module!("elementwise": "elementwise.cu", "rope_kv.cu");
pub(crate) const NORM: KernelSource = module!("norm": "norm.cu");
/// Prefill on CUDA cores and the merge of split partials.
pub(crate) const ATTENTION: KernelSource =
    module!("attention": "attention_common.cuh", "attention_prefill.cu", "attention_combine.cu");
const ATTENTION_FA2: [(usize, KernelSource); 3] = [
    (64, module!("attention_fa2_d64": "attention_common.cuh", "attention_fa2.cu"; "INST_FA2(64)")),
    (128, module!("attention_fa2_d128": "attention_common.cuh", "attention_fa2.cu"; "INST_FA2(128)")),
    (256, module!("attention_fa2_d256": "attention_common.cuh", "attention_fa2.cu"; "INST_FA2(256)")),
];
/// `(activation, cache, value registers)` of `paged_decode_<t><cache>_h*_v<dvr>` and the module
/// instantiating them, named and instantiated from the same tokens.
macro_rules! decode {
    ($t:ident, $ty:ident, $cache:ident, $cty:ident, $v:literal) => {
        decode!(@ $t, $ty, concat!("_", stringify!($cache)), $cty, $v)
    };
    ($t:ident, $ty:ident, $v:literal) => {
        decode!(@ $t, $ty, "", $ty, $v)
    };
    (@ $t:ident, $ty:ident, $cache:expr, $cty:ident, $v:literal) => {
        (
            stringify!($t),
            $cache,
            $v,
            KernelSource {
                name: concat!("attention_decode_", stringify!($t), $cache, "_v", stringify!($v)),
                src: concat!(
                    include_str!("kernels/common.cuh"),
                    include_str!("kernels/attention_common.cuh"),
                    include_str!("kernels/attention_decode.cu"),
                    "\nINST_DECODE_V(", stringify!($t), ", ", stringify!($ty), ", ", $cache, ", ",
                    stringify!($cty), ", ", stringify!($v), ")\n"
                ),
            },
        )
    };
}
const ATTENTION_DECODE: [(&str, &str, usize, KernelSource); 8] = [
    decode!(f32, float, 4),
    decode!(f32, float, 8),
    decode!(f32, float, fp8, fp8_t, 4),
    decode!(f32, float, fp8, fp8_t, 8),
    decode!(bf16, bf16_t, 4),
    decode!(bf16, bf16_t, 8),
    decode!(bf16, bf16_t, fp8, fp8_t, 4),
    decode!(bf16, bf16_t, fp8, fp8_t, 8),
];
pub(crate) const GEMV: KernelSource = module!("gemv": "gemv.cu"; "INST_GEMV(1) INST_GEMV(2) INST_GEMV(3) INST_GEMV(4)");
/// The W4A16 kernels, which share the bf16 GEMV's load and dot helpers.
pub(crate) const INT4: KernelSource = module!("int4": "gemv.cu", "int4.cu");
/// The FP8 GEMVs and MMA kernels, which share the bf16 GEMV's helpers.
pub(crate) const FP8: KernelSource = module!("fp8": "gemv.cu", "fp8.cu");
pub(crate) const SAMPLING: KernelSource = module!("sampling": "sampling.cu");
pub(crate) const RECURRENT: KernelSource = module!("recurrent": "recurrent.cu");

/// Every module, each compiled at start-up on a thread of its own.
pub(crate) fn modules() -> impl Iterator<Item = KernelSource> {
    let split = ATTENTION_DECODE.iter().map(|e| e.3).chain(ATTENTION_FA2.iter().map(|e| e.1));
    split.chain([ATTENTION, ELEMENTWISE, NORM, GEMV, INT4, FP8, SAMPLING, RECURRENT])
}

/// The module of `paged_attn_fa2_bf16<cache>_d<d>`.
pub(crate) fn attention_fa2(d: usize) -> Option<KernelSource> {
    ATTENTION_FA2.iter().find(|(dim, _)| *dim == d).map(|(_, source)| *source)
}

/// The module of `paged_decode_<t><cache>_h*_v<dvr>`.
pub(crate) fn attention_decode(t: &str, cache: &str, dvr: usize) -> Option<KernelSource> {
    ATTENTION_DECODE.iter().find(|(tn, cn, v, _)| (*tn, *cn, *v) == (t, cache, dvr)).map(|e| e.3)
}

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
