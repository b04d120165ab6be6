use rayon::prelude::*;

use super::elementwise::softmax_in_place;
use super::f32_tensor;
use crate::error::{Result, TensorError};
use crate::fp8::fake_quantize;
use crate::kv::{AttnMetadata, KvStorage, PagedKvLayer, PAD_SLOT};
use crate::ops::AttentionParams;
use crate::tensor::Tensor;

pub fn write_kv(cache: &mut PagedKvLayer, k: &Tensor, v: &Tensor, meta: &AttnMetadata) -> Result<()> {
    let (ks, vs) = (k.as_f32_slice()?, v.as_f32_slice()?);
    let kw = cache.num_kv_heads * cache.k_dim;
    let vw = cache.num_kv_heads * cache.v_dim;
    let fp8 = cache.fp8;
    let KvStorage::Cpu { k: kc, v: vc } = &mut cache.storage else {
        return Err(TensorError::Device("write_kv: CPU activations with a CUDA KV cache".into()));
    };
    for (row, &slot) in meta.slot_mapping.iter().enumerate().filter(|(_, &s)| s != PAD_SLOT) {
        let (kd, vd) = (&mut kc[slot * kw..(slot + 1) * kw], &mut vc[slot * vw..(slot + 1) * vw]);
        let (kr, vr) = (&ks[row * kw..(row + 1) * kw], &vs[row * vw..(row + 1) * vw]);
        match fp8 {
            // The values an e4m3 cache gives back: attention reads them as it reads any others.
            Some(scales) => {
                kd.iter_mut().zip(kr).for_each(|(d, &x)| *d = fake_quantize(x, scales.k));
                vd.iter_mut().zip(vr).for_each(|(d, &x)| *d = fake_quantize(x, scales.v));
            }
            None => {
                kd.copy_from_slice(kr);
                vd.copy_from_slice(vr);
            }
        }
    }
    Ok(())
}

pub fn gather_cached_keys(cache: &PagedKvLayer, rows: &[usize], start: usize, len: usize) -> Result<Tensor> {
    let KvStorage::Cpu { k, .. } = &cache.storage else {
        return Err(TensorError::Device("gather_cached_keys: a CUDA KV cache read as a CPU one".into()));
    };
    let out = rows.iter().flat_map(|&r| &k[r * cache.k_dim + start..r * cache.k_dim + start + len]).copied().collect();
    Ok(f32_tensor(out, vec![rows.len(), len]))
}

pub fn paged_attention(
    q: &Tensor,
    cache: &PagedKvLayer,
    meta: &AttnMetadata,
    p: &AttentionParams,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let qs = q.as_f32_slice()?;
    let KvStorage::Cpu { k: kc, v: vc } = &cache.storage else {
        return Err(TensorError::Device("paged_attention: CPU activations with a CUDA KV cache".into()));
    };
    let (hq, d, dv) = (p.num_heads, p.head_dim, p.v_head_dim);
    let group = hq / p.num_kv_heads;
    let kw = cache.num_kv_heads * cache.k_dim;
    let vw = cache.num_kv_heads * cache.v_dim;
    let bs = meta.block_size;
    let tokens = meta.num_tokens();

    // (sequence, query row, head) triples: a decode step has one query row per sequence, so
    // splitting by head is what keeps every core busy on a single request. Each row is computed
    // alone, the same way whatever chunk it comes in: a prompt whose prefix is cached then gives
    // the bits a cold one does. (Two small GEMMs per prompt chunk and head made a 1000-token
    // prompt 1.3x faster, but a GEMM's sums depend on its shape, and a repeated greedy request
    // then answered differently.)
    let tasks: Vec<(usize, usize, usize)> = meta
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(si, s)| (0..s.q_len).flat_map(move |i| (0..hq).map(move |h| (si, i, h))))
        .collect();
    let mut out = vec![0.0f32; tokens * hq * dv];
    let heads: Vec<(usize, Vec<f32>)> = tasks
        .par_iter()
        .map(|&(si, i, h)| {
            let s = &meta.seqs[si];
            let pos = s.query_position(i);
            let first = p.first_key(pos);
            let row = s.q_start + i;
            let slots = (first..=meta.last_key(si, i)).map(|kp| s.block_table[kp / bs] as usize * bs + kp % bs);
            let kvh = h / group;
            let qh = &qs[row * hq * d + h * d..row * hq * d + (h + 1) * d];
            let mut scores: Vec<f32> = slots
                .clone()
                .map(|slot| {
                    let kr = &kc[slot * kw + kvh * cache.k_dim..slot * kw + kvh * cache.k_dim + d];
                    let acc = super::matmul::dot(qh, kr) * p.scale;
                    match p.softcap {
                        Some(cap) => (acc / cap).tanh() * cap,
                        None => acc,
                    }
                })
                .collect();
            match sinks {
                Some(s) => softmax_with_sink(&mut scores, s[h]),
                None => softmax_in_place(&mut scores),
            }
            let mut dst = vec![0.0f32; dv];
            for (&w, slot) in scores.iter().zip(slots) {
                let vr = &vc[slot * vw + kvh * cache.v_dim..slot * vw + kvh * cache.v_dim + dv];
                dst.iter_mut().zip(vr).for_each(|(o, v)| *o += w * v);
            }
            (row * hq + h, dst)
        })
        .collect();
    for (at, values) in heads {
        out[at * dv..(at + 1) * dv].copy_from_slice(&values);
    }
    Ok(f32_tensor(out, vec![tokens, hq * dv]))
}

/// The softmax of `row` with one more logit, `sink`, in the denominator and dropped from the
/// result (gpt-oss: HF concatenates the sink column, softmaxes and slices it off). The sink joins
/// the max and is added to the sum last, as the column HF appends.
pub(crate) fn softmax_with_sink(row: &mut [f32], sink: f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(sink);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum += (sink - max).exp();
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// `out [m, n] = beta * a [m, k] @ b^T` (`b` row-major `[n, k]`) or, with `b_transposed`
/// false, `a @ b` (`b` row-major `[k, n]`), single-threaded (callers parallelise over heads).
#[allow(clippy::too_many_arguments)]
fn small_gemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], b_transposed: bool, beta: f32, out: &mut [f32]) {
    let (rhs_cs, rhs_rs) = if b_transposed { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: `a` is [m, k] and `out` [m, n] row-major, `b` holds n * k elements read with the
    // strides above; all are live slices of at least those sizes.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            rhs_cs,
            rhs_rs,
            0.0,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Dense attention over contiguous sequences of a flattened batch (no KV cache): `q [tokens,
/// heads * head_dim]`, `k [tokens, kv_heads * head_dim]`, `v [tokens, kv_heads * v_head_dim]`,
/// sequence `s` owning rows `sum(seq_lens[..s])..` of each. One task per (sequence, head):
/// `softmax(mask(scale * Q K^T)) V` as two small GEMMs.
pub fn attention_dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttentionParams,
    seq_lens: &[usize],
    causal: bool,
) -> Result<Tensor> {
    let (qs, ks, vs) = (q.as_f32_slice()?, k.as_f32_slice()?, v.as_f32_slice()?);
    let (hq, hkv, d, dv) = (p.num_heads, p.num_kv_heads, p.head_dim, p.v_head_dim);
    let group = hq / hkv;
    let tokens: usize = seq_lens.iter().sum();
    let mut starts = Vec::with_capacity(seq_lens.len());
    let mut acc = 0;
    for &len in seq_lens {
        starts.push(acc);
        acc += len;
    }
    let tasks: Vec<(usize, usize)> = (0..seq_lens.len()).flat_map(|s| (0..hq).map(move |h| (s, h))).collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(s, h)| {
            let (start, len) = (starts[s], seq_lens[s]);
            if len == 0 {
                return Vec::new();
            }
            let kvh = h / group;
            // This head's queries, keys and values, contiguous.
            let gather = |src: &[f32], width: usize, off: usize, dim: usize| -> Vec<f32> {
                (0..len).flat_map(|j| src[(start + j) * width + off..][..dim].iter().copied()).collect()
            };
            let qh = gather(qs, hq * d, h * d, d);
            let kh = gather(ks, hkv * d, kvh * d, d);
            let vh = gather(vs, hkv * dv, kvh * dv, dv);
            let mut scores = vec![0.0f32; len * len];
            small_gemm(len, len, d, &qh, &kh, true, p.scale, &mut scores);
            for (i, row) in scores.chunks_mut(len).enumerate() {
                if let Some(cap) = p.softcap {
                    row.iter_mut().for_each(|x| *x = (*x / cap).tanh() * cap);
                }
                if causal {
                    let lo = p.first_key(i);
                    row[..lo].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                    row[i + 1..].iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                }
                softmax_in_place(row);
            }
            let mut out = vec![0.0f32; len * dv];
            small_gemm(len, dv, len, &scores, &vh, false, 1.0, &mut out);
            out
        })
        .collect();
    let mut out = vec![0.0f32; tokens * hq * dv];
    for (&(s, h), values) in tasks.iter().zip(&results) {
        for i in 0..seq_lens[s] {
            out[(starts[s] + i) * hq * dv + h * dv..][..dv].copy_from_slice(&values[i * dv..(i + 1) * dv]);
        }
    }
    Ok(f32_tensor(out, vec![tokens, hq * dv]))
}

#[cfg(test)]
mod tests {
    use crate::kv::{AttnMetadata, AttnSeq, PagedKvLayer};
    use crate::ops::{paged_attention, write_kv, AttentionParams};
    use crate::Tensor;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 2654435761usize) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    /// Dense causal attention over contiguous K/V, one sequence, as the oracle computes it.
    #[allow(clippy::too_many_arguments)]
    fn dense(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        t: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        window: Option<usize>,
        chunk: Option<usize>,
    ) -> Vec<f32> {
        let mut out = vec![0.0; t * hq * d];
        for i in 0..t {
            for h in 0..hq {
                let kvh = h / (hq / hkv);
                let lo = window.map(|w| (i + 1).saturating_sub(w)).unwrap_or(0).max(chunk.map_or(0, |c| i / c * c));
                let mut s: Vec<f32> = (lo..=i)
                    .map(|j| {
                        (0..d).map(|x| q[(i * hq + h) * d + x] * k[(j * hkv + kvh) * d + x]).sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                super::softmax_in_place(&mut s);
                for (w, j) in s.iter().zip(lo..=i) {
                    for x in 0..d {
                        out[(i * hq + h) * d + x] += w * v[(j * hkv + kvh) * d + x];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn paged_prefill_then_decode_matches_dense_attention() {
        let (t, hq, hkv, d, bs) = (11, 4, 2, 8, 4);
        let (q, k, v) = (values(t * hq * d, 1), values(t * hkv * d, 2), values(t * hkv * d, 3));
        // A chunk of 3 puts the prefill/decode boundary (8) inside a chunk (6..9).
        for (window, chunk) in [(None, None), (Some(5), None), (None, Some(3)), (Some(2), Some(4))] {
            let want = dense(&q, &k, &v, t, hq, hkv, d, window, chunk);
            let params = AttentionParams {
                num_heads: hq,
                num_kv_heads: hkv,
                head_dim: d,
                v_head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                sliding_window: window,
                attention_chunk: chunk,
                softcap: None,
            };
            // Blocks deliberately out of order: the block table, not the pool order, defines the sequence.
            let table = vec![5, 0, 3];
            let mut cache = PagedKvLayer::new_cpu(6, bs, hkv, d, d);
            // Prefill the first 8 tokens, then decode the rest one at a time.
            let prefill = 8;
            let meta = AttnMetadata::new(
                vec![AttnSeq { q_start: 0, q_len: prefill, ctx_len: prefill, block_table: table.clone() }],
                bs,
            )
            .unwrap();
            let rows = |x: &[f32], w: usize, a: usize, b: usize| {
                Tensor::from_f32(x[a * w..b * w].to_vec(), &[b - a, w]).unwrap()
            };
            write_kv(&mut cache, &rows(&k, hkv * d, 0, prefill), &rows(&v, hkv * d, 0, prefill), &meta).unwrap();
            let mut got = paged_attention(&rows(&q, hq * d, 0, prefill), &cache, &meta, &params).unwrap().to_f32_vec();
            for i in prefill..t {
                let meta = AttnMetadata::new(
                    vec![AttnSeq { q_start: 0, q_len: 1, ctx_len: i + 1, block_table: table.clone() }],
                    bs,
                )
                .unwrap();
                write_kv(&mut cache, &rows(&k, hkv * d, i, i + 1), &rows(&v, hkv * d, i, i + 1), &meta).unwrap();
                got.extend(paged_attention(&rows(&q, hq * d, i, i + 1), &cache, &meta, &params).unwrap().to_f32_vec());
            }
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "window {window:?} chunk {chunk:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn dense_attention_skips_empty_sequences() {
        use crate::ops::attention_dense;
        let (hq, hkv, d, t) = (2, 1, 4, 5);
        let params = AttentionParams {
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            v_head_dim: d,
            scale: 0.5,
            sliding_window: None,
            attention_chunk: None,
            softcap: None,
        };
        let tensor = |seed: usize, w: usize| Tensor::from_f32(values(t * w, seed), &[t, w]).unwrap();
        let (q, k, v) = (tensor(1, hq * d), tensor(2, hkv * d), tensor(3, hkv * d));
        let with_empty = attention_dense(&q, &k, &v, &params, &[3, 0, 2, 0], true).unwrap().to_f32_vec();
        let without = attention_dense(&q, &k, &v, &params, &[3, 2], true).unwrap().to_f32_vec();
        assert_eq!(with_empty, without);
    }

    #[test]
    fn dense_attention_matches_paged_causal_and_sees_the_future_when_bidirectional() {
        use crate::ops::attention_dense;
        let (hq, hkv, d) = (4, 2, 8);
        let lens = [5usize, 1, 7];
        let t: usize = lens.iter().sum();
        let (q, k, v) = (values(t * hq * d, 4), values(t * hkv * d, 5), values(t * hkv * d, 6));
        let params = AttentionParams {
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            v_head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            sliding_window: None,
            attention_chunk: None,
            softcap: None,
        };
        let tensor = |x: &[f32], w: usize| Tensor::from_f32(x.to_vec(), &[t, w]).unwrap();
        let causal =
            attention_dense(&tensor(&q, hq * d), &tensor(&k, hkv * d), &tensor(&v, hkv * d), &params, &lens, true)
                .unwrap()
                .to_f32_vec();
        let full =
            attention_dense(&tensor(&q, hq * d), &tensor(&k, hkv * d), &tensor(&v, hkv * d), &params, &lens, false)
                .unwrap()
                .to_f32_vec();
        let mut start = 0;
        for &len in &lens {
            let rows = |x: &[f32], w: usize| x[start * w..(start + len) * w].to_vec();
            let want = dense(&rows(&q, hq * d), &rows(&k, hkv * d), &rows(&v, hkv * d), len, hq, hkv, d, None, None);
            let got = &causal[start * hq * d..(start + len) * hq * d];
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "causal: {g} vs {w}");
            }
            // Bidirectional: the last query row sees every key either way; row 0 of a longer sequence differs.
            let last = (start + len - 1) * hq * d;
            assert_eq!(&full[last..last + hq * d], &causal[last..last + hq * d]);
            if len > 1 {
                let first = start * hq * d;
                assert!(full[first..first + hq * d]
                    .iter()
                    .zip(&causal[first..first + hq * d])
                    .any(|(a, b)| (a - b).abs() > 1e-3));
            }
            start += len;
        }
        // Bidirectional equals a reference with the mask removed.
        let (l, s0) = (7, 6);
        let row = (s0 + 2) * hq * d;
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let qh = &q[row + h * d..row + (h + 1) * d];
            let mut s: Vec<f32> = (0..l)
                .map(|j| (0..d).map(|x| qh[x] * k[((s0 + j) * hkv + kvh) * d + x]).sum::<f32>() / (d as f32).sqrt())
                .collect();
            super::softmax_in_place(&mut s);
            for x in 0..d {
                let want: f32 = (0..l).map(|j| s[j] * v[((s0 + j) * hkv + kvh) * d + x]).sum();
                assert!((full[row + h * d + x] - want).abs() < 1e-5);
            }
        }
    }
}
