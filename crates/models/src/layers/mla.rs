//! Multi-head latent attention (DeepSeek-V2/V3, `DeepseekV2Attention` in transformers).
//!
//! Queries come from `q_proj`, or from the low-rank `q_a_proj -> q_a_layernorm -> q_b_proj`
//! when `q_lora_rank` is set; each head is `[nope | rope]`. Keys and values come from one
//! compressed latent: `kv_a_proj_with_mqa(x) = [c (kv_lora_rank) | k_rope (qk_rope_head_dim)]`;
//! `c` is normalised (`kv_a_layernorm`) and expanded per head by `kv_b_proj` into
//! `[k_nope (qk_nope_head_dim) | v (v_head_dim)]`, while the single `k_rope` is shared by every
//! head. Rotary embeddings touch only the rope parts.
//!
//! Two ways to use the paged cache ([`MlaCacheMode`]):
//! - `Expanded`: cache per-head keys `[k_nope | k_rope]` and values, `num_heads` KV heads of
//!   `k_dim = nope + rope`, `v_dim = v_head_dim`; attention is ordinary multi-head attention.
//! - `Latent`: cache the latent only, one KV head with keys `[c | k_rope]` (`kv_lora_rank + rope`)
//!   and values `c` (`kv_lora_rank`; stored a second time because the paged kernels keep keys and
//!   values apart). `kv_b_proj` is absorbed into the query and the output instead: per head,
//!   `q_lat = W_UK^T q_nope` scores against `c` (`q_nope . W_UK c == q_lat . c`), attention
//!   returns a latent `o = sum p c`, and `W_UV o` is the head's value. The per-head products run
//!   as grouped matmuls with the tokens in head-major order. This mode is used for every step
//!   (prefill and decode).
//!
//! DeepSeek-V3.2 adds a lightning indexer ([`crate::layers::dsa`]): its keys take extra columns
//! of the key rows, and each query attends only to the keys the indexer picks for it.

use ferrite_tensor::{ops, AttentionParams, AttnMetadata, PagedKvLayer, Tensor};

use crate::layers::dsa::{IndexKeyColumns, Indexer};
use crate::layers::rope::{Rope, RopeParameters};
use crate::layers::{Linear, RmsNorm};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::KvLayerSpec;
use crate::Result;

/// The `eps` of `q_a_layernorm` and `kv_a_layernorm`: transformers builds both with the
/// `RMSNorm` default, not `rms_norm_eps`.
pub const LATENT_NORM_EPS: f64 = 1e-6;

fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The softmax scale `qk_head_dim^-0.5`, times transformers' `yarn_apply_mscale` correction: any
/// non-default rope with `mscale_all_dim` multiplies it by mscale(factor, mscale_all_dim)^2.
/// Computed in f64 and rounded once, as the Python float reaches torch.
pub fn softmax_scale(raw: &RawConfig, rope: &RopeParameters, qk_head_dim: usize) -> crate::Result<f32> {
    let mut scale = (qk_head_dim as f64).powf(-0.5);
    if rope.kind() != "default" {
        if let Some(all) = rope.mscale_all_dim.filter(|&m| m != 0.0) {
            let factor = rope.factor.ok_or_else(|| raw.error("`mscale_all_dim` needs rope `factor`"))?;
            let m = yarn_mscale(factor, all);
            scale = scale * m * m;
        }
    }
    Ok(scale as f32)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MlaCacheMode {
    #[default]
    Expanded,
    Latent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub num_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

impl MlaDims {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
}

#[derive(Debug, Clone)]
pub enum QProj {
    Full(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

impl QProj {
    /// The queries, and for the low-rank form the normed latent they came from (`q_resid`).
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        match self {
            QProj::Full(q) => Ok((q.forward(x)?, None)),
            QProj::LowRank { a, norm, b } => {
                let resid = norm.forward(&a.forward(x)?)?;
                Ok((b.forward(&resid)?, Some(resid)))
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Mla {
    pub q: QProj,
    pub kv_a: Linear,
    pub kv_norm: RmsNorm,
    pub kv_b: Linear,
    pub o: Linear,
    pub dims: MlaDims,
    /// Softmax scale (`qk_head_dim^-0.5`, times YaRN's `mscale_all_dim` correction squared).
    pub scale: f32,
    pub mode: MlaCacheMode,
    /// Latent mode: `W_UK^T [heads, kv_lora_rank, nope]` and `W_UV [heads, v_head_dim, kv_lora_rank]`.
    absorbed: Option<(Tensor, Tensor)>,
    /// DeepSeek-V3.2's lightning indexer: each query sees only the keys it picks.
    pub indexer: Option<Box<Indexer>>,
}

impl Mla {
    /// Loads `{prefix}.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}`, `kv_a_proj_with_mqa`,
    /// `kv_a_layernorm`, `kv_b_proj` and `o_proj`.
    pub fn load(
        w: &Weights,
        prefix: &str,
        hidden: usize,
        dims: MlaDims,
        attention_bias: bool,
        scale: f32,
        mode: MlaCacheMode,
    ) -> Result<Mla> {
        let h = dims.num_heads;
        let (dn, dv, r) = (dims.qk_nope_head_dim, dims.v_head_dim, dims.kv_lora_rank);
        let q = match dims.q_lora_rank {
            None => QProj::Full(Linear::load(w, &format!("{prefix}.q_proj"), hidden, h * dims.qk_head_dim(), false)?),
            Some(qr) => QProj::LowRank {
                a: Linear::load(w, &format!("{prefix}.q_a_proj"), hidden, qr, attention_bias)?,
                norm: RmsNorm::load(w, &format!("{prefix}.q_a_layernorm"), qr, LATENT_NORM_EPS)?,
                b: Linear::load(w, &format!("{prefix}.q_b_proj"), qr, h * dims.qk_head_dim(), false)?,
            },
        };
        let kv_a = Linear::load(
            w,
            &format!("{prefix}.kv_a_proj_with_mqa"),
            hidden,
            r + dims.qk_rope_head_dim,
            attention_bias,
        )?;
        let kv_norm = RmsNorm::load(w, &format!("{prefix}.kv_a_layernorm"), r, LATENT_NORM_EPS)?;
        let kv_b = Linear::load(w, &format!("{prefix}.kv_b_proj"), r, h * (dn + dv), false)?;
        let o = Linear::load(w, &format!("{prefix}.o_proj"), h * dv, hidden, attention_bias)?;
        let absorbed = match mode {
            MlaCacheMode::Expanded => None,
            MlaCacheMode::Latent => {
                // kv_b rows of head `j`: `dn` rows of W_UK, then `dv` rows of W_UV, each `r` wide.
                let kvb = kv_b.weight.to_f32_vec();
                let mut uk_t = vec![0.0f32; h * r * dn];
                let mut uv = Vec::with_capacity(h * dv * r);
                for j in 0..h {
                    let base = j * (dn + dv) * r;
                    for i in 0..dn {
                        for c in 0..r {
                            uk_t[(j * r + c) * dn + i] = kvb[base + i * r + c];
                        }
                    }
                    uv.extend_from_slice(&kvb[base + dn * r..base + (dn + dv) * r]);
                }
                let dtype = kv_b.weight.dtype().of_values();
                let device = kv_b.weight.device();
                Some((
                    Tensor::from_f32_as(uk_t, &[h, r, dn], dtype)?.to_device(device)?,
                    Tensor::from_f32_as(uv, &[h, dv, r], dtype)?.to_device(device)?,
                ))
            }
        };
        Ok(Mla { q, kv_a, kv_norm, kv_b, o, dims, scale, mode, absorbed, indexer: None })
    }

    /// This attention restricted to the keys `indexer` picks; the indexer reads the q LoRA latent.
    pub fn with_indexer(mut self, indexer: Indexer) -> Result<Mla> {
        if matches!(self.q, QProj::Full(_)) {
            return Err(crate::ModelError::Config {
                path: "config.json".into(),
                message: "the sparse-attention indexer reads the q LoRA latent: `q_lora_rank` must be set".into(),
            });
        }
        self.indexer = Some(Box::new(indexer));
        Ok(self)
    }

    /// Where the key rows keep the indexer's keys, for a layer with an indexer.
    fn index_columns(&self) -> Option<IndexKeyColumns> {
        let dim = self.indexer.as_ref()?.dims.head_dim;
        let d = &self.dims;
        Some(match self.mode {
            MlaCacheMode::Expanded => IndexKeyColumns::expanded(d.num_heads, d.qk_head_dim(), dim),
            MlaCacheMode::Latent => IndexKeyColumns::latent(d.kv_lora_rank + d.qk_rope_head_dim, dim),
        })
    }

    /// The paged cache this layer reads and writes.
    pub fn kv_spec(&self) -> KvLayerSpec {
        let d = &self.dims;
        let index = self.index_columns().map_or(0, |c| c.width());
        match self.mode {
            MlaCacheMode::Expanded => {
                KvLayerSpec { num_kv_heads: d.num_heads, k_dim: d.qk_head_dim() + index, v_dim: d.v_head_dim }
            }
            MlaCacheMode::Latent => KvLayerSpec {
                num_kv_heads: 1,
                k_dim: d.kv_lora_rank + d.qk_rope_head_dim + index,
                v_dim: d.kv_lora_rank,
            },
        }
    }

    pub fn weight_bytes(&self) -> usize {
        let q = match &self.q {
            QProj::Full(q) => q.weight.size_in_bytes(),
            QProj::LowRank { a, b, .. } => a.weight.size_in_bytes() + b.weight.size_in_bytes(),
        };
        q + [&self.kv_a, &self.kv_b, &self.o].iter().map(|l| l.weight.size_in_bytes()).sum::<usize>()
            + self.indexer.as_ref().map_or(0, |i| i.weight_bytes())
    }

    /// `x [tokens, hidden]` -> `[tokens, hidden]`; `rope` rotates heads of `qk_rope_head_dim`
    /// (`None`: the rope parts stay as projected, Kimi Linear's NoPE attention).
    pub fn forward(
        &self,
        x: &Tensor,
        rope: Option<(&Rope, &Tensor, &Tensor)>,
        meta: &AttnMetadata,
        cache: &mut PagedKvLayer,
    ) -> Result<Tensor> {
        let d = self.dims;
        let (t, h) = (x.rows(), d.num_heads);
        let (dn, dr, dv, r) = (d.qk_nope_head_dim, d.qk_rope_head_dim, d.v_head_dim, d.kv_lora_rank);
        let rotate = |x: Tensor| -> Result<Tensor> {
            match rope {
                Some((rope, cos, sin)) => Ok(rope.apply(&x, cos, sin)?),
                None => Ok(x),
            }
        };

        // Queries, one row per (token, head): [nope | rope], the rope part rotated.
        let (q, q_resid) = self.q.forward(x)?;
        let q = q.reshape(&[t * h, dn + dr])?;
        let q_nope = ops::narrow_cols(&q, 0, dn)?;
        let q_pe = rotate(ops::narrow_cols(&q, dn, dr)?.reshape(&[t, h * dr])?)?.reshape(&[t * h, dr])?;

        // The compressed latent and the shared rotated key part.
        let ckv = self.kv_a.forward(x)?;
        let c = self.kv_norm.forward(&ops::narrow_cols(&ckv, 0, r)?)?;
        let k_pe = rotate(ops::narrow_cols(&ckv, r, dr)?)?;

        // The indexer's keys join the key rows the step writes.
        let tables = rope.map(|(_, cos, sin)| (cos, sin));
        let index_keys = match (&self.indexer, self.index_columns()) {
            (Some(indexer), Some(columns)) => Some(columns.pack(&indexer.keys(x, tables)?)?),
            _ => None,
        };
        let key_rows = |parts: &[&Tensor]| -> Result<Tensor> {
            let mut parts = parts.to_vec();
            parts.extend(index_keys.as_ref());
            Ok(ops::concat_cols(&parts)?)
        };
        // After the write: the keys each query keeps, where an indexer chooses.
        let chosen = |cache: &PagedKvLayer| -> Result<Option<AttnMetadata>> {
            let (Some(indexer), Some(columns)) = (&self.indexer, self.index_columns()) else {
                return Ok(None);
            };
            let q_resid = q_resid.as_ref().ok_or_else(|| ferrite_tensor::TensorError::Shape {
                op: "mla",
                detail: "an indexer without the q LoRA latent".into(),
            })?;
            indexer.select(x, q_resid, tables, meta, cache, &columns)
        };

        let params = |num_kv_heads, head_dim, v_head_dim| AttentionParams {
            num_heads: h,
            num_kv_heads,
            head_dim,
            v_head_dim,
            scale: self.scale,
            sliding_window: None,
            attention_chunk: None,
            softcap: None,
        };
        let out = match &self.absorbed {
            None => {
                let kv = self.kv_b.forward(&c)?.reshape(&[t * h, dn + dv])?;
                let k_nope = ops::narrow_cols(&kv, 0, dn)?;
                let v = ops::narrow_cols(&kv, dn, dv)?.reshape(&[t, h * dv])?;
                let per_head: Vec<usize> = (0..t * h).map(|row| row / h).collect();
                let k_pe = ops::gather_rows(&k_pe, &per_head)?;
                let k = key_rows(&[&k_nope, &k_pe])?;
                let k = k.reshape(&[t, h * k.last_dim()])?;
                let q = ops::concat_cols(&[&q_nope, &q_pe])?.reshape(&[t, h * (dn + dr)])?;
                ops::write_kv(cache, &k, &v, meta)?;
                let chosen = chosen(cache)?;
                ops::paged_attention(&q, cache, chosen.as_ref().unwrap_or(meta), &params(h, dn + dr, dv))?
            }
            Some((uk_t, uv)) => {
                // (token, head) rows <-> head-major rows, so each head's tokens form one group.
                let head_major: Vec<usize> = (0..h * t).map(|i| (i % t) * h + i / t).collect();
                let token_major: Vec<usize> = (0..t * h).map(|i| (i % h) * t + i / h).collect();
                let offsets: Vec<usize> = (0..=h).map(|j| j * t).collect();
                let per_head = |x: &Tensor, w: &Tensor| -> Result<Tensor> {
                    let y = ops::grouped_matmul_t(&ops::gather_rows(x, &head_major)?, w, &offsets)?;
                    Ok(ops::gather_rows(&y, &token_major)?)
                };
                let q_lat = per_head(&q_nope, uk_t)?;
                let q = ops::concat_cols(&[&q_lat, &q_pe])?.reshape(&[t, h * (r + dr)])?;
                ops::write_kv(cache, &key_rows(&[&c, &k_pe])?, &c, meta)?;
                let chosen = chosen(cache)?;
                let o_lat = ops::paged_attention(&q, cache, chosen.as_ref().unwrap_or(meta), &params(1, r + dr, r))?;
                per_head(&o_lat.reshape(&[t * h, r])?, uv)?.reshape(&[t, h * dv])?
            }
        };
        self.o.forward(&out)
    }
}
