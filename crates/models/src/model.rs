use ferrite_tensor::{AttnMetadata, PagedKvLayer, Tensor};

use crate::Result;

/// Shape of one layer's paged KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayerSpec {
    pub num_kv_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
}

/// What the engine needs to know about a loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub architecture: String,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub kv_layers: Vec<KvLayerSpec>,
    /// Bytes of weights, for roofline and memory reports.
    pub weight_bytes: usize,
}

/// One forward step over a flattened batch of sequences.
pub struct ForwardInput<'a> {
    pub tokens: &'a [u32],
    pub meta: &'a AttnMetadata,
    /// Rows of the batch whose logits are wanted (usually the last token of each sequence).
    pub logit_rows: &'a [usize],
}

/// A decoder-only language model that reads and writes a paged KV cache.
pub trait CausalLM: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// Runs the model over `input.tokens`, writing their keys and values into `kv` (one entry per
    /// layer, shaped as `info().kv_layers`), and returns logits `[logit_rows.len(), vocab]` (f32).
    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor>;

    /// Whether the rotary frequencies depend on the sequence length (dynamic NTK, LongRoPE): the
    /// cached keys of a prefix then depend on the length of the sequence that wrote them, so they
    /// cannot be shared with another sequence (the engine turns prefix caching off).
    fn rotary_depends_on_length(&self) -> bool {
        false
    }

    /// A sequence length at which transformers recomputes a sequence's whole cache: the first time
    /// a sequence grows past it while at most that many tokens are cached (Phi-3's generate, where
    /// LongRoPE switches to its long factors past `original_max_position_embeddings`), so that
    /// every key is rotated with the factors of the longer sequence. `None` for most models.
    fn rotary_recompute_at(&self) -> Option<usize> {
        None
    }

    /// As [`CausalLM::forward`], but returns the final-norm hidden states of `logit_rows`
    /// (`[logit_rows.len(), hidden]`, the LM head's input) instead of logits: a decoder used as an
    /// embedding model pools these. Families that do not expose them say so.
    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let _ = (input, kv);
        Err(ferrite_tensor::TensorError::Unsupported {
            op: "hidden_states",
            detail: format!("{} (no hidden-state output yet)", self.info().architecture),
        }
        .into())
    }
}
