//! Sampling rows of logits on the host: the reference that the CUDA kernel
//! (`cuda/kernels/sampling.cu`) follows step for step.
//!
//! A sampled row, in vLLM V1's order, with every filter expressed as a threshold on the scaled
//! logit so that the GPU can find it by selection over the row instead of sorting it:
//! 1. `x = logit * (1 / temperature)` (NaN counts as -inf) and `d = x - max(x)`, the log of the
//!    probability relative to the best token's (exactly 0 for the best). Tokens with
//!    `d = -inf` have no probability and never survive.
//! 2. min-p keeps `d >= ln(min_p)`: `p >= min_p * p_max` without an exponential, so both arms
//!    make the same decision from the same `d`.
//! 3. top-k keeps values at least the k-th largest survivor's: an exact selection.
//! 4. top-p keeps values at least the largest `t` such that the survivors at or above `t` hold
//!    `top_p` of the survivors' mass (the smallest such set of most likely tokens; ties with its
//!    least likely token stay, as in top-k).
//! 5. the token is `argmax d_i - ln(E_i)` over the survivors, `E_i = -ln(u_i)`: the exponential
//!    race `argmax p_i / E_i` taken in logs, so tokens whose `exp(d)` underflows still race
//!    correctly. `u_i` comes from Philox4x32-10 keyed by the seed at counter `(step, i)`.
//!
//! The two arms differ only in rounding: the order (and here the f64 width) of the mass sums
//! behind top-p, and the last ulp of `exp` and `ln` (libm here, CUDA's `expf`/`logf` there). Both
//! only matter when a threshold or the race is tied to within a few ulps.

use rayon::prelude::*;

use super::elementwise::argmax_row;
use crate::error::Result;
use crate::ops::RowSampling;
use crate::tensor::{CpuStorage, Tensor};

/// A row's parameters as both arms use them, derived once on the host so that the GPU gets
/// bit-identical `1 / temperature` and `ln(min_p)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowPlan {
    pub greedy: bool,
    pub inv_t: f32,
    /// `ln(min_p)`, -inf when off.
    pub log_min_p: f32,
    /// 0 when off, or when it would keep the whole vocabulary anyway.
    pub top_k: u32,
    /// 1 or more when off.
    pub top_p: f32,
    pub seed: u64,
    pub step: u64,
}

impl RowPlan {
    pub fn new(r: &RowSampling, vocab: usize) -> RowPlan {
        // A NaN parameter turns its step off (a NaN temperature: greedy).
        let greedy = r.temperature.is_nan() || r.temperature < 1e-5;
        let log_min_p = if r.min_p > 0.0 { (f64::from(r.min_p.min(1.0))).ln() as f32 } else { f32::NEG_INFINITY };
        let top_k = if (r.top_k as usize) < vocab { r.top_k } else { 0 };
        let top_p = if r.top_p < 1.0 { r.top_p } else { 1.0 };
        RowPlan { greedy, inv_t: 1.0 / r.temperature, log_min_p, top_k, top_p, seed: r.seed, step: r.step }
    }
}

/// The Philox4x32-10 block function (Salmon et al., SC'11) of `ctr` under `key`.
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(0x9E37_79B9), k[1].wrapping_add(0xBB67_AE85)];
        }
        let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0]);
        let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2]);
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// The uniform of token `i` at `step`: the top 23 bits of the first Philox word, centred in their
/// interval. It lies in (0, 1) strictly, so `E = -ln(u)` is never 0 (an infinite score, a certain
/// win for even the least likely token) nor infinite, and every value is exact in f32.
pub fn uniform(seed: u64, step: u64, i: u32) -> f32 {
    unit(philox4x32_10([step as u32, (step >> 32) as u32, i, 0], [seed as u32, (seed >> 32) as u32])[0])
}

fn unit(w: u32) -> f32 {
    ((w >> 9) as f32 + 0.5) * (1.0 / (1u32 << 23) as f32)
}

/// A float's bits mapped so that unsigned order is numeric order (for the finite and infinite
/// values the filters compare).
fn order_key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The scaled logit; -0 becomes +0 so that values that compare equal share an order key.
fn scaled(logit: f32, inv_t: f32) -> f32 {
    let x = logit * inv_t;
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// `d = x - m` when `x` survives min-p and has an order key of at least `floor`.
fn survivor(x: f32, m: f32, log_min_p: f32, floor: u32) -> Option<f32> {
    let d = if x == m { 0.0 } else { x - m };
    (d > f32::NEG_INFINITY && d >= log_min_p && order_key(x) >= floor).then_some(d)
}

fn sample_row(row: &[f32], plan: &RowPlan) -> u32 {
    if plan.greedy {
        return argmax_row(row);
    }
    let x: Vec<f32> = row.iter().map(|&l| scaled(l, plan.inv_t)).collect();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        // No token has any probability: fall back to what greedy would pick.
        return argmax_row(row);
    }
    let lmin = plan.log_min_p;
    let mut floor = 0u32;
    if plan.top_k > 0 {
        let mut keys: Vec<u32> =
            x.iter().filter(|&&v| survivor(v, m, lmin, 0).is_some()).map(|&v| order_key(v)).collect();
        let k = plan.top_k as usize;
        if keys.len() > k {
            let at = keys.len() - k;
            floor = *keys.select_nth_unstable(at).1;
        }
    }
    if plan.top_p < 1.0 {
        let mut kept: Vec<(u32, f32)> =
            x.iter().filter_map(|&v| survivor(v, m, lmin, floor).map(|d| (order_key(v), d.exp()))).collect();
        // f64 keeps this sum closer to the GPU's tree of f32 partial sums than a serial f32 sum.
        let target = f64::from(plan.top_p) * kept.iter().map(|&(_, w)| f64::from(w)).sum::<f64>();
        kept.sort_unstable_by_key(|&(k, _)| std::cmp::Reverse(k));
        let mut mass = 0.0f64;
        // The first key (from the top) that brings the mass to the target: every survivor at or
        // above it is kept. None only when rounding leaves the total short: keep them all.
        if let Some(&(t, _)) = kept.iter().find(|&&(_, w)| {
            mass += f64::from(w);
            mass >= target
        }) {
            floor = t;
        }
    }
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if let Some(d) = survivor(v, m, lmin, floor) {
            // Finite: d is, and u in (0, 1) keeps ln(E) within [-16.7, 2.9].
            let score = d - (-uniform(plan.seed, plan.step, i as u32).ln()).ln();
            if score > best.1 {
                best = (i as u32, score);
            }
        }
    }
    best.0
}

pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<u32>> {
    let vocab = logits.last_dim();
    let widened;
    let data: &[f32] = match logits.cpu() {
        Some(CpuStorage::F32(v)) => v,
        _ => {
            widened = logits.to_f32_vec();
            &widened
        }
    };
    Ok(data.par_chunks(vocab).zip(rows.par_iter()).map(|(row, r)| sample_row(row, &RowPlan::new(r, vocab))).collect())
}

/// `ops::mask_tokens` on the host.
pub fn mask_tokens(logits: &Tensor, bitmask: &[u32]) -> Result<Tensor> {
    let cols = logits.last_dim();
    let words = bitmask.len() / logits.rows().max(1);
    let mut out = logits.to_f32_vec();
    out.par_chunks_mut(cols.max(1)).zip(bitmask.par_chunks(words.max(1))).for_each(|(row, mask)| {
        for (c, v) in row.iter_mut().enumerate() {
            if mask[c / 32] >> (c % 32) & 1 == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    });
    Ok(super::f32_tensor(out, logits.shape().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use crate::DType;

    fn params(temperature: f32) -> RowSampling {
        RowSampling { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0, step: 0 }
    }

    /// Deterministic pseudo-random logits in [-scale, scale).
    fn logits(n: usize, scale: f32, salt: u32) -> Vec<f32> {
        (0..n as u32).map(|i| (uniform(99, u64::from(salt), i) * 2.0 - 1.0) * scale).collect()
    }

    fn sample(row: &[f32], p: RowSampling) -> u32 {
        let t = Tensor::from_f32(row.to_vec(), &[1, row.len()]).unwrap();
        ops::sample_rows(&t, &[p]).unwrap()[0]
    }

    /// Token frequencies over `draws` steps of one row.
    fn frequencies(row: &[f32], p: RowSampling, draws: u64) -> Vec<f64> {
        let t = Tensor::from_f32(row.repeat(draws as usize), &[draws as usize, row.len()]).unwrap();
        let rows: Vec<RowSampling> = (0..draws).map(|step| RowSampling { step, ..p }).collect();
        let mut counts = vec![0.0; row.len()];
        for id in ops::sample_rows(&t, &rows).unwrap() {
            counts[id as usize] += 1.0 / draws as f64;
        }
        counts
    }

    fn softmax(row: &[f32]) -> Vec<f64> {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row.iter().map(|&v| f64::from(v - m).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|v| v / z).collect()
    }

    #[test]
    fn philox_matches_random123_known_answers() {
        let cases = [
            ([0u32; 4], [0u32; 2], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
            ([u32::MAX; 4], [u32::MAX; 2], [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
            (
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0],
                [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
            ),
        ];
        for (ctr, key, want) in cases {
            assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:08x?} key {key:08x?}");
        }
    }

    #[test]
    fn uniforms_stay_inside_the_open_interval() {
        let (lo, hi) = (unit(0), unit(u32::MAX));
        assert!(lo > 0.0 && hi < 1.0 && -hi.ln() > 0.0, "{lo:e} {hi}");
        let mean = (0..100_000u32).map(|i| f64::from(uniform(5, 9, i))).sum::<f64>() / 100_000.0;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    }

    #[test]
    fn greedy_takes_the_lowest_maximum_and_nan_first() {
        let rows = [vec![1.0, 3.0, 3.0, 2.0], vec![f32::NEG_INFINITY; 4], vec![0.0, f32::NAN, 5.0, f32::NAN]];
        let t = Tensor::from_f32(rows.concat(), &[3, 4]).unwrap();
        let greedy = [params(0.0), params(1e-6), params(-1.0)];
        assert_eq!(ops::sample_rows(&t, &greedy).unwrap(), vec![1, 0, 1]);
        assert_eq!(ops::sample_rows(&t, &greedy).unwrap(), ops::argmax_rows(&t).unwrap());
        // Sampled rows treat NaN as no probability; a row with none at all falls back to greedy.
        let sampled = [params(1.0); 3];
        for step in 0..50 {
            let got = ops::sample_rows(&t, &sampled.map(|p| RowSampling { step, ..p })).unwrap();
            assert!(got[1] == 0 && (got[2] == 0 || got[2] == 2), "{got:?}");
        }
    }

    #[test]
    fn the_tightest_filters_equal_greedy() {
        for salt in 0..20 {
            let row = logits(1000, 4.0, salt);
            let want = argmax_row(&row);
            let base = RowSampling { seed: u64::from(salt), step: 3, ..params(0.8) };
            assert_eq!(sample(&row, RowSampling { top_k: 1, ..base }), want, "top_k 1");
            assert_eq!(sample(&row, RowSampling { top_p: 1e-6, ..base }), want, "tiny top_p");
            assert_eq!(sample(&row, RowSampling { top_p: 0.0, ..base }), want, "zero top_p");
            assert_eq!(sample(&row, RowSampling { min_p: 1.0, ..base }), want, "min_p 1");
        }
    }

    #[test]
    fn draws_are_reproducible_and_move_with_the_step_and_seed() {
        let row = logits(5000, 0.5, 1);
        let p = RowSampling { seed: 42, step: 7, ..params(1.0) };
        let first = sample(&row, p);
        assert_eq!(sample(&row, p), first);
        // In a batch, next to other rows: the same draw.
        let t = Tensor::from_f32([logits(5000, 3.0, 2), row.clone()].concat(), &[2, 5000]).unwrap();
        assert_eq!(ops::sample_rows(&t, &[params(0.7), p]).unwrap()[1], first);
        let by_step: std::collections::HashSet<u32> =
            (0..20).map(|step| sample(&row, RowSampling { step, ..p })).collect();
        assert!(by_step.len() > 15, "20 steps over a flat row gave {} tokens", by_step.len());
        let by_seed: std::collections::HashSet<u32> =
            (0..20).map(|seed| sample(&row, RowSampling { seed, ..p })).collect();
        assert!(by_seed.len() > 15, "20 seeds over a flat row gave {} tokens", by_seed.len());
    }

    #[test]
    fn draws_follow_the_softmax() {
        let row = [0.0, 1.0, -1.0, 2.0, 0.5, -3.0, f32::NEG_INFINITY, 1.5];
        let want = softmax(&row);
        let got = frequencies(&row, RowSampling { seed: 11, ..params(1.0) }, 40_000);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // 40K draws: a standard error of at most 0.0025.
            assert!((g - w).abs() < 0.01, "token {i}: {g:.4} vs softmax {w:.4}\n{got:?}");
        }
        assert_eq!(got[6], 0.0, "a -inf logit is never drawn");
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let row = [0.0, 1.0, 2.0];
        let cold = frequencies(&row, RowSampling { seed: 3, ..params(0.1) }, 4000);
        assert!(cold[2] > 0.99, "{cold:?}");
        let hot = frequencies(&row, RowSampling { seed: 3, ..params(50.0) }, 20_000);
        assert!(hot.iter().all(|&f| (f - 1.0 / 3.0).abs() < 0.03), "{hot:?}");
        let warm = frequencies(&row, RowSampling { seed: 3, ..params(2.0) }, 20_000);
        let want = softmax(&[0.0, 0.5, 1.0]);
        assert!(warm.iter().zip(&want).all(|(g, w)| (g - w).abs() < 0.02), "{warm:?} vs {want:?}");
    }

    #[test]
    fn filters_renormalise_in_order() {
        // p ~ [0.4, 0.3, 0.2, 0.1].
        let row: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
        let draw = |p: RowSampling| frequencies(&row, RowSampling { seed: 8, ..p }, 20_000);
        let close = |got: &[f64], want: &[f64]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 0.015);
        let k2 = draw(RowSampling { top_k: 2, ..params(1.0) });
        assert!(close(&k2, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]), "top_k 2: {k2:?}");
        // 0.75 of the whole needs three tokens; of the top 3 renormalised (0.44, 0.33, 0.22) two.
        let p = draw(RowSampling { top_p: 0.75, ..params(1.0) });
        assert!(close(&p, &[0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0]), "top_p 0.75: {p:?}");
        let kp = draw(RowSampling { top_k: 3, top_p: 0.75, ..params(1.0) });
        assert!(close(&kp, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]), "top_k 3 then top_p 0.75: {kp:?}");
        // min_p 0.4 keeps p >= 0.16: three tokens, then top_p 0.5 of those (0.44, 0.33, 0.22) two.
        let mp = draw(RowSampling { min_p: 0.4, ..params(1.0) });
        assert!(close(&mp, &[0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0.0]), "min_p 0.4: {mp:?}");
        let mpp = draw(RowSampling { min_p: 0.4, top_p: 0.5, ..params(1.0) });
        assert!(close(&mpp, &[4.0 / 7.0, 3.0 / 7.0, 0.0, 0.0]), "min_p 0.4 then top_p 0.5: {mpp:?}");
    }

    #[test]
    fn top_k_keeps_ties_with_the_kth_value() {
        let row = [1.0, 4.0, 3.0, 3.0, 0.0, 3.0];
        let seen: std::collections::HashSet<u32> =
            (0..400).map(|step| sample(&row, RowSampling { top_k: 2, step, ..params(1.0) })).collect();
        assert_eq!(seen, [1, 2, 3, 5].into_iter().collect());
    }

    #[test]
    fn bf16_logits_and_misuse() {
        let row = logits(300, 3.0, 4);
        let f32s = Tensor::from_f32_as(row.clone(), &[1, 300], DType::BF16).unwrap().to_f32_vec();
        let bf = Tensor::from_f32_as(row, &[1, 300], DType::BF16).unwrap();
        let p = RowSampling { top_k: 50, top_p: 0.9, seed: 1, ..params(0.9) };
        assert_eq!(ops::sample_rows(&bf, &[p]).unwrap()[0], sample(&f32s, p));
        assert!(ops::sample_rows(&bf, &[p, p]).is_err(), "one plan per row");
        assert!(ops::sample_rows(&Tensor::from_f32(vec![], &[2, 0]).unwrap(), &[p, p]).is_err(), "empty vocab");
    }

    #[test]
    fn mask_tokens_sets_cleared_bits_to_minus_infinity() {
        let logits = Tensor::from_f32((0..70).map(|v| v as f32).collect(), &[2, 35]).unwrap();
        // Row 0 allows tokens 1 and 33; row 1 allows everything.
        let mask = [0b10, 0b10, u32::MAX, u32::MAX];
        let out = mask_tokens(&logits, &mask).unwrap().to_f32_vec();
        let allowed: Vec<usize> = (0..35).filter(|&c| out[c].is_finite()).collect();
        assert_eq!(allowed, vec![1, 33]);
        assert_eq!(&out[35..], &logits.to_f32_vec()[35..]);
    }
}
