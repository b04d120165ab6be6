use ferrite_models::ModelError;
use ferrite_tensor::TensorError;
use ferrite_tokenizer::TokenizerError;

/// Everything the engine can refuse or fail with. The variants a request can cause
/// ([`EngineError::is_request_error`]) are the client's fault and map to HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid `{param}`: {message}")]
    InvalidParameter { param: &'static str, message: String },
    #[error("invalid prompt: {0}")]
    InvalidPrompt(String),
    /// A structured-output constraint that does not compile (vLLM's wording).
    #[error("Grammar error: {0}")]
    Grammar(String),
    /// The length errors use vLLM's OpenAI front-end wording, which is what clients see.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens \
         ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the \
         messages or completion.",
        prompt_tokens + max_tokens
    )]
    ContextLengthExceeded { prompt_tokens: usize, max_tokens: usize, max_model_len: usize },
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested {prompt_tokens} \
         tokens in the messages, Please reduce the length of the messages."
    )]
    PromptTooLong { prompt_tokens: usize, max_model_len: usize },
    #[error(
        "the request needs {needed_tokens} KV cache slots ({prompt_tokens} prompt + {max_tokens} completion \
         tokens) but the whole cache holds {capacity_tokens}; lower max_tokens or raise kv_cache_memory"
    )]
    CacheTooSmall { prompt_tokens: usize, max_tokens: usize, needed_tokens: usize, capacity_tokens: usize },
    #[error("This request has {inputs} inputs; the server accepts at most {limit} at once.")]
    TooManyInputs { inputs: usize, limit: usize },
    /// Admission refused: more sequences are queued than the engine takes (HTTP 503).
    #[error("The server is overloaded ({queued} sequences queued, limit {limit}); retry later.")]
    Overloaded { queued: usize, limit: usize },
    #[error("engine configuration: {0}")]
    Config(String),
    /// A pooling forward pass failed; every request in its batch gets the model's message.
    #[error("{0}")]
    BatchFailed(String),
    /// A broken invariant between the engine's parts or with the model; fails the step's requests.
    #[error("engine internal error: {0}")]
    Internal(String),
    #[error("the engine has stopped")]
    EngineStopped,
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

impl EngineError {
    /// Whether the request itself is at fault (bad parameters or a prompt that cannot fit).
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidParameter { .. }
                | EngineError::InvalidPrompt(_)
                | EngineError::Grammar(_)
                | EngineError::ContextLengthExceeded { .. }
                | EngineError::PromptTooLong { .. }
                | EngineError::CacheTooSmall { .. }
                | EngineError::TooManyInputs { .. }
        )
    }

    pub(crate) fn invalid(param: &'static str, message: impl Into<String>) -> EngineError {
        EngineError::InvalidParameter { param, message: message.into() }
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
