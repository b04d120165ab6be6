//! One decoder layer: a token mixer (how positions see each other) and a channel mixer (what each
//! position computes alone), with the family's norms and residual wiring. The layer kinds are
//! chosen per layer by the family's loader from its config, so dense, MoE, MLA and (later)
//! recurrent layers share one forward loop.

use ferrite_tensor::{ops, AttentionParams, AttnMetadata, PagedKvLayer, Tensor};

use crate::layers::gdn::GatedDeltaNet;
use crate::layers::kda::KimiDeltaAttention;
use crate::layers::mamba::MambaMixer;
use crate::layers::mamba2::Mamba2Mixer;
use crate::layers::mla::Mla;
use crate::layers::moe::SparseMoe;
use crate::layers::rope::Rope;
use crate::layers::shared_block::SharedHybrid;
use crate::layers::short_conv::ShortConv;
use crate::layers::{Attention, DenseMlp, GatedMlp, HeadLayerNorm, Linear, Norm, RmsNorm, ScaledGatedMlp};
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
    /// Per-head RMS QK-norm applied after the rotary embedding, so the cache holds normalised keys
    /// (HunYuan's `query_layernorm` / `key_layernorm`).
    pub post_rope_norms: Option<(RmsNorm, RmsNorm)>,
    /// Per-head RMS norm of the values before they are cached (Gemma 4's weightless `v_norm`).
    pub v_norm: Option<Box<RmsNorm>>,
    /// Index into the decoder's rotary tables; `None` for models with learned absolute positions.
    pub rope: Option<usize>,
    /// A learned logit per query head in each softmax denominator (gpt-oss), f32 `[heads]`.
    pub sinks: Option<Tensor>,
    /// Projects the layer input to a gate per attention output element, applied as
    /// `sigmoid(gate) * attention` before `o` (Qwen3-Next / Qwen3.5).
    pub output_gate: Option<Linear>,
}

impl SelfAttention {
    /// Plain attention on rotary table `rope`: no LayerNorm QK-norm, no query scale.
    pub fn new(attn: Attention, rope: Option<usize>) -> SelfAttention {
        SelfAttention {
            attn,
            head_norms: None,
            q_scale: None,
            post_rope_norms: None,
            v_norm: None,
            rope,
            sinks: None,
            output_gate: None,
        }
    }
}

/// Attention over the keys and values an earlier layer cached (Gemma 4's `num_kv_shared_layers`):
/// it projects queries only and has no cache of its own, so the engine sizes no KV for it.
#[derive(Debug, Clone)]
pub struct SharedKvAttention {
    pub q: Linear,
    /// Per-head RMS QK-norm of the queries (its weight spans one head).
    pub q_norm: Option<RmsNorm>,
    pub o: Linear,
    /// The source layer's parameters (heads, head size, window) with this layer's scale.
    pub params: AttentionParams,
    pub rope: Option<usize>,
    /// The layer whose cache this one reads; an earlier layer with a cache of its own.
    pub source: usize,
}

/// Falcon-H1's token mixer: attention and a Mamba2 mixer read the same normed input and their
/// outputs are summed, each branch with its muP multipliers. The layer keeps a KV cache and a
/// recurrent state.
#[derive(Debug, Clone)]
pub struct ParallelHybrid {
    pub attn: Attention,
    /// Index into the decoder's rotary tables.
    pub rope: usize,
    /// Multiplies the attention's input, its keys before the rotary embedding, and its output.
    pub attn_in: f32,
    pub key_scale: f32,
    pub attn_out: f32,
    pub ssm: Mamba2Mixer,
    /// Multiply the Mamba2 mixer's input and output.
    pub ssm_in: f32,
    pub ssm_out: f32,
}

/// `x * s`, skipped where `s` is 1 (the product would be `x` to the bit).
fn times(x: &Tensor, s: f32) -> Result<Tensor> {
    Ok(if s == 1.0 { x.clone() } else { ops::scale(x, s)? })
}

impl ParallelHybrid {
    fn forward(
        &self,
        x: &Tensor,
        rope: (&Rope, &Tensor, &Tensor),
        meta: &AttnMetadata,
        kv: &mut PagedKvLayer,
        state: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let m = times(&self.ssm.forward(&times(x, self.ssm_in)?, meta, state)?, self.ssm_out)?;
        let (q, k, v) = self.attn.project(&times(x, self.attn_in)?)?;
        let a = self.attn.attend(q, times(&k, self.key_scale)?, v, Some(rope), meta, kv)?;
        Ok(ops::add(&m, &times(&a, self.attn_out)?)?)
    }
}

/// The caches one layer reads and writes in a step: its KV cache (its own or the one it shares)
/// and its recurrent state. Falcon-H1's layers have both, other layers one or neither.
pub(crate) struct LayerCaches<'a> {
    pub kv: Option<&'a mut PagedKvLayer>,
    pub state: Option<&'a mut PagedKvLayer>,
}

impl<'a> LayerCaches<'a> {
    /// A KV cache alone (an attention layer's, or a draft head's).
    pub fn kv(kv: &'a mut PagedKvLayer) -> LayerCaches<'a> {
        LayerCaches { kv: Some(kv), state: None }
    }
}

/// How positions exchange information. Each mixer owns the cache of its layer: paged KV for
/// attention, a latent paged KV for MLA.
// One per layer, built once at load: the size difference between variants costs a few hundred
// bytes per layer, and boxing would add a pointer chase per layer per step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum TokenMixer {
    Attention(SelfAttention),
    /// Multi-head latent attention (DeepSeek-V2/V3), on rotary table `rope`; `None` leaves the
    /// rope parts unrotated (Kimi Linear's NoPE MLA).
    Latent {
        mla: Mla,
        rope: Option<usize>,
    },
    /// Reads another layer's cache and writes none.
    SharedKv(SharedKvAttention),
    /// Linear attention with a per-sequence recurrent state instead of a KV cache.
    GatedDeltaNet(Box<GatedDeltaNet>),
    /// Kimi Delta Attention: the delta rule with a decay per key channel, a per-sequence state.
    KimiDelta(Box<KimiDeltaAttention>),
    /// A selective state-space layer (Mamba 1) with a per-sequence state.
    Mamba(Box<MambaMixer>),
    /// A selective state-space layer (Mamba2) with a per-sequence state.
    Mamba2(Box<Mamba2Mixer>),
    /// A gated short convolution (LFM2) whose state is its conv's last inputs.
    ShortConv(Box<ShortConv>),
    /// Attention and a Mamba2 mixer side by side (Falcon-H1), with a KV cache and a state.
    ParallelHybrid(Box<ParallelHybrid>),
    /// A shared transformer block feeding a Mamba2 mixer (Zamba2's hybrid layers), with the
    /// invocation's KV cache and the mixer's state; it reads the decoder's input embeddings.
    SharedHybrid(Box<SharedHybrid>),
    /// The layer has no token mixer (Nemotron-H's MLP layers): the block is its channel mixer
    /// behind `mlp_norm`.
    None,
}

/// What a layer keeps between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCache {
    Kv(crate::model::KvLayerSpec),
    State(crate::model::StateLayerSpec),
    /// A KV cache and a recurrent state (Falcon-H1's parallel layers, Zamba2's hybrid ones).
    KvAndState(crate::model::KvLayerSpec, crate::model::StateLayerSpec),
    /// Another (earlier) layer's KV cache.
    Shared(usize),
    /// Nothing kept between steps.
    None,
}

/// A batch's rotary tables: the rope and its cos/sin for these positions, one entry per table.
pub(crate) type RopeTables<'a> = [(&'a Rope, Tensor, Tensor)];

impl TokenMixer {
    /// `embeds` are the decoder's input embeddings for this step (Zamba2's shared blocks read
    /// them); `None` for a draft head's block.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        embeds: Option<&Tensor>,
        ropes: &RopeTables,
        meta: &AttnMetadata,
        caches: LayerCaches,
    ) -> Result<Tensor> {
        let missing = || -> crate::ModelError {
            ferrite_tensor::TensorError::Shape {
                op: "token mixer",
                detail: "a layer that keeps a cache was given none".into(),
            }
            .into()
        };
        // A recurrent mixer runs on its state; the rest on their KV cache, Falcon-H1's on both.
        let (own, state) = match self.cache() {
            LayerCache::State(_) => (caches.state, None),
            _ => (caches.kv, caches.state),
        };
        let cache = own.ok_or_else(missing)?;
        let table = |i: usize| {
            let (rope, cos, sin) = &ropes[i];
            (*rope, cos, sin)
        };
        match self {
            TokenMixer::Attention(a) => {
                let (mut q, mut k, mut v) = a.attn.project(x)?;
                let gate = a.output_gate.as_ref().map(|g| g.forward(x)).transpose()?;
                if let Some(n) = &a.v_norm {
                    v = n.forward_heads(&v, n.weight.numel())?;
                }
                if let Some((qn, kn)) = &a.head_norms {
                    q = qn.forward(&q)?;
                    k = kn.forward(&k)?;
                }
                if let Some(s) = a.q_scale {
                    q = ops::scale(&q, s)?;
                }
                let rope = a.rope.map(table);
                if let Some((qn, kn)) = &a.post_rope_norms {
                    if let Some((rope, cos, sin)) = rope {
                        (q, k) = (rope.apply(&q, cos, sin)?, rope.apply(&k, cos, sin)?);
                    }
                    let d = a.attn.params.head_dim;
                    let (q, k) = (qn.forward_heads(&q, d)?, kn.forward_heads(&k, d)?);
                    return a.attn.attend_sinks(q, k, v, None, meta, cache, a.sinks.as_ref(), gate.as_ref());
                }
                a.attn.attend_sinks(q, k, v, rope, meta, cache, a.sinks.as_ref(), gate.as_ref())
            }
            TokenMixer::Latent { mla, rope } => mla.forward(x, rope.map(table), meta, cache),
            TokenMixer::SharedKv(s) => {
                let mut q = s.q.forward(x)?;
                if let Some(n) = &s.q_norm {
                    q = n.forward_heads(&q, n.weight.numel())?;
                }
                if let Some((rope, cos, sin)) = s.rope.map(table) {
                    q = rope.apply(&q, cos, sin)?;
                }
                s.o.forward(&ops::paged_attention(&q, cache, meta, &s.params)?)
            }
            TokenMixer::GatedDeltaNet(g) => g.forward(x, meta, cache),
            TokenMixer::KimiDelta(k) => k.forward(x, meta, cache),
            TokenMixer::Mamba(m) => m.forward(x, meta, cache),
            TokenMixer::Mamba2(m) => m.forward(x, meta, cache),
            TokenMixer::ShortConv(c) => c.forward(x, meta, cache),
            TokenMixer::ParallelHybrid(p) => p.forward(x, table(p.rope), meta, cache, state.ok_or_else(missing)?),
            TokenMixer::SharedHybrid(s) => {
                let embeds = embeds.ok_or_else(|| ferrite_tensor::TensorError::Shape {
                    op: "token mixer",
                    detail: "a shared transformer block was given no input embeddings".into(),
                })?;
                s.forward(x, embeds, s.rope.map(table), meta, cache, state.ok_or_else(missing)?)
            }
            TokenMixer::None => Err(ferrite_tensor::TensorError::Unsupported {
                op: "token mixer",
                detail: "a layer without one is its channel mixer alone (see Block::forward)".into(),
            }
            .into()),
        }
    }

    /// The cache this mixer keeps, or the layer whose KV cache it reads.
    pub fn cache(&self) -> LayerCache {
        let spec = |p: &AttentionParams| crate::model::KvLayerSpec {
            num_kv_heads: p.num_kv_heads,
            k_dim: p.head_dim,
            v_dim: p.v_head_dim,
        };
        match self {
            TokenMixer::Attention(a) => LayerCache::Kv(spec(&a.attn.params)),
            TokenMixer::Latent { mla, .. } => LayerCache::Kv(mla.kv_spec()),
            TokenMixer::SharedKv(s) => LayerCache::Shared(s.source),
            TokenMixer::GatedDeltaNet(g) => LayerCache::State(g.state_spec()),
            TokenMixer::KimiDelta(k) => LayerCache::State(k.state_spec()),
            TokenMixer::Mamba(m) => LayerCache::State(m.state_spec()),
            TokenMixer::Mamba2(m) => LayerCache::State(m.state_spec()),
            TokenMixer::ShortConv(c) => LayerCache::State(c.state_spec()),
            TokenMixer::ParallelHybrid(p) => LayerCache::KvAndState(spec(&p.attn.params), p.ssm.state_spec()),
            TokenMixer::SharedHybrid(s) => LayerCache::KvAndState(spec(&s.block.attn.params), s.mamba.state_spec()),
            TokenMixer::None => LayerCache::None,
        }
    }

    /// The KV layer of a mixer built as attention alone (a draft head's block), else `None`.
    pub fn kv_spec(&self) -> Option<crate::model::KvLayerSpec> {
        match self.cache() {
            LayerCache::Kv(spec) => Some(spec),
            _ => None,
        }
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        match self {
            TokenMixer::Attention(sa) => {
                let gate = sa.output_gate.as_ref().map_or(0, |g| g.weight.size_in_bytes());
                let a = &sa.attn;
                // Gemma 4's K = V layers hold one tensor for both.
                let v_is_k = std::ptr::eq(a.k.weight.storage(), a.v.weight.storage());
                [&a.q, &a.k, &a.o].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
                    + if v_is_k { 0 } else { a.v.weight.size_in_bytes() }
                    + gate
            }
            TokenMixer::Latent { mla, .. } => mla.weight_bytes(),
            TokenMixer::SharedKv(s) => s.q.weight.size_in_bytes() + s.o.weight.size_in_bytes(),
            TokenMixer::GatedDeltaNet(g) => g.weight_bytes(),
            TokenMixer::KimiDelta(k) => k.weight_bytes(),
            TokenMixer::Mamba(m) => m.weight_bytes(),
            TokenMixer::Mamba2(m) => m.weight_bytes(),
            TokenMixer::ShortConv(c) => c.weight_bytes(),
            TokenMixer::ParallelHybrid(p) => {
                [&p.attn.q, &p.attn.k, &p.attn.v, &p.attn.o].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
                    + p.ssm.weight_bytes()
            }
            TokenMixer::SharedHybrid(s) => s.weight_bytes(),
            TokenMixer::None => 0,
        }
    }
}

/// What each position computes on its own.
#[derive(Debug, Clone)]
pub enum ChannelMixer {
    /// `down(act(gate(x)) * up(x))`.
    Gated(GatedMlp),
    /// The same with muP multipliers on the gate and down projections (Falcon-H1).
    ScaledGated(ScaledGatedMlp),
    /// `fc2(act(fc1(x)))`.
    Dense(DenseMlp),
    /// Routed experts, plus shared ones where the family has them.
    Moe(Box<SparseMoe>),
    /// The layer has no channel mixer (Mamba2's layers are a mixer alone): the block ends after
    /// its token mixer's residual add.
    None,
}

impl ChannelMixer {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            ChannelMixer::Gated(m) => m.forward(x),
            ChannelMixer::ScaledGated(m) => m.forward(x),
            ChannelMixer::Dense(m) => m.forward(x),
            ChannelMixer::Moe(m) => m.forward(x),
            ChannelMixer::None => Err(ferrite_tensor::TensorError::Unsupported {
                op: "channel mixer",
                detail: "a layer without one is wired sequentially (it ends after its token mixer)".into(),
            }
            .into()),
        }
    }

    pub fn weight_bytes(&self) -> usize {
        match self {
            ChannelMixer::Gated(m) => m.weight_bytes(),
            ChannelMixer::ScaledGated(m) => m.mlp.weight_bytes(),
            ChannelMixer::Dense(m) => m.fc1.weight.size_in_bytes() + m.fc2.weight.size_in_bytes(),
            ChannelMixer::Moe(m) => m.weight_bytes(),
            ChannelMixer::None => 0,
        }
    }
}

/// How a block combines its token and channel mixers with the residual stream.
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
    pub mixer: TokenMixer,
    /// Normalises the attention output before it joins the residual (Gemma 2/3, OLMo-2).
    pub attn_out_norm: Option<Norm>,
    pub mlp_norm: Option<Norm>,
    pub mlp: ChannelMixer,
    pub mlp_out_norm: Option<Norm>,
    pub wiring: Wiring,
}

/// The residual stream between blocks: `h`, plus a branch output not yet added to it. The add is
/// left to whoever reads the stream next, so that it runs fused into that reader's RMSNorm (one
/// pass instead of two). `h + pending` and `pending + h` are the same bits (f32 addition
/// commutes), so the deferred add keeps every family's sum order.
pub(crate) struct Residual {
    pub h: Tensor,
    pub pending: Option<Tensor>,
}

impl Residual {
    /// The stream with its pending add done.
    pub fn settle(self) -> Result<Tensor> {
        match self.pending {
            Some(p) => Ok(ops::add(&self.h, &p)?),
            None => Ok(self.h),
        }
    }

    /// The stream settled and normalised by `norm` (fused where it is an RMSNorm): `(normed, h)`.
    pub fn settle_norm(self, norm: Option<&Norm>) -> Result<(Tensor, Tensor)> {
        match (norm, self.pending) {
            (Some(Norm::Rms(n)), Some(p)) => n.forward_add(&p, &self.h),
            (norm, pending) => {
                let h = Residual { h: self.h, pending }.settle()?;
                let x = match norm {
                    Some(n) => n.forward(&h)?,
                    None => h.clone(),
                };
                Ok((x, h))
            }
        }
    }
}

fn norm_opt(n: &Option<Norm>, x: Tensor) -> Result<Tensor> {
    match n {
        Some(n) => n.forward(&x),
        None => Ok(x),
    }
}

impl Block {
    /// A pre-norm block (Llama's): `h + attn(norm(h))`, then `h + mlp(norm(h))`.
    pub fn pre_norm(attn_norm: RmsNorm, mixer: TokenMixer, mlp_norm: RmsNorm, mlp: ChannelMixer) -> Block {
        Block {
            attn_norm: Some(Norm::Rms(attn_norm)),
            mixer,
            attn_out_norm: None,
            mlp_norm: Some(Norm::Rms(mlp_norm)),
            mlp,
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        }
    }

    /// One norm feeding the token and channel mixers side by side, their outputs summed with the
    /// residual in `sum`'s order (Phi, GPT-J, Cohere).
    pub fn parallel(norm: Norm, mixer: TokenMixer, mlp: ChannelMixer, sum: ParallelSum) -> Block {
        Block {
            attn_norm: Some(norm),
            mixer,
            attn_out_norm: None,
            mlp_norm: None,
            mlp,
            mlp_out_norm: None,
            wiring: Wiring::Parallel(sum),
        }
    }

    /// A layer that is a token mixer alone behind `norm`: `h + mixer(norm(h))` (Mamba2's layers).
    pub fn mixer_only(norm: Norm, mixer: TokenMixer) -> Block {
        Block {
            attn_norm: Some(norm),
            mixer,
            attn_out_norm: None,
            mlp_norm: None,
            mlp: ChannelMixer::None,
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        }
    }

    /// A layer that is a channel mixer alone behind `norm`: `h + mlp(norm(h))` (Nemotron-H's MLP
    /// layers).
    pub fn channel_only(norm: Norm, mlp: ChannelMixer) -> Block {
        Block {
            attn_norm: None,
            mixer: TokenMixer::None,
            attn_out_norm: None,
            mlp_norm: Some(norm),
            mlp,
            mlp_out_norm: None,
            wiring: Wiring::Sequential { residual_scale: None },
        }
    }

    pub fn weight_bytes(&self) -> usize {
        self.mixer.weight_bytes() + self.mlp.weight_bytes()
    }

    /// `embeds`: the decoder's input embeddings, for the token mixers that read them.
    pub(crate) fn forward(
        &self,
        stream: Residual,
        embeds: Option<&Tensor>,
        ropes: &RopeTables,
        meta: &AttnMetadata,
        caches: LayerCaches,
    ) -> Result<Residual> {
        if matches!(self.mixer, TokenMixer::None) {
            let (x, h) = stream.settle_norm(self.mlp_norm.as_ref())?;
            return Ok(Residual { h, pending: Some(self.mlp.forward(&x)?) });
        }
        match self.wiring {
            Wiring::Sequential { residual_scale } => {
                let (x, h) = stream.settle_norm(self.attn_norm.as_ref())?;
                self.sequential_from(&x, h, residual_scale, embeds, ropes, meta, caches)
            }
            Wiring::PostNorm => {
                let h = stream.settle()?;
                let a = self.mixer.forward(&h, embeds, ropes, meta, caches)?;
                let h = norm_opt(&self.attn_norm, ops::add(&h, &a)?)?;
                let m = self.mlp.forward(&h)?;
                Ok(Residual { h: norm_opt(&self.mlp_norm, ops::add(&h, &m)?)?, pending: None })
            }
            Wiring::Parallel(sum) => {
                let (x, h) = stream.settle_norm(self.attn_norm.as_ref())?;
                let a = self.mixer.forward(&x, embeds, ropes, meta, caches)?;
                let m = match &self.mlp_norm {
                    Some(n) => self.mlp.forward(&n.forward(&h)?)?,
                    None => self.mlp.forward(&x)?,
                };
                Ok(match sum {
                    ParallelSum::BranchesFirst => Residual { h, pending: Some(ops::add(&a, &m)?) },
                    ParallelSum::ResidualFirst => Residual { h: ops::add(&h, &a)?, pending: Some(m) },
                })
            }
        }
    }

    /// A sequential block past its input norm: the token mixer reads `x`, its output joins the
    /// residual `h`, then the channel mixer. EAGLE-3's first layer enters here, its mixer reading
    /// the normed embedding and hidden state side by side.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sequential_from(
        &self,
        x: &Tensor,
        h: Tensor,
        residual_scale: Option<f32>,
        embeds: Option<&Tensor>,
        ropes: &RopeTables,
        meta: &AttnMetadata,
        caches: LayerCaches,
    ) -> Result<Residual> {
        let branch = |out: Tensor, out_norm: &Option<Norm>| -> Result<Tensor> {
            let out = norm_opt(out_norm, out)?;
            Ok(match residual_scale {
                Some(s) => ops::scale(&out, s)?,
                None => out,
            })
        };
        let a = branch(self.mixer.forward(x, embeds, ropes, meta, caches)?, &self.attn_out_norm)?;
        if matches!(self.mlp, ChannelMixer::None) {
            return Ok(Residual { h, pending: Some(a) });
        }
        let (x, h) = Residual { h, pending: Some(a) }.settle_norm(self.mlp_norm.as_ref())?;
        let m = branch(self.mlp.forward(&x)?, &self.mlp_out_norm)?;
        Ok(Residual { h, pending: Some(m) })
    }
}
