//! Model definitions: Hugging Face `config.json` parsing and weight loading (safetensors, GGUF)
//! in [`loading`], the layers decoders share in [`layers`], the one decoder every causal LM runs
//! in [`decoder`], one module per model family in [`families`], the architecture [`registry`],
//! and the pooling models (embedding, classification) in [`pooling`].

pub mod decoder;
pub mod error;
pub mod families;
pub mod layers;
pub mod loading;
pub mod model;
pub mod pooling;
pub mod registry;

pub use error::{ModelError, Result};
pub use loading::loader::{load_eagle_head, load_model, load_pooling_model, EagleVersion, LoadOptions, LoadedModel};
pub use model::{
    placeholder_runs, CausalLM, DraftHead, Encoded, ForwardInput, HiddenTap, InputEmbeds, KvLayerSpec, ModelInfo,
    StateLayerSpec, VisionEncoder, VisionInfo, Visual, VisualGrid,
};
