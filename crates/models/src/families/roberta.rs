//! RoBERTa and XLM-RoBERTa (`RobertaModel`, `XLMRobertaModel`, `*ForSequenceClassification`):
//! the BERT encoder ([`super::bert`]) with positions counted from `padding_idx + 1` (fairseq's
//! `make_positions`). XLM-RoBERTa's Hugging Face classes compute exactly what RoBERTa's do, so
//! its names are registry aliases (the oracle checks the two give bit-identical outputs).
//! The classification head reads the `<s>` state: `out_proj(tanh(dense(x)))`.

use ferrite_tensor::{ops, Tensor};

use super::bert::{base_prefix, BertEncoder, BertModel, Positions};
use crate::layers::Linear;
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::pooling::{PoolingInfo, PoolingInput, PoolingModel, PoolingTask, PoolingType};
use crate::Result;

fn positions(raw: &RawConfig) -> Result<Positions> {
    let padding_idx = raw
        .value
        .get("pad_token_id")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| raw.error("missing field `pad_token_id` (RoBERTa positions start after it)"))?;
    Ok(Positions::AfterPadding { padding_idx: padding_idx as u32 })
}

/// `RobertaModel` / `XLMRobertaModel` as an embedding model (CLS pooling unless the
/// sentence-transformers config says otherwise, as vLLM's `RobertaEmbeddingModel`).
pub fn load_model(raw: &RawConfig, w: &Weights) -> Result<BertModel> {
    BertModel::load(raw, w, "roberta", positions(raw)?)
}

pub struct RobertaForSequenceClassification {
    info: PoolingInfo,
    encoder: BertEncoder,
    dense: Linear,
    out_proj: Linear,
}

impl RobertaForSequenceClassification {
    pub fn load(raw: &RawConfig, w: &Weights) -> Result<RobertaForSequenceClassification> {
        let encoder = BertEncoder::load(raw, w, &base_prefix(w, "roberta"), positions(raw)?)?;
        let h = encoder.config.hidden_size;
        let labels = encoder.config.labels();
        let dense = Linear::load(w, "classifier.dense", h, h, true)?;
        let out_proj = Linear::load(w, "classifier.out_proj", h, labels.len(), true)?;
        let info = PoolingInfo {
            architecture: raw.architecture()?,
            hidden_size: h,
            vocab_size: encoder.config.vocab_size,
            max_tokens: encoder.max_tokens(),
            task: PoolingTask::Classify,
            default_pooling: PoolingType::Cls,
            labels,
            type_vocab_size: encoder.config.type_vocab_size,
            weight_bytes: encoder.weight_bytes() + dense.weight.size_in_bytes() + out_proj.weight.size_in_bytes(),
        };
        Ok(RobertaForSequenceClassification { info, encoder, dense, out_proj })
    }
}

impl PoolingModel for RobertaForSequenceClassification {
    fn info(&self) -> &PoolingInfo {
        &self.info
    }

    fn hidden_states(&self, batch: &[PoolingInput]) -> Result<Tensor> {
        self.encoder.forward(batch)
    }

    fn head(&self, pooled: &Tensor) -> Result<Tensor> {
        let x = ops::softcap(&self.dense.forward(pooled)?, 1.0)?;
        self.out_proj.forward(&x)
    }
}
