//! Architecture name (`config.json` `architectures[0]`) -> constructor. An alias whose
//! Hugging Face class really shares a family's computation is one line here.

use crate::config::RawConfig;
use crate::families::{llama, qwen2, qwen3};
use crate::model::CausalLM;
use crate::weights::Weights;
use crate::{ModelError, Result};

pub type Constructor = fn(&RawConfig, &Weights) -> Result<Box<dyn CausalLM>>;

const ENTRIES: &[(&str, Constructor)] = &[
    ("LlamaForCausalLM", |r, w| Ok(Box::new(llama::LlamaModel::load(r, w, llama::Variant::default())?))),
    ("MistralForCausalLM", |r, w| {
        let variant = llama::Variant { window: llama::WindowRule::AllLayers, ..Default::default() };
        Ok(Box::new(llama::LlamaModel::load(r, w, variant)?))
    }),
    ("Qwen2ForCausalLM", |r, w| Ok(Box::new(qwen2::load(r, w)?))),
    ("Qwen3ForCausalLM", |r, w| Ok(Box::new(qwen3::load(r, w)?))),
];

/// Every architecture name that has a constructor, sorted.
pub fn architectures() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = ENTRIES.iter().map(|(n, _)| *n).collect();
    names.sort_unstable();
    names
}

pub fn constructor(arch: &str) -> Result<Constructor> {
    ENTRIES.iter().find(|(n, _)| *n == arch).map(|(_, c)| *c).ok_or_else(|| ModelError::UnsupportedArchitecture {
        arch: arch.to_owned(),
        supported: architectures().join(", "),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_architecture_lists_supported_ones() {
        let err = super::constructor("GPTBananaForCausalLM").err().expect("must be rejected").to_string();
        assert!(err.contains("GPTBananaForCausalLM") && err.contains("LlamaForCausalLM"), "{err}");
    }
}
