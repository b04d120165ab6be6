//! `x @ w^T` with `w` kept in ggml blocks (a GGUF weight), as llama.cpp computes it: each input
//! row is quantized to 8 bits per 32 elements, each output is a sum of integer block dot products
//! times the blocks' scales. A decode step reads the weights' bytes once, a quarter to an eighth
//! of what the same matrix dequantized to f32 takes.
//!
//! Precision is llama.cpp's or finer: its Q8_0/Q8_1 activation blocks keep an f16 scale, these keep
//! f32, and under K-quant weights its Q8_K has one scale per 256 elements, these one per 32.
//! Each output element is computed the same way whatever the batch, so a request's logits do not
//! depend on what it is batched with.
//!
//! The kernels are written per block layout (ggml-common.h), once portably and once with AVX2,
//! chosen at run time; tests hold both to the dequantized weights.

use rayon::prelude::*;

use crate::ggml::{f16_at, scale_min_k4, GgmlType};

/// Elements per activation block.
const QK: usize = 32;
/// Output channels (weight rows) per rayon task.
const ROWS_PER_TASK: usize = 16;

/// Input rows quantized per 32 elements: `x ≈ d * q`, with `sum = Σ q` for the weight formats
/// whose blocks carry an offset.
pub(crate) struct Q8Rows {
    qs: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    /// `d * sum`: the block's values summed, for the weight blocks' offsets.
    dsum: Vec<f32>,
    k: usize,
}

impl Q8Rows {
    /// llama.cpp's `quantize_row_q8_0_ref` per block, with the scale kept in f32.
    pub(crate) fn quantize(x: &[f32], k: usize) -> Q8Rows {
        let mut qs = vec![0i8; x.len()];
        let scales: Vec<(f32, i32)> = if x.len() >= 4096 * QK {
            x.par_chunks(QK).zip(qs.par_chunks_mut(QK)).map(|(x, q)| quantize_block(x, q)).collect()
        } else {
            x.chunks(QK).zip(qs.chunks_mut(QK)).map(|(x, q)| quantize_block(x, q)).collect()
        };
        let (d, sum): (Vec<f32>, Vec<i32>) = scales.into_iter().unzip();
        let dsum = d.iter().zip(&sum).map(|(d, &s)| d * s as f32).collect();
        Q8Rows { qs, d, sum, dsum, k }
    }

    fn row(&self, i: usize) -> Q8Row<'_> {
        let nb = self.k / QK;
        Q8Row {
            qs: &self.qs[i * self.k..(i + 1) * self.k],
            d: &self.d[i * nb..(i + 1) * nb],
            sum: &self.sum[i * nb..(i + 1) * nb],
            dsum: &self.dsum[i * nb..(i + 1) * nb],
        }
    }
}

/// One block's scale and the sum of its quants.
fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
        sum += *q as i32;
    }
    (d, sum)
}

#[derive(Clone, Copy)]
struct Q8Row<'a> {
    qs: &'a [i8],
    d: &'a [f32],
    sum: &'a [i32],
    dsum: &'a [f32],
}

/// One weight row (whole blocks) dotted with one quantized input row.
type DotFn = fn(&[u8], Q8Row<'_>) -> f32;
/// Four weight rows dotted with one input row: the input block is loaded once for four rows,
/// and the four sums are independent chains the core can overlap.
type Dot4Fn = fn([&[u8]; 4], Q8Row<'_>) -> [f32; 4];
/// Four weight rows dotted with two input rows (prompts): the weights are unpacked once for
/// both. Each input row's sums are the same bits as [`Dot4Fn`]'s.
type Dot4x2Fn = fn([&[u8]; 4], [Q8Row<'_>; 2]) -> [[f32; 4]; 2];

/// One weight row dotted with four input rows (prompts): each block is decoded once for all
/// four. Each input row's sum is the same bits as [`DotFn`]'s.
type Dot1x4Fn = fn(&[u8], [Q8Row<'_>; 4]) -> [f32; 4];

#[derive(Clone, Copy)]
struct Kernel {
    one: DotFn,
    four: Option<(Dot4Fn, Dot4x2Fn)>,
    inputs4: Option<Dot1x4Fn>,
}

/// `out [m, n] = x [m, k] @ w^T` for `w` the `n` rows of `ty` blocks in `w`.
pub(crate) fn matmul_t(x: &[f32], m: usize, k: usize, ty: GgmlType, w: &[u8], n: usize, out: &mut [f32]) {
    matmul_with(select(ty, simd_available()), x, m, k, ty, w, n, out);
}

#[allow(clippy::too_many_arguments)]
fn matmul_with(kernel: Kernel, x: &[f32], m: usize, k: usize, ty: GgmlType, w: &[u8], n: usize, out: &mut [f32]) {
    let xq = Q8Rows::quantize(x, k);
    let row_bytes = ty.bytes_for(k);
    let row = |j: usize| &w[j * row_bytes..(j + 1) * row_bytes];
    // Each task owns ROWS_PER_TASK weight rows (a few KiB, kept in L1 while every input row
    // goes past) and writes their outputs as [m, rows]. Which kernel computes a channel depends
    // on its index only, never on the batch.
    let mut blocks = vec![0f32; n * m];
    blocks.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(t, chunk)| {
        let (j0, rows) = (t * ROWS_PER_TASK, chunk.len() / m);
        let mut i = 0;
        while i < m {
            let pair = kernel.four.is_some() && i + 1 < m;
            let mut r = 0;
            if let Some((four, four_by_two)) = kernel.four {
                while r + 4 <= rows {
                    let ws = [row(j0 + r), row(j0 + r + 1), row(j0 + r + 2), row(j0 + r + 3)];
                    if pair {
                        let sums = four_by_two(ws, [xq.row(i), xq.row(i + 1)]);
                        chunk[i * rows + r..][..4].copy_from_slice(&sums[0]);
                        chunk[(i + 1) * rows + r..][..4].copy_from_slice(&sums[1]);
                    } else {
                        chunk[i * rows + r..][..4].copy_from_slice(&four(ws, xq.row(i)));
                    }
                    r += 4;
                }
            }
            if let Some(inputs4) = kernel.inputs4.filter(|_| i + 4 <= m) {
                for r in r..rows {
                    let sums = inputs4(row(j0 + r), [xq.row(i), xq.row(i + 1), xq.row(i + 2), xq.row(i + 3)]);
                    (0..4).for_each(|a| chunk[(i + a) * rows + r] = sums[a]);
                }
                i += 4;
                continue;
            }
            for a in i..i + 1 + usize::from(pair) {
                for r in r..rows {
                    chunk[a * rows + r] = (kernel.one)(row(j0 + r), xq.row(a));
                }
            }
            i += 1 + usize::from(pair);
        }
    });
    if m == 1 {
        out.copy_from_slice(&blocks);
    } else {
        out.par_chunks_mut(n).enumerate().for_each(|(i, out_row)| {
            for (t, dst) in out_row.chunks_mut(ROWS_PER_TASK).enumerate() {
                let start = t * ROWS_PER_TASK * m + i * dst.len();
                dst.copy_from_slice(&blocks[start..start + dst.len()]);
            }
        });
    }
}

fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The dot kernels for `ty`.
///
/// # Panics
/// For a type without a kernel: the loader keeps only [`GgmlType::has_cpu_kernel`] types.
fn select(ty: GgmlType, simd: bool) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY (each wrapper): the caller checked the CPU for AVX2, FMA and F16C.
        macro_rules! rows {
            ($f:ident) => {
                (|w, x| unsafe { avx2::$f::<1>(w, [x])[0] }, None, Some(|w, x| unsafe { avx2::$f::<4>(w, x) }))
            };
        }
        let (one, four, inputs4): (DotFn, Option<(Dot4Fn, Dot4x2Fn)>, Option<Dot1x4Fn>) = match ty {
            GgmlType::Q4_0 => (
                |w, x| unsafe { avx2::q4_0(w, x) },
                Some((|w, x| unsafe { avx2::q4_0_x4(w, [x])[0] }, |w, x| unsafe { avx2::q4_0_x4(w, x) })),
                None,
            ),
            GgmlType::Q4_1 => (
                |w, x| unsafe { avx2::q4_1(w, x) },
                Some((|w, x| unsafe { avx2::q4_1_x4(w, [x])[0] }, |w, x| unsafe { avx2::q4_1_x4(w, x) })),
                None,
            ),
            GgmlType::Q5_0 => rows!(q5_0),
            GgmlType::Q5_1 => rows!(q5_1),
            // Four Q8_0 rows at once are faster from cache but slower from DRAM (the LM head:
            // 18 against 27 GB/s, prefetching or not), so one row at a time.
            GgmlType::Q8_0 => (|w, x| unsafe { avx2::q8_0(w, x) }, None, None),
            GgmlType::Q4_K => rows!(q4_k),
            GgmlType::Q5_K => rows!(q5_k),
            GgmlType::Q6_K => rows!(q6_k),
            other => panic!("no CPU kernel for ggml {other}"),
        };
        return Kernel { one, four, inputs4 };
    }
    let _ = simd;
    let one: DotFn = match ty {
        GgmlType::Q4_0 => portable::q4_0,
        GgmlType::Q4_1 => portable::q4_1,
        GgmlType::Q5_0 => portable::q5_0,
        GgmlType::Q5_1 => portable::q5_1,
        GgmlType::Q8_0 => portable::q8_0,
        GgmlType::Q4_K => portable::q4_k,
        GgmlType::Q5_K => portable::q5_k,
        GgmlType::Q6_K => portable::q6_k,
        other => panic!("no CPU kernel for ggml {other}"),
    };
    Kernel { one, four: None, inputs4: None }
}

/// The element values of one 32-element sub-block, as the block layouts (ggml-common.h) store
/// them; shared by the portable kernels.
mod portable {
    use super::*;

    fn idot(q: impl Iterator<Item = i32>, x: &[i8]) -> i32 {
        q.zip(x).map(|(q, &x)| q * x as i32).sum()
    }

    /// block_q4_0: f16 d, 16 bytes of nibbles (low: elements 0..16, high: 16..32); w = d (q - 8).
    pub(super) fn q4_0(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(18).enumerate() {
            let qs = &blk[2..18];
            let isum =
                idot(qs.iter().map(|q| (q & 15) as i32).chain(qs.iter().map(|q| (q >> 4) as i32)), &x.qs[b * QK..]);
            acc += f16_at(blk, 0) * x.d[b] * (isum - 8 * x.sum[b]) as f32;
        }
        acc
    }

    /// block_q4_1: f16 d, f16 m, 16 bytes of nibbles; w = d q + m.
    pub(super) fn q4_1(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(20).enumerate() {
            let qs = &blk[4..20];
            let isum =
                idot(qs.iter().map(|q| (q & 15) as i32).chain(qs.iter().map(|q| (q >> 4) as i32)), &x.qs[b * QK..]);
            acc += f16_at(blk, 0) * x.d[b] * isum as f32 + f16_at(blk, 2) * x.d[b] * x.sum[b] as f32;
        }
        acc
    }

    /// The 32 five-bit values of a Q5 block: nibbles as Q4's, bit `e` of `qh` the fifth bit of
    /// element `e`.
    fn q5_values(qh: u32, qs: &[u8]) -> impl Iterator<Item = i32> + '_ {
        let nibbles = qs.iter().map(|q| (q & 15) as i32).chain(qs.iter().map(|q| (q >> 4) as i32));
        nibbles.enumerate().map(move |(e, n)| n | (((qh >> e) & 1) << 4) as i32)
    }

    /// block_q5_0: f16 d, u32 of fifth bits, 16 bytes of nibbles; w = d (q - 16).
    pub(super) fn q5_0(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(22).enumerate() {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let isum = idot(q5_values(qh, &blk[6..22]), &x.qs[b * QK..]);
            acc += f16_at(blk, 0) * x.d[b] * (isum - 16 * x.sum[b]) as f32;
        }
        acc
    }

    /// block_q5_1: f16 d, f16 m, u32 of fifth bits, 16 bytes of nibbles; w = d q + m.
    pub(super) fn q5_1(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(24).enumerate() {
            let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
            let isum = idot(q5_values(qh, &blk[8..24]), &x.qs[b * QK..]);
            acc += f16_at(blk, 0) * x.d[b] * isum as f32 + f16_at(blk, 2) * x.d[b] * x.sum[b] as f32;
        }
        acc
    }

    /// block_q8_0: f16 d, 32 signed bytes; w = d q.
    pub(super) fn q8_0(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in w.chunks_exact(34).enumerate() {
            let isum = idot(blk[2..34].iter().map(|&q| q as i8 as i32), &x.qs[b * QK..]);
            acc += f16_at(blk, 0) * x.d[b] * isum as f32;
        }
        acc
    }

    /// block_q4_K: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs, 128 bytes of nibbles:
    /// 32 bytes per 64 elements, low nibbles first; w = d sc q - dmin m per 32 elements.
    pub(super) fn q4_k(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(144).enumerate() {
            let (d, dmin, scales) = (f16_at(blk, 0), f16_at(blk, 2), &blk[4..16]);
            for (j, q) in blk[16..144].chunks_exact(32).enumerate() {
                for (half, shift) in [(0, 0), (1, 4)] {
                    let (sc, m) = scale_min_k4(2 * j + half, scales);
                    let b = sb * 8 + 2 * j + half;
                    let isum = idot(q.iter().map(|q| ((q >> shift) & 15) as i32), &x.qs[b * QK..]);
                    acc += x.d[b] * (d * sc as f32 * isum as f32 - dmin * m as f32 * x.sum[b] as f32);
                }
            }
        }
        acc
    }

    /// block_q5_K: Q4_K plus 32 bytes of fifth bits (bit 2j / 2j+1 of byte l for chunk j).
    pub(super) fn q5_k(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(176).enumerate() {
            let (d, dmin, scales, qh) = (f16_at(blk, 0), f16_at(blk, 2), &blk[4..16], &blk[16..48]);
            for (j, q) in blk[48..176].chunks_exact(32).enumerate() {
                for (half, shift) in [(0, 0), (1, 4)] {
                    let (sc, m) = scale_min_k4(2 * j + half, scales);
                    let b = sb * 8 + 2 * j + half;
                    let bit = 2 * j + half;
                    let vals = q.iter().zip(qh).map(|(q, h)| (((q >> shift) & 15) | (((h >> bit) & 1) << 4)) as i32);
                    let isum = idot(vals, &x.qs[b * QK..]);
                    acc += x.d[b] * (d * sc as f32 * isum as f32 - dmin * m as f32 * x.sum[b] as f32);
                }
            }
        }
        acc
    }

    /// block_q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed scales (one per 16
    /// elements), f16 d; w = d sc (q - 32).
    pub(super) fn q6_k(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in w.chunks_exact(210).enumerate() {
            let d = f16_at(blk, 208);
            for n in 0..2 {
                let (ql, qh, sc) = (&blk[64 * n..64 * n + 64], &blk[128 + 32 * n..160 + 32 * n], &blk[192 + 8 * n..]);
                for t in 0..4 {
                    let b = sb * 8 + 4 * n + t;
                    let low = &ql[32 * (t & 1)..32 * (t & 1) + 32];
                    let shift = if t < 2 { 0 } else { 4 };
                    let vals: Vec<i32> = low
                        .iter()
                        .zip(qh)
                        .map(|(l, h)| (((l >> shift) & 15) | (((h >> (2 * t)) & 3) << 4)) as i32 - 32)
                        .collect();
                    let xs = &x.qs[b * QK..(b + 1) * QK];
                    let lo = idot(vals[..16].iter().copied(), &xs[..16]);
                    let hi = idot(vals[16..].iter().copied(), &xs[16..]);
                    let (s_lo, s_hi) = (sc[2 * t] as i8 as i32, sc[2 * t + 1] as i8 as i32);
                    acc += d * x.d[b] * (s_lo * lo + s_hi * hi) as f32;
                }
            }
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The same sums with 32 products per instruction pair: `maddubs` multiplies unsigned weight
    //! bytes by signed input bytes into pairs of i16, `madd` by ones widens them to i32. Signed
    //! weights go through the sign trick (|w| times x with w's sign). No i16 saturates: the
    //! largest pair is 2 · 128 · 127.

    use std::arch::x86_64::*;

    use super::{scale_min_k4, Q8Row, QK};

    /// How far ahead (in rows) the four-row kernels prefetch: the next group of four.
    const PREFETCH_ROWS: usize = 4;

    #[inline(always)]
    unsafe fn f16(b: &[u8], i: usize) -> f32 {
        let bits = u16::from_le_bytes([b[i], b[i + 1]]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }

    #[inline(always)]
    unsafe fn dot_u8_i8(w: __m256i, x: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn dot_i8_i8(w: __m256i, x: __m256i) -> __m256i {
        dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    }

    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        _mm256_loadu_si256(p as *const __m256i)
    }

    #[inline(always)]
    unsafe fn input(x: Q8Row<'_>, b: usize) -> __m256i {
        load(x.qs.as_ptr().add(b * QK) as *const u8)
    }

    /// 16 bytes of nibbles as 32 bytes: low nibbles, then high ones.
    #[inline(always)]
    unsafe fn nibbles16(p: *const u8) -> __m256i {
        let q = _mm_loadu_si128(p as *const __m128i);
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F))
    }

    #[inline(always)]
    unsafe fn fma(isum: __m256i, scale: f32, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(scale), acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0(w: &[u8], x: Q8Row<'_>) -> f32 {
        let (mut acc, mut offsets) = (_mm256_setzero_ps(), 0f32);
        for (b, blk) in w.chunks_exact(18).enumerate() {
            let d = f16(blk, 0) * x.d[b];
            acc = fma(dot_u8_i8(nibbles16(blk.as_ptr().add(2)), input(x, b)), d, acc);
            offsets -= 8.0 * d * x.sum[b] as f32;
        }
        hsum(acc) + offsets
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut offsets = [0f32; 2];
        for (b, blk) in w.chunks_exact(20).enumerate() {
            let lane = b & 1;
            acc[lane] = fma(dot_u8_i8(nibbles16(blk.as_ptr().add(4)), input(x, b)), f16(blk, 0) * x.d[b], acc[lane]);
            offsets[lane] += f16(blk, 2) * x.d[b] * x.sum[b] as f32;
        }
        hsum(_mm256_add_ps(acc[0], acc[1])) + (offsets[0] + offsets[1])
    }

    /// Q5's fifth bits as 0x10 in byte `e` where bit `e` of `qh` is set (llama.cpp's
    /// `bytes_from_bits_32`: byte `e` picks byte `e / 8` of `qh`, is ORed with all bits but
    /// `e % 8`, and compared with all ones).
    #[inline(always)]
    unsafe fn fifth_bits(qh: u32) -> __m256i {
        let bytes = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
        );
        let set = _mm256_cmpeq_epi8(
            _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
            _mm256_set1_epi64x(-1),
        );
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_0<const A: usize>(w: &[u8], x: [Q8Row<'_>; A]) -> [f32; A] {
        let (mut acc, mut offsets) = ([_mm256_setzero_ps(); A], [0f32; A]);
        for (b, blk) in w.chunks_exact(22).enumerate() {
            let dw = f16(blk, 0);
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let q = _mm256_or_si256(nibbles16(blk.as_ptr().add(6)), fifth_bits(qh));
            for a in 0..A {
                let d = dw * x[a].d[b];
                acc[a] = fma(dot_u8_i8(q, input(x[a], b)), d, acc[a]);
                offsets[a] -= 16.0 * d * x[a].sum[b] as f32;
            }
        }
        std::array::from_fn(|a| hsum(acc[a]) + offsets[a])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_1<const A: usize>(w: &[u8], x: [Q8Row<'_>; A]) -> [f32; A] {
        let (mut acc, mut offsets) = ([_mm256_setzero_ps(); A], [0f32; A]);
        for (b, blk) in w.chunks_exact(24).enumerate() {
            let (dw, mw) = (f16(blk, 0), f16(blk, 2));
            let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
            let q = _mm256_or_si256(nibbles16(blk.as_ptr().add(8)), fifth_bits(qh));
            for a in 0..A {
                acc[a] = fma(dot_u8_i8(q, input(x[a], b)), dw * x[a].d[b], acc[a]);
                offsets[a] += mw * x[a].dsum[b];
            }
        }
        std::array::from_fn(|a| hsum(acc[a]) + offsets[a])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0(w: &[u8], x: Q8Row<'_>) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for (b, blk) in w.chunks_exact(34).enumerate() {
            acc = fma(dot_i8_i8(load(blk.as_ptr().add(2)), input(x, b)), f16(blk, 0) * x.d[b], acc);
        }
        hsum(acc)
    }

    /// The f16 scale at byte `at` of each of four rows' block `b` (blocks of `size` bytes).
    #[inline(always)]
    unsafe fn scales4(w: &[&[u8]; 4], b: usize, size: usize, at: usize) -> __m128 {
        let h = |r: usize| std::ptr::read_unaligned(w[r].as_ptr().add(b * size + at) as *const u16) as u64;
        let packed = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
        _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64))
    }

    #[inline(always)]
    unsafe fn finish4(acc: [__m256; 4], offsets: __m128) -> [f32; 4] {
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), offsets);
        [out[0] + hsum(acc[0]), out[1] + hsum(acc[1]), out[2] + hsum(acc[2]), out[3] + hsum(acc[3])]
    }

    /// Asks for the bytes `ahead` rows past block `b` of each of the four rows. Four rows read
    /// side by side are four streams that the hardware prefetcher follows poorly once rows are
    /// long: a 576x1536 Q4_1 matrix from DRAM took 3.5x longer per block than from cache.
    #[inline(always)]
    unsafe fn prefetch4(w: &[&[u8]; 4], b: usize, size: usize, ahead: usize) {
        for row in w {
            let at = row.as_ptr().wrapping_add(b * size + ahead * row.len());
            _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
        }
    }

    /// `acc[r] += isum(r) * scale[r]` for the four rows, spelled out so that each accumulator
    /// stays in a register.
    macro_rules! accumulate4 {
        ($acc:expr, $scale:expr, |$r:ident| $isum:expr) => {{
            let scale = _mm256_castps128_ps256($scale);
            accumulate4!(@row $acc, scale, 0, $r, $isum);
            accumulate4!(@row $acc, scale, 1, $r, $isum);
            accumulate4!(@row $acc, scale, 2, $r, $isum);
            accumulate4!(@row $acc, scale, 3, $r, $isum);
        }};
        (@row $acc:expr, $scale:ident, $i:literal, $r:ident, $isum:expr) => {{
            let $r = $i;
            let s = _mm256_permutevar8x32_ps($scale, _mm256_set1_epi32($i));
            $acc[$i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps($isum), s, $acc[$i]);
        }};
    }

    /// Four Q4_0 rows against `A` input rows: each row's weights are unpacked once per block for
    /// all of them. Every input row goes through the same operations whatever `A` is, so its
    /// sums are the same bits alone or in a pair.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_x4<const A: usize>(w: [&[u8]; 4], x: [Q8Row<'_>; A]) -> [[f32; 4]; A] {
        let (mut acc, mut offsets) = ([[_mm256_setzero_ps(); 4]; A], [_mm_setzero_ps(); A]);
        for b in 0..x[0].d.len() {
            prefetch4(&w, b, 18, PREFETCH_ROWS);
            let d = scales4(&w, b, 18, 0);
            let q = [0, 1, 2, 3].map(|r| nibbles16(w[r].as_ptr().add(b * 18 + 2)));
            for a in 0..A {
                let xv = input(x[a], b);
                offsets[a] = _mm_fmadd_ps(d, _mm_set1_ps(-8.0 * x[a].dsum[b]), offsets[a]);
                accumulate4!(acc[a], _mm_mul_ps(d, _mm_set1_ps(x[a].d[b])), |r| dot_u8_i8(q[r], xv));
            }
        }
        std::array::from_fn(|a| finish4(acc[a], offsets[a]))
    }

    /// Four Q4_1 rows against `A` input rows, as [`q4_0_x4`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_1_x4<const A: usize>(w: [&[u8]; 4], x: [Q8Row<'_>; A]) -> [[f32; 4]; A] {
        let (mut acc, mut offsets) = ([[_mm256_setzero_ps(); 4]; A], [_mm_setzero_ps(); A]);
        for b in 0..x[0].d.len() {
            prefetch4(&w, b, 20, PREFETCH_ROWS);
            let (d, m) = (scales4(&w, b, 20, 0), scales4(&w, b, 20, 2));
            let q = [0, 1, 2, 3].map(|r| nibbles16(w[r].as_ptr().add(b * 20 + 4)));
            for a in 0..A {
                let xv = input(x[a], b);
                offsets[a] = _mm_fmadd_ps(m, _mm_set1_ps(x[a].dsum[b]), offsets[a]);
                accumulate4!(acc[a], _mm_mul_ps(d, _mm_set1_ps(x[a].d[b])), |r| dot_u8_i8(q[r], xv));
            }
        }
        std::array::from_fn(|a| finish4(acc[a], offsets[a]))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k<const A: usize>(w: &[u8], x: [Q8Row<'_>; A]) -> [f32; A] {
        let (mut acc, mut offsets) = ([_mm256_setzero_ps(); A], [0f32; A]);
        let low = _mm256_set1_epi8(0x0F);
        for (sb, blk) in w.chunks_exact(144).enumerate() {
            let (d, dmin, scales) = (f16(blk, 0), f16(blk, 2), &blk[4..16]);
            for j in 0..4 {
                let q = load(blk.as_ptr().add(16 + 32 * j));
                let halves = [_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16(q, 4), low)];
                for (half, vals) in halves.into_iter().enumerate() {
                    let (sc, m) = scale_min_k4(2 * j + half, scales);
                    let b = sb * 8 + 2 * j + half;
                    for a in 0..A {
                        acc[a] = fma(dot_u8_i8(vals, input(x[a], b)), d * sc as f32 * x[a].d[b], acc[a]);
                        offsets[a] -= dmin * m as f32 * x[a].d[b] * x[a].sum[b] as f32;
                    }
                }
            }
        }
        std::array::from_fn(|a| hsum(acc[a]) + offsets[a])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q5_k<const A: usize>(w: &[u8], x: [Q8Row<'_>; A]) -> [f32; A] {
        let (mut acc, mut offsets) = ([_mm256_setzero_ps(); A], [0f32; A]);
        let (low, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
        for (sb, blk) in w.chunks_exact(176).enumerate() {
            let (d, dmin, scales) = (f16(blk, 0), f16(blk, 2), &blk[4..16]);
            let qh = load(blk.as_ptr().add(16));
            for j in 0..4 {
                let q = load(blk.as_ptr().add(48 + 32 * j));
                let halves = [_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16(q, 4), low)];
                for (half, nib) in halves.into_iter().enumerate() {
                    let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128((2 * j + half) as i32)), one);
                    let vals = _mm256_or_si256(nib, _mm256_slli_epi16(bit, 4));
                    let (sc, m) = scale_min_k4(2 * j + half, scales);
                    let b = sb * 8 + 2 * j + half;
                    for a in 0..A {
                        acc[a] = fma(dot_u8_i8(vals, input(x[a], b)), d * sc as f32 * x[a].d[b], acc[a]);
                        offsets[a] -= dmin * m as f32 * x[a].d[b] * x[a].sum[b] as f32;
                    }
                }
            }
        }
        std::array::from_fn(|a| hsum(acc[a]) + offsets[a])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k<const A: usize>(w: &[u8], x: [Q8Row<'_>; A]) -> [f32; A] {
        let mut acc = [_mm256_setzero_ps(); A];
        let (low, three, bias) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
        for (sb, blk) in w.chunks_exact(210).enumerate() {
            let d = f16(blk, 208);
            for n in 0..2 {
                let qh = load(blk.as_ptr().add(128 + 32 * n));
                for t in 0..4 {
                    let raw = load(blk.as_ptr().add(64 * n + 32 * (t & 1)));
                    let nib = if t < 2 { raw } else { _mm256_srli_epi16(raw, 4) };
                    let high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t as i32)), three);
                    let vals =
                        _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(nib, low), _mm256_slli_epi16(high, 4)), bias);
                    let b = sb * 8 + 4 * n + t;
                    let (s_lo, s_hi) = (blk[192 + 8 * n + 2 * t] as i8, blk[193 + 8 * n + 2 * t] as i8);
                    let scales = _mm256_set_m128i(_mm_set1_epi16(s_hi as i16), _mm_set1_epi16(s_lo as i16));
                    let magnitude = _mm256_sign_epi8(vals, vals);
                    for a in 0..A {
                        let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(input(x[a], b), vals));
                        acc[a] = fma(_mm256_madd_epi16(pairs, scales), d * x[a].d[b], acc[a]);
                    }
                }
            }
        }
        std::array::from_fn(|a| hsum(acc[a]))
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    /// Random blocks of `ty` for `[n, k]`, with every f16 scale set to a small normal number (the
    /// quant bytes stay random, as the kernels must handle any).
    fn random_blocks(ty: GgmlType, n: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut bytes: Vec<u8> = (0..ty.bytes_for(n * k)).map(|_| next() as u8).collect();
        let scale_at: &[usize] = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            other => panic!("{other}"),
        };
        for blk in bytes.chunks_exact_mut(ty.type_size()) {
            for &at in scale_at {
                let v = ((next() % 1000) as f32 / 1000.0 + 0.05) * if next() % 2 == 0 { 0.02 } else { -0.02 };
                blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
            }
        }
        bytes
    }

    fn inputs(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0 * if i % 7 == 0 { 3.0 } else { 1.0 }).collect()
    }

    const TYPES: [GgmlType; 8] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// The dequantized weights times the dequantized 8-bit inputs, in f64: what the integer
    /// kernels compute up to f32 rounding.
    fn reference(w: &[f32], xq: &Q8Rows, m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            let x: Vec<f64> = (0..k).map(|p| xq.qs[i * k + p] as f64 * xq.d[i * k / QK + p / QK] as f64).collect();
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| w[j * k + p] as f64 * x[p]).sum();
            }
        }
        out
    }

    #[test]
    fn kernels_compute_the_dequantized_product() {
        let (m, k, n) = (5, 512, 37);
        let x = inputs(m, k);
        let xq = Q8Rows::quantize(&x, k);
        for ty in TYPES {
            let blocks = random_blocks(ty, n, k, ty.id() as u64);
            let mut w = vec![0f32; n * k];
            ty.dequantize_into(&blocks, &mut w).unwrap();
            let want = reference(&w, &xq, m, k, n);
            let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
            let mut paths = vec![("portable", select(ty, false))];
            if simd_available() {
                let simd = select(ty, true);
                paths.push(("avx2, one row at a time", Kernel { four: None, inputs4: None, ..simd }));
                paths.push(("avx2", simd));
            }
            for (path, kernel) in paths {
                let mut got = vec![0f32; m * n];
                matmul_with(kernel, &x, m, k, ty, &blocks, n, &mut got);
                for (g, w) in got.iter().zip(&want) {
                    assert!((*g as f64 - w).abs() <= 1e-5 * scale, "{ty} {path}: {g} vs {w}");
                }
            }
        }
    }

    #[test]
    fn eight_bit_inputs_stay_close_to_f32_inputs() {
        let (m, k, n) = (2, 256, 16);
        let x = inputs(m, k);
        for ty in TYPES {
            let blocks = random_blocks(ty, n, k, 7 + ty.id() as u64);
            let mut w = vec![0f32; n * k];
            ty.dequantize_into(&blocks, &mut w).unwrap();
            let mut got = vec![0f32; m * n];
            matmul_t(&x, m, k, ty, &blocks, n, &mut got);
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k).map(|p| w[j * k + p] as f64 * x[i * k + p] as f64).sum();
                    // Rounding each input to 1/254 of its block's range moves the sum by at most
                    // half a step per element.
                    let bound: f64 = (0..k)
                        .map(|p| {
                            let b = &x[i * k + p / QK * QK..i * k + p / QK * QK + QK];
                            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            w[j * k + p].abs() as f64 * amax / 254.0
                        })
                        .sum();
                    let g = got[i * n + j] as f64;
                    assert!((g - exact).abs() <= bound * 1.01 + 1e-4, "{ty}: {g} vs {exact} (bound {bound})");
                }
            }
        }
    }

    #[test]
    fn a_row_is_computed_the_same_alone_and_batched() {
        let (m, k, n) = (7, 256, 40);
        let x = inputs(m, k);
        for ty in TYPES {
            let blocks = random_blocks(ty, n, k, 3);
            let mut batched = vec![0f32; m * n];
            matmul_t(&x, m, k, ty, &blocks, n, &mut batched);
            for i in 0..m {
                let mut alone = vec![0f32; n];
                matmul_t(&x[i * k..(i + 1) * k], 1, k, ty, &blocks, n, &mut alone);
                assert_eq!(alone, batched[i * n..(i + 1) * n], "{ty} row {i}");
            }
        }
    }

    #[test]
    fn input_quantization_is_llama_cpps() {
        let x: Vec<f32> = (0..QK).map(|i| i as f32 - 12.7).collect();
        let q = Q8Rows::quantize(&x, QK);
        let d = x[31] / 127.0;
        assert_eq!(q.d[0], d);
        assert_eq!(q.qs[31], 127);
        assert_eq!(q.qs[0], (x[0] * (1.0 / d)).round() as i8);
        assert_eq!(q.qs[0], -88);
        assert_eq!(q.sum[0], q.qs.iter().map(|&v| v as i32).sum::<i32>());
        let zeros = Q8Rows::quantize(&[0.0; QK], QK);
        assert_eq!((zeros.d[0], zeros.sum[0]), (0.0, 0));
    }
}
