//! One module per model family. Families that differ from Llama only in details (biases,
//! QK-norm, sliding windows) build the Llama decoder with a [`llama::Variant`].

pub mod llama;
pub mod qwen2;
pub mod qwen3;
