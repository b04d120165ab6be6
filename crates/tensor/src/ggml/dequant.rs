//! ggml tensor types and their dequantization to f32.
//!
//! Each kernel transcribes ggml's reference `dequantize_row_*` (ggml/src/ggml-quants.c) with the
//! same float operations in the same order and no fused multiply-add, which is also what gguf-py's
//! numpy port (`gguf.quants`, the code transformers dequantizes with) computes. The results are
//! therefore bit-identical to the weights transformers loads from the same file.

use std::fmt;

use half::f16;
use rayon::prelude::*;

/// Elements in one K-quant super-block.
const QK_K: usize = 256;
/// Elements handed to one rayon task: big enough to amortize scheduling, small enough that a
/// 2-core machine and a 64-core one both get balanced work on a single weight matrix.
const CHUNK_ELEMS: usize = 1 << 14;

macro_rules! ggml_types {
    ($($name:ident = $id:literal, $block:literal, $bytes:literal;)*) => {
        /// A ggml tensor type, with its GGUF id, block size (elements) and block size (bytes).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum GgmlType { $($name),* }

        impl GgmlType {
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id { $($id => Some(GgmlType::$name),)* _ => None }
            }

            pub fn id(self) -> u32 {
                match self { $(GgmlType::$name => $id),* }
            }

            /// ggml's name for the type, e.g. `Q4_K`.
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$name => stringify!($name)),* }
            }

            /// Elements per block (1 for plain types).
            pub fn block_size(self) -> usize {
                match self { $(GgmlType::$name => $block),* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $(GgmlType::$name => $bytes),* }
            }
        }
    };
}

// Ids and sizes from ggml.h / ggml-common.h. Every type a GGUF file can hold is listed, so that any
// file's tensor table can be validated, even for types this module cannot dequantize.
ggml_types! {
    F32 = 0, 1, 4;
    F16 = 1, 1, 2;
    Q4_0 = 2, 32, 18;
    Q4_1 = 3, 32, 20;
    Q5_0 = 6, 32, 22;
    Q5_1 = 7, 32, 24;
    Q8_0 = 8, 32, 34;
    Q8_1 = 9, 32, 36;
    Q2_K = 10, 256, 84;
    Q3_K = 11, 256, 110;
    Q4_K = 12, 256, 144;
    Q5_K = 13, 256, 176;
    Q6_K = 14, 256, 210;
    Q8_K = 15, 256, 292;
    IQ2_XXS = 16, 256, 66;
    IQ2_XS = 17, 256, 74;
    IQ3_XXS = 18, 256, 98;
    IQ1_S = 19, 256, 50;
    IQ4_NL = 20, 32, 18;
    IQ3_S = 21, 256, 110;
    IQ2_S = 22, 256, 82;
    IQ4_XS = 23, 256, 136;
    I8 = 24, 1, 1;
    I16 = 25, 1, 2;
    I32 = 26, 1, 4;
    I64 = 27, 1, 8;
    F64 = 28, 1, 8;
    IQ1_M = 29, 256, 56;
    BF16 = 30, 1, 2;
    TQ1_0 = 34, 256, 54;
    TQ2_0 = 35, 256, 66;
    MXFP4 = 39, 32, 17;
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DequantError {
    #[error("ggml type {0} cannot be dequantized by ferrite")]
    Unsupported(GgmlType),
    #[error("{src} bytes of {ty} cannot fill {dst} f32 values (blocks of {block} elements take {bytes} bytes)")]
    Length { ty: GgmlType, src: usize, dst: usize, block: usize, bytes: usize },
}

type RowKernel = fn(&[u8], &mut [f32]);

impl GgmlType {
    fn kernel(self) -> Option<RowKernel> {
        Some(match self {
            GgmlType::F32 => dequant_f32,
            GgmlType::F16 => dequant_f16,
            GgmlType::BF16 => dequant_bf16,
            GgmlType::Q4_0 => dequant_q4_0,
            GgmlType::Q4_1 => dequant_q4_1,
            GgmlType::Q5_0 => dequant_q5_0,
            GgmlType::Q5_1 => dequant_q5_1,
            GgmlType::Q8_0 => dequant_q8_0,
            GgmlType::Q2_K => dequant_q2_k,
            GgmlType::Q3_K => dequant_q3_k,
            GgmlType::Q4_K => dequant_q4_k,
            GgmlType::Q5_K => dequant_q5_k,
            GgmlType::Q6_K => dequant_q6_k,
            _ => return None,
        })
    }

    pub fn can_dequantize(self) -> bool {
        self.kernel().is_some()
    }

    /// Dequantizes whole blocks: `src` must hold exactly `dst.len()` elements of this type. Also
    /// usable on a byte range of a tensor (one embedding row, say), as long as it is whole blocks.
    pub fn dequantize_into(self, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
        let kernel = self.kernel().ok_or(DequantError::Unsupported(self))?;
        let (block, bytes) = (self.block_size(), self.type_size());
        if !dst.len().is_multiple_of(block) || dst.len() / block * bytes != src.len() {
            return Err(DequantError::Length { ty: self, src: src.len(), dst: dst.len(), block, bytes });
        }
        let blocks_per_chunk = (CHUNK_ELEMS / block).max(1);
        dst.par_chunks_mut(blocks_per_chunk * block)
            .zip(src.par_chunks(blocks_per_chunk * bytes))
            .for_each(|(d, s)| kernel(s, d));
        Ok(())
    }
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (y, x) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    }
}

fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (y, x) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f16::from_bits(u16::from_le_bytes([x[0], x[1]])).to_f32();
    }
}

fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (y, x) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f32::from_bits(u32::from(u16::from_le_bytes([x[0], x[1]])) << 16);
    }
}

/// block_q4_0: f16 d, 16 bytes of nibbles; low nibbles are elements 0..16, high ones 16..32.
fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (j, &q) in b[2..18].iter().enumerate() {
            y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// block_q4_1: f16 d, f16 m, 16 bytes of nibbles.
fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (j, &q) in b[4..20].iter().enumerate() {
            y[j] = (q & 0x0F) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

/// The fifth bits of a Q5 block: bit j of the u32 belongs to element j.
#[inline]
fn q5_high_bits(qh: u32, j: usize) -> (u8, u8) {
    ((((qh >> j) << 4) & 0x10) as u8, ((qh >> (j + 12)) & 0x10) as u8)
}

/// block_q5_0: f16 d, u32 of fifth bits, 16 bytes of nibbles.
fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, &q) in b[6..22].iter().enumerate() {
            let (h0, h1) = q5_high_bits(qh, j);
            y[j] = (((q & 0x0F) | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) | h1) as i32 - 16) as f32 * d;
        }
    }
}

/// block_q5_1: f16 d, f16 m, u32 of fifth bits, 16 bytes of nibbles.
fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (j, &q) in b[8..24].iter().enumerate() {
            let (h0, h1) = q5_high_bits(qh, j);
            y[j] = ((q & 0x0F) | h0) as f32 * d + m;
            y[j + 16] = ((q >> 4) | h1) as f32 * d + m;
        }
    }
}

/// block_q8_0: f16 d, 32 signed bytes.
fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..34]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// block_q2_K: 16 bytes of 4-bit (scale, min) pairs, 64 bytes of 2-bit quants, f16 d, f16 dmin.
/// Each quant byte holds elements l, l+32, l+64, l+96 of its 128-element half.
fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let (d, min) = (f16_at(b, 80), f16_at(b, 82));
        let mut out = y.iter_mut();
        let mut is = 0;
        for q in qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [&q[..16], &q[16..]] {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0x0F) as f32, min * (sc >> 4) as f32);
                    // The finite side goes first: zip pulls from its left before its right.
                    for (&q, y) in half.iter().zip(out.by_ref()) {
                        *y = dl * ((q >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

/// block_q3_K: 32 bytes of high bits, 64 bytes of low 2-bit quants, 12 bytes of 6-bit scales,
/// f16 d. A set high bit means "no -4 offset".
fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let (hm, qs) = (&b[0..32], &b[32..96]);
        let d_all = f16_at(b, 108);
        let word = |i: usize| u32::from_le_bytes([b[96 + i], b[97 + i], b[98 + i], b[99 + i]]);
        let (a0, a1, tmp) = (word(0), word(4), word(8));
        let aux = [
            (a0 & KMASK2) | ((tmp & KMASK1) << 4),
            (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
            ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
            ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
        ];
        let mut scales = [0i8; 16];
        for (s, byte) in scales.iter_mut().zip(aux.iter().flat_map(|w| w.to_le_bytes())) {
            *s = byte as i8;
        }
        let mut out = y.iter_mut();
        let (mut is, mut m) = (0, 1u8);
        for q in qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for (q, h) in [(&q[..16], &hm[..16]), (&q[16..], &hm[16..])] {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for ((&q, &h), y) in q.iter().zip(h).zip(out.by_ref()) {
                        let offset = if h & m != 0 { 0 } else { 4 };
                        *y = dl * (((q >> shift) & 3) as i32 - offset) as f32;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// ggml's `get_scale_min_k4`: the j-th 6-bit (scale, min) pair of a Q4_K/Q5_K block.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// block_q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles; each 32-byte
/// run holds a 64-element chunk, low nibbles first.
fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        for (j, (q, y)) in b[16..144].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (lo, hi) = y.split_at_mut(32);
            for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(q) {
                *lo = d1 * (q & 0x0F) as f32 - m1;
                *hi = d2 * (q >> 4) as f32 - m2;
            }
        }
    }
}

/// block_q5_K: Q4_K plus 32 bytes of fifth bits, two bits per 64-element chunk.
fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qh) = (&b[4..16], &b[16..48]);
        for (j, (ql, y)) in b[48..176].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (u1, u2) = (1u8 << (2 * j), 2u8 << (2 * j));
            let (sc1, m1) = scale_min_k4(2 * j, scales);
            let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (lo, hi) = y.split_at_mut(32);
            for (((lo, hi), &q), &h) in lo.iter_mut().zip(hi).zip(ql).zip(qh) {
                *lo = d1 * ((q & 0x0F) + if h & u1 != 0 { 16 } else { 0 }) as f32 - m1;
                *hi = d2 * ((q >> 4) + if h & u2 != 0 { 16 } else { 0 }) as f32 - m2;
            }
        }
    }
}

/// block_q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed 8-bit scales,
/// f16 d. Each 128-element half takes 64 low bytes, 32 high bytes and 8 scales.
fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 208);
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let sc = &b[192 + 8 * n..192 + 8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each block is packed here the way ggml's `quantize_row_*_ref` packs it, from chosen quants
    //! and scales, and must decode to the textbook formula. The bit-exact comparison against
    //! gguf-py on random bytes and on real tensors lives in `gguf::tests`.

    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    fn run(ty: GgmlType, block: &[u8]) -> Vec<f32> {
        assert_eq!(block.len(), ty.type_size());
        let mut out = vec![f32::NAN; ty.block_size()];
        ty.dequantize_into(block, &mut out).unwrap();
        out
    }

    /// A reproducible spread of small integers in `0..n`.
    fn quants(n: u32, len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32).map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) % n) as u8).collect()
    }

    #[test]
    fn plain_types() {
        let vals = [1.5f32, -0.0, 3.25e-3, -65504.0];
        let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = [0f32; 4];
        GgmlType::F32.dequantize_into(&f32_bytes, &mut out).unwrap();
        assert_eq!(out.map(f32::to_bits), vals.map(f32::to_bits));

        let f16s: Vec<u8> = vals.iter().flat_map(|&v| f16_bytes(v)).collect();
        GgmlType::F16.dequantize_into(&f16s, &mut out).unwrap();
        assert_eq!(out, vals.map(|v| f16::from_f32(v).to_f32()));

        // bf16 is the top half of the f32.
        let bf16s: Vec<u8> = vals.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
        GgmlType::BF16.dequantize_into(&bf16s, &mut out).unwrap();
        assert_eq!(out.map(f32::to_bits), vals.map(|v| v.to_bits() & 0xFFFF_0000));
    }

    #[test]
    fn q4_0() {
        let (d, q) = (0.5f32, quants(16, 32, 1));
        let mut b = f16_bytes(d).to_vec();
        b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        let want: Vec<f32> = q.iter().map(|&q| (q as f32 - 8.0) * d).collect();
        assert_eq!(run(GgmlType::Q4_0, &b), want);
    }

    #[test]
    fn q4_1() {
        let (d, m, q) = (0.25f32, -1.5f32, quants(16, 32, 2));
        let mut b = [f16_bytes(d), f16_bytes(m)].concat();
        b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        let want: Vec<f32> = q.iter().map(|&q| q as f32 * d + m).collect();
        assert_eq!(run(GgmlType::Q4_1, &b), want);
    }

    fn q5_bits(q: &[u8]) -> (u32, Vec<u8>) {
        let qh = (0..32).fold(0u32, |acc, j| acc | (u32::from(q[j] >> 4) << j));
        (qh, (0..16).map(|j| (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)).collect())
    }

    #[test]
    fn q5_0() {
        let (d, q) = (0.125f32, quants(32, 32, 3));
        let (qh, qs) = q5_bits(&q);
        let b = [&f16_bytes(d)[..], &qh.to_le_bytes(), &qs].concat();
        let want: Vec<f32> = q.iter().map(|&q| (q as f32 - 16.0) * d).collect();
        assert_eq!(run(GgmlType::Q5_0, &b), want);
    }

    #[test]
    fn q5_1() {
        let (d, m, q) = (0.375f32, 2.0f32, quants(32, 32, 4));
        let (qh, qs) = q5_bits(&q);
        let b = [&f16_bytes(d)[..], &f16_bytes(m), &qh.to_le_bytes(), &qs].concat();
        let want: Vec<f32> = q.iter().map(|&q| q as f32 * d + m).collect();
        assert_eq!(run(GgmlType::Q5_1, &b), want);
    }

    #[test]
    fn q8_0() {
        let d = 0.0625f32;
        let q: Vec<i8> = quants(256, 32, 5).iter().map(|&v| v as i8).collect();
        let mut b = f16_bytes(d).to_vec();
        b.extend(q.iter().map(|&v| v as u8));
        let want: Vec<f32> = q.iter().map(|&q| q as f32 * d).collect();
        assert_eq!(run(GgmlType::Q8_0, &b), want);
    }

    /// The 2-bit layout Q2_K and Q3_K share: byte l of each 32-byte run holds elements
    /// l, l+32, l+64, l+96 of its 128-element half.
    fn pack_2bit(l: &[u8]) -> Vec<u8> {
        let mut qs = vec![0u8; 64];
        for j in (0..QK_K).step_by(128) {
            for i in 0..32 {
                qs[j / 4 + i] = l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
            }
        }
        qs
    }

    #[test]
    fn q2_k() {
        let (d, dmin) = (0.5f32, 0.25f32);
        let (sc, mn, l) = (quants(16, 16, 6), quants(16, 16, 7), quants(4, QK_K, 8));
        let scales: Vec<u8> = sc.iter().zip(&mn).map(|(&s, &m)| s | (m << 4)).collect();
        let b = [&scales[..], &pack_2bit(&l), &f16_bytes(d), &f16_bytes(dmin)].concat();
        let want: Vec<f32> =
            (0..QK_K).map(|i| d * sc[i / 16] as f32 * l[i] as f32 - dmin * mn[i / 16] as f32).collect();
        assert_eq!(run(GgmlType::Q2_K, &b), want);
    }

    #[test]
    fn q3_k() {
        let d = 0.75f32;
        // Scales are stored offset by 32 (0..64 meaning -32..32), quants offset by 4.
        let (sc, l) = (quants(64, 16, 9), quants(8, QK_K, 10));
        let mut hmask = [0u8; 32];
        let mut low = l.clone();
        for j in 0..QK_K {
            if low[j] > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                low[j] -= 4;
            }
        }
        let mut scales = vec![0u8; 12];
        for (j, &s) in sc.iter().enumerate() {
            if j < 8 {
                scales[j] = s & 0x0F;
            } else {
                scales[j - 8] |= (s & 0x0F) << 4;
            }
            scales[j % 4 + 8] |= (s >> 4) << (2 * (j / 4));
        }
        let b = [&hmask[..], &pack_2bit(&low), &scales, &f16_bytes(d)].concat();
        let want: Vec<f32> = (0..QK_K).map(|i| d * (sc[i / 16] as f32 - 32.0) * (l[i] as f32 - 4.0)).collect();
        assert_eq!(run(GgmlType::Q3_K, &b), want);
    }

    /// The 6-bit (scale, min) packing of Q4_K and Q5_K.
    fn pack_scale_min(sc: &[u8], mn: &[u8]) -> Vec<u8> {
        let mut s = vec![0u8; 12];
        for j in 0..8 {
            if j < 4 {
                s[j] = sc[j];
                s[j + 4] = mn[j];
            } else {
                s[j + 4] = (sc[j] & 0x0F) | ((mn[j] & 0x0F) << 4);
                s[j - 4] |= (sc[j] >> 4) << 6;
                s[j] |= (mn[j] >> 4) << 6;
            }
        }
        s
    }

    #[test]
    fn q4_k() {
        let (d, dmin) = (0.5f32, 0.125f32);
        let (sc, mn, l) = (quants(64, 8, 11), quants(64, 8, 12), quants(16, QK_K, 13));
        let mut qs = vec![0u8; 128];
        for (c, j) in (0..QK_K).step_by(64).enumerate() {
            for i in 0..32 {
                qs[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
        let b = [&f16_bytes(d)[..], &f16_bytes(dmin), &pack_scale_min(&sc, &mn), &qs].concat();
        let want: Vec<f32> =
            (0..QK_K).map(|i| d * sc[i / 32] as f32 * l[i] as f32 - dmin * mn[i / 32] as f32).collect();
        assert_eq!(run(GgmlType::Q4_K, &b), want);
    }

    #[test]
    fn q5_k() {
        let (d, dmin) = (0.25f32, 0.5f32);
        let (sc, mn, l) = (quants(64, 8, 14), quants(64, 8, 15), quants(32, QK_K, 16));
        let (mut qh, mut ql) = (vec![0u8; 32], vec![0u8; 128]);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (c, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let (mut l1, mut l2) = (l[n + j], l[n + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[32 * c + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
        let b = [&f16_bytes(d)[..], &f16_bytes(dmin), &pack_scale_min(&sc, &mn), &qh, &ql].concat();
        let want: Vec<f32> =
            (0..QK_K).map(|i| d * sc[i / 32] as f32 * l[i] as f32 - dmin * mn[i / 32] as f32).collect();
        assert_eq!(run(GgmlType::Q5_K, &b), want);
    }

    #[test]
    fn q6_k() {
        let d = 0.03125f32;
        let sc: Vec<i8> = quants(256, 16, 17).iter().map(|&v| v as i8).collect();
        let l = quants(64, QK_K, 18);
        let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
        for (c, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                let (a, b, e, f) = (l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]);
                ql[64 * c + i] = (a & 0x0F) | ((e & 0x0F) << 4);
                ql[64 * c + i + 32] = (b & 0x0F) | ((f & 0x0F) << 4);
                qh[32 * c + i] = (a >> 4) | ((b >> 4) << 2) | ((e >> 4) << 4) | ((f >> 4) << 6);
            }
        }
        let scales: Vec<u8> = sc.iter().map(|&s| s as u8).collect();
        let b = [&ql[..], &qh, &scales, &f16_bytes(d)].concat();
        let want: Vec<f32> = (0..QK_K).map(|i| d * sc[i / 16] as f32 * (l[i] as f32 - 32.0)).collect();
        assert_eq!(run(GgmlType::Q6_K, &b), want);
    }

    #[test]
    fn rejects_bad_lengths_and_unsupported_types() {
        let mut out = vec![0f32; 32];
        assert!(matches!(GgmlType::Q4_0.dequantize_into(&[0u8; 17], &mut out), Err(DequantError::Length { .. })));
        assert!(matches!(GgmlType::Q4_K.dequantize_into(&[0u8; 18], &mut out), Err(DequantError::Length { .. })));
        assert!(matches!(
            GgmlType::IQ2_XXS.dequantize_into(&[], &mut []),
            Err(DequantError::Unsupported(GgmlType::IQ2_XXS))
        ));
    }

    #[test]
    fn type_table_round_trips() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
        assert_eq!(GgmlType::Q6_K.to_string(), "Q6_K");
    }
}
