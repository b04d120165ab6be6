//! A decoder stack assembled from shared layers, for the families whose blocks differ from
//! Llama's only in wiring: which norms sit where (pre, post, sandwich), whether attention and MLP
//! run in sequence or in parallel, how the embedding is scaled or positioned, and what happens to
//! the logits. A family file parses its `config.json`, maps checkpoint names onto a [`Decoder`]
//! and says which wiring its Hugging Face class uses; the forward pass lives here once.
//!
//! Every sum keeps the operand order of the Hugging Face forward it mirrors (f32 addition is not
//! associative), so the CPU result matches the oracle to the last bits where it can.

use ferrite_tensor::{ops, AttnMetadata, DType, PagedKvLayer, Tensor};

use crate::layers::{Attention, Embedding, HeadLayerNorm, Linear, Mlp, Norm};
use crate::model::{CausalLM, ForwardInput, KvLayerSpec, ModelInfo};
use crate::rope::Rope;
use crate::Result;

/// Self-attention with the per-family extras around the shared [`Attention`].
#[derive(Debug, Clone)]
pub struct SelfAttention {
    /// Projections, RMS QK-norm (if any) and the attention parameters.
    pub attn: Attention,
    /// LayerNorm QK-norm over each head (StableLM, Cohere), applied after the projections.
    pub head_norms: Option<(HeadLayerNorm, HeadLayerNorm)>,
    /// Queries are multiplied by this before the product and the attention itself scales by 1 (OPT).
    pub q_scale: Option<f32>,
    /// Index into [`Decoder::ropes`]; `None` for models with learned absolute positions.
    pub rope: Option<usize>,
}

impl SelfAttention {
    /// `rope` holds the rotary table this layer uses, for this batch.
    fn forward(
        &self,
        x: &Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let (mut q, mut k, v) = self.attn.project(x)?;
        if let Some((qn, kn)) = &self.head_norms {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        if let Some(s) = self.q_scale {
            q = ops::scale(&q, s)?;
        }
        self.attn.attend(q, k, v, rope, meta, cache)
    }

    fn weight_bytes(&self) -> usize {
        let a = &self.attn;
        [&a.q, &a.k, &a.v, &a.o].iter().map(|l| l.weight.size_in_bytes()).sum()
    }
}

/// How a block combines its attention and MLP branches with the residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wiring {
    /// `h = h + s * out(attn(in(h)))`, then the same for the MLP. The optional norms give pre-norm
    /// (Llama, GPT-2), sandwich (Gemma 2/3: `in` and `out`) and post-branch norm (OLMo-2: `out` only);
    /// `s` is Granite's `residual_multiplier`.
    Sequential { residual_scale: Option<f32> },
    /// `h = attn_norm(h + attn(h))`, `h = mlp_norm(h + mlp(h))` (OPT with `do_layer_norm_before: false`).
    PostNorm,
    /// Both branches read the block input: the MLP through `mlp_norm` if it has one, else through
    /// the attention's input norm.
    Parallel(ParallelSum),
}

/// The order a parallel block adds its three terms in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParallelSum {
    /// `(attn + mlp) + h` (Phi, GPT-NeoX).
    BranchesFirst,
    /// `(h + attn) + mlp` (StableLM, Cohere).
    ResidualFirst,
}

#[derive(Debug, Clone)]
pub struct Block {
    pub attn_norm: Option<Norm>,
    pub attn: SelfAttention,
    /// Normalises the attention output before it joins the residual (Gemma 2/3, OLMo-2).
    pub attn_out_norm: Option<Norm>,
    pub mlp_norm: Option<Norm>,
    pub mlp: Mlp,
    pub mlp_out_norm: Option<Norm>,
    pub wiring: Wiring,
}

fn norm_opt(n: &Option<Norm>, x: Tensor) -> Result<Tensor> {
    match n {
        Some(n) => n.forward(&x),
        None => Ok(x),
    }
}

impl Block {
    fn forward(
        &self,
        h: Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        match self.wiring {
            Wiring::Sequential { residual_scale } => {
                let x = norm_opt(&self.attn_norm, h.clone())?;
                let mut a = norm_opt(&self.attn_out_norm, self.attn.forward(&x, rope, meta, cache)?)?;
                if let Some(s) = residual_scale {
                    a = ops::scale(&a, s)?;
                }
                let h = ops::add(&h, &a)?;
                let x = norm_opt(&self.mlp_norm, h.clone())?;
                let mut m = norm_opt(&self.mlp_out_norm, self.mlp.forward(&x)?)?;
                if let Some(s) = residual_scale {
                    m = ops::scale(&m, s)?;
                }
                Ok(ops::add(&h, &m)?)
            }
            Wiring::PostNorm => {
                let a = self.attn.forward(&h, rope, meta, cache)?;
                let h = norm_opt(&self.attn_norm, ops::add(&h, &a)?)?;
                let m = self.mlp.forward(&h)?;
                norm_opt(&self.mlp_norm, ops::add(&h, &m)?)
            }
            Wiring::Parallel(sum) => {
                let x = norm_opt(&self.attn_norm, h.clone())?;
                let a = self.attn.forward(&x, rope, meta, cache)?;
                let m = match &self.mlp_norm {
                    Some(n) => self.mlp.forward(&n.forward(&h)?)?,
                    None => self.mlp.forward(&x)?,
                };
                Ok(match sum {
                    ParallelSum::BranchesFirst => ops::add(&ops::add(&a, &m)?, &h)?,
                    ParallelSum::ResidualFirst => ops::add(&ops::add(&h, &a)?, &m)?,
                })
            }
        }
    }
}

/// Learned absolute position embeddings, looked up at `position + offset` (OPT's offset is 2).
#[derive(Debug, Clone)]
pub struct LearnedPositions {
    pub table: Tensor,
    pub offset: usize,
}

/// What the LM head's logits go through, in this order.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LogitsPost {
    /// Multiplies the logits (Cohere's `logit_scale`, `1 / logits_scaling` for Granite).
    pub scale: Option<f32>,
    /// `cap * tanh(logits / cap)` (Gemma 2's `final_logit_softcapping`).
    pub softcap: Option<f32>,
}

pub struct Decoder {
    pub info: ModelInfo,
    pub embed: Embedding,
    /// Multiplies the token embeddings (Gemma's `sqrt(hidden)`, Granite's `embedding_multiplier`).
    pub embed_scale: Option<f32>,
    /// OPT's `project_in` from `word_embed_proj_dim` to the hidden size (before positions are added).
    pub project_in: Option<Linear>,
    pub positions: Option<LearnedPositions>,
    pub blocks: Vec<Block>,
    pub final_norm: Option<Norm>,
    /// OPT's `project_out` back to `word_embed_proj_dim` (after the final norm).
    pub project_out: Option<Linear>,
    pub lm_head: Linear,
    pub logits: LogitsPost,
    /// Rotary tables the blocks index into (Gemma 3 has a local and a global one).
    pub ropes: Vec<Rope>,
}

/// A multiplier as Hugging Face applies it to a tensor of `dtype`: Gemma casts its
/// `sqrt(hidden)` normalizer to the weights' dtype (55.4256 becomes 55.5 in bf16).
pub fn scalar_in_dtype(v: f64, dtype: DType) -> f32 {
    Tensor::from_f32_as(vec![v as f32], &[1], dtype).map(|t| t.to_f32_vec()[0]).unwrap_or(v as f32)
}

impl Decoder {
    /// Fills in the model info: one KV layer per block, weight bytes from the loaded tensors.
    #[allow(clippy::too_many_arguments)]
    pub fn info_for(
        architecture: String,
        vocab_size: usize,
        max_position_embeddings: usize,
        blocks: &[Block],
        embed: &Embedding,
        lm_head: &Linear,
        extra: &[&Tensor],
    ) -> ModelInfo {
        let kv_layers = blocks
            .iter()
            .map(|b| {
                let p = &b.attn.attn.params;
                KvLayerSpec { num_kv_heads: p.num_kv_heads, k_dim: p.head_dim, v_dim: p.v_head_dim }
            })
            .collect();
        let tied = std::ptr::eq(embed.table.storage(), lm_head.weight.storage());
        let weight_bytes = embed.table.size_in_bytes()
            + if tied { 0 } else { lm_head.weight.size_in_bytes() }
            + blocks.iter().map(|b| b.attn.weight_bytes() + b.mlp.weight_bytes()).sum::<usize>()
            + extra.iter().map(|t| t.size_in_bytes()).sum::<usize>();
        ModelInfo { architecture, vocab_size, max_position_embeddings, kv_layers, weight_bytes }
    }
}

impl CausalLM for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn rotary_depends_on_length(&self) -> bool {
        self.ropes.iter().any(Rope::depends_on_length)
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let mut logits = self.lm_head.forward(&self.hidden_states(input, kv)?)?;
        if let Some(s) = self.logits.scale {
            logits = ops::scale(&logits, s)?;
        }
        if let Some(cap) = self.logits.softcap {
            logits = ops::softcap(&logits, cap)?;
        }
        Ok(logits)
    }

    /// The LM head's input: final norm (and OPT's `project_out`) of the `logit_rows`.
    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        let meta = input.meta;
        let mut h = self.embed.forward(input.tokens)?;
        let tables = self.ropes.iter().map(|r| r.cos_sin(meta, h.device())).collect::<Result<Vec<_>>>()?;
        if let Some(s) = self.embed_scale {
            h = ops::scale(&h, s)?;
        }
        if let Some(p) = &self.project_in {
            h = p.forward(&h)?;
        }
        if let Some(pos) = &self.positions {
            let ids: Vec<u32> = meta.positions().into_iter().map(|p| (p + pos.offset) as u32).collect();
            h = ops::add(&h, &ops::embedding(&pos.table, &ids)?)?;
        }
        for (block, cache) in self.blocks.iter().zip(kv.iter_mut()) {
            let rope = block.attn.rope.map(|i| (&self.ropes[i], &tables[i].0, &tables[i].1));
            h = block.forward(h, rope, meta, cache)?;
        }
        let mut h = norm_opt(&self.final_norm, ops::gather_rows(&h, input.logit_rows)?)?;
        if let Some(p) = &self.project_out {
            h = p.forward(&h)?;
        }
        Ok(h)
    }
}

/// Helpers the family loaders share.
pub mod load {
    use ferrite_tensor::{Activation, AttentionParams};

    use crate::config::RawConfig;
    use crate::layers::{Embedding, LayerNorm, Linear, RmsNorm};
    use crate::weights::Weights;
    use crate::Result;

    /// A Hugging Face activation name, or an error naming the config key.
    pub fn activation(raw: &RawConfig, key: &str, name: &str) -> Result<Activation> {
        Activation::from_hf(name).ok_or_else(|| raw.error(format!("unsupported `{key}` `{name}`")))
    }

    #[allow(clippy::manual_is_multiple_of)] // `is_multiple_of` is newer than the workspace's rust-version
    pub fn check_heads(raw: &RawConfig, heads: usize, kv_heads: usize) -> Result<()> {
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(
                raw.error(format!("num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"))
            );
        }
        Ok(())
    }

    /// `scale` is computed in f64 and rounded once, as a Python float reaches a torch f32 op.
    pub fn attention_params(
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        scale: f64,
        sliding_window: Option<usize>,
        softcap: Option<f64>,
    ) -> AttentionParams {
        AttentionParams {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            v_head_dim: head_dim,
            scale: scale as f32,
            sliding_window,
            softcap: softcap.map(|c| c as f32),
        }
    }

    /// The LM head: the input embedding when tied (or when the checkpoint has no head), else `name`.
    pub fn lm_head(w: &Weights, name: &str, embed: &Embedding, tied: bool, bias: bool) -> Result<Linear> {
        let [vocab, hidden] = [embed.table.shape()[0], embed.table.shape()[1]];
        if tied || !w.contains(&format!("{name}.weight")) {
            let bias = if bias { Some(w.get_f32(&format!("{name}.bias"), &[vocab])?) } else { None };
            return Ok(Linear { weight: embed.table.clone(), bias });
        }
        Linear::load(w, name, hidden, vocab, bias)
    }

    pub fn rms(w: &Weights, name: &str, size: usize, eps: f64) -> Result<RmsNorm> {
        RmsNorm::load(w, name, size, eps)
    }

    pub fn layer_norm(w: &Weights, name: &str, size: usize, eps: f64, bias: bool) -> Result<LayerNorm> {
        LayerNorm::load(w, name, size, eps, bias)
    }

    /// Whether layer `i` slides, from `layer_types` (`sliding_attention` / `full_attention`).
    pub fn is_sliding(raw: &RawConfig, layer_types: &[String], i: usize) -> Result<bool> {
        match layer_types.get(i).map(String::as_str) {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            Some(other) => Err(raw.error(format!("unsupported layer type `{other}` in `layer_types`"))),
            None => Err(raw.error(format!("`layer_types` has no entry for layer {i}"))),
        }
    }
}
