//! Model definitions: Hugging Face `config.json` parsing, weight loading (safetensors, GGUF),
//! the layers decoders share, one module per model family, and the architecture registry.

pub mod config;
pub mod decoder;
pub mod error;
pub mod families;
pub mod gguf;
pub mod layers;
pub mod loader;
pub mod mla;
pub mod model;
pub mod moe;
pub mod pooling;
pub mod registry;
pub mod rope;
pub mod weights;

pub use error::{ModelError, Result};
pub use loader::{load_model, load_pooling_model, LoadOptions, LoadedModel};
pub use model::{CausalLM, ForwardInput, KvLayerSpec, ModelInfo};
