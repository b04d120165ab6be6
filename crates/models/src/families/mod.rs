//! One module per model family: its config mapping onto [`crate::decoder::load::CommonConfig`],
//! its checkpoint names and its quirks; the forward pass is [`crate::decoder::Decoder`]'s.
//! Families that differ from another only in details (Mistral, Qwen2/3 from Llama; the MoE
//! families from Mixtral; DeepSeek-V3 from V2) are a variant of it, named in the registry.

pub mod bert;
pub mod chatglm;
pub mod cohere;
pub mod deepseek_v2;
pub mod eagle;
pub mod eagle3;
pub mod ernie45_moe;
pub mod exaone;
pub mod exaone4;
pub mod falcon;
pub mod falcon_h1;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod gemma3_vl;
pub mod gemma4;
pub mod glm;
pub mod glm4_moe;
pub mod gpt2;
pub mod gpt_neox;
pub mod gpt_oss;
pub mod granite;
pub mod granite_moe;
pub mod hunyuan;
pub mod internlm2;
pub mod jamba;
pub mod kimi_linear;
pub mod lfm2;
pub mod llama;
pub mod llama4;
pub mod llava;
pub mod mamba;
pub mod mamba2;
pub mod minicpm;
pub mod minicpm3;
pub mod minimax_m2;
pub mod mixtral;
pub mod nemotron;
pub mod nemotron_h;
pub mod olmo2;
pub mod olmo_hybrid;
pub mod opt;
pub mod phi;
pub mod phi3;
pub mod qwen2_5_vl;
pub mod qwen2_vl;
pub mod qwen3_next;
pub mod qwen3_vl;
pub mod roberta;
pub mod stablelm;
pub mod starcoder2;
pub mod zamba2;
