use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("weights: tensor `{name}` not found (looked in {location})")]
    MissingTensor { name: String, location: String },
    #[error("weights: tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape { name: String, expected: Vec<usize>, actual: Vec<usize> },
    #[error("{path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error("unsupported architecture `{arch}`; supported: {supported}")]
    UnsupportedArchitecture { arch: String, supported: String },
    /// A request the model cannot run (an empty sequence, too many tokens, a bad token type).
    #[error("{0}")]
    InvalidInput(String),
    #[error(transparent)]
    Tensor(#[from] ferrite_tensor::TensorError),
    #[error(transparent)]
    Gguf(#[from] crate::loading::gguf::GgufError),
}

pub type Result<T> = std::result::Result<T, ModelError>;
