//! Weight sources: sharded safetensors (memory-mapped) and GGUF, behind one lookup by
//! Hugging Face tensor name. Tensors are converted to the compute dtype as they are loaded.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ferrite_tensor::{DType, Device, Tensor};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::loading::gguf::GgufFile;
use crate::{ModelError, Result};

pub trait WeightSource: Send + Sync {
    fn contains(&self, name: &str) -> bool;
    /// Loads a tensor by HF name as `dtype`; `None` when absent.
    fn load(&self, name: &str, dtype: DType) -> Result<Option<Tensor>>;
    fn describe(&self) -> String;
    fn tensor_count(&self) -> usize;
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// `model.safetensors`, or the shards listed by `model.safetensors.index.json`.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    index: HashMap<String, usize>,
}

impl SafetensorsWeights {
    pub fn open(dir: &Path) -> Result<SafetensorsWeights> {
        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|source| ModelError::Io { path: index_path.clone(), source })?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| ModelError::Weights { path: index_path.clone(), message: format!("invalid JSON: {e}") })?;
            let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| ModelError::Weights {
                path: index_path.clone(),
                message: "missing field `weight_map`".into(),
            })?;
            let mut names: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
            names.sort();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(ModelError::Weights {
                    path: dir.to_path_buf(),
                    message: "no model.safetensors or model.safetensors.index.json".into(),
                });
            }
            vec![single]
        };
        let mut shards = Vec::new();
        let mut index = HashMap::new();
        for path in files {
            let file = File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
            // SAFETY: the checkpoint files are treated as read-only for the life of the process.
            let mmap = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io { path: path.clone(), source })?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| ModelError::Weights {
                path: path.clone(),
                message: format!("invalid safetensors: {e}"),
            })?;
            for name in st.names() {
                index.insert(name.to_string(), shards.len());
            }
            shards.push(Shard { path, mmap });
        }
        Ok(SafetensorsWeights { dir: dir.to_path_buf(), shards, index })
    }
}

fn convert(bytes: &[u8], dtype: StDtype, target: DType, shape: &[usize], name: &str, path: &Path) -> Result<Tensor> {
    let err = |m: String| ModelError::Weights { path: path.to_path_buf(), message: format!("tensor `{name}`: {m}") };
    let f32s =
        |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect() };
    let u16s = |b: &[u8]| -> Vec<u16> { b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect() };
    let storage = match (dtype, target) {
        (StDtype::BF16, DType::BF16) => {
            ferrite_tensor::CpuStorage::BF16(u16s(bytes).into_iter().map(bf16::from_bits).collect())
        }
        (StDtype::F16, DType::F16) => {
            ferrite_tensor::CpuStorage::F16(u16s(bytes).into_iter().map(f16::from_bits).collect())
        }
        (StDtype::F32, _) => ferrite_tensor::CpuStorage::from_f32(f32s(bytes), target),
        (StDtype::BF16, _) => ferrite_tensor::CpuStorage::from_f32(
            u16s(bytes).into_iter().map(|b| bf16::from_bits(b).to_f32()).collect(),
            target,
        ),
        (StDtype::F16, _) => ferrite_tensor::CpuStorage::from_f32(
            u16s(bytes).into_iter().map(|b| f16::from_bits(b).to_f32()).collect(),
            target,
        ),
        // Packed quantized data (MXFP4 blocks and scales): each byte as its value, exact in every
        // float dtype (integers to 256), for the loader to unpack.
        (StDtype::U8, _) => ferrite_tensor::CpuStorage::from_f32(bytes.iter().map(|&b| f32::from(b)).collect(), target),
        (other, _) => return Err(err(format!("unsupported safetensors dtype {other:?}"))),
    };
    Tensor::from_storage(ferrite_tensor::Storage::Cpu(storage), shape.to_vec()).map_err(|e| err(e.to_string()))
}

impl WeightSource for SafetensorsWeights {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn load(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        let Some(&shard) = self.index.get(name) else {
            return Ok(None);
        };
        let shard = &self.shards[shard];
        let st = SafeTensors::deserialize(&shard.mmap)
            .map_err(|e| ModelError::Weights { path: shard.path.clone(), message: e.to_string() })?;
        let view = st
            .tensor(name)
            .map_err(|e| ModelError::Weights { path: shard.path.clone(), message: format!("tensor `{name}`: {e}") })?;
        convert(view.data(), view.dtype(), dtype, view.shape(), name, &shard.path).map(Some)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn tensor_count(&self) -> usize {
        self.index.len()
    }
}

/// A GGUF file, its quantized tensors dequantized to f32 and then to the compute dtype.
pub struct GgufWeights {
    file: GgufFile,
    path: PathBuf,
    names: HashMap<String, String>,
}

impl GgufWeights {
    pub fn new(file: GgufFile, path: &Path) -> GgufWeights {
        let names = file.hf_tensors().into_iter().collect();
        GgufWeights { file, path: path.to_path_buf(), names }
    }
}

impl WeightSource for GgufWeights {
    fn contains(&self, name: &str) -> bool {
        self.names.contains_key(name)
    }

    fn load(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        if !self.names.contains_key(name) {
            return Ok(None);
        }
        let (shape, data) = self.file.load_hf_tensor(name)?;
        Ok(Some(Tensor::from_f32_as(data, &shape, dtype)?))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn tensor_count(&self) -> usize {
        self.names.len()
    }
}

/// Typed access to a weight source for model constructors: the dtype to load as, the device the
/// tensors are placed on, and a progress counter for the load bar.
pub struct Weights {
    source: Box<dyn WeightSource>,
    dtype: DType,
    device: Device,
    loaded: AtomicUsize,
    progress: Option<indicatif::ProgressBar>,
}

impl Weights {
    pub fn new(source: Box<dyn WeightSource>, dtype: DType, progress: Option<indicatif::ProgressBar>) -> Weights {
        Weights { source, dtype, device: Device::Cpu, loaded: AtomicUsize::new(0), progress }
    }

    /// Places every tensor on `device` as it is loaded (one tensor in host memory at a time).
    pub fn on_device(mut self, device: Device) -> Weights {
        self.device = device;
        self
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(name)
    }

    pub fn tensor_count(&self) -> usize {
        self.source.tensor_count()
    }

    fn fetch(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        let t = match self.source.load(name, dtype)? {
            Some(t) => Some(t.to_device(self.device).map_err(|e| ModelError::Weights {
                path: PathBuf::from(self.source.describe()),
                message: format!("tensor `{name}` to {:?}: {e}", self.device),
            })?),
            None => None,
        };
        if t.is_some() {
            self.loaded.fetch_add(1, Ordering::Relaxed);
            if let Some(bar) = &self.progress {
                bar.inc(1);
            }
        }
        Ok(t)
    }

    /// A required tensor in the compute dtype, checked against the expected shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.get_any_shape(name)?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    pub fn get_any_shape(&self, name: &str) -> Result<Tensor> {
        self.fetch(name, self.dtype)?
            .ok_or_else(|| ModelError::MissingTensor { name: name.into(), location: self.source.describe() })
    }

    pub fn get_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Norm weights and biases stay f32: they are tiny and the oracle applies them in f32.
    pub fn get_f32(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self
            .fetch(name, DType::F32)?
            .ok_or_else(|| ModelError::MissingTensor { name: name.into(), location: self.source.describe() })?;
        if t.shape() != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: shape.to_vec(),
                actual: t.shape().to_vec(),
            });
        }
        Ok(t)
    }

    pub fn get_f32_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.get_f32(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A one-element tensor (shape `[]` or `[1]`) as a number; `None` when absent.
    pub fn get_scalar_opt(&self, name: &str) -> Result<Option<f32>> {
        let Some(t) = self.fetch(name, DType::F32)? else { return Ok(None) };
        if t.numel() != 1 {
            return Err(ModelError::TensorShape { name: name.into(), expected: vec![1], actual: t.shape().to_vec() });
        }
        Ok(Some(t.to_f32_vec()[0]))
    }

    pub fn loaded_count(&self) -> usize {
        self.loaded.load(Ordering::Relaxed)
    }
}

impl Weights {
    /// A view of the tensors under `prefix` (`model.layers.3.self_attn`), so that a loader names
    /// each tensor by its last parts and a wrong prefix is a one-place bug.
    pub fn at(&self, prefix: impl Into<String>) -> Scope<'_> {
        Scope { weights: self, prefix: prefix.into() }
    }
}

/// The tensors under one name prefix of a [`Weights`]; see [`Weights::at`].
#[derive(Clone)]
pub struct Scope<'w> {
    weights: &'w Weights,
    prefix: String,
}

impl<'w> Scope<'w> {
    pub fn weights(&self) -> &'w Weights {
        self.weights
    }

    /// The full checkpoint name of `leaf` under this prefix.
    pub fn name(&self, leaf: &str) -> String {
        match (self.prefix.is_empty(), leaf.is_empty()) {
            (true, _) => leaf.to_owned(),
            (_, true) => self.prefix.clone(),
            _ => format!("{}.{leaf}", self.prefix),
        }
    }

    pub fn at(&self, sub: &str) -> Scope<'w> {
        Scope { weights: self.weights, prefix: self.name(sub) }
    }

    pub fn get(&self, leaf: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get(&self.name(leaf), shape)
    }

    pub fn get_f32(&self, leaf: &str, shape: &[usize]) -> Result<Tensor> {
        self.weights.get_f32(&self.name(leaf), shape)
    }
}
