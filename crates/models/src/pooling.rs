//! Pooling models: encoders (BERT, RoBERTa) and decoders used as embedding or classification
//! models. Where a [`crate::CausalLM`] turns the last token into logits, a [`PoolingModel`]
//! turns each whole sequence into one vector:
//!
//! ```text
//! token ids -> hidden_states [tokens, hidden] -> pool (CLS / MEAN / LAST) -> head -> vector
//!                                                   embed:    truncate to `dimensions`, L2-normalise
//!                                                   classify: the classifier's logits
//! ```
//!
//! How an embedding model pools and whether it normalises comes from its sentence-transformers
//! config (`modules.json`, `1_Pooling/config.json`, a `Normalize` module), as vLLM reads it; a
//! checkpoint without one gets the architecture's default pooling and normalisation.
//! Matryoshka truncation (`dimensions`) is allowed where `config.json` declares it
//! (`is_matryoshka` / `matryoshka_dimensions`).

use std::path::{Path, PathBuf};

use ferrite_tensor::{ops, AttnMetadata, AttnSeq, PagedKvLayer, Tensor};
use serde_json::Value;

use crate::loading::config::RawConfig;
use crate::model::{CausalLM, ForwardInput};
use crate::{ModelError, Result};

/// How the hidden states of a sequence become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingType {
    /// The first token's state (`[CLS]` / `<s>`).
    Cls,
    /// The mean over every token.
    Mean,
    /// The last token's state (decoders).
    Last,
}

impl PoolingType {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolingType::Cls => "CLS",
            PoolingType::Mean => "MEAN",
            PoolingType::Last => "LAST",
        }
    }

    /// A sentence-transformers pooling mode (`cls`, `mean`, `lasttoken`) or vLLM's name.
    pub fn parse(name: &str) -> Option<PoolingType> {
        match name.to_ascii_lowercase().as_str() {
            "cls" | "cls_token" => Some(PoolingType::Cls),
            "mean" | "mean_tokens" => Some(PoolingType::Mean),
            "last" | "lasttoken" => Some(PoolingType::Last),
            _ => None,
        }
    }
}

/// What a pooling model's output is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingTask {
    /// A sentence embedding (`/v1/embeddings`; `/score` as a cosine).
    Embed,
    /// Class logits (`/classify`; a single-label cross-encoder scores pairs: `/score`, `/rerank`).
    Classify,
}

impl PoolingTask {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolingTask::Embed => "embed",
            PoolingTask::Classify => "classify",
        }
    }
}

/// One sequence: token ids and, for BERT-style pair inputs, segment ids (zeros when absent).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolingInput {
    pub ids: Vec<u32>,
    pub type_ids: Option<Vec<u32>>,
}

impl From<Vec<u32>> for PoolingInput {
    fn from(ids: Vec<u32>) -> PoolingInput {
        PoolingInput { ids, type_ids: None }
    }
}

impl PoolingInput {
    /// The checks every model makes before running sequence `index` of a batch.
    pub fn check(&self, index: usize, max_tokens: usize) -> Result<()> {
        let n = self.ids.len();
        if n == 0 {
            return Err(ModelError::InvalidInput(format!("sequence {index} is empty")));
        }
        if n > max_tokens {
            return Err(ModelError::InvalidInput(format!(
                "sequence {index} has {n} tokens; this model takes at most {max_tokens}"
            )));
        }
        if let Some(t) = &self.type_ids {
            if t.len() != n {
                return Err(ModelError::InvalidInput(format!(
                    "sequence {index} has {n} token ids but {} token type ids",
                    t.len()
                )));
            }
        }
        Ok(())
    }
}

/// What the server and the pooler need to know about a loaded pooling model.
#[derive(Debug, Clone)]
pub struct PoolingInfo {
    pub architecture: String,
    pub hidden_size: usize,
    pub vocab_size: usize,
    /// Tokens one sequence may hold (positions the model has).
    pub max_tokens: usize,
    /// What the architecture computes: a sentence embedding or class logits.
    pub task: PoolingTask,
    /// The pooling used where the checkpoint's sentence-transformers config names none.
    pub default_pooling: PoolingType,
    /// Class names in index order (`id2label`); empty for embedding models.
    pub labels: Vec<String>,
    /// Token type (segment) ids below this are valid (1 where the model has a single segment).
    pub type_vocab_size: usize,
    pub weight_bytes: usize,
}

/// A model that maps whole sequences to vectors.
pub trait PoolingModel: Send + Sync {
    fn info(&self) -> &PoolingInfo;

    /// Final hidden states of every token, `[sum of lengths, hidden]`, sequences in order. Each
    /// sequence sees only itself (bidirectionally for encoders, causally for decoders).
    fn hidden_states(&self, batch: &[PoolingInput]) -> Result<Tensor>;

    /// The model's own head over pooled states `[n, hidden]`: class logits `[n, labels]` for
    /// classifiers, the identity for embedding models.
    fn head(&self, pooled: &Tensor) -> Result<Tensor> {
        Ok(pooled.clone())
    }
}

/// Sentence embeddings of token-id sequences, as the checkpoint's pooler defines them.
pub trait EmbeddingModel: Send + Sync {
    fn embed(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>>;
}

/// Whether `dimensions` (Matryoshka truncation) may be requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matryoshka {
    /// The model was not trained for it (vLLM refuses `dimensions`).
    Unsupported,
    /// `is_matryoshka: true`: any prefix length.
    Any,
    /// `matryoshka_dimensions`: only these.
    Dimensions(Vec<usize>),
}

/// The pooler of an embedding model: from the sentence-transformers config, else defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolerConfig {
    pub pooling: PoolingType,
    pub normalize: bool,
    pub matryoshka: Matryoshka,
    /// `sentence_bert_config.json`'s `max_seq_length`: sentence-transformers truncates to it,
    /// and vLLM caps the model length at it.
    pub max_seq_length: Option<usize>,
    /// Where `pooling` and `normalize` came from (`modules.json` or `defaults`).
    pub source: &'static str,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })
}

impl PoolerConfig {
    /// Reads `modules.json` (and the Pooling module's `config.json`) and
    /// `sentence_bert_config.json` from a checkpoint directory, and the Matryoshka fields from
    /// `config.json`. Without `modules.json`: `default_pooling`, normalised (vLLM's default for
    /// embedding models).
    pub fn from_dir(dir: &Path, raw: &RawConfig, default_pooling: PoolingType) -> Result<PoolerConfig> {
        let err = |path: &Path, message: String| ModelError::Config { path: path.to_path_buf(), message };
        let mut pooler = PoolerConfig {
            pooling: default_pooling,
            normalize: true,
            matryoshka: Matryoshka::Unsupported,
            max_seq_length: None,
            source: "defaults",
        };
        let modules_path = dir.join("modules.json");
        if let Some(modules) = read_json(&modules_path)? {
            let list = modules.as_array().ok_or_else(|| err(&modules_path, "expected a list of modules".into()))?;
            let mut normalize = false;
            for module in list {
                let kind = module.get("type").and_then(Value::as_str).unwrap_or_default();
                let name = kind.rsplit('.').next().unwrap_or_default();
                match name {
                    "Transformer" => {}
                    "Normalize" => normalize = true,
                    "Pooling" => {
                        let sub = module.get("path").and_then(Value::as_str).unwrap_or_default();
                        let path = dir.join(sub).join("config.json");
                        let cfg =
                            read_json(&path)?.ok_or_else(|| err(&path, "missing (named by modules.json)".into()))?;
                        pooler.pooling = st_pooling_mode(&cfg).map_err(|m| err(&path, m))?;
                    }
                    other => {
                        return Err(err(
                            &modules_path,
                            format!("unsupported sentence-transformers module `{other}` ({kind})"),
                        ))
                    }
                }
            }
            pooler.normalize = normalize;
            pooler.source = "modules.json";
        }
        if let Some(st) = read_json(&dir.join("sentence_bert_config.json"))? {
            pooler.max_seq_length = st.get("max_seq_length").and_then(Value::as_u64).map(|n| n as usize);
        }
        if let Some(dims) = raw.value.get("matryoshka_dimensions").and_then(Value::as_array) {
            pooler.matryoshka =
                Matryoshka::Dimensions(dims.iter().filter_map(Value::as_u64).map(|d| d as usize).collect());
        } else if raw.value.get("is_matryoshka").and_then(Value::as_bool) == Some(true) {
            pooler.matryoshka = Matryoshka::Any;
        }
        Ok(pooler)
    }

    /// Validates a requested `dimensions` as vLLM does (the messages are vLLM's).
    pub fn check_dimensions(&self, model: &str, dimensions: usize, hidden: usize) -> std::result::Result<(), String> {
        match &self.matryoshka {
            Matryoshka::Unsupported => {
                return Err(format!(
                    "Model \"{model}\" does not support matryoshka representation, changing output dimensions will lead to poor results."
                ))
            }
            Matryoshka::Dimensions(allowed) if !allowed.contains(&dimensions) => {
                return Err(format!(
                    "Model \"{model}\" only supports {allowed:?} matryoshka dimensions, use other output dimensions will lead to poor results."
                ))
            }
            _ => {}
        }
        if dimensions < 1 {
            return Err("Dimensions must be greater than 0".into());
        }
        if dimensions > hidden {
            return Err(format!("dimensions {dimensions} exceed the model's embedding size {hidden}"));
        }
        Ok(())
    }
}

/// The pooling of a sentence-transformers `Pooling` config: the `pooling_mode` string (v5+)
/// or the legacy `pooling_mode_*` flags, exactly one set.
fn st_pooling_mode(cfg: &Value) -> std::result::Result<PoolingType, String> {
    let modes: Vec<String> = match cfg.get("pooling_mode") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => cfg
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| k.starts_with("pooling_mode_") && v.as_bool() == Some(true))
            .map(|(k, _)| k.trim_start_matches("pooling_mode_").to_owned())
            .collect(),
    };
    match modes.as_slice() {
        [one] => {
            PoolingType::parse(one).ok_or_else(|| format!("unsupported pooling mode `{one}` (CLS, MEAN and LAST are)"))
        }
        [] => Err("no pooling mode is set".into()),
        many => Err(format!("combined pooling modes {many:?} are not supported")),
    }
}

/// Pools the hidden states `[sum(lens), hidden]` of consecutive sequences: `[lens.len(), hidden]`.
pub fn pool(hidden: &Tensor, lens: &[usize], pooling: PoolingType) -> Result<Tensor> {
    let mut starts = Vec::with_capacity(lens.len());
    let mut at = 0;
    for &n in lens {
        starts.push(at);
        at += n;
    }
    if at != hidden.rows() || lens.contains(&0) {
        return Err(ModelError::InvalidInput(format!("pool: lengths {lens:?} for {} rows", hidden.rows())));
    }
    match pooling {
        PoolingType::Cls => Ok(ops::gather_rows(hidden, &starts)?),
        PoolingType::Last => {
            let rows: Vec<usize> = starts.iter().zip(lens).map(|(s, n)| s + n - 1).collect();
            Ok(ops::gather_rows(hidden, &rows)?)
        }
        PoolingType::Mean => {
            let h = hidden.last_dim();
            let data = hidden.to_f32_vec();
            let mut out = vec![0.0f32; lens.len() * h];
            for (i, (&s, &n)) in starts.iter().zip(lens).enumerate() {
                let dst = &mut out[i * h..(i + 1) * h];
                for r in s..s + n {
                    dst.iter_mut().zip(&data[r * h..(r + 1) * h]).for_each(|(o, v)| *o += v);
                }
                dst.iter_mut().for_each(|o| *o /= n as f32);
            }
            Ok(Tensor::from_f32(out, &[lens.len(), h])?)
        }
    }
}

/// `x / max(|x|, 1e-12)` (`torch.nn.functional.normalize`).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-24)
}

/// Class probabilities from logits as vLLM's classify/score activation gives them: the sigmoid
/// of a single logit (cross-encoder relevance), else the softmax.
pub fn classifier_activation(logits: &[f32]) -> Vec<f32> {
    if logits.len() == 1 {
        return vec![1.0 / (1.0 + (-logits[0]).exp())];
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    exp.into_iter().map(|e| e / sum).collect()
}

/// How a one-label cross-encoder's logit becomes a relevance score: sentence-transformers'
/// `activation_fn` in `config.json` (`sentence_transformers.activation_fn`, or the older
/// `sbert_ce_default_activation_function`), else the sigmoid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreActivation {
    Sigmoid,
    Identity,
}

impl ScoreActivation {
    pub fn from_config(raw: &RawConfig) -> ScoreActivation {
        let path = raw
            .value
            .get("sentence_transformers")
            .and_then(|v| v.get("activation_fn"))
            .or_else(|| raw.value.get("sbert_ce_default_activation_function"))
            .and_then(Value::as_str);
        match path {
            Some(p) if p.ends_with(".Identity") => ScoreActivation::Identity,
            _ => ScoreActivation::Sigmoid,
        }
    }

    pub fn apply(self, logit: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => 1.0 / (1.0 + (-logit).exp()),
            ScoreActivation::Identity => logit,
        }
    }
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    let cols = t.last_dim();
    t.to_f32_vec().chunks(cols.max(1)).map(<[f32]>::to_vec).collect()
}

/// A pooling model with its pooler, ready to serve.
pub struct LoadedPoolingModel {
    pub model: Box<dyn PoolingModel>,
    pub pooler: PoolerConfig,
    pub config: RawConfig,
    pub dir: PathBuf,
    /// Tokens a request may hold: the model's positions, capped by `max_seq_length`.
    pub max_model_len: usize,
    /// Sequences run through the model this many tokens at a time (a longer one alone): large
    /// batches are faster on CPU in cache-sized pieces than as one pass.
    pub max_forward_tokens: usize,
}

/// The default [`LoadedPoolingModel::max_forward_tokens`]. Measured with all-MiniLM-L6-v2 at
/// batch 64 x 128 tokens on 2 cores: 256 ran about 15% faster than 1024 and 8192 (whose
/// activations, 50 MB per [tokens, intermediate] matrix, stream through memory).
pub const MAX_FORWARD_TOKENS: usize = 256;

impl LoadedPoolingModel {
    pub fn info(&self) -> &PoolingInfo {
        self.model.info()
    }

    /// The task's raw output for each sequence, the unit a batching server runs: for embedding
    /// models the pooled state (full size, not normalised; finish it with
    /// [`LoadedPoolingModel::finish_embedding`]), for classifiers the logits.
    pub fn forward(&self, batch: &[PoolingInput]) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let pooling = match self.info().task {
            PoolingTask::Embed => self.pooler.pooling,
            PoolingTask::Classify => self.info().default_pooling,
        };
        let mut out = Vec::with_capacity(batch.len());
        let mut start = 0;
        while start < batch.len() {
            let (mut end, mut tokens) = (start, 0);
            while end < batch.len() && (end == start || tokens + batch[end].ids.len() <= self.max_forward_tokens) {
                tokens += batch[end].ids.len();
                end += 1;
            }
            let chunk = &batch[start..end];
            let hidden = self.model.hidden_states(chunk)?;
            let lens: Vec<usize> = chunk.iter().map(|s| s.ids.len()).collect();
            out.extend(rows(&self.model.head(&pool(&hidden, &lens, pooling)?)?));
            start = end;
        }
        Ok(out)
    }

    /// Cuts a pooled state to `dimensions` (Matryoshka; validate it first with
    /// [`PoolerConfig::check_dimensions`]), then L2-normalises it if `normalize` (the
    /// pooler's setting unless overridden), in that order, as vLLM does.
    pub fn finish_embedding(&self, v: &mut Vec<f32>, dimensions: Option<usize>, normalize: Option<bool>) {
        if let Some(d) = dimensions {
            v.truncate(d);
        }
        if normalize.unwrap_or(self.pooler.normalize) {
            l2_normalize(v);
        }
    }

    /// Embeddings of `batch` as the pooler defines them, cut to `dimensions` if given.
    pub fn embed_inputs(&self, batch: &[PoolingInput], dimensions: Option<usize>) -> Result<Vec<Vec<f32>>> {
        if self.info().task != PoolingTask::Embed {
            return Err(ModelError::InvalidInput(format!(
                "{} is a classification model, not an embedding model",
                self.info().architecture
            )));
        }
        let mut out = self.forward(batch)?;
        out.iter_mut().for_each(|v| self.finish_embedding(v, dimensions, None));
        Ok(out)
    }

    /// Class logits of `batch` (`[labels]` per sequence), from the classifier head over the
    /// architecture's pooling.
    pub fn classify(&self, batch: &[PoolingInput]) -> Result<Vec<Vec<f32>>> {
        if self.info().task != PoolingTask::Classify {
            return Err(ModelError::InvalidInput(format!(
                "{} is an embedding model, not a classifier",
                self.info().architecture
            )));
        }
        self.forward(batch)
    }
}

impl EmbeddingModel for LoadedPoolingModel {
    fn embed(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let inputs: Vec<PoolingInput> = batch.iter().cloned().map(PoolingInput::from).collect();
        self.embed_inputs(&inputs, None)
    }
}

/// A decoder ([`CausalLM`]) as an embedding model: its final-norm hidden states, each sequence
/// through a private paged cache (causal attention, as the decoder was trained).
pub struct DecoderEmbedding {
    info: PoolingInfo,
    model: Box<dyn CausalLM>,
}

const DECODER_BLOCK: usize = 16;

impl DecoderEmbedding {
    pub fn new(raw: &RawConfig, model: Box<dyn CausalLM>) -> Result<DecoderEmbedding> {
        let hidden_size = raw
            .value
            .get("hidden_size")
            .and_then(Value::as_u64)
            .ok_or_else(|| raw.error("missing field `hidden_size`"))? as usize;
        let m = model.info();
        let info = PoolingInfo {
            architecture: m.architecture.clone(),
            hidden_size,
            vocab_size: m.vocab_size,
            max_tokens: m.max_position_embeddings,
            task: PoolingTask::Embed,
            default_pooling: PoolingType::Last,
            labels: Vec::new(),
            type_vocab_size: 1,
            weight_bytes: m.weight_bytes,
        };
        Ok(DecoderEmbedding { info, model })
    }
}

impl PoolingModel for DecoderEmbedding {
    fn info(&self) -> &PoolingInfo {
        &self.info
    }

    fn hidden_states(&self, batch: &[PoolingInput]) -> Result<Tensor> {
        let mut tokens = Vec::new();
        let mut seqs = Vec::with_capacity(batch.len());
        let mut next_block = 0u32;
        for (i, s) in batch.iter().enumerate() {
            s.check(i, self.info.max_tokens)?;
            if s.type_ids.as_ref().is_some_and(|t| t.iter().any(|&x| x != 0)) {
                return Err(ModelError::InvalidInput(format!("{} has no token types", self.info.architecture)));
            }
            if let Some(&bad) = s.ids.iter().find(|&&id| id as usize >= self.info.vocab_size) {
                return Err(ModelError::InvalidInput(format!("token id {bad} is out of vocabulary")));
            }
            let blocks = s.ids.len().div_ceil(DECODER_BLOCK) as u32;
            seqs.push(AttnSeq {
                q_start: tokens.len(),
                q_len: s.ids.len(),
                ctx_len: s.ids.len(),
                block_table: (next_block..next_block + blocks).collect(),
            });
            next_block += blocks;
            tokens.extend_from_slice(&s.ids);
        }
        let meta = AttnMetadata::new(seqs, DECODER_BLOCK)?;
        let mut kv: Vec<PagedKvLayer> = self
            .model
            .info()
            .kv_layers
            .iter()
            .map(|l| PagedKvLayer::new_cpu(next_block as usize, DECODER_BLOCK, l.num_kv_heads, l.k_dim, l.v_dim))
            .collect();
        let all: Vec<usize> = (0..tokens.len()).collect();
        self.model
            .hidden_states(&ForwardInput { tokens: &tokens, meta: &meta, logit_rows: &all, embeds: None }, &mut kv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_transformers_pooling_modes() {
        let legacy = serde_json::json!({"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true});
        assert_eq!(st_pooling_mode(&legacy), Ok(PoolingType::Mean));
        assert_eq!(st_pooling_mode(&serde_json::json!({"pooling_mode": "lasttoken"})), Ok(PoolingType::Last));
        assert_eq!(st_pooling_mode(&serde_json::json!({"pooling_mode": ["cls"]})), Ok(PoolingType::Cls));
        assert!(st_pooling_mode(&serde_json::json!({"pooling_mode_max_tokens": true})).is_err());
        assert!(st_pooling_mode(&serde_json::json!({"pooling_mode": ["cls", "mean"]})).is_err());
    }

    #[test]
    fn pooling_picks_rows_and_means() {
        let h = Tensor::from_f32(vec![1., 2., 3., 4., 5., 6., 7., 8., 9., 10.], &[5, 2]).unwrap();
        let lens = [2, 3];
        assert_eq!(pool(&h, &lens, PoolingType::Cls).unwrap().to_f32_vec(), vec![1., 2., 5., 6.]);
        assert_eq!(pool(&h, &lens, PoolingType::Last).unwrap().to_f32_vec(), vec![3., 4., 9., 10.]);
        assert_eq!(pool(&h, &lens, PoolingType::Mean).unwrap().to_f32_vec(), vec![2., 3., 7., 8.]);
        assert!(pool(&h, &[2, 2], PoolingType::Cls).is_err());
    }

    #[test]
    fn matryoshka_rules() {
        let mut p = PoolerConfig {
            pooling: PoolingType::Mean,
            normalize: true,
            matryoshka: Matryoshka::Unsupported,
            max_seq_length: None,
            source: "defaults",
        };
        assert!(p.check_dimensions("m", 8, 16).unwrap_err().contains("does not support matryoshka"));
        p.matryoshka = Matryoshka::Any;
        assert!(p.check_dimensions("m", 8, 16).is_ok());
        assert!(p.check_dimensions("m", 0, 16).is_err());
        assert!(p.check_dimensions("m", 17, 16).is_err());
        p.matryoshka = Matryoshka::Dimensions(vec![4, 8]);
        assert!(p.check_dimensions("m", 8, 16).is_ok());
        assert!(p.check_dimensions("m", 6, 16).unwrap_err().contains("only supports [4, 8]"));
    }

    #[test]
    fn activations() {
        let p = classifier_activation(&[0.0]);
        assert!((p[0] - 0.5).abs() < 1e-7);
        let p = classifier_activation(&[1.0, 1.0]);
        assert!((p[0] - 0.5).abs() < 1e-7 && (p[1] - 0.5).abs() < 1e-7);
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
    }
}
