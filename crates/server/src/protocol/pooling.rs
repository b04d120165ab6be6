//! The pooling endpoints' wire format as vLLM speaks it: `/v1/embeddings` (OpenAI), `/score`,
//! `/rerank` (Jina / Cohere shape) and `/classify`.

use serde::{Deserialize, Serialize};

use super::Usage;

/// The `{"object": "list", "data": [...]}` body embeddings, score and classify answer with.
#[derive(Debug, Clone, Serialize)]
pub struct ListResponse<T> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub data: Vec<T>,
    pub usage: Usage,
}

/// `input`: a string, a list of strings, a list of token ids, or a list of token-id lists.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub input: Input,
    pub encoding_format: Option<String>,
    pub dimensions: Option<i64>,
    pub user: Option<String>,
    pub truncate_prompt_tokens: Option<i64>,
    pub add_special_tokens: Option<bool>,
    /// vLLM's override of the pooler's normalisation.
    pub normalize: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum EmbeddingData {
    Float(Vec<f32>),
    /// Little-endian f32 bytes, base64 (what the `openai` client asks for by default).
    Base64(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct Embedding {
    pub index: usize,
    pub object: &'static str,
    pub embedding: EmbeddingData,
}

/// `text_1` / `text_2`: one text or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(s) => vec![s],
            Texts::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ScoreRequest {
    pub model: Option<String>,
    pub text_1: Texts,
    pub text_2: Texts,
    pub truncate_prompt_tokens: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScoreData {
    pub index: usize,
    pub object: &'static str,
    pub score: f32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    pub documents: Vec<String>,
    /// Keep the best `top_n` (0 or absent: all).
    pub top_n: Option<i64>,
    pub return_documents: Option<bool>,
    pub truncate_prompt_tokens: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankResult {
    pub index: usize,
    pub document: Option<RerankDocument>,
    pub relevance_score: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankUsage {
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RerankResponse {
    pub id: String,
    pub model: String,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClassificationRequest {
    pub model: Option<String>,
    pub input: Input,
    pub truncate_prompt_tokens: Option<i64>,
    pub add_special_tokens: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClassificationData {
    pub index: usize,
    pub label: Option<String>,
    pub probs: Vec<f32>,
    pub num_classes: usize,
}
