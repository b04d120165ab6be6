//! DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, transformers'
//! `DeepseekV32Indexer`): for each query, the `topk` keys its MLA attention sees.
//!
//! Every token has an indexer key `k = k_norm(wk(x))` (one head of `head_dim`; LayerNorm with a
//! bias, eps 1e-6) and every query `heads` indexer queries `q = wq_b(q_resid)`, read from MLA's
//! normed q LoRA latent. Both are rotated on their first `qk_rope_head_dim` dims by the
//! half-split (NeoX) rotation, with MLA's cos/sin, although MLA rotates interleaved pairs. A key
//! scores `sum_h w_h relu(q_h . k * head_dim^-0.5)` for a query, with
//! `w = weights_proj(x) * heads^-0.5` in f32 (transformers keeps `weights_proj` in f32), and the
//! query keeps its `topk` best causal keys (all of them while it has no more).
//!
//! The keys live in the layer's paged KV cache beside MLA's ([`IndexKeyColumns`]), so chunked
//! prefill, prefix caching and preemption keep them exactly as they keep the attention keys. The
//! choice is made on the host: each sequence's index scores are read back, and the kept keys
//! become metadata of one-token blocks, a sequence per query whose block table lists its kept
//! slots in position order, so that the paged attention kernels see those keys and no others.
//! A step where no sequence can hold more than `topk` keys (by its block table's capacity, which
//! a CUDA graph fixes for every step it replays) attends as plain MLA and reads nothing back.

use ferrite_tensor::{ops, Activation, AttnMetadata, AttnSeq, DType, PagedKvLayer, RopeStyle, Tensor, TensorError};

use crate::layers::{LayerNorm, Linear};
use crate::loading::weights::Weights;
use crate::Result;

/// transformers builds `k_norm` as `nn.LayerNorm(head_dim, eps=1e-6)` whatever the config says.
const K_NORM_EPS: f64 = 1e-6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerDims {
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_head_dim`.
    pub head_dim: usize,
    /// The rotated leading dims of each head (`qk_rope_head_dim`).
    pub rope_dim: usize,
    /// `index_topk`: keys kept per query.
    pub topk: usize,
}

/// Where a layer's paged KV cache keeps each token's indexer key: extra columns of its key rows,
/// the keys read as `[slots * kv_heads, k_dim]` (see [`ops::gather_cached_keys`]). A latent MLA
/// cache (one KV head) holds the whole key after `[c | k_rope]`; an expanded one (a row per
/// attention head) holds it cut into pieces of `width` columns after each head's
/// `[k_nope | k_rope]`, heads 0, 1, ... in order, so that a row grows by `width` rather than by
/// the key's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexKeyColumns {
    kv_heads: usize,
    /// The first extra column of each row.
    offset: usize,
    width: usize,
    /// Rows (of a slot's `kv_heads`) a key spans.
    pieces: usize,
    dim: usize,
}

impl IndexKeyColumns {
    pub fn latent(offset: usize, dim: usize) -> IndexKeyColumns {
        IndexKeyColumns { kv_heads: 1, offset, width: dim, pieces: 1, dim }
    }

    pub fn expanded(heads: usize, offset: usize, dim: usize) -> IndexKeyColumns {
        // Whole 16-byte groups of bf16: rows stay aligned for the CUDA kernels' vector loads.
        let width = dim.div_ceil(heads.max(1)).next_multiple_of(8);
        IndexKeyColumns { kv_heads: heads, offset, width, pieces: dim.div_ceil(width), dim }
    }

    /// Columns each key row gains.
    pub fn width(&self) -> usize {
        self.width
    }

    /// `keys [tokens, dim]` as the extra columns of the step's key rows, `[tokens * kv_heads, width]`.
    pub fn pack(&self, keys: &Tensor) -> Result<Tensor> {
        let pad = self.kv_heads * self.width - self.dim;
        let wide = if pad == 0 {
            keys.clone()
        } else {
            // The columns past the key are never read: zeros made on the keys' device, not uploaded.
            let zeros = ops::scale(keys, 0.0)?;
            let fill = (0..pad)
                .step_by(self.dim)
                .map(|at| ops::narrow_cols(&zeros, 0, self.dim.min(pad - at)))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            ops::concat_cols(&std::iter::once(keys).chain(&fill).collect::<Vec<_>>())?
        };
        Ok(wide.reshape(&[keys.rows() * self.kv_heads, self.width])?)
    }

    /// The keys of `slots` from `cache`, `[slots.len(), dim]`.
    pub fn read(&self, cache: &PagedKvLayer, slots: &[usize]) -> Result<Tensor> {
        let rows: Vec<usize> =
            slots.iter().flat_map(|&s| (0..self.pieces).map(move |j| s * self.kv_heads + j)).collect();
        let pieces = ops::gather_cached_keys(cache, &rows, self.offset, self.width)?;
        let keys = pieces.reshape(&[slots.len(), self.pieces * self.width])?;
        Ok(if self.pieces * self.width == self.dim { keys } else { ops::narrow_cols(&keys, 0, self.dim)? })
    }
}

#[derive(Debug, Clone)]
pub struct Indexer {
    wq_b: Linear,
    wk: Linear,
    k_norm: LayerNorm,
    /// f32 `[heads, hidden]`.
    weights_proj: Tensor,
    pub dims: IndexerDims,
}

impl Indexer {
    /// Loads `{prefix}.{wq_b, wk, k_norm, weights_proj}`.
    pub fn load(w: &Weights, prefix: &str, hidden: usize, q_lora_rank: usize, dims: IndexerDims) -> Result<Indexer> {
        let (h, d) = (dims.heads, dims.head_dim);
        Ok(Indexer {
            wq_b: Linear::load(w, &format!("{prefix}.wq_b"), q_lora_rank, h * d, false)?,
            wk: Linear::load(w, &format!("{prefix}.wk"), hidden, d, false)?,
            k_norm: LayerNorm::load(w, &format!("{prefix}.k_norm"), d, K_NORM_EPS, true)?,
            weights_proj: w.get_f32(&format!("{prefix}.weights_proj.weight"), &[h, hidden])?,
            dims,
        })
    }

    pub fn weight_bytes(&self) -> usize {
        self.wq_b.size_in_bytes() + self.wk.size_in_bytes() + self.weights_proj.size_in_bytes()
    }

    /// Rotates the first `rope_dim` dims of every head of `x [tokens, heads * head_dim]`.
    fn rotate(&self, x: Tensor, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        match rope {
            Some((cos, sin)) => Ok(ops::rope(&x, cos, sin, self.dims.head_dim, RopeStyle::Neox)?),
            None => Ok(x),
        }
    }

    /// Each token's indexer key, `[tokens, head_dim]`.
    pub fn keys(&self, x: &Tensor, rope: Option<(&Tensor, &Tensor)>) -> Result<Tensor> {
        self.rotate(self.k_norm.forward(&self.wk.forward(x)?)?, rope)
    }

    /// Metadata that shows each query of `meta` only the keys it keeps, the step's keys already
    /// in `cache` at `columns`; `None` where no query can have more keys than it keeps.
    pub fn select(
        &self,
        x: &Tensor,
        q_resid: &Tensor,
        rope: Option<(&Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &PagedKvLayer,
        columns: &IndexKeyColumns,
    ) -> Result<Option<AttnMetadata>> {
        let IndexerDims { heads: h, head_dim: d, topk, .. } = self.dims;
        let bs = meta.block_size;
        if meta.seqs.iter().all(|s| s.block_table.len() * bs <= topk) {
            return Ok(None);
        }
        // Scores in f32 whatever the activations, as transformers computes them.
        let q = self.rotate(self.wq_b.forward(q_resid)?, rope)?.to_dtype(DType::F32);
        let q = q.reshape(&[x.rows() * h, d])?;
        let head_weight = (h as f64).powf(-0.5) as f32;
        let weights: Vec<f32> = ops::matmul_t(&x.to_dtype(DType::F32), &self.weights_proj, None)?
            .try_to_f32_vec()?
            .into_iter()
            .map(|v| v * head_weight)
            .collect();
        let scale = (d as f64).powf(-0.5) as f32;
        let mut seqs = Vec::with_capacity(meta.num_tokens());
        for (si, s) in meta.seqs.iter().enumerate() {
            let slots = (0..s.ctx_len)
                .map(|p| {
                    let slot = s.block_table[p / bs] as usize * bs + p % bs;
                    u32::try_from(slot).map_err(|_| TensorError::Shape {
                        op: "indexer",
                        detail: format!("slot {slot} beyond 32 bits"),
                    })
                })
                .collect::<std::result::Result<Vec<u32>, _>>()?;
            let scores = if s.ctx_len > topk {
                let read: Vec<usize> = slots.iter().map(|&slot| slot as usize).collect();
                let keys = columns.read(cache, &read)?.to_dtype(DType::F32);
                let rows: Vec<usize> = (s.q_start * h..(s.q_start + s.q_len) * h).collect();
                let dots = ops::matmul_t(&ops::gather_rows(&q, &rows)?, &keys, None)?;
                let per_head = ops::activation(&ops::scale(&dots, scale)?, Activation::Relu)?;
                let w = &weights[s.q_start * h..(s.q_start + s.q_len) * h];
                let local: Vec<usize> = (0..s.q_len * h).collect();
                Some(ops::combine_rows(&per_head, &local, w, h)?.try_to_f32_vec()?)
            } else {
                None
            };
            for i in 0..s.q_len {
                let seen = meta.last_key(si, i) + 1;
                let kept = match &scores {
                    Some(scores) if seen > topk => top_keys(&scores[i * s.ctx_len..i * s.ctx_len + seen], topk),
                    _ => (0..seen).collect(),
                };
                let block_table = kept.iter().map(|&p| slots[p]).collect();
                seqs.push(AttnSeq { q_start: s.q_start + i, q_len: 1, ctx_len: kept.len(), block_table });
            }
        }
        Ok(Some(AttnMetadata::new(seqs, 1)?))
    }
}

/// The positions of the `k` highest scores (`k < scores.len()`), in position order; of equal
/// scores the earlier position wins.
fn top_keys(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.select_nth_unstable_by(k - 1, |&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_keys_keeps_the_best_in_position_order() {
        assert_eq!(top_keys(&[0.5, 3.0, -1.0, 2.0, 2.5], 3), [1, 3, 4]);
        assert_eq!(top_keys(&[1.0, 1.0, 1.0, 0.0], 2), [0, 1]);
        assert_eq!(top_keys(&[f32::NEG_INFINITY, 0.0], 1), [1]);
    }

    #[test]
    fn index_keys_round_trip_through_the_cache_rows() {
        let (t, dim) = (3, 12);
        let keys: Vec<f32> = (0..t * dim).map(|i| i as f32 + 1.0).collect();
        let keys = Tensor::from_f32(keys, &[t, dim]).unwrap();
        // An expanded cache of 4 heads of [k 6 | index 8]: the key spans two heads' pieces.
        let columns = IndexKeyColumns::expanded(4, 6, dim);
        assert_eq!((columns.width(), columns.pieces), (8, 2));
        let packed = columns.pack(&keys).unwrap();
        assert_eq!(packed.shape(), [t * 4, 8]);
        let rows = ops::concat_cols(&[&Tensor::zeros(&[t * 4, 6]), &packed]).unwrap();
        let mut cache = PagedKvLayer::new_cpu(2, 4, 4, 14, 1);
        let seq = AttnSeq { q_start: 0, q_len: t, ctx_len: t, block_table: vec![1] };
        let meta = AttnMetadata::new(vec![seq], 4).unwrap();
        let v = Tensor::zeros(&[t, 4]);
        ops::write_kv(&mut cache, &rows.reshape(&[t, 4 * 14]).unwrap(), &v, &meta).unwrap();
        let back = columns.read(&cache, &[6, 4]).unwrap().to_f32_vec();
        let want: Vec<f32> = [2, 0].iter().flat_map(|&r| keys.to_f32_vec()[r * dim..(r + 1) * dim].to_vec()).collect();
        assert_eq!(back, want);
        // The latent layout: one row per slot, the key whole.
        let latent = IndexKeyColumns::latent(6, dim);
        assert_eq!(latent.pack(&keys).unwrap().to_f32_vec(), keys.to_f32_vec());
    }
}
