//! GGUF checkpoints, read natively: the container (header, metadata, tensor table), ggml's block
//! dequantization, and the translation into what a Hugging Face checkpoint would have held — a
//! `config.json`, transformers' tensor names and layouts, and a `tokenizer.json`.
//!
//! The reference throughout is transformers' own GGUF loader (`modeling_gguf_pytorch_utils.py`,
//! `integrations/ggml.py`, `integrations/gguf/gguf_tokenizer_mapping.py`, as of 5.24): ferrite has to
//! produce the same logits as transformers does from the same file, so where transformers and
//! llama.cpp disagree, this module follows transformers and says so.
//!
//! Layout of a GGUF file (all little-endian; versions 2 and 3 share it):
//! `"GGUF"`, u32 version, u64 tensor count, u64 metadata count, the metadata key/value pairs, the
//! tensor infos (name, dims innermost-first, ggml type, offset), padding to `general.alignment`, and
//! the tensor data, each tensor at its offset from the start of that data section.

mod hf;
mod tokenizer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use ferrite_tensor::ggml::{DequantError, GgmlType};

const MAGIC: &[u8; 4] = b"GGUF";
/// What ggml assumes when a file does not set `general.alignment`.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions; a larger count means the table is garbage.
const MAX_DIMS: u32 = 4;

/// A GGUF read failure, always naming the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct GgufError {
    pub path: PathBuf,
    pub kind: GgufErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum GgufErrorKind {
    #[error("{0}")]
    Io(#[source] std::io::Error),
    #[error("not a GGUF file: it starts with {0:02x?}, not \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("a big-endian GGUF file, which ferrite does not read")]
    BigEndian,
    #[error("GGUF version {0} is not supported (ferrite reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("truncated: {what} at byte {offset} runs past the end of the file ({len} bytes)")]
    Truncated { what: String, offset: u64, len: u64 },
    #[error("malformed: {0}")]
    Malformed(String),
    #[error("tensor `{name}` has ggml type id {id}, which is not a type ggml defines")]
    UnknownType { name: String, id: u32 },
    #[error("tensor `{name}` is of ggml type {ty}, which ferrite cannot dequantize")]
    UnsupportedType { name: String, ty: GgmlType },
    #[error("no tensor named `{0}`")]
    MissingTensor(String),
    #[error("metadata key `{key}`: {problem}")]
    Metadata { key: String, problem: String },
    #[error("{0}")]
    Unsupported(String),
}

/// One metadata value, in the type the file stored it as.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// Any integer type that fits, since writers disagree on widths (llama.cpp writes ids as u32,
    /// other tools as i32 or u64).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Floats and integers both, as f64. An f32 widens exactly, which is also what Python's
    /// `float(np.float32(x))` gives transformers, so configs print the same digits.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F32(_) => "f32",
            GgufValue::F64(_) => "f64",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
        }
    }
}

impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(v) => write!(f, "{v:?}"),
            GgufValue::Array(v) => write!(f, "[{} values]", v.len()),
        }
    }
}

/// Where one tensor lives and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// As the file lists them: innermost (fastest-moving) dimension first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// From the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Row-major shape, outermost first: the shape transformers gives the tensor.
    pub fn shape(&self) -> Vec<usize> {
        // Every dim was checked at open to make the element count fit in u64 and the data in the
        // file, so each fits in usize on any target that could map the file.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A memory-mapped GGUF file with its metadata and tensor table parsed.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

/// Whether the file at `path` starts with the GGUF magic. Unreadable files are not GGUF.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).map(|()| &magic == MAGIC).unwrap_or(false)
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let err = |kind| GgufError { path: path.to_path_buf(), kind };
        let file = File::open(path).map_err(|e| err(GgufErrorKind::Io(e)))?;
        // SAFETY: the map is read-only and private to this struct. Like every mmap-based loader
        // (safetensors included), this assumes nobody truncates or rewrites the file while it is
        // open; that is the one thing Rust cannot check here.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| err(GgufErrorKind::Io(e)))?;
        let parsed = parse(&mmap).map_err(err)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version: parsed.version,
            metadata: parsed.metadata,
            by_name: parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect(),
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the tensor data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes exactly as stored (ggml blocks for quantized types).
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| self.error(GgufErrorKind::MissingTensor(name.to_string())))?;
        Ok(self.data_of(info))
    }

    /// Dequantizes a tensor to f32, returning its row-major shape (GGUF dims reversed) and values.
    /// Bit-exact with ggml's `dequantize_row_*` and gguf-py's `gguf.quants.dequantize`.
    pub fn dequantize(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>), GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| self.error(GgufErrorKind::MissingTensor(name.to_string())))?;
        if !info.ggml_type.can_dequantize() {
            return Err(self.error(GgufErrorKind::UnsupportedType { name: info.name.clone(), ty: info.ggml_type }));
        }
        let mut out = vec![0f32; info.n_elements as usize];
        // Sizes were validated at open, so the only failure left would be a bug in that check.
        info.ggml_type
            .dequantize_into(self.data_of(info), &mut out)
            .map_err(|e| self.error(GgufErrorKind::Malformed(format!("tensor `{}`: {e}", info.name))))?;
        Ok((info.shape(), out))
    }

    fn data_of(&self, info: &GgufTensorInfo) -> &[u8] {
        // Bounds were checked against the file length at open.
        let start = (self.data_offset + info.offset) as usize;
        &self.mmap[start..start + info.n_bytes as usize]
    }

    fn error(&self, kind: GgufErrorKind) -> GgufError {
        GgufError { path: self.path.clone(), kind }
    }

    fn metadata_error(&self, key: &str, problem: impl Into<String>) -> GgufError {
        self.error(GgufErrorKind::Metadata { key: key.to_string(), problem: problem.into() })
    }

    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// An optional integer key; present with the wrong type is an error, not a silent default.
    fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    self.metadata_error(key, format!("expected an unsigned integer, found {} {v}", v.type_name()))
                })
            })
            .transpose()
    }

    fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.metadata_error(key, format!("expected a number, found {} {v}", v.type_name())))
            })
            .transpose()
    }

    fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.metadata_error(key, format!("expected a bool, found {} {v}", v.type_name())))
            })
            .transpose()
    }

    fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.metadata_error(key, format!("expected a string, found {} {v}", v.type_name())))
            })
            .transpose()
    }

    fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| self.metadata_error(key, "missing"))
    }

    fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")?.ok_or_else(|| self.metadata_error("general.architecture", "missing"))
    }
}

struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the mapped bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufErrorKind> {
        let (buf, pos) = (self.buf, self.pos);
        let truncated = || GgufErrorKind::Truncated { what: what(), offset: pos as u64, len: buf.len() as u64 };
        let end = pos.checked_add(n).ok_or_else(truncated)?;
        let bytes = buf.get(pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufErrorKind> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufErrorKind> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufErrorKind> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufErrorKind> {
        let len = self.u64(what)?;
        // A length past the end is truncation; checking before converting keeps a corrupt length
        // from being mistaken for an allocation request.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| GgufErrorKind::Malformed(format!("{} is not valid UTF-8 ({e})", what())))
    }

    fn value(&mut self, ty: u32, what: &dyn Fn() -> String) -> Result<GgufValue, GgufErrorKind> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(what)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => GgufValue::U32(self.u32(what)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(GgufErrorKind::Malformed(format!("{} is a bool stored as {b}", what()))),
            },
            8 => GgufValue::String(self.string(what)?),
            9 => {
                let elem_ty = self.u32(what)?;
                let count = self.u64(what)?;
                // Every element takes at least one byte, so a count beyond the bytes left is
                // corrupt; rejecting it here bounds the allocation below by the file size.
                if count > self.remaining() as u64 {
                    return Err(GgufErrorKind::Malformed(format!(
                        "{} claims {count} array elements with only {} bytes left",
                        what(),
                        self.remaining()
                    )));
                }
                if elem_ty == 9 {
                    return Err(GgufErrorKind::Malformed(format!("{} is an array of arrays", what())));
                }
                // No preallocation from the count: memory grows only with elements actually read.
                let mut values = Vec::new();
                for i in 0..count {
                    values.push(self.value(elem_ty, &|| format!("{}[{i}]", what()))?);
                }
                GgufValue::Array(values)
            }
            10 => GgufValue::U64(self.u64(what)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            other => {
                return Err(GgufErrorKind::Malformed(format!("{} has unknown value type {other}", what())));
            }
        })
    }
}

fn parse(buf: &[u8]) -> Result<Parsed, GgufErrorKind> {
    let mut r = Reader { buf, pos: 0 };
    let magic: [u8; 4] = r.array(&|| "the magic".into())?;
    if &magic != MAGIC {
        return Err(GgufErrorKind::BadMagic(magic));
    }
    let version = r.u32(&|| "the version".into())?;
    if version != 2 && version != 3 {
        // A big-endian writer puts 3 as 0x03000000; name that rather than a bogus version.
        if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            return Err(GgufErrorKind::BigEndian);
        }
        return Err(GgufErrorKind::UnsupportedVersion(version));
    }
    let tensor_count = r.u64(&|| "the tensor count".into())?;
    let kv_count = r.u64(&|| "the metadata count".into())?;
    // Each entry needs at least 8 bytes (its name's length), so larger counts are corrupt.
    for (count, what) in [(tensor_count, "tensor"), (kv_count, "metadata")] {
        if count > (r.remaining() / 8) as u64 {
            return Err(GgufErrorKind::Malformed(format!(
                "{what} count {count} is impossible in a {}-byte file",
                buf.len()
            )));
        }
    }

    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r.string(&|| format!("metadata key #{i}"))?;
        let what = || format!("metadata value `{key}`");
        let ty = r.u32(&what)?;
        let value = r.value(ty, &what)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(GgufErrorKind::Malformed(format!("metadata key `{key}` appears twice")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(GgufErrorKind::Metadata {
                    key: "general.alignment".into(),
                    problem: format!("must be a power of two, found {v}"),
                });
            }
        },
    };

    let mut tensors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for i in 0..tensor_count {
        let name = r.string(&|| format!("tensor name #{i}"))?;
        let what = || format!("tensor info of `{name}`");
        let n_dims = r.u32(&what)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufErrorKind::Malformed(format!(
                "tensor `{name}` has {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64(&what)?);
        }
        let type_id = r.u32(&what)?;
        let offset = r.u64(&what)?;
        let ggml_type =
            GgmlType::from_id(type_id).ok_or_else(|| GgufErrorKind::UnknownType { name: name.clone(), id: type_id })?;
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| GgufErrorKind::Malformed(format!("tensor `{name}` has dims {dims:?} overflowing u64")))?;
        let block = ggml_type.block_size() as u64;
        // ggml stores each row as whole blocks, so the innermost dim must be a multiple.
        if dims[0] % block != 0 {
            return Err(GgufErrorKind::Malformed(format!(
                "tensor `{name}` of type {ggml_type} has row length {} not a multiple of its block size {block}",
                dims[0]
            )));
        }
        let n_bytes = (n_elements / block).checked_mul(ggml_type.type_size() as u64).ok_or_else(|| {
            GgufErrorKind::Malformed(format!("tensor `{name}` has dims {dims:?} whose size overflows u64"))
        })?;
        if offset % alignment != 0 {
            return Err(GgufErrorKind::Malformed(format!(
                "tensor `{name}` starts at data offset {offset}, not a multiple of the alignment {alignment}"
            )));
        }
        if !seen.insert(name.clone()) {
            return Err(GgufErrorKind::Malformed(format!("tensor `{name}` appears twice")));
        }
        tensors.push(GgufTensorInfo { name, dims, ggml_type, offset, n_elements, n_bytes });
    }

    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes));
        if end.is_none_or(|end| end > file_len) {
            return Err(GgufErrorKind::Truncated {
                what: format!("data of tensor `{}` ({} bytes at data offset {})", t.name, t.n_bytes, t.offset),
                offset: data_offset.saturating_add(t.offset),
                len: file_len,
            });
        }
    }

    Ok(Parsed { version, metadata, tensors, alignment, data_offset })
}
