//! One module per model family. Families that differ from Llama only in details (biases,
//! QK-norm, sliding windows) build the Llama decoder with a [`llama::Variant`]; families whose
//! blocks are wired differently (norm placement, parallel branches, learned positions, logit
//! scaling) map their checkpoints onto the shared [`crate::decoder::Decoder`].

pub mod bert;
pub mod cohere;
pub mod deepseek_v2;
pub mod deepseek_v3;
pub mod falcon;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod gpt2;
pub mod gpt_neox;
pub mod granite;
pub mod llama;
pub mod mixtral;
pub mod olmo2;
pub mod olmoe;
pub mod opt;
pub mod phi;
pub mod phi3;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;
pub mod roberta;
pub mod stablelm;
pub mod starcoder2;
