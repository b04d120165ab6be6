//! The decoder every causal-LM family runs: embeddings, a stack of [`Block`]s (each a token mixer
//! plus a channel mixer, see [`block`]), the final norm and the LM head. A family file parses its
//! `config.json` (through [`load::CommonConfig`] for the keys most share), names its checkpoint
//! tensors and says which layer kinds and wiring its Hugging Face class uses; the forward pass
//! lives here once.
//!
//! Every sum keeps the operand order of the Hugging Face forward it mirrors (f32 addition is not
//! associative), so the CPU result matches the oracle to the last bits where it can. Residual adds
//! run fused into the RMSNorm that reads them next ([`block::Residual`]).

pub mod block;
pub mod load;
pub mod per_layer;

use ferrite_tensor::kv::Fp8KvScales;
use ferrite_tensor::{ops, DType, PagedKvLayer, Tensor};

pub use self::block::{
    Block, ChannelMixer, LayerCache, ParallelHybrid, ParallelSum, SelfAttention, SharedKvAttention, TokenMixer, Wiring,
};
use self::block::{LayerCaches, Residual};
use self::per_layer::PerLayerInputs;
use crate::layers::rope::Rope;
use crate::layers::{Embedding, Linear, Norm};
use crate::model::{CausalLM, DraftHead, ForwardInput, HiddenTap, InputEmbeds, KvLayerSpec, ModelInfo};
use crate::Result;

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
    info: ModelInfo,
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
    /// Gemma 4's per-layer inputs, added to the stream after each block.
    pub per_layer: Option<PerLayerInputs>,
    /// Multiplies the stream after each block (and its per-layer input), one factor per block
    /// (Gemma 4's `layer_scalar`).
    pub layer_scales: Option<Vec<f32>>,
    /// The checkpoint's multi-token-prediction head, when asked for.
    pub mtp: Option<Mtp>,
}

/// A multi-token-prediction head's own weights, as vLLM reads them: `norm(block(fc([norm_e(
/// embed(next)), norm_h(hidden)])))`, then an LM head. The decoder supplies the embeddings and
/// the rotary tables. Qwen3-Next's and Qwen3.5's `mtp.*` use the decoder's LM head and feed the
/// normed output back for a further draft; DeepSeek's extra layer (`eh_proj`, `enorm`, `hnorm`,
/// `shared_head`) has its own head, zeroes the embedding at position 0 and feeds back the
/// stream before its norm.
pub struct Mtp {
    pub norm_embedding: Norm,
    pub norm_hidden: Norm,
    /// `[embedding, hidden]` (twice the hidden size) to the hidden size.
    pub fc: Linear,
    pub block: Block,
    pub norm: Norm,
    /// Its own LM head (`None`: the decoder's).
    pub head: Option<Linear>,
    pub zero_first_embedding: bool,
    pub feeds_back_normed: bool,
}

/// A multiplier as Hugging Face applies it to a tensor of `dtype`: Gemma casts its
/// `sqrt(hidden)` normalizer to the weights' dtype (55.4256 becomes 55.5 in bf16).
pub fn scalar_in_dtype(v: f64, dtype: DType) -> f32 {
    Tensor::from_f32_as(vec![v as f32], &[1], dtype.of_values()).map(|t| t.to_f32_vec()[0]).unwrap_or(v as f32)
}

impl Decoder {
    /// A decoder with no embedding scale, projections, learned positions or logit processing;
    /// the `with_*` methods add those.
    pub fn new(
        architecture: String,
        max_position_embeddings: usize,
        embed: Embedding,
        blocks: Vec<Block>,
        final_norm: Option<Norm>,
        lm_head: Linear,
        ropes: Vec<Rope>,
    ) -> Decoder {
        let info = ModelInfo {
            architecture,
            vocab_size: lm_head.out_features(),
            max_position_embeddings,
            kv_layers: blocks
                .iter()
                .filter_map(|b| match b.mixer.cache() {
                    LayerCache::Kv(spec) | LayerCache::KvAndState(spec, _) => Some(spec),
                    _ => None,
                })
                .collect(),
            kv_scales: Vec::new(),
            state_layers: blocks
                .iter()
                .filter_map(|b| match b.mixer.cache() {
                    LayerCache::State(spec) | LayerCache::KvAndState(_, spec) => Some(spec),
                    _ => None,
                })
                .collect(),
            num_layers: blocks.len(),
            weight_bytes: 0,
            vision: None,
        };
        let mut d = Decoder {
            info,
            embed,
            embed_scale: None,
            project_in: None,
            positions: None,
            blocks,
            final_norm,
            project_out: None,
            lm_head,
            logits: LogitsPost::default(),
            ropes,
            per_layer: None,
            layer_scales: None,
            mtp: None,
        };
        d.count_weights();
        d
    }

    /// Adds the multi-token-prediction head, if one was loaded; its block must be an attention
    /// layer with a KV cache.
    pub fn with_mtp(mut self, mtp: Option<Mtp>) -> Result<Decoder> {
        let Some(mtp) = mtp else { return Ok(self) };
        if !matches!(mtp.block.mixer.cache(), LayerCache::Kv(_)) {
            return Err(ferrite_tensor::TensorError::Shape {
                op: "mtp",
                detail: "the MTP block is not an attention layer with a KV cache".into(),
            }
            .into());
        }
        self.mtp = Some(mtp);
        self.count_weights();
        Ok(self)
    }

    /// The checkpoint's FP8 KV-cache scales, one entry per KV layer (see [`ModelInfo::kv_scales`]).
    pub fn with_kv_scales(mut self, scales: Vec<Option<Fp8KvScales>>) -> Decoder {
        self.info.kv_scales = scales;
        self
    }

    pub fn with_embed_scale(mut self, scale: f32) -> Decoder {
        self.embed_scale = Some(scale);
        self
    }

    pub fn with_logits(mut self, logits: LogitsPost) -> Decoder {
        self.logits = logits;
        self
    }

    pub fn with_positions(mut self, positions: LearnedPositions) -> Decoder {
        self.positions = Some(positions);
        self.count_weights();
        self
    }

    pub fn with_projections(mut self, project_in: Option<Linear>, project_out: Option<Linear>) -> Decoder {
        (self.project_in, self.project_out) = (project_in, project_out);
        self.count_weights();
        self
    }

    pub fn with_per_layer(mut self, per_layer: Option<PerLayerInputs>, layer_scales: Option<Vec<f32>>) -> Decoder {
        (self.per_layer, self.layer_scales) = (per_layer, layer_scales);
        self.count_weights();
        self
    }

    fn cache_slots(&self, caches: usize) -> Result<Vec<[Option<usize>; 2]>> {
        cache_slots(&self.blocks.iter().map(|b| b.mixer.cache()).collect::<Vec<_>>(), caches)
    }

    fn count_weights(&mut self) {
        let tied = std::ptr::eq(self.embed.table.storage(), self.lm_head.weight.storage());
        let extra = [self.positions.as_ref().map(|p| &p.table)]
            .into_iter()
            .chain([&self.project_in, &self.project_out].map(|p| p.as_ref().map(|l| &l.weight)))
            .flatten();
        self.info.weight_bytes = self.embed.table.size_in_bytes()
            + if tied { 0 } else { self.lm_head.weight.size_in_bytes() }
            + self.blocks.iter().map(Block::weight_bytes).sum::<usize>()
            + extra.map(Tensor::size_in_bytes).sum::<usize>()
            + self.per_layer.as_ref().map_or(0, PerLayerInputs::weight_bytes)
            + self.mtp.as_ref().map_or(0, |m| {
                m.fc.weight.size_in_bytes()
                    + m.block.weight_bytes()
                    + m.head.as_ref().map_or(0, |h| h.weight.size_in_bytes())
            });
    }

    /// The LM head and its logit processing over final hidden states.
    fn logits_of(&self, h: &Tensor) -> Result<Tensor> {
        let mut logits = self.lm_head.forward(h)?;
        if let Some(s) = self.logits.scale {
            logits = ops::scale(&logits, s)?;
        }
        if let Some(cap) = self.logits.softcap {
            logits = ops::softcap(&logits, cap)?;
        }
        Ok(logits)
    }

    fn rope_tables(
        &self,
        meta: &ferrite_tensor::AttnMetadata,
        device: ferrite_tensor::Device,
    ) -> Result<Vec<(&Rope, Tensor, Tensor)>> {
        self.ropes.iter().map(|r| r.cos_sin(meta, device).map(|(cos, sin)| (r, cos, sin))).collect()
    }
}

impl DraftHead for Decoder {
    fn kv_layer(&self) -> KvLayerSpec {
        match self.mtp.as_ref().map(|m| m.block.mixer.cache()) {
            Some(LayerCache::Kv(spec)) => spec,
            // `with_mtp` admits attention blocks only, and `mtp()` hands out heads that exist.
            _ => unreachable!("an MTP head without an attention cache"),
        }
    }

    fn hidden_tap(&self) -> HiddenTap {
        HiddenTap::Final
    }

    fn forward(
        &self,
        next_tokens: &[u32],
        hidden: &Tensor,
        meta: &ferrite_tensor::AttnMetadata,
        logit_rows: &[usize],
        kv: &mut PagedKvLayer,
    ) -> Result<(Tensor, Tensor)> {
        let mtp = self.mtp.as_ref().ok_or_else(|| ferrite_tensor::TensorError::Unsupported {
            op: "mtp",
            detail: format!("{} was loaded without its MTP head", self.info.architecture),
        })?;
        let mut e = self.embed.forward(next_tokens)?;
        if let Some(s) = self.embed_scale {
            e = ops::scale(&e, s)?;
        }
        if mtp.zero_first_embedding {
            let first: Vec<usize> =
                (meta.positions().into_iter().enumerate()).filter_map(|(row, p)| (p == 0).then_some(row)).collect();
            if !first.is_empty() {
                let zeros = ops::scale(&ops::gather_rows(&e, &first)?, 0.0)?;
                e = merge_rows(&e, &InputEmbeds { rows: first, values: zeros, deepstack: Vec::new() })?;
            }
        }
        let joined = ops::concat_cols(&[
            &mtp.norm_embedding.forward(&e)?,
            &mtp.norm_hidden.forward(&hidden.to_dtype(e.dtype()))?,
        ])?;
        let tables = self.rope_tables(meta, e.device())?;
        let stream = Residual { h: mtp.fc.forward(&joined)?, pending: None };
        let stream = mtp.block.forward(stream, None, &tables, meta, LayerCaches::kv(kv))?;
        let (normed, stream) = stream.settle_norm(Some(&mtp.norm))?;
        let rows = ops::gather_rows(&normed, logit_rows)?;
        let logits = match &mtp.head {
            Some(head) => head.forward(&rows)?,
            None => self.logits_of(&rows)?,
        };
        Ok((logits, if mtp.feeds_back_normed { normed } else { stream }))
    }
}

/// The caches each layer (by what it keeps, `layers`) reads, as indices into a forward's
/// `caches`: its KV cache (its own, in layer order, or its source's for a layer that shares
/// another's keys and values) and its recurrent state layer (after all KV layers).
pub(crate) fn cache_slots(layers: &[LayerCache], caches: usize) -> Result<Vec<[Option<usize>; 2]>> {
    let num_kv = layers.iter().filter(|c| matches!(c, LayerCache::Kv(_) | LayerCache::KvAndState(..))).count();
    let mut slots: Vec<[Option<usize>; 2]> = Vec::with_capacity(layers.len());
    let (mut kv, mut state) = (0, 0);
    for (i, cache) in layers.iter().enumerate() {
        let slot = match *cache {
            LayerCache::Shared(src) if src < i && matches!(layers[src], LayerCache::Kv(_)) => [slots[src][0], None],
            LayerCache::Shared(src) => {
                return Err(ferrite_tensor::TensorError::Shape {
                    op: "kv sharing",
                    detail: format!("layer {i} reads layer {src}, which is not an earlier layer with a KV cache"),
                }
                .into())
            }
            LayerCache::Kv(_) => {
                kv += 1;
                [Some(kv - 1), None]
            }
            LayerCache::State(_) => {
                state += 1;
                [None, Some(num_kv + state - 1)]
            }
            LayerCache::KvAndState(..) => {
                (kv, state) = (kv + 1, state + 1);
                [Some(kv - 1), Some(num_kv + state - 1)]
            }
            LayerCache::None => [None, None],
        };
        slots.push(slot);
    }
    if kv + state != caches {
        return Err(ferrite_tensor::TensorError::Shape {
            op: "forward",
            detail: format!("{caches} caches for a model with {kv} KV and {state} recurrent layers"),
        }
        .into());
    }
    Ok(slots)
}

/// The caches at `[kv, state]` in `caches`; a state slot lies after every KV slot.
pub(crate) fn layer_caches(caches: &mut [PagedKvLayer], [kv, state]: [Option<usize>; 2]) -> LayerCaches<'_> {
    match (kv, state) {
        (Some(k), Some(s)) => {
            let (before, from_state) = caches.split_at_mut(s);
            LayerCaches { kv: Some(&mut before[k]), state: Some(&mut from_state[0]) }
        }
        (Some(k), None) => LayerCaches::kv(&mut caches[k]),
        (None, s) => LayerCaches { kv: None, state: s.map(|s| &mut caches[s]) },
    }
}

/// `h` with the rows `embeds` names replaced by its values (in `h`'s dtype).
fn merge_rows(h: &Tensor, embeds: &InputEmbeds) -> Result<Tensor> {
    let n = h.rows();
    if embeds.values.rows() != embeds.rows.len() || embeds.values.last_dim() != h.last_dim() {
        return Err(ferrite_tensor::TensorError::Shape {
            op: "input embeddings",
            detail: format!("{:?} for {} rows of width {}", embeds.values.shape(), embeds.rows.len(), h.last_dim()),
        }
        .into());
    }
    let values = embeds.values.to_dtype(h.dtype());
    let stacked = ops::concat_rows(&[h, &values])?;
    let mut index: Vec<usize> = (0..n).collect();
    for (k, &row) in embeds.rows.iter().enumerate() {
        *index.get_mut(row).ok_or_else(|| ferrite_tensor::TensorError::Shape {
            op: "input embeddings",
            detail: format!("row {row} of a {n}-token step"),
        })? = n + k;
    }
    Ok(ops::gather_rows(&stacked, &index)?)
}

/// `h` with `values` (`[rows.len(), width]`) added to its rows `rows`: DeepStack's
/// `hidden_states[visual_pos_masks] + visual_embeds`.
fn add_rows(h: &Tensor, rows: &[usize], values: &Tensor) -> Result<Tensor> {
    let sum = ops::add(&ops::gather_rows(h, rows)?, &values.to_dtype(h.dtype()))?;
    merge_rows(h, &InputEmbeds { rows: rows.to_vec(), values: sum, deepstack: Vec::new() })
}

impl CausalLM for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn rotary_depends_on_length(&self) -> bool {
        self.ropes.iter().any(Rope::depends_on_length)
    }

    fn rotary_recompute_at(&self) -> Option<usize> {
        self.ropes.iter().filter_map(Rope::long_factors_past).min()
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.logits_of(&self.hidden_states(input, kv)?)
    }

    fn forward_with_hidden(
        &self,
        input: &ForwardInput<'_>,
        kv: &mut [PagedKvLayer],
        tap: &HiddenTap,
    ) -> Result<(Tensor, Tensor)> {
        let rows: Vec<usize> = (0..input.tokens.len()).collect();
        let every_row =
            ForwardInput { tokens: input.tokens, meta: input.meta, logit_rows: &rows, embeds: input.embeds };
        let layers = match tap {
            HiddenTap::Final => &[][..],
            HiddenTap::LayerInputs(layers) => layers.as_slice(),
        };
        if let Some(&bad) = layers.iter().find(|&&l| l >= self.blocks.len()) {
            return Err(ferrite_tensor::TensorError::Shape {
                op: "hidden states",
                detail: format!("the input of layer {bad} of a {}-layer model", self.blocks.len()),
            }
            .into());
        }
        let mut inputs = Vec::with_capacity(layers.len());
        let last = self.hidden_states_observed(&every_row, kv, &mut |i, stream| {
            if layers.contains(&i) {
                inputs.push(match &stream.pending {
                    Some(p) => ops::add(&stream.h, p)?,
                    None => stream.h.clone(),
                });
            }
            Ok(())
        })?;
        let logits = self.logits_of(&ops::gather_rows(&last, input.logit_rows)?)?;
        let hidden = match tap {
            HiddenTap::Final => last,
            HiddenTap::LayerInputs(_) => ops::concat_cols(&inputs.iter().collect::<Vec<_>>())?,
        };
        Ok((logits, hidden))
    }

    fn mtp(&self) -> Option<&dyn DraftHead> {
        self.mtp.as_ref().map(|_| self as &dyn DraftHead)
    }

    fn token_embedding(&self) -> Option<&Embedding> {
        Some(&self.embed)
    }

    fn lm_head(&self) -> Option<&Linear> {
        Some(&self.lm_head)
    }

    /// The LM head's input: final norm (and OPT's `project_out`) of the `logit_rows`.
    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.hidden_states_observed(input, kv, &mut |_, _| Ok(()))
    }
}

impl Decoder {
    /// [`CausalLM::hidden_states`], showing `observe` the residual stream entering each layer.
    fn hidden_states_observed(
        &self,
        input: &ForwardInput<'_>,
        kv: &mut [PagedKvLayer],
        observe: &mut dyn FnMut(usize, &Residual) -> Result<()>,
    ) -> Result<Tensor> {
        let meta = input.meta;
        let mut h = self.embed.forward(input.tokens)?;
        let tables = self.rope_tables(meta, h.device())?;
        if let Some(s) = self.embed_scale {
            h = ops::scale(&h, s)?;
        }
        if let Some(embeds) = input.embeds {
            h = merge_rows(&h, embeds)?;
        }
        if let Some(p) = &self.project_in {
            h = p.forward(&h)?;
        }
        if let Some(pos) = &self.positions {
            let ids: Vec<u32> = meta.positions().into_iter().map(|p| (p + pos.offset) as u32).collect();
            h = ops::add(&h, &ops::embedding(&pos.table, &ids)?)?;
        }
        let slots = self.cache_slots(kv.len())?;
        // Per-layer inputs read the scaled token embeddings.
        let embeds = match &self.per_layer {
            Some(p) => Some((p.embed(input.tokens)?, h.clone())),
            None => None,
        };
        let inputs = h.clone();
        let mut stream = Residual { h, pending: None };
        for (i, block) in self.blocks.iter().enumerate() {
            observe(i, &stream)?;
            stream = block.forward(stream, Some(&inputs), &tables, meta, layer_caches(kv, slots[i]))?;
            if let Some((embeds, features)) = input.embeds.and_then(|e| Some(e).zip(e.deepstack.get(i))) {
                stream = Residual { h: add_rows(&stream.settle()?, &embeds.rows, features)?, pending: None };
            }
            if let (Some(p), Some((packed, embeds))) = (&self.per_layer, &embeds) {
                let h = stream.settle()?;
                stream = Residual { h: p.apply(i, &h, &p.input(i, packed, embeds)?)?, pending: None };
            }
            if let Some(s) = self.layer_scales.as_ref().map(|s| s[i]) {
                stream = Residual { h: ops::scale(&stream.settle()?, s)?, pending: None };
            }
        }
        // Only the logit rows go on: the last pending add is done after the gather (none when
        // every row goes on in order, as for an MTP head's step).
        let rows = input.logit_rows;
        let every_row = rows.len() == stream.h.rows() && rows.iter().enumerate().all(|(i, &r)| i == r);
        let last = match every_row {
            true => stream,
            false => Residual {
                h: ops::gather_rows(&stream.h, rows)?,
                pending: stream.pending.map(|p| ops::gather_rows(&p, rows)).transpose()?,
            },
        };
        let mut h = last.settle_norm(self.final_norm.as_ref())?.0;
        if let Some(p) = &self.project_out {
            h = p.forward(&h)?;
        }
        Ok(h)
    }
}
