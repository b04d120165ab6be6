//! BERT (`BertModel`, `BertForSequenceClassification`): a bidirectional encoder of post-norm
//! blocks. Embeddings are `LayerNorm((word + token_type) + position)` with learned absolute
//! positions; each block is `h = LN(attn(h) + h)`, `h = LN(out(act(inter(h))) + h)`.
//! RoBERTa ([`super::roberta`]) is the same encoder with positions offset past the padding id.
//!
//! Sums keep the operand order of transformers' `modeling_bert.py`, so f32 results match it up
//! to accumulation order inside the matmuls.

use std::collections::BTreeMap;

use ferrite_tensor::{ops, Activation, AttentionParams, Tensor};
use serde::Deserialize;

use crate::layers::{Embedding, LayerNorm, Linear};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::pooling::{PoolingInfo, PoolingInput, PoolingModel, PoolingTask, PoolingType};
use crate::Result;

fn default_eps() -> f64 {
    1e-12
}
fn default_type_vocab() -> usize {
    2
}
fn default_act() -> String {
    "gelu".into()
}
fn default_position_type() -> String {
    "absolute".into()
}

/// The `config.json` fields of BERT-style encoders (BERT, RoBERTa, XLM-RoBERTa).
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    pub pad_token_id: Option<u32>,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
    /// Classifier labels by index (`{"0": "negative", ...}`); sets the number of labels.
    pub id2label: Option<BTreeMap<String, String>>,
    pub num_labels: Option<usize>,
}

impl BertConfig {
    /// Label names in index order (`LABEL_i` where the config names none), for classifiers.
    pub fn labels(&self) -> Vec<String> {
        let n = self.id2label.as_ref().map(|m| m.len()).or(self.num_labels).unwrap_or(2);
        (0..n)
            .map(|i| {
                self.id2label
                    .as_ref()
                    .and_then(|m| m.get(&i.to_string()).cloned())
                    .unwrap_or_else(|| format!("LABEL_{i}"))
            })
            .collect()
    }
}

/// How token positions index the position table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// `0, 1, 2, ...` (BERT).
    Absolute,
    /// fairseq's `make_positions` (RoBERTa): a padding token sits at `padding_idx`, the others
    /// count from `padding_idx + 1` over the non-padding tokens.
    AfterPadding { padding_idx: u32 },
}

impl Positions {
    pub fn ids(&self, tokens: &[u32]) -> Vec<u32> {
        match *self {
            Positions::Absolute => (0..tokens.len() as u32).collect(),
            Positions::AfterPadding { padding_idx } => {
                let mut seen = 0;
                tokens
                    .iter()
                    .map(|&t| {
                        if t == padding_idx {
                            padding_idx
                        } else {
                            seen += 1;
                            padding_idx + seen
                        }
                    })
                    .collect()
            }
        }
    }

    /// Tokens a sequence may hold given `max_position_embeddings`.
    pub fn max_tokens(&self, max_position_embeddings: usize) -> usize {
        match *self {
            Positions::Absolute => max_position_embeddings,
            Positions::AfterPadding { padding_idx } => max_position_embeddings.saturating_sub(padding_idx as usize + 1),
        }
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    out_norm: LayerNorm,
}

/// The embeddings and the encoder stack: token ids in, final hidden states out.
pub struct BertEncoder {
    pub config: BertConfig,
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    params: AttentionParams,
    act: Activation,
    positions: Positions,
    weight_bytes: usize,
}

impl BertEncoder {
    /// `prefix` is the base model's name in the checkpoint (`"bert."`, `"roberta."`, or `""`
    /// for a checkpoint saved from the base class).
    pub fn load(raw: &RawConfig, w: &Weights, prefix: &str, positions: Positions) -> Result<BertEncoder> {
        let cfg: BertConfig = raw.parse()?;
        if cfg.position_embedding_type != "absolute" {
            return Err(raw.error(format!("unsupported `position_embedding_type` `{}`", cfg.position_embedding_type)));
        }
        let act = Activation::from_hf(&cfg.hidden_act)
            .ok_or_else(|| raw.error(format!("unsupported `hidden_act` `{}`", cfg.hidden_act)))?;
        let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        if heads == 0 || h % heads != 0 {
            return Err(raw.error(format!("hidden_size {h} is not a multiple of num_attention_heads {heads}")));
        }
        let head_dim = h / heads;
        let eps = cfg.layer_norm_eps;
        let e = |n: &str| format!("{prefix}embeddings.{n}");
        let word = Embedding { table: w.get(&e("word_embeddings.weight"), &[cfg.vocab_size, h])? };
        let position = Embedding { table: w.get(&e("position_embeddings.weight"), &[cfg.max_position_embeddings, h])? };
        let token_type = Embedding { table: w.get(&e("token_type_embeddings.weight"), &[cfg.type_vocab_size, h])? };
        let embed_norm = LayerNorm::load(w, &e("LayerNorm"), h, eps, true)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("{prefix}encoder.layer.{i}");
            layers.push(Layer {
                query: Linear::load(w, &format!("{p}.attention.self.query"), h, h, true)?,
                key: Linear::load(w, &format!("{p}.attention.self.key"), h, h, true)?,
                value: Linear::load(w, &format!("{p}.attention.self.value"), h, h, true)?,
                attn_out: Linear::load(w, &format!("{p}.attention.output.dense"), h, h, true)?,
                attn_norm: LayerNorm::load(w, &format!("{p}.attention.output.LayerNorm"), h, eps, true)?,
                intermediate: Linear::load(w, &format!("{p}.intermediate.dense"), h, cfg.intermediate_size, true)?,
                output: Linear::load(w, &format!("{p}.output.dense"), cfg.intermediate_size, h, true)?,
                out_norm: LayerNorm::load(w, &format!("{p}.output.LayerNorm"), h, eps, true)?,
            });
        }
        let weight_bytes =
            [&word.table, &position.table, &token_type.table].iter().map(|t| t.size_in_bytes()).sum::<usize>()
                + layers
                    .iter()
                    .map(|l| {
                        [&l.query, &l.key, &l.value, &l.attn_out, &l.intermediate, &l.output]
                            .iter()
                            .map(|x| x.weight.size_in_bytes())
                            .sum::<usize>()
                    })
                    .sum::<usize>();
        let params = AttentionParams {
            num_heads: heads,
            num_kv_heads: heads,
            head_dim,
            v_head_dim: head_dim,
            scale: (head_dim as f64).powf(-0.5) as f32,
            sliding_window: None,
            attention_chunk: None,
            softcap: None,
        };
        Ok(BertEncoder {
            config: cfg,
            word,
            position,
            token_type,
            embed_norm,
            layers,
            params,
            act,
            positions,
            weight_bytes,
        })
    }

    /// Tokens one sequence may hold.
    pub fn max_tokens(&self) -> usize {
        self.positions.max_tokens(self.config.max_position_embeddings)
    }

    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Final hidden states `[total tokens, hidden]` of the sequences, each attending only to itself.
    pub fn forward(&self, batch: &[PoolingInput]) -> Result<Tensor> {
        let max = self.max_tokens();
        let mut ids = Vec::new();
        let mut types = Vec::new();
        let mut positions = Vec::new();
        let mut lens = Vec::with_capacity(batch.len());
        for (i, seq) in batch.iter().enumerate() {
            seq.check(i, max)?;
            ids.extend_from_slice(&seq.ids);
            match &seq.type_ids {
                Some(t) => types.extend_from_slice(t),
                None => types.extend(std::iter::repeat_n(0, seq.ids.len())),
            }
            positions.extend(self.positions.ids(&seq.ids));
            lens.push(seq.ids.len());
        }
        let h = ops::add(&self.word.forward(&ids)?, &self.token_type.forward(&types)?)?;
        let h = ops::add(&h, &self.position.forward(&positions)?)?;
        let mut h = self.embed_norm.forward(&h)?;
        for l in &self.layers {
            let (q, k, v) = (l.query.forward(&h)?, l.key.forward(&h)?, l.value.forward(&h)?);
            let a = ops::attention_dense(&q, &k, &v, &self.params, &lens, false)?;
            let a = l.attn_out.forward(&a)?;
            h = l.attn_norm.forward(&ops::add(&a, &h)?)?;
            let x = ops::activation(&l.intermediate.forward(&h)?, self.act)?;
            let x = l.output.forward(&x)?;
            h = l.out_norm.forward(&ops::add(&x, &h)?)?;
        }
        Ok(h)
    }
}

/// The base model's prefix in a checkpoint: `"<family>."` when it was saved from a task class
/// (`BertForSequenceClassification` keeps `bert.embeddings...`), else none.
pub fn base_prefix(w: &Weights, family: &str) -> String {
    if w.contains(&format!("{family}.embeddings.word_embeddings.weight")) {
        format!("{family}.")
    } else {
        String::new()
    }
}

fn info(
    raw: &RawConfig,
    enc: &BertEncoder,
    task: PoolingTask,
    pooling: PoolingType,
    labels: Vec<String>,
    extra: usize,
) -> Result<PoolingInfo> {
    Ok(PoolingInfo {
        architecture: raw.architecture()?,
        hidden_size: enc.config.hidden_size,
        vocab_size: enc.config.vocab_size,
        max_tokens: enc.max_tokens(),
        task,
        default_pooling: pooling,
        labels,
        type_vocab_size: enc.config.type_vocab_size,
        weight_bytes: enc.weight_bytes() + extra,
    })
}

/// `BertModel` as an embedding model: the pooling comes from the checkpoint's
/// sentence-transformers config, CLS where it has none (as vLLM's `BertEmbeddingModel`).
pub struct BertModel {
    info: PoolingInfo,
    encoder: BertEncoder,
}

impl BertModel {
    pub fn load(raw: &RawConfig, w: &Weights, family: &str, positions: Positions) -> Result<BertModel> {
        let encoder = BertEncoder::load(raw, w, &base_prefix(w, family), positions)?;
        let info = info(raw, &encoder, PoolingTask::Embed, PoolingType::Cls, Vec::new(), 0)?;
        Ok(BertModel { info, encoder })
    }
}

impl PoolingModel for BertModel {
    fn info(&self) -> &PoolingInfo {
        &self.info
    }

    fn hidden_states(&self, batch: &[PoolingInput]) -> Result<Tensor> {
        self.encoder.forward(batch)
    }
}

/// `BertForSequenceClassification` (cross-encoders such as ms-marco-MiniLM): the [CLS] state
/// through `pooler.dense` and tanh (BERT's pooler), then the classifier.
pub struct BertForSequenceClassification {
    info: PoolingInfo,
    encoder: BertEncoder,
    pooler: Linear,
    classifier: Linear,
}

impl BertForSequenceClassification {
    pub fn load(raw: &RawConfig, w: &Weights) -> Result<BertForSequenceClassification> {
        let prefix = base_prefix(w, "bert");
        let encoder = BertEncoder::load(raw, w, &prefix, Positions::Absolute)?;
        let h = encoder.config.hidden_size;
        let labels = encoder.config.labels();
        let pooler = Linear::load(w, &format!("{prefix}pooler.dense"), h, h, true)?;
        let classifier = Linear::load(w, "classifier", h, labels.len(), true)?;
        let extra = pooler.weight.size_in_bytes() + classifier.weight.size_in_bytes();
        let info = info(raw, &encoder, PoolingTask::Classify, PoolingType::Cls, labels, extra)?;
        Ok(BertForSequenceClassification { info, encoder, pooler, classifier })
    }
}

impl PoolingModel for BertForSequenceClassification {
    fn info(&self) -> &PoolingInfo {
        &self.info
    }

    fn hidden_states(&self, batch: &[PoolingInput]) -> Result<Tensor> {
        self.encoder.forward(batch)
    }

    fn head(&self, pooled: &Tensor) -> Result<Tensor> {
        // tanh(x) as `1 * tanh(x / 1)`.
        let x = ops::softcap(&self.pooler.forward(pooled)?, 1.0)?;
        self.classifier.forward(&x)
    }
}

#[cfg(test)]
mod tests {
    use super::Positions;

    #[test]
    fn roberta_positions_skip_padding() {
        let p = Positions::AfterPadding { padding_idx: 1 };
        assert_eq!(p.ids(&[0, 5, 1, 9, 2]), vec![2, 3, 1, 4, 5]);
        assert_eq!(p.max_tokens(514), 512);
        assert_eq!(Positions::Absolute.ids(&[7, 7, 7]), vec![0, 1, 2]);
    }
}
