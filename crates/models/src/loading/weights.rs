//! Weight sources: sharded safetensors (memory-mapped) and GGUF, behind one lookup by
//! Hugging Face tensor name. Tensors are converted to the compute dtype as they are loaded.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ferrite_tensor::cuda::Uploader;
use ferrite_tensor::fp8::Fp8Matrix;
use ferrite_tensor::int4::Int4Matrix;
use ferrite_tensor::{ActivationQuant, CpuStorage, DType, Device, Storage, Tensor};
use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};

use crate::loading::gguf::GgufFile;
use crate::loading::quant::{self, InputQuantSource, Quantization};
use crate::{ModelError, Result};

pub trait WeightSource: Send + Sync {
    fn contains(&self, name: &str) -> bool;
    /// Loads a tensor by HF name as `dtype`; `None` when absent.
    fn load(&self, name: &str, dtype: DType) -> Result<Option<Tensor>>;
    fn describe(&self) -> String;
    fn tensor_count(&self) -> usize;
    /// Whether the tensor is stored as FP8 e4m3 (its values need their scales).
    fn is_fp8(&self, _name: &str) -> bool {
        false
    }
    /// The matrix kept in the quantized blocks it is stored in, where this source keeps them
    /// (GGUF on CPU); `None` to load it as [`WeightSource::load`] does.
    fn load_blocks(&self, _name: &str) -> Result<Option<Tensor>> {
        Ok(None)
    }
    /// An integer tensor's values exactly (packed int32 words, shapes), with its shape; `None`
    /// when absent. Integer tensors are refused by [`WeightSource::load`], whose floats would
    /// round words past 2^24.
    fn load_ints(&self, _name: &str) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        Ok(None)
    }
    /// The tensor's shape and stored bytes, when they already are little-endian `dtype` values
    /// (nothing to convert): what an upload can copy as is. `None` otherwise or when absent.
    fn stored_bytes(&self, _name: &str, _dtype: DType) -> Result<Option<(Vec<usize>, &[u8])>> {
        Ok(None)
    }
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// Where a tensor's values lie in its shard, as the shard's header (checked once, at open)
/// says.
struct Stored {
    shard: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: std::ops::Range<usize>,
}

/// `model.safetensors`, or the shards listed by `model.safetensors.index.json`.
pub struct SafetensorsWeights {
    dir: PathBuf,
    shards: Vec<Shard>,
    index: HashMap<String, Stored>,
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
            let mut names = Vec::with_capacity(map.len());
            for (tensor, shard) in map {
                let shard = shard.as_str().filter(|s| is_plain_file_name(s)).ok_or_else(|| ModelError::Weights {
                    path: index_path.clone(),
                    message: format!(
                        "`weight_map` entry `{tensor}`: {shard} is not a file name in the model directory"
                    ),
                })?;
                names.push(shard.to_owned());
            }
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
            for (name, view) in st.tensors() {
                // The view's bytes lie inside the map: deserialize checked the offsets.
                let start = view.data().as_ptr() as usize - mmap.as_ptr() as usize;
                let bytes = start..start + view.data().len();
                index.insert(
                    name,
                    Stored { shard: shards.len(), dtype: view.dtype(), shape: view.shape().to_vec(), bytes },
                );
            }
            shards.push(Shard { path, mmap });
        }
        Ok(SafetensorsWeights { dir: dir.to_path_buf(), shards, index })
    }
}

/// A shard named by an index must sit in the model directory: one normal path component, so
/// that a crafted index cannot make the loader open (and map) files elsewhere.
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    !name.contains(['/', '\\']) && matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(_)), None))
}

impl SafetensorsWeights {
    /// The stored tensor `name`, its bytes and the shard file holding it; `None` when absent.
    fn view(&self, name: &str) -> Option<(&Stored, &[u8], &Path)> {
        let stored = self.index.get(name)?;
        let shard = &self.shards[stored.shard];
        Some((stored, &shard.mmap[stored.bytes.clone()], &shard.path))
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
        // e4m3 values, exact in every float dtype; the loader multiplies in their scales.
        (StDtype::F8_E4M3, _) => ferrite_tensor::CpuStorage::from_f32(
            bytes.iter().map(|&b| ferrite_tensor::fp8::e4m3_to_f32(b)).collect(),
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
        let Some((stored, bytes, path)) = self.view(name) else { return Ok(None) };
        convert(bytes, stored.dtype, dtype, &stored.shape, name, path).map(Some)
    }

    fn stored_bytes(&self, name: &str, dtype: DType) -> Result<Option<(Vec<usize>, &[u8])>> {
        let Some((stored, bytes, _)) = self.view(name) else { return Ok(None) };
        let as_stored = matches!(
            (stored.dtype, dtype),
            (StDtype::BF16, DType::BF16) | (StDtype::F32, DType::F32) | (StDtype::F8_E4M3, DType::Fp8)
        );
        Ok(as_stored.then(|| (stored.shape.clone(), bytes)))
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn tensor_count(&self) -> usize {
        self.index.len()
    }

    fn is_fp8(&self, name: &str) -> bool {
        self.index.get(name).is_some_and(|t| t.dtype == StDtype::F8_E4M3)
    }

    fn load_ints(&self, name: &str) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        let Some((stored, b, path)) = self.view(name) else { return Ok(None) };
        let err = |message: String| ModelError::Weights { path: path.to_path_buf(), message };
        let values: Vec<i64> = match stored.dtype {
            StDtype::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
            StDtype::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
            StDtype::I8 => b.iter().map(|&v| v as i8 as i64).collect(),
            StDtype::U8 => b.iter().map(|&v| i64::from(v)).collect(),
            other => {
                return Err(err(format!("tensor `{name}`: {other:?}, where integers (I32, I64, I8, U8) are expected")))
            }
        };
        Ok(Some((stored.shape.clone(), values)))
    }
}

/// A GGUF file. Its quantized matrices either stay in their ggml blocks (for the CPU, which
/// multiplies them as they are) or are dequantized to f32 and then to the compute dtype.
pub struct GgufWeights {
    file: GgufFile,
    path: PathBuf,
    names: HashMap<String, String>,
    keep_blocks: bool,
}

impl GgufWeights {
    pub fn new(file: GgufFile, path: &Path) -> GgufWeights {
        let names = file.hf_tensors().into_iter().collect();
        GgufWeights { file, path: path.to_path_buf(), names, keep_blocks: false }
    }

    /// Serves matrices of the types the CPU multiplies in blocks as those blocks.
    pub fn keeping_blocks(mut self, keep: bool) -> GgufWeights {
        self.keep_blocks = keep;
        self
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

    fn load_blocks(&self, name: &str) -> Result<Option<Tensor>> {
        if !self.keep_blocks || !self.names.contains_key(name) {
            return Ok(None);
        }
        let Some((shape, blocks)) = self.file.load_hf_blocks(name)? else { return Ok(None) };
        Ok(Some(Tensor::from_storage(Storage::Cpu(CpuStorage::Ggml(blocks)), shape)?))
    }
}

/// `t`, or an error naming the tensor when it is not of the `expected` shape.
fn with_shape(name: &str, t: Tensor, expected: &[usize]) -> Result<Tensor> {
    if t.shape() != expected {
        return Err(ModelError::TensorShape {
            name: name.into(),
            expected: expected.to_vec(),
            actual: t.shape().to_vec(),
        });
    }
    Ok(t)
}

/// Typed access to a weight source for model constructors: the dtype to load as, the device the
/// tensors are placed on, and a progress counter for the load bar.
pub struct Weights {
    source: Box<dyn WeightSource>,
    dtype: DType,
    device: Device,
    loaded: AtomicUsize,
    progress: Option<indicatif::ProgressBar>,
    quantization: Option<Quantization>,
    keep_packed: bool,
    keep_fp8: bool,
    /// The family loads the checkpoint's multi-token-prediction head too.
    load_mtp: bool,
    /// Pinned staging for tensors copied to a GPU as stored; made on the first such tensor.
    uploader: Mutex<Option<Uploader>>,
}

/// A pack-quantized module's scheme and shape, as [`Weights::packed_parts`] reads them.
struct PackedParts {
    bits: u32,
    how: quant::WeightScales,
    rows: usize,
    cols: usize,
}

impl Weights {
    pub fn new(source: Box<dyn WeightSource>, dtype: DType, progress: Option<indicatif::ProgressBar>) -> Weights {
        Weights {
            source,
            dtype,
            device: Device::Cpu,
            loaded: AtomicUsize::new(0),
            progress,
            quantization: None,
            keep_packed: true,
            keep_fp8: false,
            load_mtp: false,
            uploader: Mutex::new(None),
        }
    }

    /// Whether linear layers' 4-bit pack-quantized weights stay packed where the device can
    /// multiply them so (see `kept_int4`); otherwise they are dequantized at load.
    pub fn keeping_packed(mut self, keep: bool) -> Weights {
        self.keep_packed = keep;
        self
    }

    /// Whether FP8 linear weights stay e4m3 bytes on CUDA (see `kept_fp8`); otherwise they are
    /// dequantized at load.
    pub fn keeping_fp8(mut self, keep: bool) -> Weights {
        self.keep_fp8 = keep;
        self
    }

    pub fn loading_mtp(mut self, load: bool) -> Weights {
        self.load_mtp = load;
        self
    }

    /// Whether the checkpoint's multi-token-prediction head is wanted (speculative decoding).
    pub fn loads_mtp(&self) -> bool {
        self.load_mtp
    }

    /// Places every tensor on `device` as it is loaded (one tensor in host memory at a time).
    pub fn on_device(mut self, device: Device) -> Weights {
        self.device = device;
        self
    }

    /// How the checkpoint's quantized tensors are to be read (its `quantization_config`).
    pub fn with_quantization(mut self, quantization: Option<Quantization>) -> Weights {
        self.quantization = quantization;
        self
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn contains(&self, name: &str) -> bool {
        self.source.contains(name) || self.packed_module(name).is_some() || self.qweight_module(name).is_some()
    }

    pub fn tensor_count(&self) -> usize {
        self.source.tensor_count()
    }

    fn fetch(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        if let Some(t) = self.upload_as_stored(name, dtype)? {
            return self.place(name, Some(t));
        }
        let loaded = self.load_host(name, dtype)?;
        self.place(name, loaded)
    }

    /// A tensor stored as `dtype`, copied from the checkpoint's bytes straight to the GPU
    /// through pinned staging buffers ([`Uploader`]), without a converted copy in host memory;
    /// `None` when the weights stay on the CPU or the tensor needs converting.
    fn upload_as_stored(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        let Device::Cuda(ordinal) = self.device else { return Ok(None) };
        let Some((shape, bytes)) = self.source.stored_bytes(name, dtype)? else { return Ok(None) };
        let to_device =
            |e: ferrite_tensor::TensorError| self.weights_err(format!("tensor `{name}` to {:?}: {e}", self.device));
        let mut uploader =
            self.uploader.lock().map_err(|_| self.weights_err("the upload staging is poisoned".into()))?;
        if uploader.is_none() {
            let dev = ferrite_tensor::cuda::device(ordinal).map_err(to_device)?;
            *uploader = Some(Uploader::new(&dev).map_err(to_device)?);
        }
        let uploader = uploader.as_mut().expect("made above");
        uploader.tensor(dtype, &shape, bytes).map(Some).map_err(to_device)
    }

    /// A tensor in host memory as `dtype`, an FP8 or packed integer weight dequantized; `None`
    /// when absent.
    fn load_host(&self, name: &str, dtype: DType) -> Result<Option<Tensor>> {
        if self.source.is_fp8(name) {
            self.dequantized(name, dtype).map(Some)
        } else if let Some(module) = self.packed_module(name) {
            self.unpacked(module, dtype).map(Some)
        } else if let Some(module) = self.qweight_module(name) {
            self.zero_point_dequantized(module, dtype).map(Some)
        } else {
            self.source.load(name, dtype)
        }
    }

    /// The module whose weight `name` is stored packed (`{module}.weight_packed`), if it is.
    fn packed_module<'n>(&self, name: &'n str) -> Option<&'n str> {
        let module = name.strip_suffix(".weight")?;
        (!self.source.contains(name) && self.source.contains(&format!("{module}.weight_packed"))).then_some(module)
    }

    /// The module whose weight `name` is stored as GPTQ's or AWQ's `{module}.qweight`, if it is.
    fn qweight_module<'n>(&self, name: &'n str) -> Option<&'n str> {
        let module = name.strip_suffix(".weight")?;
        (!self.source.contains(name) && self.source.contains(&format!("{module}.qweight"))).then_some(module)
    }

    /// Runs `f` on the GPTQ or AWQ linear `module`'s packed parts and its scales (as f32).
    fn with_zero_point_parts<R>(
        &self,
        module: &str,
        f: impl FnOnce(&quant::ZeroPointParts, &[f32], &[usize]) -> Result<R>,
    ) -> Result<R> {
        let ints = |leaf: &str| self.packed_ints(module, leaf);
        let (qweight, qzeros) = (ints("qweight")?, ints("qzeros")?);
        let g_idx = self.source.load_ints(&format!("{module}.g_idx"))?;
        let parts = quant::ZeroPointParts {
            qweight: (&qweight.0, &qweight.1),
            qzeros: (&qzeros.0, &qzeros.1),
            g_idx: g_idx.as_ref().map(|(shape, v)| (shape.as_slice(), v.as_slice())),
        };
        let scale_name = format!("{module}.scales");
        let scales = self.source.load(&scale_name, DType::F32)?.ok_or_else(|| self.missing(&scale_name))?;
        f(&parts, &scales.try_to_f32_vec()?, scales.shape())
    }

    /// A GPTQ or AWQ weight dequantized (see [`quant::dequantize_gptq`], [`quant::dequantize_awq`]),
    /// then `dtype`.
    fn zero_point_dequantized(&self, module: &str, dtype: DType) -> Result<Tensor> {
        let scale_name = format!("{module}.scales");
        // gptqmodel multiplies in the scales' dtype: f16 as both formats store them, bf16 where a
        // checkpoint keeps them so.
        let round: fn(f32) -> f32 = if self.source.stored_bytes(&scale_name, DType::BF16)?.is_some() {
            |v| bf16::from_f32(v).to_f32()
        } else {
            |v| f16::from_f32(v).to_f32()
        };
        let dequantized = self.with_zero_point_parts(module, |parts, values, scale_shape| {
            Ok(match &self.quantization {
                Some(Quantization::Gptq(gptq)) => quant::dequantize_gptq(gptq, parts, values, scale_shape, round),
                Some(Quantization::Awq(awq)) => quant::dequantize_awq(awq, parts, values, scale_shape, round),
                _ => {
                    return Err(self.weights_err(format!(
                        "tensor `{module}.qweight` is GPTQ/AWQ-packed but config.json's `quantization_config` is \
                         not gptq or awq"
                    )))
                }
            })
        })?;
        let (weight, shape) =
            dequantized.map_err(|(leaf, m)| self.weights_err(format!("tensor `{module}.{leaf}`: {m}")))?;
        Ok(Tensor::from_f32_as(weight, &shape, dtype)?)
    }

    /// A pack-quantized weight: its integers unpacked and times their scales, in f32 (as
    /// compressed-tensors decompresses it), or its NVFP4 codes dequantized; then `dtype`.
    fn unpacked(&self, module: &str, dtype: DType) -> Result<Tensor> {
        if self.packed_quantization(module)?.is_nvfp4(module)? {
            return self.nvfp4_dequantized(module, dtype);
        }
        let packed = self.packed_parts(module)?;
        let (rows, cols) = (packed.rows, packed.cols);
        let (word_shape, words) = self.packed_words(module)?;
        let mut values = quant::unpack_int32(&words, &word_shape, packed.bits, rows, cols)
            .map_err(|m| self.weights_err(format!("tensor `{module}.weight_packed`: {m}")))?;
        let scale_name = format!("{module}.weight_scale");
        let scales = self.source.load(&scale_name, DType::F32)?.ok_or_else(|| self.missing(&scale_name))?;
        quant::dequantize(&mut values, &[rows, cols], &scales.try_to_f32_vec()?, scales.shape(), packed.how)
            .map_err(|m| self.weights_err(format!("tensor `{scale_name}`: {m}")))?;
        Ok(Tensor::from_f32_as(values, &[rows, cols], dtype)?)
    }

    /// An NVFP4 weight dequantized as compressed-tensors decompresses it (see
    /// [`quant::dequantize_nvfp4`]), then `dtype`.
    fn nvfp4_dequantized(&self, module: &str, dtype: DType) -> Result<Tensor> {
        let (packed_shape, packed) = self.packed_words(module)?;
        let scale_name = format!("{module}.weight_scale");
        let scales = self.source.load(&scale_name, DType::F32)?.ok_or_else(|| self.missing(&scale_name))?;
        let global_name = format!("{module}.weight_global_scale");
        let global = self.source.load(&global_name, DType::F32)?.ok_or_else(|| self.missing(&global_name))?;
        // A global scale of another dtype would change the precision compressed-tensors divides in.
        if self.source.stored_bytes(&global_name, DType::F32)?.is_none() {
            return Err(self.weights_err(format!(
                "tensor `{global_name}` is not stored as F32, the dtype llm-compressor writes it in"
            )));
        }
        let (weight, shape) = quant::dequantize_nvfp4(
            (&packed_shape, &packed),
            (scales.shape(), &scales.try_to_f32_vec()?),
            (global.shape(), &global.try_to_f32_vec()?),
        )
        .map_err(|(leaf, m)| self.weights_err(format!("tensor `{module}.{leaf}`: {m}")))?;
        Ok(Tensor::from_f32_as(weight, &shape, dtype)?)
    }

    /// A pack-quantized 4-bit weight kept packed, where the product can read it so: on CUDA, in a
    /// bf16 model, in a shape the W4A16 kernel takes. Its scales are rounded to bf16 (vLLM's
    /// kernels take them in the activation dtype too); `None` where the weight is to be
    /// dequantized instead.
    fn kept_int4(&self, name: &str, shape: [usize; 2]) -> Result<Option<Tensor>> {
        if self.device == Device::Cpu || self.dtype != DType::BF16 || !self.keep_packed {
            return Ok(None);
        }
        if let Some(module) = self.qweight_module(name) {
            return self.kept_gptq(name, module, shape);
        }
        let Some(module) = self.packed_module(name) else { return Ok(None) };
        // NVFP4 weights are dequantized at load on every device.
        if self.packed_quantization(module)?.is_nvfp4(module)? {
            return Ok(None);
        }
        let packed = self.packed_parts(module)?;
        let group = match packed.how {
            quant::WeightScales::Group(g) => g,
            quant::WeightScales::Channel => packed.cols,
            _ => return Ok(None),
        };
        if packed.bits != 4 || !Int4Matrix::kernel_takes(packed.rows, packed.cols, group) {
            return Ok(None);
        }
        if [packed.rows, packed.cols] != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: shape.to_vec(),
                actual: vec![packed.rows, packed.cols],
            });
        }
        let (word_shape, words) = self.packed_words(module)?;
        if word_shape != [packed.rows, packed.cols / 8] {
            return Err(self.weights_err(format!(
                "tensor `{module}.weight_packed` is {word_shape:?}; expected [{}, {}]",
                packed.rows,
                packed.cols / 8
            )));
        }
        let scale_name = format!("{module}.weight_scale");
        let scales = self.source.load(&scale_name, DType::BF16)?.ok_or_else(|| self.missing(&scale_name))?;
        let groups = packed.cols / group;
        if scales.numel() != packed.rows * groups || scales.shape().first() != Some(&packed.rows) {
            return Err(self.weights_err(format!(
                "tensor `{scale_name}` is {:?}; expected [{}, {groups}]",
                scales.shape(),
                packed.rows
            )));
        }
        let scales = match scales.cpu() {
            Some(CpuStorage::BF16(v)) => v.clone(),
            _ => scales.to_f32_vec().into_iter().map(bf16::from_f32).collect(),
        };
        let words = words.iter().map(|&w| w as u32).collect();
        let matrix = Int4Matrix::new(packed.rows, packed.cols, group, words, scales)
            .map_err(|m| self.weights_err(format!("tensor `{module}.weight_packed`: {m}")))?;
        let t = Tensor::from_storage(Storage::Cpu(CpuStorage::Int4(matrix)), shape.to_vec())?;
        self.place(name, Some(t))
    }

    /// A GPTQ weight kept packed where it is an [`Int4Matrix`] (symmetric 4 bits in input order:
    /// [`quant::gptq_as_int4`]) of a shape the W4A16 kernel takes; `None` where it is to be
    /// dequantized (asymmetric, act-order, 8-bit, AWQ).
    fn kept_gptq(&self, name: &str, module: &str, shape: [usize; 2]) -> Result<Option<Tensor>> {
        let Some(Quantization::Gptq(gptq)) = &self.quantization else { return Ok(None) };
        let [rows, cols] = shape;
        if gptq.bits != 4 || !Int4Matrix::kernel_takes(rows, cols, gptq.group.unwrap_or(cols)) {
            return Ok(None);
        }
        let matrix = self.with_zero_point_parts(module, |parts, scales, scale_shape| {
            quant::gptq_as_int4(gptq, parts, scales, scale_shape)
                .map_err(|(leaf, m)| self.weights_err(format!("tensor `{module}.{leaf}`: {m}")))
        })?;
        let Some(matrix) = matrix else { return Ok(None) };
        if [matrix.rows, matrix.cols] != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: shape.to_vec(),
                actual: vec![matrix.rows, matrix.cols],
            });
        }
        let t = Tensor::from_storage(Storage::Cpu(CpuStorage::Int4(matrix)), shape.to_vec())?;
        self.place(name, Some(t))
    }

    /// An FP8 linear weight kept as e4m3 bytes with its scales, where the products can read it
    /// so: on CUDA, in a bf16 model, in a shape the kernels take. A stored FP8 weight keeps the
    /// checkpoint's codes and scales; under `--quantization fp8` (`online`) the weight is rounded
    /// per output channel as it loads. `None` where the weight is to be dequantized instead.
    fn kept_fp8(&self, name: &str, shape: [usize; 2], online: bool) -> Result<Option<Tensor>> {
        if self.device == Device::Cpu || self.dtype != DType::BF16 || !self.keep_fp8 {
            return Ok(None);
        }
        let Some(module) = name.strip_suffix(".weight") else { return Ok(None) };
        let [rows, cols] = shape;
        let shape_err = |actual: &[usize]| ModelError::TensorShape {
            name: name.into(),
            expected: shape.to_vec(),
            actual: actual.to_vec(),
        };
        let matrix = if online {
            if !Fp8Matrix::kernel_takes(rows, cols, cols) {
                return Ok(None);
            }
            let weight = self.load_host(name, DType::F32)?.ok_or_else(|| self.missing(name))?;
            if weight.shape() != shape {
                return Err(shape_err(weight.shape()));
            }
            Fp8Matrix::quantize_rows(&weight.try_to_f32_vec()?, rows, cols, self.input_quant(module)?)
        } else if self.source.is_fp8(name) {
            let Some(quantization) = self.quantization.as_ref().filter(|q| !matches!(q, Quantization::Mxfp4)) else {
                return Ok(None);
            };
            let (how, scale_name) = quantization.weight_scales(module)?;
            let Some((stored_shape, bytes)) = self.source.stored_bytes(name, DType::Fp8)? else { return Ok(None) };
            if stored_shape != shape {
                return Err(shape_err(&stored_shape));
            }
            let scales = self.source.load(&scale_name, DType::F32)?.ok_or_else(|| self.missing(&scale_name))?;
            let (scales, block) = quant::scale_blocks(rows, cols, &scales.try_to_f32_vec()?, scales.shape(), how)
                .map_err(|m| self.weights_err(format!("tensor `{scale_name}`: {m}")))?;
            if !Fp8Matrix::kernel_takes(rows, cols, block[1]) {
                return Ok(None);
            }
            Fp8Matrix::new(rows, cols, bytes.to_vec(), scales, block, self.input_quant(module)?)
                .map_err(|m| self.weights_err(format!("tensor `{name}`: {m}")))?
        } else {
            return Ok(None);
        };
        let t = Tensor::from_storage(Storage::Cpu(CpuStorage::Fp8(matrix)), shape.to_vec())?;
        self.place(name, Some(t))
    }

    /// A pack-quantized module's scheme and shape, checked for range (its words are read apart,
    /// by [`Weights::packed_words`], once the caller knows it wants them).
    fn packed_parts(&self, module: &str) -> Result<PackedParts> {
        let (bits, how) = self.packed_quantization(module)?.packed_weight(module)?;
        let (_, shape) = self.packed_ints(module, "weight_shape")?;
        let &[rows, cols] = shape.as_slice() else {
            return Err(self.weights_err(format!("tensor `{module}.weight_shape` is {shape:?}, not [rows, cols]")));
        };
        let dims = |v: i64| usize::try_from(v).ok().filter(|&d| d <= crate::decoder::load::MAX_DIM);
        let (Some(rows), Some(cols)) = (dims(rows), dims(cols)) else {
            return Err(self.weights_err(format!("tensor `{module}.weight_shape` {shape:?} is out of range")));
        };
        Ok(PackedParts { bits, how, rows, cols })
    }

    /// The quantization that says how module `module`'s `weight_packed` is to be read.
    fn packed_quantization(&self, module: &str) -> Result<&Quantization> {
        self.quantization.as_ref().ok_or_else(|| {
            self.weights_err(format!(
                "tensor `{module}.weight_packed` is packed but config.json has no `quantization_config`"
            ))
        })
    }

    /// A pack-quantized module's `weight_packed` words (NVFP4's bytes) and their shape.
    fn packed_words(&self, module: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        self.packed_ints(module, "weight_packed")
    }

    fn packed_ints(&self, module: &str, leaf: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let name = format!("{module}.{leaf}");
        self.source.load_ints(&name)?.ok_or_else(|| self.missing(&name))
    }

    fn weights_err(&self, message: String) -> ModelError {
        ModelError::Weights { path: PathBuf::from(self.source.describe()), message }
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor { name: name.into(), location: self.source.describe() }
    }

    /// A loaded tensor moved to the weights' device and counted for the progress bar.
    fn place(&self, name: &str, loaded: Option<Tensor>) -> Result<Option<Tensor>> {
        let t = match loaded {
            Some(t) => Some(
                t.to_device(self.device)
                    .map_err(|e| self.weights_err(format!("tensor `{name}` to {:?}: {e}", self.device)))?,
            ),
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

    /// An FP8 weight times its scales (see [`quant::dequantize`]), in f32 and then `dtype`.
    fn dequantized(&self, name: &str, dtype: DType) -> Result<Tensor> {
        let err = |message: String| self.weights_err(message);
        let quantization =
            self.quantization.as_ref().filter(|q| !matches!(q, Quantization::Mxfp4)).ok_or_else(|| {
                err(format!("tensor `{name}` is FP8 (F8_E4M3) but config.json has no FP8 `quantization_config`"))
            })?;
        let module = name
            .strip_suffix(".weight")
            .ok_or_else(|| err(format!("tensor `{name}` is FP8, which only a linear layer's weight may be")))?;
        let (how, scale_name) = quantization.weight_scales(module)?;
        let weight = self.source.load(name, DType::F32)?.ok_or_else(|| err(format!("tensor `{name}` vanished")))?;
        let scales = self.source.load(&scale_name, DType::F32)?.ok_or_else(|| self.missing(&scale_name))?;
        let mut values = weight.try_to_f32_vec()?;
        quant::dequantize(&mut values, weight.shape(), &scales.try_to_f32_vec()?, scales.shape(), how)
            .map_err(|m| err(format!("tensor `{scale_name}`: {m}")))?;
        Ok(Tensor::from_f32_as(values, weight.shape(), dtype)?)
    }

    /// The weight `[out, in]` of linear layer `module`; under `--quantization fp8` rounded to
    /// e4m3 per output channel as it loads.
    pub fn linear_weight(&self, module: &str, shape: [usize; 2]) -> Result<Tensor> {
        self.online_linear_weight(format!("{module}.weight"), shape, false)
    }

    /// [`Weights::linear_weight`] of a layer stored `[in, out]` (GPT-2's `Conv1D`), transposed.
    pub fn linear_weight_transposed(&self, module: &str, shape: [usize; 2]) -> Result<Tensor> {
        self.online_linear_weight(format!("{module}.weight"), shape, true)
    }

    /// A projection kept as a bare `[in, out]` parameter that the model multiplies by
    /// (`x @ W`, as Gemma 3's `mm_input_projection_weight`), in the `Linear` layout `[out, in]`.
    pub fn parameter_transposed(&self, name: &str, shape: [usize; 2]) -> Result<Tensor> {
        self.online_linear_weight(name.to_string(), shape, true)
    }

    fn online_linear_weight(&self, name: String, shape: [usize; 2], transposed: bool) -> Result<Tensor> {
        let [out, inp] = shape;
        let online = matches!(self.quantization, Some(Quantization::OnlineFp8)) && !self.source.is_fp8(&name);
        if !transposed {
            if let Some(kept) = self.kept_fp8(&name, shape, online)? {
                return Ok(kept);
            }
        }
        if !online && !transposed {
            if let Some(kept) = self.kept_int4(&name, shape)? {
                return Ok(kept);
            }
            return self.matrix(&name, &shape);
        }
        let stored = if transposed { [inp, out] } else { shape };
        let weight = self.load_host(&name, DType::F32)?.ok_or_else(|| self.missing(&name))?;
        if weight.shape() != stored {
            return Err(ModelError::TensorShape { name, expected: stored.to_vec(), actual: weight.shape().to_vec() });
        }
        let mut weight = weight;
        if transposed {
            let values = weight.try_to_f32_vec()?;
            weight = Tensor::from_f32((0..out * inp).map(|i| values[(i % inp) * out + i / inp]).collect(), &shape)?;
        }
        if online {
            // One scale per output channel is the per-row scale of the input quantization.
            weight = ferrite_tensor::ops::fp8_fake_quant(&weight, ActivationQuant::PerToken)?;
        }
        let t = weight.to_dtype(self.dtype);
        Ok(self.place(&name, Some(t))?.expect("a tensor was given"))
    }

    /// How the input of the linear layer `module` is quantized before its product: `Some` for a
    /// W8A8 checkpoint's quantized layers (with a static scheme, the module's `input_scale`) and
    /// for every layer [`Weights::linear_weight`] quantizes online.
    pub fn input_quant(&self, module: &str) -> Result<Option<ActivationQuant>> {
        let Some(quantization) = &self.quantization else { return Ok(None) };
        let online = matches!(quantization, Quantization::OnlineFp8) && self.contains(&format!("{module}.weight"));
        if !online && !self.stored_fp8(module) {
            return Ok(None);
        }
        Ok(match quantization.input_scheme(module)? {
            None => None,
            Some(InputQuantSource::Dynamic(q)) => Some(q),
            Some(InputQuantSource::StaticScale(name)) => {
                let scale = self.get_scalar_opt(&name)?.ok_or_else(|| self.missing(&name))?;
                if !(scale.is_finite() && scale > 0.0) {
                    return Err(
                        self.weights_err(format!("tensor `{name}`: input scale {scale} is not a positive number"))
                    );
                }
                Some(ActivationQuant::Static(scale))
            }
        })
    }

    /// The input quantization of a layer read as stored, never quantized online (the LM head).
    pub fn stored_input_quant(&self, module: &str) -> Result<Option<ActivationQuant>> {
        if self.stored_fp8(module) {
            self.input_quant(module)
        } else {
            Ok(None)
        }
    }

    fn stored_fp8(&self, module: &str) -> bool {
        self.source.is_fp8(&format!("{module}.weight"))
    }

    /// A weight matrix that only products and embedding lookups read (linear layers, the LM
    /// head, token embeddings): kept in its quantized blocks where the source keeps them, else
    /// as [`Weights::get`] loads it.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        if self.device == Device::Cpu {
            if let Some(t) = self.source.load_blocks(name)? {
                let t = with_shape(name, t, shape)?;
                return Ok(self.place(name, Some(t))?.expect("a tensor was given"));
            }
        }
        self.get(name, shape)
    }

    /// A required tensor in the compute dtype, checked against the expected shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        with_shape(name, self.get_any_shape(name)?, shape)
    }

    pub fn get_any_shape(&self, name: &str) -> Result<Tensor> {
        self.fetch(name, self.dtype)?.ok_or_else(|| self.missing(name))
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
        with_shape(name, self.get_f32_any_shape(name)?, shape)
    }

    /// A required tensor in f32, in whatever shape it is stored (the caller checks it).
    pub fn get_f32_any_shape(&self, name: &str) -> Result<Tensor> {
        self.fetch(name, DType::F32)?.ok_or_else(|| self.missing(name))
    }

    pub fn get_f32_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.get_f32(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An integer tensor's shape and exact values (an index map such as EAGLE-3's `d2t`); `None`
    /// when absent.
    pub fn ints_opt(&self, name: &str) -> Result<Option<(Vec<usize>, Vec<i64>)>> {
        self.source.load_ints(name)
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

#[cfg(test)]
mod hostile {
    //! Checkpoints from strangers: a damaged or lying safetensors header, or an index naming
    //! files outside the model directory, fails with an error, never a panic, an out-of-bounds
    //! read or an allocation the file does not back.

    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    /// A small real checkpoint: one of the committed parity fixtures.
    fn sample() -> Vec<u8> {
        let path = ferrite_testing::gate::fixtures_dir().join("models/llama/model.safetensors");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn split(file: &[u8]) -> (Value, &[u8]) {
        let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        (serde_json::from_slice(&file[8..8 + n]).unwrap(), &file[8 + n..])
    }

    fn join(header: &Value, data: &[u8]) -> Vec<u8> {
        let text = serde_json::to_vec(header).unwrap();
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(data);
        out
    }

    #[derive(Debug, Clone)]
    enum Lie {
        Dtype(usize, &'static str),
        Shape(usize, Vec<u64>),
        Offsets(usize, u64, u64),
        Flip { at: usize, byte: u8 },
        HeaderLength(u64),
        Cut { len: usize },
    }

    fn lie() -> impl Strategy<Value = Lie> {
        let big = prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(1 << 33), Just(1 << 62), 0u64..4096];
        let dtypes = prop_oneof![Just("F32"), Just("BF16"), Just("F16"), Just("I64"), Just("U8"), Just("F8_E4M3")];
        prop_oneof![
            (any::<usize>(), dtypes).prop_map(|(t, d)| Lie::Dtype(t, d)),
            (any::<usize>(), proptest::collection::vec(big.clone(), 0..4)).prop_map(|(t, s)| Lie::Shape(t, s)),
            (any::<usize>(), big.clone(), big.clone()).prop_map(|(t, a, b)| Lie::Offsets(t, a, b)),
            (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Lie::Flip { at, byte }),
            big.prop_map(Lie::HeaderLength),
            any::<usize>().prop_map(|len| Lie::Cut { len }),
        ]
    }

    fn tell(file: Vec<u8>, lie: &Lie) -> Vec<u8> {
        let edit = |file: Vec<u8>, t: usize, f: &dyn Fn(&mut Value)| -> Vec<u8> {
            let Ok(n) = file.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize).ok_or(()) else {
                return file;
            };
            let Some(Ok(mut header)) = file.get(8..8usize.saturating_add(n)).map(serde_json::from_slice::<Value>)
            else {
                return file;
            };
            let names: Vec<String> = header
                .as_object()
                .map(|o| o.keys().filter(|k| *k != "__metadata__").cloned().collect())
                .unwrap_or_default();
            if names.is_empty() {
                return file;
            }
            f(&mut header[&names[t % names.len()]]);
            join(&header, &file[8 + n..])
        };
        match lie {
            Lie::Dtype(t, d) => edit(file, *t, &|v| v["dtype"] = json!(d)),
            Lie::Shape(t, s) => edit(file, *t, &|v| v["shape"] = json!(s)),
            Lie::Offsets(t, a, b) => edit(file, *t, &|v| v["data_offsets"] = json!([a, b])),
            Lie::Flip { at, byte } => {
                let mut file = file;
                let n = file.len();
                if n > 0 {
                    file[at % n] ^= (*byte).max(1);
                }
                file
            }
            Lie::HeaderLength(len) => {
                let mut file = file;
                if file.len() >= 8 {
                    file[..8].copy_from_slice(&len.to_le_bytes());
                }
                file
            }
            Lie::Cut { len } => {
                let mut file = file;
                let n = file.len().max(1);
                file.truncate(len % n);
                file
            }
        }
    }

    fn scratch_dir(tag: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ferrite-hostile-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Opens `dir` and reads every tensor it lists: errors are fine, panics are not, and what
    /// loads has exactly the bytes its shape and dtype need.
    fn open_and_read(dir: &Path) {
        let Ok(weights) = SafetensorsWeights::open(dir) else { return };
        for name in weights.index.keys() {
            if let Ok(Some(t)) = weights.load(name, DType::F32) {
                assert_eq!(t.numel(), t.shape().iter().product::<usize>());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(300), ..ProptestConfig::default() })]
        #[test]
        fn lying_headers_fail_cleanly(lies in proptest::collection::vec(lie(), 1..4)) {
            let mut file = sample();
            for l in &lies {
                file = tell(file, l);
            }
            let dir = scratch_dir("st");
            std::fs::write(dir.join("model.safetensors"), &file).unwrap();
            open_and_read(&dir);
            std::fs::remove_dir_all(&dir).ok();
        }

        #[test]
        fn index_files_stay_in_the_model_directory(
            shard in prop_oneof![
                Just(json!("model.safetensors")), Just(json!("../model.safetensors")), Just(json!("/etc/hostname")),
                Just(json!("")), Just(json!(".")), Just(json!("sub/model.safetensors")), Just(json!(7)), Just(json!(null)),
                "[a-z./]{0,12}".prop_map(|s| json!(s)),
            ],
        ) {
            let dir = scratch_dir("index");
            std::fs::write(dir.join("model.safetensors"), sample()).unwrap();
            let index = json!({"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard.clone()}});
            std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
            let opened = SafetensorsWeights::open(&dir);
            std::fs::remove_dir_all(&dir).ok();
            // Judged here, not by the loader's own check, so that a broken check fails the test.
            let plain = shard.as_str().is_some_and(|s| !s.is_empty() && !s.contains('/') && s != "." && s != "..");
            match opened {
                Ok(w) => prop_assert!(plain && w.shards.iter().all(|s| s.path.parent() == Some(dir.as_path()))),
                Err(e) => prop_assert!(plain || e.to_string().contains("weight_map"), "{e}"),
            }
        }
    }

    #[test]
    fn a_header_that_lies_about_a_tensor_names_it() {
        let file = sample();
        let (mut header, data) = split(&file);
        header["model.norm.weight"]["data_offsets"] = json!([0, 1u64 << 40]);
        let dir = scratch_dir("offsets");
        std::fs::write(dir.join("model.safetensors"), join(&header, data)).unwrap();
        let err = SafetensorsWeights::open(&dir).err().expect("offsets beyond the file must not load");
        std::fs::remove_dir_all(&dir).ok();
        let message = err.to_string();
        assert!(message.contains("model.safetensors") && message.contains("`model.norm.weight`"), "{message}");
    }
}
