//! Zamba2's hybrid layer: a transformer block whose weights several layers share runs on the
//! RMSNorm of `[hidden state, the decoder's input embeddings]` (twice the hidden size wide), the
//! layer's own linear maps its output back, and that is added to the input of the layer's Mamba2
//! mixer (behind the mixer's RMSNorm; the residual stream itself does not receive it). Each
//! invocation of a shared block brings its own low-rank adapters and keeps its own KV cache.

use ferrite_tensor::{ops, Activation, AttnMetadata, PagedKvLayer, Tensor};

use crate::layers::mamba2::Mamba2Mixer;
use crate::layers::rope::Rope;
use crate::layers::{Attention, Linear, RmsNorm};
use crate::Result;

/// A low-rank adapter `up(down(x))` (transformers' `Sequential(Linear(in, rank), Linear(rank, out))`).
#[derive(Debug, Clone)]
pub struct Lora {
    pub down: Linear,
    pub up: Linear,
}

impl Lora {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.up.forward(&self.down.forward(x)?)
    }

    fn weight_bytes(&self) -> usize {
        self.down.weight.size_in_bytes() + self.up.weight.size_in_bytes()
    }
}

/// The weights of one shared transformer block: attention from twice the hidden size, then an
/// MLP whose gate and up projections are one matrix, each behind an RMSNorm and neither with a
/// residual add.
#[derive(Debug, Clone)]
pub struct SharedBlock {
    /// Over `[hidden state, input embeddings]`.
    pub input_norm: RmsNorm,
    pub attn: Attention,
    pub ff_norm: RmsNorm,
    /// `[gate; up]`, each `intermediate` rows.
    pub gate_up: Linear,
    pub down: Linear,
    pub act: Activation,
}

impl SharedBlock {
    fn weight_bytes(&self) -> usize {
        let a = &self.attn;
        [&a.q, &a.k, &a.v, &a.o, &self.gate_up, &self.down].iter().map(|l| l.weight.size_in_bytes()).sum()
    }
}

/// One hybrid layer: its invocation of a shared block (the block's tensors are shared with the
/// other invocations, not copied), the adapters of this invocation, the layer's linear, and the
/// Mamba2 mixer behind its norm.
#[derive(Debug, Clone)]
pub struct SharedHybrid {
    pub block: SharedBlock,
    /// This invocation's adapters added to q, k and v (`use_shared_attention_adapter`).
    pub qkv_adapters: Option<Box<[Lora; 3]>>,
    /// This invocation's adapter added to `gate_up`.
    pub gate_up_adapter: Lora,
    /// Index into the decoder's rotary tables (`use_mem_rope`), else no position embedding.
    pub rope: Option<usize>,
    pub linear: Linear,
    pub mamba_norm: RmsNorm,
    pub mamba: Mamba2Mixer,
    /// The first invocation of a block counts its weights, the others only their own.
    pub counts_block: bool,
}

impl SharedHybrid {
    /// The mixer's output for residual stream `h` (the layer adds it to `h`).
    pub fn forward(
        &self,
        h: &Tensor,
        embeds: &Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        kv: &mut PagedKvLayer,
        state: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let b = &self.block;
        let x = b.input_norm.forward(&ops::concat_cols(&[h, embeds])?)?;
        let (mut q, mut k, mut v) = b.attn.project(&x)?;
        if let Some(adapters) = &self.qkv_adapters {
            let [aq, ak, av] = adapters.as_ref();
            (q, k, v) =
                (ops::add(&q, &aq.forward(&x)?)?, ops::add(&k, &ak.forward(&x)?)?, ops::add(&v, &av.forward(&x)?)?);
        }
        let a = b.ff_norm.forward(&b.attn.attend(q, k, v, rope, meta, kv)?)?;
        let gate_up = ops::add(&b.gate_up.forward(&a)?, &self.gate_up_adapter.forward(&a)?)?;
        let inter = gate_up.last_dim() / 2;
        let (gate, up) = (ops::narrow_cols(&gate_up, 0, inter)?, ops::narrow_cols(&gate_up, inter, inter)?);
        let t = self.linear.forward(&b.down.forward(&ops::act_mul(&gate, &up, b.act)?)?)?;
        let (x, _) = self.mamba_norm.forward_add(&t, h)?;
        self.mamba.forward(&x, meta, state)
    }

    pub fn weight_bytes(&self) -> usize {
        let adapters = self.qkv_adapters.as_ref().map_or(0, |a| a.iter().map(Lora::weight_bytes).sum());
        (if self.counts_block { self.block.weight_bytes() } else { 0 })
            + adapters
            + self.gate_up_adapter.weight_bytes()
            + self.linear.weight.size_in_bytes()
            + self.mamba.weight_bytes()
    }
}
