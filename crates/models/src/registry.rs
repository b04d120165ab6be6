//! Architecture name (`config.json` `architectures[0]`) -> constructor, for every kind of model
//! ferrite runs: causal LMs and pooling models (embedding, classification). An alias whose
//! Hugging Face class really shares a family's computation is one line here.

use crate::config::RawConfig;
use crate::families::deepseek_v2::{self, DeepseekVariant};
use crate::families::llama::{self, Variant};
use crate::families::mixtral::{self, MoeVariant};
use crate::families::{bert, cohere, falcon, gemma, gemma2, gemma3, gpt2, gpt_neox, granite, olmo2, opt, phi, phi3};
use crate::families::{roberta, stablelm, starcoder2};
use crate::model::CausalLM;
use crate::pooling::{DecoderEmbedding, PoolingModel};
use crate::weights::Weights;
use crate::{ModelError, Result};

pub type Constructor = fn(&RawConfig, &Weights) -> Result<Box<dyn CausalLM>>;
pub type PoolingConstructor = fn(&RawConfig, &Weights) -> Result<Box<dyn PoolingModel>>;

/// What a registered constructor builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A decoder producing next-token logits ([`CausalLM`]), served by the generation engine.
    CausalLM,
    /// A model mapping whole sequences to vectors ([`PoolingModel`]).
    Pooling,
}

/// The causal-LM rows of the registry.
const ENTRIES: &[(&str, Constructor)] = &[
    ("LlamaForCausalLM", |r, w| Ok(Box::new(llama::load(r, w, Variant::default())?))),
    ("MistralForCausalLM", |r, w| Ok(Box::new(llama::load(r, w, Variant::MISTRAL)?))),
    ("Qwen2ForCausalLM", |r, w| Ok(Box::new(llama::load(r, w, Variant::QWEN2)?))),
    ("Qwen3ForCausalLM", |r, w| Ok(Box::new(llama::load(r, w, Variant::QWEN3)?))),
    ("MixtralForCausalLM", |r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::MIXTRAL)?))),
    ("Qwen2MoeForCausalLM", |r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::QWEN2_MOE)?))),
    ("Qwen3MoeForCausalLM", |r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::QWEN3_MOE)?))),
    ("OlmoeForCausalLM", |r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::OLMOE)?))),
    ("DeepseekV2ForCausalLM", |r, w| Ok(Box::new(deepseek_v2::load(r, w, DeepseekVariant::V2)?))),
    ("DeepseekV3ForCausalLM", |r, w| Ok(Box::new(deepseek_v2::load(r, w, DeepseekVariant::V3)?))),
    ("GemmaForCausalLM", |r, w| Ok(Box::new(gemma::load(r, w)?))),
    ("Gemma2ForCausalLM", |r, w| Ok(Box::new(gemma2::load(r, w)?))),
    ("Gemma3ForCausalLM", |r, w| Ok(Box::new(gemma3::load(r, w)?))),
    ("Phi3ForCausalLM", |r, w| Ok(Box::new(phi3::load(r, w)?))),
    ("PhiForCausalLM", |r, w| Ok(Box::new(phi::load(r, w)?))),
    ("OPTForCausalLM", |r, w| Ok(Box::new(opt::load(r, w)?))),
    ("GPT2LMHeadModel", |r, w| Ok(Box::new(gpt2::load(r, w)?))),
    ("GPTNeoXForCausalLM", |r, w| Ok(Box::new(gpt_neox::load(r, w)?))),
    ("StableLmForCausalLM", |r, w| Ok(Box::new(stablelm::load(r, w)?))),
    ("GraniteForCausalLM", |r, w| Ok(Box::new(granite::load(r, w)?))),
    ("Olmo2ForCausalLM", |r, w| Ok(Box::new(olmo2::load(r, w)?))),
    ("CohereForCausalLM", |r, w| Ok(Box::new(cohere::load(r, w)?))),
    ("Starcoder2ForCausalLM", |r, w| Ok(Box::new(starcoder2::load(r, w)?))),
    ("FalconForCausalLM", |r, w| Ok(Box::new(falcon::load(r, w)?))),
];

/// The pooling rows of the registry. A decoder here is built by its causal-LM row and embeds
/// with last-token pooling, so it is listed under both kinds.
const POOLING_ENTRIES: &[(&str, PoolingConstructor)] = &[
    ("BertModel", |r, w| Ok(Box::new(bert::BertModel::load(r, w, "bert", bert::Positions::Absolute)?))),
    ("BertForSequenceClassification", |r, w| Ok(Box::new(bert::BertForSequenceClassification::load(r, w)?))),
    ("RobertaModel", |r, w| Ok(Box::new(roberta::load_model(r, w)?))),
    ("XLMRobertaModel", |r, w| Ok(Box::new(roberta::load_model(r, w)?))),
    ("RobertaForSequenceClassification", |r, w| Ok(Box::new(roberta::RobertaForSequenceClassification::load(r, w)?))),
    ("XLMRobertaForSequenceClassification", |r, w| {
        Ok(Box::new(roberta::RobertaForSequenceClassification::load(r, w)?))
    }),
    ("LlamaModel", |r, w| decoder("LlamaForCausalLM", r, w)),
    ("LlamaForCausalLM", |r, w| decoder("LlamaForCausalLM", r, w)),
    ("Qwen3ForCausalLM", |r, w| decoder("Qwen3ForCausalLM", r, w)),
];

/// The causal LM registered as `arch`, as an embedding model.
fn decoder(arch: &str, raw: &RawConfig, weights: &Weights) -> Result<Box<dyn PoolingModel>> {
    let model = constructor(arch)?(raw, weights)?;
    Ok(Box::new(DecoderEmbedding::new(raw, model)?))
}

/// The kinds `arch` is registered under (none, one, or both for a decoder that also embeds).
pub fn kinds(arch: &str) -> Vec<ModelKind> {
    let causal = ENTRIES.iter().any(|(n, _)| *n == arch).then_some(ModelKind::CausalLM);
    let pooling = POOLING_ENTRIES.iter().any(|(n, _)| *n == arch).then_some(ModelKind::Pooling);
    causal.into_iter().chain(pooling).collect()
}

/// Every architecture name that has a constructor, of either kind, sorted.
pub fn architectures() -> Vec<&'static str> {
    let mut names = names(ENTRIES);
    names.extend(POOLING_ENTRIES.iter().map(|(n, _)| *n));
    names.sort_unstable();
    names.dedup();
    names
}

fn names<T>(entries: &[(&'static str, T)]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = entries.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names
}

pub fn constructor(arch: &str) -> Result<Constructor> {
    ENTRIES.iter().find(|(n, _)| *n == arch).map(|(_, c)| *c).ok_or_else(|| {
        let mut supported = names(ENTRIES).join(", ");
        if kinds(arch).contains(&ModelKind::Pooling) {
            supported.push_str(&format!(" ({arch} is a pooling model: load it with `load_pooling_model`)"));
        }
        ModelError::UnsupportedArchitecture { arch: arch.to_owned(), supported }
    })
}

pub fn pooling_constructor(arch: &str) -> Result<PoolingConstructor> {
    POOLING_ENTRIES.iter().find(|(n, _)| *n == arch).map(|(_, c)| *c).ok_or_else(|| {
        ModelError::UnsupportedArchitecture {
            arch: arch.to_owned(),
            supported: format!("{} (as pooling models)", names(POOLING_ENTRIES).join(", ")),
        }
    })
}

/// Whether `arch` is served as a pooling model by default (it has no causal-LM constructor).
pub fn is_pooling_only(arch: &str) -> bool {
    kinds(arch) == [ModelKind::Pooling]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_architecture_lists_supported_ones() {
        let err = constructor("GPTBananaForCausalLM").expect_err("must be rejected").to_string();
        assert!(err.contains("GPTBananaForCausalLM") && err.contains("LlamaForCausalLM"), "{err}");
    }

    #[test]
    fn decoders_that_embed_are_both_kinds() {
        assert_eq!(kinds("LlamaForCausalLM"), [ModelKind::CausalLM, ModelKind::Pooling]);
        assert!(is_pooling_only("BertModel") && !is_pooling_only("Qwen3ForCausalLM"));
        assert!(kinds("GPTBananaForCausalLM").is_empty());
    }
}
