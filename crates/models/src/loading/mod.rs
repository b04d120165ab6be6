//! From files to a model: `config.json` ([`config`]), weight sources (sharded safetensors,
//! memory-mapped, and GGUF with its tokenizer and config rebuilt from the metadata) behind one
//! lookup by Hugging Face name ([`weights`], [`gguf`]), and the entry points that open a
//! checkpoint and build its model through the registry ([`loader`]).

pub mod config;
pub mod gguf;
pub mod loader;
pub mod quant;
pub mod weights;
