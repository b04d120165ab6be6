use std::fmt;

use crate::ggml::GgmlType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// A weight kept in ggml's blocks (CPU only); computed with, never converted to.
    Ggml(GgmlType),
    /// A weight of symmetric 4-bit integers with a bf16 scale per `group` inputs (W4A16), kept
    /// packed on CUDA; computed with, never converted to.
    Int4 {
        group: usize,
    },
    /// A weight of e4m3 bytes with f32 block scales (FP8 checkpoints), kept so on CUDA; computed
    /// with, never converted to.
    Fp8,
}

impl DType {
    /// Bytes per element; for a block format, its block's bytes per element rounded up (use
    /// `Tensor::size_in_bytes` for a tensor's exact size).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Ggml(ty) => ty.type_size().div_ceil(ty.block_size()),
            DType::Int4 { .. } | DType::Fp8 => 1,
        }
    }

    /// The dtype the values come out as: a block type's are f32 (dequantized rows, products),
    /// 4-bit and FP8 weights' bf16.
    pub fn of_values(self) -> DType {
        match self {
            DType::Ggml(_) => DType::F32,
            DType::Int4 { .. } | DType::Fp8 => DType::BF16,
            dense => dense,
        }
    }

    /// Parses the spellings used by `--dtype` flags and Hugging Face configs (`torch_dtype`).
    pub fn parse(name: &str) -> Option<DType> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" | "float" | "fp32" => Some(DType::F32),
            "f16" | "float16" | "half" | "fp16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Ggml(ty) => ty.name(),
            DType::Int4 { .. } => "int4",
            DType::Fp8 => "fp8",
        })
    }
}
