#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op} does not support {detail}")]
    Unsupported { op: &'static str, detail: String },
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, TensorError>;

pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> TensorError {
    TensorError::Shape { op, detail: detail.into() }
}
