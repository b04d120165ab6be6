//! Architecture name (`config.json` `architectures[0]`) -> constructor. An alias whose
//! Hugging Face class really shares a family's computation is one line here.

use crate::config::RawConfig;
use crate::families::deepseek_v2::{self, DeepseekVariant};
use crate::families::llama::{self, Variant};
use crate::families::mixtral::{self, MoeVariant};
use crate::families::{cohere, falcon, gemma, gemma2, gemma3, gpt2, gpt_neox, granite, olmo2, opt, phi, phi3};
use crate::families::{stablelm, starcoder2};
use crate::model::CausalLM;
use crate::weights::Weights;
use crate::{ModelError, Result};

pub type Constructor = fn(&RawConfig, &Weights) -> Result<Box<dyn CausalLM>>;

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

/// Every architecture name that has a constructor, sorted: causal LMs here, and pooling models
/// (embedding, classification) in [`crate::pooling::architectures`].
pub fn architectures() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = ENTRIES.iter().map(|(n, _)| *n).collect();
    names.extend(crate::pooling::architectures());
    names.sort_unstable();
    names.dedup();
    names
}

pub fn constructor(arch: &str) -> Result<Constructor> {
    ENTRIES.iter().find(|(n, _)| *n == arch).map(|(_, c)| *c).ok_or_else(|| {
        let mut causal: Vec<&str> = ENTRIES.iter().map(|(n, _)| *n).collect();
        causal.sort_unstable();
        let mut supported = causal.join(", ");
        if crate::pooling::constructor(arch).is_ok() {
            supported.push_str(&format!(" ({arch} is a pooling model: load it with `pooling::load_pooling_model`)"));
        }
        ModelError::UnsupportedArchitecture { arch: arch.to_owned(), supported }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_architecture_lists_supported_ones() {
        let err = super::constructor("GPTBananaForCausalLM").expect_err("must be rejected").to_string();
        assert!(err.contains("GPTBananaForCausalLM") && err.contains("LlamaForCausalLM"), "{err}");
    }
}
