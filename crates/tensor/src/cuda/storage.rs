use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use half::bf16;

use super::device::{dev_err, CudaDevice};
use super::fp8::Fp8Buf;
use super::int4::Int4Buf;
use super::ops::Cast;
use crate::error::{Result, TensorError};
use crate::tensor::CpuStorage;
use crate::DType;

#[derive(Debug)]
pub(crate) enum CudaBuf {
    F32(CudaSlice<f32>),
    BF16(CudaSlice<bf16>),
    Int4(Box<Int4Buf>),
    Fp8(Box<Fp8Buf>),
}

/// The device memory of one tensor: f32 or bf16 elements, or a packed 4-bit or FP8 weight matrix,
/// on one GPU.
#[derive(Debug)]
pub struct CudaStorage {
    dev: Arc<CudaDevice>,
    buf: CudaBuf,
    /// Elements in use; the buffer holds at least one so that empty tensors need no special case.
    len: usize,
}

pub(crate) fn dtype_suffix(dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        DType::F16 => Err(unsupported_f16("cuda")),
        DType::Ggml(ty) => Err(unsupported_ggml("cuda", ty)),
        DType::Int4 { .. } | DType::Fp8 => Err(unsupported_packed("cuda")),
    }
}

fn unsupported_f16(op: &'static str) -> TensorError {
    TensorError::Unsupported { op, detail: "f16 on CUDA (convert to bf16 or f32 with to_dtype first)".into() }
}

fn unsupported_ggml(op: &'static str, ty: crate::ggml::GgmlType) -> TensorError {
    TensorError::Unsupported { op, detail: format!("ggml {ty} blocks on CUDA (GGUF weights are dequantized for CUDA)") }
}

/// A 4-bit or FP8 weight is only ever the weight of a product.
pub(crate) fn unsupported_packed(op: &'static str) -> TensorError {
    TensorError::Unsupported { op, detail: "4-bit integer or FP8 weights outside a matmul".into() }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn flat_cfg(dev: &CudaDevice, n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, dev.multiprocessors() * 16);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// One block per row; long rows (vocabularies) get more threads.
pub(crate) fn row_cfg(rows: usize, cols: usize) -> LaunchConfig {
    let threads = if cols >= 8192 { 1024 } else { 256 };
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

impl CudaStorage {
    /// Uninitialised memory for `len` elements; every caller writes all of them.
    pub(crate) fn alloc(dev: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaStorage> {
        CudaStorage::alloc_on(dev, dev.stream(), dtype, len)
    }

    /// Like [`CudaStorage::alloc`], but allocated in `stream`'s order (a stream other than the
    /// device's, for memory a graph capture must not own).
    pub(crate) fn alloc_on(
        dev: &Arc<CudaDevice>,
        stream: &Arc<cudarc::driver::CudaStream>,
        dtype: DType,
        len: usize,
    ) -> Result<CudaStorage> {
        // SAFETY: the caller overwrites the memory before anything reads it.
        let buf = unsafe {
            match dtype {
                DType::F32 => CudaBuf::F32(stream.alloc::<f32>(len.max(1)).map_err(dev_err)?),
                DType::BF16 => CudaBuf::BF16(stream.alloc::<bf16>(len.max(1)).map_err(dev_err)?),
                DType::F16 => return Err(unsupported_f16("alloc")),
                DType::Ggml(ty) => return Err(unsupported_ggml("alloc", ty)),
                DType::Int4 { .. } | DType::Fp8 => return Err(unsupported_packed("alloc")),
            }
        };
        Ok(CudaStorage { dev: dev.clone(), buf, len })
    }

    pub(crate) fn zeros(dev: &Arc<CudaDevice>, dtype: DType, len: usize) -> Result<CudaStorage> {
        let s = dev.stream();
        let buf = match dtype {
            DType::F32 => CudaBuf::F32(s.alloc_zeros::<f32>(len.max(1)).map_err(dev_err)?),
            DType::BF16 => CudaBuf::BF16(s.alloc_zeros::<bf16>(len.max(1)).map_err(dev_err)?),
            DType::F16 => return Err(unsupported_f16("zeros")),
            DType::Ggml(ty) => return Err(unsupported_ggml("zeros", ty)),
            DType::Int4 { .. } | DType::Fp8 => return Err(unsupported_packed("zeros")),
        };
        Ok(CudaStorage { dev: dev.clone(), buf, len })
    }

    pub(crate) fn from_parts(dev: &Arc<CudaDevice>, buf: CudaBuf, len: usize) -> CudaStorage {
        CudaStorage { dev: dev.clone(), buf, len }
    }

    pub fn from_cpu(dev: &Arc<CudaDevice>, src: &CpuStorage) -> Result<CudaStorage> {
        dev.check_not_capturing("a host-to-device copy")?;
        let s = dev.stream();
        let len = src.len();
        let buf = match src {
            CpuStorage::F32(v) if !v.is_empty() => CudaBuf::F32(s.clone_htod(v).map_err(dev_err)?),
            CpuStorage::BF16(v) if !v.is_empty() => CudaBuf::BF16(s.clone_htod(v).map_err(dev_err)?),
            CpuStorage::F16(_) => return Err(unsupported_f16("to_device")),
            CpuStorage::Ggml(b) => return Err(unsupported_ggml("to_device", b.ty)),
            CpuStorage::Int4(m) => CudaBuf::Int4(Box::new(Int4Buf::upload(dev, m)?)),
            CpuStorage::Fp8(m) => CudaBuf::Fp8(Box::new(Fp8Buf::upload(dev, m)?)),
            _ => return CudaStorage::zeros(dev, src.dtype(), 0),
        };
        Ok(CudaStorage { dev: dev.clone(), buf, len })
    }

    /// Copies to host memory; waits for the ops that produce this tensor.
    pub fn to_cpu(&self) -> Result<CpuStorage> {
        self.dev.check_not_capturing("a device-to-host copy")?;
        let s = self.dev.stream();
        Ok(match &self.buf {
            CudaBuf::F32(b) => CpuStorage::F32(s.clone_dtoh(&b.slice(..self.len)).map_err(dev_err)?),
            CudaBuf::BF16(b) => CpuStorage::BF16(s.clone_dtoh(&b.slice(..self.len)).map_err(dev_err)?),
            CudaBuf::Int4(b) => CpuStorage::Int4(b.download(&self.dev)?),
            CudaBuf::Fp8(b) => CpuStorage::Fp8(b.download(&self.dev)?),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> DType {
        match &self.buf {
            CudaBuf::F32(_) => DType::F32,
            CudaBuf::BF16(_) => DType::BF16,
            CudaBuf::Int4(b) => DType::Int4 { group: b.group },
            CudaBuf::Fp8(_) => DType::Fp8,
        }
    }

    /// Bytes of device memory the values take.
    pub fn size_in_bytes(&self) -> usize {
        match &self.buf {
            CudaBuf::Int4(b) => b.size_in_bytes(),
            CudaBuf::Fp8(b) => b.size_in_bytes(),
            _ => self.len * self.dtype().size_in_bytes(),
        }
    }

    /// The packed matrix, where this is a 4-bit weight.
    pub(crate) fn int4(&self) -> Option<&Int4Buf> {
        match &self.buf {
            CudaBuf::Int4(b) => Some(b),
            _ => None,
        }
    }

    /// The e4m3 matrix, where this is an FP8 weight.
    pub(crate) fn fp8(&self) -> Option<&Fp8Buf> {
        match &self.buf {
            CudaBuf::Fp8(b) => Some(b),
            _ => None,
        }
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The device address of the first element (of a 4-bit or FP8 matrix, of its packed words: an op
    /// other than a product refuses the dtype before it takes the address).
    pub(crate) fn ptr(&self) -> u64 {
        let s = self.dev.stream();
        // Event tracking is off, so the returned guards record nothing.
        match &self.buf {
            CudaBuf::F32(b) => b.device_ptr(s).0,
            CudaBuf::BF16(b) => b.device_ptr(s).0,
            CudaBuf::Int4(b) => b.packed_ptr(&self.dev),
            CudaBuf::Fp8(b) => b.codes_ptr(&self.dev),
        }
    }

    /// A copy converted to `dtype` on the device (rounding to nearest even when narrowing).
    pub(crate) fn cast(&self, dtype: DType) -> Result<CudaStorage> {
        if self.int4().is_some() || self.fp8().is_some() {
            return Err(unsupported_packed("cast"));
        }
        let out = CudaStorage::alloc(&self.dev, dtype, self.len)?;
        if self.len > 0 {
            Cast { x: self.ptr(), y: out.ptr(), n: self.len as u64 }.launch(&self.dev, self.dtype(), dtype)?;
        }
        Ok(out)
    }

    /// This storage read as `dtype`: itself, or a converted copy where the dtype differs.
    pub(crate) fn as_dtype(&self, dtype: DType) -> Result<Converted<'_>> {
        if self.dtype() == dtype {
            Ok(Converted::Same(self))
        } else {
            self.cast(dtype).map(Converted::Cast)
        }
    }
}

pub(crate) enum Converted<'a> {
    Same(&'a CudaStorage),
    Cast(CudaStorage),
}

impl std::ops::Deref for Converted<'_> {
    type Target = CudaStorage;
    fn deref(&self) -> &CudaStorage {
        match self {
            Converted::Same(s) => s,
            Converted::Cast(s) => s,
        }
    }
}
