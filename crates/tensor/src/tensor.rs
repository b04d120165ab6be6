use std::sync::Arc;

use half::{bf16, f16};

use crate::cuda::CudaStorage;
use crate::error::{shape_err, Result};
use crate::fp8::Fp8Matrix;
use crate::ggml::GgmlBlocks;
use crate::int4::Int4Matrix;
use crate::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

#[derive(Debug, Clone)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    /// A matrix kept quantized in ggml blocks (a GGUF weight).
    Ggml(GgmlBlocks),
    /// A 4-bit weight matrix on its way to or from CUDA (on CPU, 4-bit weights are dequantized
    /// at load).
    Int4(Int4Matrix),
    /// An FP8 weight matrix on its way to or from CUDA (on CPU, FP8 weights are dequantized at
    /// load).
    Fp8(Fp8Matrix),
}

impl CpuStorage {
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::Ggml(b) => b.len(),
            CpuStorage::Int4(m) => m.len(),
            CpuStorage::Fp8(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::Ggml(b) => DType::Ggml(b.ty),
            CpuStorage::Int4(m) => DType::Int4 { group: m.group },
            CpuStorage::Fp8(_) => DType::Fp8,
        }
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            CpuStorage::F32(v) => v.clone(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            CpuStorage::Ggml(b) => b.to_f32_vec(),
            CpuStorage::Int4(m) => m.to_f32_vec(),
            CpuStorage::Fp8(m) => m.to_f32_vec(),
        }
    }

    /// Bytes the values take.
    pub fn size_in_bytes(&self) -> usize {
        match self {
            CpuStorage::Ggml(b) => b.bytes.len(),
            CpuStorage::Int4(m) => m.size_in_bytes(),
            CpuStorage::Fp8(m) => m.size_in_bytes(),
            dense => dense.len() * dense.dtype().size_in_bytes(),
        }
    }

    /// # Panics
    /// For a ggml block type, 4-bit integers or FP8: values are never quantized to one at run time,
    /// only loaded as one.
    pub fn from_f32(data: Vec<f32>, dtype: DType) -> CpuStorage {
        match dtype {
            DType::F32 => CpuStorage::F32(data),
            DType::F16 => CpuStorage::F16(data.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => CpuStorage::BF16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::Ggml(ty) => panic!("values cannot be converted to the ggml block type {ty}, only loaded as it"),
            DType::Int4 { .. } => panic!("values cannot be converted to 4-bit integers, only loaded as them"),
            DType::Fp8 => panic!("values cannot be converted to an FP8 weight, only loaded as one"),
        }
    }
}

#[derive(Debug)]
pub enum Storage {
    Cpu(CpuStorage),
    Cuda(CudaStorage),
}

/// A contiguous, row-major, immutable tensor. Cloning is cheap (the storage is shared).
#[derive(Debug, Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    shape: Vec<usize>,
}

impl Tensor {
    pub fn from_storage(storage: Storage, shape: Vec<usize>) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        let len = match &storage {
            Storage::Cpu(s) => s.len(),
            Storage::Cuda(s) => s.len(),
        };
        if numel != len {
            return Err(shape_err(
                "from_storage",
                format!("shape {shape:?} needs {numel} elements, storage has {len}"),
            ));
        }
        Ok(Tensor { storage: Arc::new(storage), shape })
    }

    pub fn from_f32(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_storage(Storage::Cpu(CpuStorage::F32(data)), shape.to_vec())
    }

    /// Builds a CPU tensor of `dtype` from f32 values (rounding to nearest even for 16-bit types).
    pub fn from_f32_as(data: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::from_storage(Storage::Cpu(CpuStorage::from_f32(data, dtype)), shape.to_vec())
    }

    pub fn zeros(shape: &[usize]) -> Tensor {
        let numel = shape.iter().product();
        Tensor { storage: Arc::new(Storage::Cpu(CpuStorage::F32(vec![0.0; numel]))), shape: shape.to_vec() }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The size of the last dimension (the row length of a row-major matrix view).
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// The number of rows when viewed as a matrix of `last_dim` columns.
    pub fn rows(&self) -> usize {
        self.numel().checked_div(self.last_dim()).unwrap_or(0)
    }

    pub fn dtype(&self) -> DType {
        match &*self.storage {
            Storage::Cpu(s) => s.dtype(),
            Storage::Cuda(s) => s.dtype(),
        }
    }

    pub fn device(&self) -> Device {
        match &*self.storage {
            Storage::Cpu(_) => Device::Cpu,
            Storage::Cuda(s) => Device::Cuda(s.device().ordinal()),
        }
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    pub fn cpu(&self) -> Option<&CpuStorage> {
        match &*self.storage {
            Storage::Cpu(s) => Some(s),
            Storage::Cuda(_) => None,
        }
    }

    pub fn cuda(&self) -> Option<&CudaStorage> {
        match &*self.storage {
            Storage::Cuda(s) => Some(s),
            Storage::Cpu(_) => None,
        }
    }

    /// The f32 data of a CPU f32 tensor; the activations every CPU op produces.
    pub fn as_f32_slice(&self) -> Result<&[f32]> {
        match &*self.storage {
            Storage::Cpu(CpuStorage::F32(v)) => Ok(v),
            Storage::Cpu(other) => {
                Err(crate::TensorError::Unsupported { op: "as_f32_slice", detail: format!("dtype {}", other.dtype()) })
            }
            Storage::Cuda(_) => Err(crate::TensorError::Device(format!(
                "as_f32_slice needs a CPU tensor, this one is on {:?}",
                self.device()
            ))),
        }
    }

    /// The values as f32, copied back from the device for CUDA tensors.
    ///
    /// # Panics
    /// If a CUDA copy fails (a faulted context, a graph capture); [`Tensor::try_to_f32_vec`]
    /// reports that as an error.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.try_to_f32_vec().unwrap_or_else(|e| panic!("to_f32_vec: {e}"))
    }

    /// [`Tensor::to_f32_vec`] for forward passes, which may run under a CUDA graph capture.
    pub fn try_to_f32_vec(&self) -> Result<Vec<f32>> {
        match &*self.storage {
            Storage::Cpu(s) => Ok(s.to_f32_vec()),
            Storage::Cuda(s) => Ok(s.to_cpu()?.to_f32_vec()),
        }
    }

    /// Converts on the tensor's own device.
    ///
    /// # Panics
    /// For CUDA tensors, if `dtype` is f16 (CUDA storage is f32 or bf16) or the device fails.
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        if self.cuda().is_some() {
            return crate::cuda::ops::cast(self, dtype).unwrap_or_else(|e| panic!("to_dtype: {e}"));
        }
        let data = self.to_f32_vec();
        Tensor { storage: Arc::new(Storage::Cpu(CpuStorage::from_f32(data, dtype))), shape: self.shape.clone() }
    }

    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let numel: usize = shape.iter().product();
        if numel != self.numel() {
            return Err(shape_err("reshape", format!("{:?} -> {shape:?}", self.shape)));
        }
        Ok(Tensor { storage: self.storage.clone(), shape: shape.to_vec() })
    }

    pub fn size_in_bytes(&self) -> usize {
        match &*self.storage {
            Storage::Cpu(s) => s.size_in_bytes(),
            Storage::Cuda(s) => s.size_in_bytes(),
        }
    }

    /// A copy on `device` in the same dtype (the same tensor if it is already there). CUDA
    /// holds f32 and bf16; f16 tensors must be converted first.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        let storage = match (&*self.storage, device) {
            (Storage::Cpu(_), Device::Cpu) => return Ok(self.clone()),
            (Storage::Cpu(s), Device::Cuda(ordinal)) => {
                Storage::Cuda(CudaStorage::from_cpu(&crate::cuda::device(ordinal)?, s)?)
            }
            (Storage::Cuda(s), Device::Cpu) => Storage::Cpu(s.to_cpu()?),
            (Storage::Cuda(s), Device::Cuda(ordinal)) => {
                Storage::Cuda(CudaStorage::from_cpu(&crate::cuda::device(ordinal)?, &s.to_cpu()?)?)
            }
        };
        Ok(Tensor { storage: Arc::new(storage), shape: self.shape.clone() })
    }
}
