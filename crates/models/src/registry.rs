//! Architecture name (`config.json` `architectures[0]`) -> constructor, for every kind of model
//! ferrite runs: causal LMs and pooling models (embedding, classification). An alias whose
//! Hugging Face class really shares a family's computation is one line here.

use crate::families::cohere::CohereVersion;
use crate::families::deepseek_v2::{self, DeepseekVariant};
use crate::families::deepseek_v32;
use crate::families::glm::{self, GlmVariant};
use crate::families::glm4_moe;
use crate::families::hunyuan::{self, HunYuanVariant};
use crate::families::lfm2::{self, Lfm2Variant};
use crate::families::llama::{self, Variant};
use crate::families::mixtral::{self, MoeVariant};
use crate::families::olmo2::OlmoVersion;
use crate::families::qwen3_next::{self, Layout as HybridLayout, Variant::*};

use crate::families::gemma3n;
use crate::families::{
    afmoe, bert, chatglm, cohere, cohere2_moe, ernie45_moe, exaone, exaone4, falcon, falcon_h1, gemma, gemma2, gemma3,
    gemma3_vl, gemma4, gpt2, gpt_neox, gpt_oss, gptj, granite, granite_moe, internlm2, jamba, kimi_linear, llama4,
    llava, llava_next, mamba, mamba2, minicpm, minicpm3, minimax_m2, mistral3, nemotron, nemotron_h, olmo2,
    olmo_hybrid, opt, phi, phi3, phimoe, qwen2_5_vl, qwen2_vl, qwen3_vl, roberta, stablelm, starcoder2, zamba2,
};
use crate::families::{eagle, eagle3};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{CausalLM, DraftHead};
use crate::pooling::{DecoderEmbedding, PoolingModel};
use crate::{ModelError, Result};

pub type Constructor = fn(&RawConfig, &Weights) -> Result<Box<dyn CausalLM>>;
pub type PoolingConstructor = fn(&RawConfig, &Weights) -> Result<Box<dyn PoolingModel>>;
/// Builds a speculative-decoding draft head of its own checkpoint for the target it drafts for.
pub type DraftHeadConstructor = fn(&RawConfig, &Weights, &dyn CausalLM) -> Result<Box<dyn DraftHead>>;

/// A registered constructor, by what it builds.
#[derive(Clone, Copy)]
enum Entry {
    Causal(Constructor),
    Pooling(PoolingConstructor),
    Draft(DraftHeadConstructor),
}
use Entry::{Causal, Draft, Pooling};

impl Entry {
    fn kind(&self) -> ModelKind {
        match self {
            Causal(_) => ModelKind::CausalLM,
            Pooling(_) => ModelKind::Pooling,
            Draft(_) => ModelKind::DraftHead,
        }
    }
}

/// What a registered constructor builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A decoder producing next-token logits ([`CausalLM`]), served by the generation engine.
    CausalLM,
    /// A model mapping whole sequences to vectors ([`PoolingModel`]).
    Pooling,
    /// A speculative-decoding head on a target's hidden states ([`DraftHead`]).
    DraftHead,
}

/// Every registered (architecture, kind). A decoder that also embeds (last-token pooling) has a
/// row of each kind.
const ENTRIES: &[(&str, Entry)] = &[
    ("LlamaForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::LLAMA)?)))),
    // Served as Llama by vLLM's registry: the same checkpoints under other names.
    ("LLaMAForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::LLAMA)?)))),
    ("IQuestCoderForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::LLAMA)?)))),
    ("TeleChat3ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::LLAMA)?)))),
    ("InternLM3ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::INTERNLM3)?)))),
    ("SeedOssForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::SEED_OSS)?)))),
    ("Ernie4_5ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::ERNIE4_5)?)))),
    ("SmolLM3ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::SMOLLM3)?)))),
    ("ApertusForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::APERTUS)?)))),
    ("ArceeForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::ARCEE)?)))),
    ("Ministral3ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::MINISTRAL3)?)))),
    ("MistralForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::MISTRAL)?)))),
    ("Qwen2ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::QWEN2)?)))),
    ("Qwen3ForCausalLM", Causal(|r, w| Ok(Box::new(llama::load(r, w, Variant::QWEN3)?)))),
    ("MixtralForCausalLM", Causal(|r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::MIXTRAL)?)))),
    ("Qwen2MoeForCausalLM", Causal(|r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::QWEN2_MOE)?)))),
    ("Qwen3MoeForCausalLM", Causal(|r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::QWEN3_MOE)?)))),
    ("Qwen3NextForCausalLM", Causal(|r, w| Ok(Box::new(qwen3_next::load(r, w, Qwen3Next, HybridLayout::CausalLm)?)))),
    ("Qwen3_5ForCausalLM", Causal(|r, w| Ok(Box::new(qwen3_next::load(r, w, Qwen3_5, HybridLayout::CausalLm)?)))),
    ("Qwen3_5MoeForCausalLM", Causal(|r, w| Ok(Box::new(qwen3_next::load(r, w, Qwen3_5Moe, HybridLayout::CausalLm)?)))),
    ("Qwen3_5ForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen3_vl::load_qwen3_5(r, w, Qwen3_5)?)))),
    ("Qwen3_5MoeForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen3_vl::load_qwen3_5(r, w, Qwen3_5Moe)?)))),
    ("Qwen2VLForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen2_vl::load(r, w)?)))),
    ("Qwen2_5_VLForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen2_5_vl::load(r, w)?)))),
    ("Qwen3VLForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen3_vl::load(r, w)?)))),
    ("Qwen3VLMoeForConditionalGeneration", Causal(|r, w| Ok(Box::new(qwen3_vl::load_moe(r, w)?)))),
    ("LlavaForConditionalGeneration", Causal(|r, w| Ok(Box::new(llava::load(r, w)?)))),
    ("LlavaNextForConditionalGeneration", Causal(|r, w| Ok(Box::new(llava_next::load(r, w)?)))),
    ("Mistral3ForConditionalGeneration", Causal(|r, w| Ok(Box::new(mistral3::load(r, w)?)))),
    ("Gemma3ForConditionalGeneration", Causal(|r, w| Ok(Box::new(gemma3_vl::load(r, w)?)))),
    ("Gemma3nForConditionalGeneration", Causal(|r, w| Ok(Box::new(gemma3n::load_conditional(r, w)?)))),
    ("MambaForCausalLM", Causal(|r, w| Ok(Box::new(mamba::load(r, w, mamba::Variant::Mamba)?)))),
    ("FalconMambaForCausalLM", Causal(|r, w| Ok(Box::new(mamba::load(r, w, mamba::Variant::FalconMamba)?)))),
    ("Mamba2ForCausalLM", Causal(|r, w| Ok(Box::new(mamba2::load(r, w)?)))),
    ("JambaForCausalLM", Causal(|r, w| Ok(Box::new(jamba::load(r, w)?)))),
    ("FalconH1ForCausalLM", Causal(|r, w| Ok(Box::new(falcon_h1::load(r, w)?)))),
    ("Zamba2ForCausalLM", Causal(|r, w| Ok(Box::new(zamba2::load(r, w)?)))),
    ("KimiLinearForCausalLM", Causal(|r, w| Ok(Box::new(kimi_linear::load(r, w)?)))),
    ("ExaoneForCausalLM", Causal(|r, w| Ok(Box::new(exaone::load(r, w)?)))),
    ("OlmoHybridForCausalLM", Causal(|r, w| Ok(Box::new(olmo_hybrid::load(r, w)?)))),
    ("NemotronHForCausalLM", Causal(|r, w| Ok(Box::new(nemotron_h::load(r, w)?)))),
    ("NemotronForCausalLM", Causal(|r, w| Ok(Box::new(nemotron::load(r, w)?)))),
    ("Lfm2ForCausalLM", Causal(|r, w| Ok(Box::new(lfm2::load(r, w, Lfm2Variant::Dense)?)))),
    ("Lfm2MoeForCausalLM", Causal(|r, w| Ok(Box::new(lfm2::load(r, w, Lfm2Variant::Moe)?)))),
    ("Lfm3ForCausalLM", Causal(|r, w| Ok(Box::new(lfm2::load_lfm3(r, w)?)))),
    ("OlmoeForCausalLM", Causal(|r, w| Ok(Box::new(mixtral::load(r, w, MoeVariant::OLMOE)?)))),
    ("DeepseekV2ForCausalLM", Causal(|r, w| Ok(Box::new(deepseek_v2::load(r, w, DeepseekVariant::V2)?)))),
    ("DeepseekV3ForCausalLM", Causal(|r, w| Ok(Box::new(deepseek_v2::load(r, w, DeepseekVariant::V3)?)))),
    ("DeepseekV32ForCausalLM", Causal(|r, w| Ok(Box::new(deepseek_v32::load(r, w)?)))),
    ("GemmaForCausalLM", Causal(|r, w| Ok(Box::new(gemma::load(r, w)?)))),
    ("Gemma2ForCausalLM", Causal(|r, w| Ok(Box::new(gemma2::load(r, w)?)))),
    ("Gemma3ForCausalLM", Causal(|r, w| Ok(Box::new(gemma3::load(r, w)?)))),
    ("Gemma4ForCausalLM", Causal(|r, w| Ok(Box::new(gemma4::load(r, w)?)))),
    ("Gemma3nForCausalLM", Causal(|r, w| Ok(Box::new(gemma3n::load(r, w)?)))),
    ("Phi3ForCausalLM", Causal(|r, w| Ok(Box::new(phi3::load(r, w)?)))),
    ("PhiForCausalLM", Causal(|r, w| Ok(Box::new(phi::load(r, w)?)))),
    ("OPTForCausalLM", Causal(|r, w| Ok(Box::new(opt::load(r, w)?)))),
    ("GPT2LMHeadModel", Causal(|r, w| Ok(Box::new(gpt2::load(r, w)?)))),
    ("GPTNeoXForCausalLM", Causal(|r, w| Ok(Box::new(gpt_neox::load(r, w)?)))),
    ("GPTJForCausalLM", Causal(|r, w| Ok(Box::new(gptj::load(r, w)?)))),
    ("AfmoeForCausalLM", Causal(|r, w| Ok(Box::new(afmoe::load(r, w)?)))),
    ("Cohere2MoeForCausalLM", Causal(|r, w| Ok(Box::new(cohere2_moe::load(r, w)?)))),
    ("PhiMoEForCausalLM", Causal(|r, w| Ok(Box::new(phimoe::load(r, w)?)))),
    ("StableLmForCausalLM", Causal(|r, w| Ok(Box::new(stablelm::load(r, w)?)))),
    ("GraniteForCausalLM", Causal(|r, w| Ok(Box::new(granite::load(r, w)?)))),
    ("GraniteSWAForCausalLM", Causal(|r, w| Ok(Box::new(granite::load_swa(r, w)?)))),
    ("HyperCLOVAXForCausalLM", Causal(|r, w| Ok(Box::new(granite::load_hyperclovax(r, w)?)))),
    ("Olmo2ForCausalLM", Causal(|r, w| Ok(Box::new(olmo2::load(r, w, OlmoVersion::V2)?)))),
    ("Exaone4ForCausalLM", Causal(|r, w| Ok(Box::new(exaone4::load(r, w)?)))),
    ("Olmo3ForCausalLM", Causal(|r, w| Ok(Box::new(olmo2::load(r, w, OlmoVersion::V3)?)))),
    ("CohereForCausalLM", Causal(|r, w| Ok(Box::new(cohere::load(r, w, CohereVersion::V1)?)))),
    ("Cohere2ForCausalLM", Causal(|r, w| Ok(Box::new(cohere::load(r, w, CohereVersion::V2)?)))),
    ("Starcoder2ForCausalLM", Causal(|r, w| Ok(Box::new(starcoder2::load(r, w)?)))),
    ("FalconForCausalLM", Causal(|r, w| Ok(Box::new(falcon::load(r, w)?)))),
    ("GlmForCausalLM", Causal(|r, w| Ok(Box::new(glm::load(r, w, GlmVariant::Glm)?)))),
    ("Glm4ForCausalLM", Causal(|r, w| Ok(Box::new(glm::load(r, w, GlmVariant::Glm4)?)))),
    ("Glm4MoeForCausalLM", Causal(|r, w| Ok(Box::new(glm4_moe::load(r, w)?)))),
    ("Glm4MoeLiteForCausalLM", Causal(|r, w| Ok(Box::new(deepseek_v2::load(r, w, DeepseekVariant::Glm4MoeLite)?)))),
    ("HunYuanDenseV1ForCausalLM", Causal(|r, w| Ok(Box::new(hunyuan::load(r, w, HunYuanVariant::Dense)?)))),
    ("HunYuanMoEV1ForCausalLM", Causal(|r, w| Ok(Box::new(hunyuan::load(r, w, HunYuanVariant::Moe)?)))),
    ("GraniteMoeForCausalLM", Causal(|r, w| Ok(Box::new(granite_moe::load(r, w, granite_moe::Variant::default())?)))),
    (
        "GraniteMoeSharedForCausalLM",
        Causal(|r, w| Ok(Box::new(granite_moe::load(r, w, granite_moe::Variant::SHARED)?))),
    ),
    (
        "GraniteMoeSWAForCausalLM",
        Causal(|r, w| Ok(Box::new(granite_moe::load(r, w, granite_moe::Variant::SHARED_SWA)?))),
    ),
    (
        "GraniteMoeHybridForCausalLM",
        Causal(|r, w| Ok(Box::new(granite_moe::load(r, w, granite_moe::Variant::HYBRID)?))),
    ),
    ("MiniMaxM2ForCausalLM", Causal(|r, w| Ok(Box::new(minimax_m2::load(r, w)?)))),
    ("Ernie4_5_MoeForCausalLM", Causal(|r, w| Ok(Box::new(ernie45_moe::load(r, w)?)))),
    ("GptOssForCausalLM", Causal(|r, w| Ok(Box::new(gpt_oss::load(r, w)?)))),
    ("MiniCPM3ForCausalLM", Causal(|r, w| Ok(Box::new(minicpm3::load(r, w)?)))),
    ("Llama4ForCausalLM", Causal(|r, w| Ok(Box::new(llama4::load(r, w)?)))),
    ("InternLM2ForCausalLM", Causal(|r, w| Ok(Box::new(internlm2::load(r, w)?)))),
    ("MiniCPMForCausalLM", Causal(|r, w| Ok(Box::new(minicpm::load(r, w)?)))),
    ("ChatGLMModel", Causal(|r, w| Ok(Box::new(chatglm::load(r, w)?)))),
    ("ChatGLMForConditionalGeneration", Causal(|r, w| Ok(Box::new(chatglm::load(r, w)?)))),
    ("BertModel", Pooling(|r, w| Ok(Box::new(bert::BertModel::load(r, w, "bert", bert::Positions::Absolute)?)))),
    ("BertForSequenceClassification", Pooling(|r, w| Ok(Box::new(bert::BertForSequenceClassification::load(r, w)?)))),
    ("RobertaModel", Pooling(|r, w| Ok(Box::new(roberta::load_model(r, w)?)))),
    ("XLMRobertaModel", Pooling(|r, w| Ok(Box::new(roberta::load_model(r, w)?)))),
    (
        "RobertaForSequenceClassification",
        Pooling(|r, w| Ok(Box::new(roberta::RobertaForSequenceClassification::load(r, w)?))),
    ),
    (
        "XLMRobertaForSequenceClassification",
        Pooling(|r, w| Ok(Box::new(roberta::RobertaForSequenceClassification::load(r, w)?))),
    ),
    ("LlamaModel", Pooling(|r, w| decoder("LlamaForCausalLM", r, w))),
    ("LlamaForCausalLM", Pooling(|r, w| decoder("LlamaForCausalLM", r, w))),
    ("Qwen3ForCausalLM", Pooling(|r, w| decoder("Qwen3ForCausalLM", r, w))),
    ("EagleLlamaForCausalLM", Draft(|r, w, target| Ok(Box::new(eagle::load(r, w, target)?)))),
    ("LlamaForCausalLMEagle3", Draft(|r, w, target| Ok(Box::new(eagle3::load(r, w, target)?)))),
    ("Eagle3LlamaForCausalLM", Draft(|r, w, target| Ok(Box::new(eagle3::load(r, w, target)?)))),
];

/// The causal LM registered as `arch`, as an embedding model.
fn decoder(arch: &str, raw: &RawConfig, weights: &Weights) -> Result<Box<dyn PoolingModel>> {
    let model = constructor(arch)?(raw, weights)?;
    Ok(Box::new(DecoderEmbedding::new(raw, model)?))
}

/// The kinds `arch` is registered under (none, one, or both for a decoder that also embeds).
pub fn kinds(arch: &str) -> Vec<ModelKind> {
    ENTRIES.iter().filter(|(n, _)| *n == arch).map(|(_, e)| e.kind()).collect()
}

/// Every architecture name that has a constructor, of either kind, sorted.
pub fn architectures() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = ENTRIES.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    names
}

fn names_of(kind: ModelKind) -> String {
    let mut names: Vec<&str> = ENTRIES.iter().filter(|(_, e)| e.kind() == kind).map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.join(", ")
}

pub fn constructor(arch: &str) -> Result<Constructor> {
    let found = ENTRIES.iter().find_map(|(n, e)| match e {
        Causal(c) if *n == arch => Some(*c),
        _ => None,
    });
    found.ok_or_else(|| {
        let mut supported = names_of(ModelKind::CausalLM);
        if kinds(arch).contains(&ModelKind::Pooling) {
            supported.push_str(&format!(" ({arch} is a pooling model: load it with `load_pooling_model`)"));
        }
        ModelError::UnsupportedArchitecture { arch: arch.to_owned(), supported }
    })
}

pub fn pooling_constructor(arch: &str) -> Result<PoolingConstructor> {
    let found = ENTRIES.iter().find_map(|(n, e)| match e {
        Pooling(c) if *n == arch => Some(*c),
        _ => None,
    });
    found.ok_or_else(|| ModelError::UnsupportedArchitecture {
        arch: arch.to_owned(),
        supported: format!("{} (as pooling models)", names_of(ModelKind::Pooling)),
    })
}

pub fn draft_head_constructor(arch: &str) -> Result<DraftHeadConstructor> {
    let found = ENTRIES.iter().find_map(|(n, e)| match e {
        Draft(c) if *n == arch => Some(*c),
        _ => None,
    });
    found.ok_or_else(|| ModelError::UnsupportedArchitecture {
        arch: arch.to_owned(),
        supported: format!("{} (as draft heads)", names_of(ModelKind::DraftHead)),
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
        assert_eq!(kinds("LlamaForCausalLMEagle3"), [ModelKind::DraftHead]);
        let err = draft_head_constructor("LlamaForCausalLM").expect_err("not a draft head").to_string();
        assert!(err.contains("Eagle3LlamaForCausalLM") && err.contains("draft heads"), "{err}");
    }
}
