//! ggml's block-quantized formats (the tensors of a GGUF file): their types, dequantization to
//! f32, and [`GgmlBlocks`], a weight matrix kept in its blocks, which the CPU backend multiplies
//! without widening it (`cpu::ggml`).

mod dequant;

pub(crate) use dequant::{f16_at, scale_min_k4};
pub use dequant::{DequantError, GgmlType};

/// A row-major matrix `[rows, cols]` held as ggml blocks: each row is `cols / block_size` whole
/// blocks, so a row (an embedding, an output channel) is a contiguous byte range.
#[derive(Debug, Clone)]
pub struct GgmlBlocks {
    pub ty: GgmlType,
    pub bytes: Vec<u8>,
}

impl GgmlType {
    /// The types the CPU backend multiplies in their blocks; tensors of other types are
    /// dequantized at load.
    pub fn has_cpu_kernel(self) -> bool {
        matches!(
            self,
            GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }

    /// Bytes of `elements` elements, which must be whole blocks.
    pub fn bytes_for(self, elements: usize) -> usize {
        elements / self.block_size() * self.type_size()
    }
}

impl GgmlBlocks {
    /// Blocks for `elements` elements, checked to be whole blocks of the right total size.
    pub fn new(ty: GgmlType, bytes: Vec<u8>, elements: usize) -> Result<GgmlBlocks, DequantError> {
        let (block, size) = (ty.block_size(), ty.type_size());
        if !elements.is_multiple_of(block) || elements / block * size != bytes.len() {
            return Err(DequantError::Length { ty, src: bytes.len(), dst: elements, block, bytes: size });
        }
        Ok(GgmlBlocks { ty, bytes })
    }

    pub fn len(&self) -> usize {
        self.bytes.len() / self.ty.type_size() * self.ty.block_size()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.ty.dequantize_into(&self.bytes, &mut out).expect("blocks were checked when built");
        out
    }
}
