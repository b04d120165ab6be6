//! The FP8 e4m3 format (`torch.float8_e4m3fn`) and the activation quantization of FP8 W8A8
//! checkpoints.
//!
//! Written here rather than taken from a crate because the semantics must be torch's exactly, on
//! the CPU and in the CUDA kernel alike: round to nearest even, subnormals down to 2^-9, no
//! infinities, 448 the largest finite value. The kernel (`kernels/norm.cu`) mirrors
//! [`round_to_e4m3`] step for step.

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The value of an e4m3 byte (`0x7f` / `0xff` are NaN; there are no infinities).
pub fn e4m3_to_f32(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((byte >> 3) & 0x0f);
    let mant = f32::from(byte & 0x07);
    if exp == 0x0f && byte & 0x07 == 0x07 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 { mant * 2f32.powi(-9) } else { (1.0 + mant / 8.0) * 2f32.powi(exp - 7) };
    sign * magnitude
}

/// `x` rounded to the nearest e4m3 value (ties to even), returned as f32: torch's
/// `x.to(torch.float8_e4m3fn).to(torch.float32)` for `|x| <= 448`, which every caller clamps
/// to first. Larger magnitudes saturate to ±448.
pub fn round_to_e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let rounded = if a < 2f32.powi(-6) {
        // Subnormal: a multiple of 2^-9; scaling by a power of two is exact.
        (a * 512.0).round_ties_even() / 512.0
    } else {
        // Normal: keep 3 of f32's 23 mantissa bits, rounding the 20 dropped ones to even.
        let bits = a.to_bits();
        let half = (1u32 << 19) - 1 + ((bits >> 20) & 1);
        f32::from_bits((bits + half) & !((1u32 << 20) - 1))
    };
    rounded.min(E4M3_MAX).copysign(x)
}

/// The scale that maps a block whose largest magnitude is `amax` onto the e4m3 range, as
/// compressed-tensors computes it for symmetric FP8: `amax / 448`, and f32's epsilon in place
/// of zero so that an all-zero block divides cleanly.
pub fn fp8_scale(amax: f32) -> f32 {
    let scale = amax / E4M3_MAX;
    if scale == 0.0 {
        f32::EPSILON
    } else {
        scale
    }
}

/// `x` quantized to e4m3 with `scale` and dequantized: `e4m3(clamp(x / scale, ±448)) * scale`.
pub fn fake_quantize(x: f32, scale: f32) -> f32 {
    round_to_e4m3((x / scale).clamp(-E4M3_MAX, E4M3_MAX)) * scale
}

/// The e4m3 byte of `x`, rounded as [`round_to_e4m3`] rounds it (saturating at ±448).
pub fn encode_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let v = round_to_e4m3(x);
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    let magnitude = if a < 2f32.powi(-6) {
        // Subnormal: `a` is a multiple of 2^-9 below 8 of them.
        (a * 512.0) as u8
    } else {
        let bits = a.to_bits();
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
        ((exp as u8) << 3) | ((bits >> 20) & 0x7) as u8
    };
    sign | magnitude
}

/// A weight matrix kept in e4m3, one byte per weight, with f32 scales per block of
/// `block_rows x block_cols` weights (the last block of a dimension may be partial): a per-tensor
/// or per-channel scheme is `1 x cols` blocks, a DeepSeek/Qwen `fp8` checkpoint's `128 x 128`.
/// Its value is `f32(code) * scale`, exactly what the CPU path dequantizes at load; on CUDA the
/// products read the bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Matrix {
    pub rows: usize,
    pub cols: usize,
    /// Row-major e4m3 bytes.
    pub codes: Vec<u8>,
    /// Row-major `[rows.div_ceil(block_rows), cols.div_ceil(block_cols)]`.
    pub scales: Vec<f32>,
    pub block_rows: usize,
    pub block_cols: usize,
    /// How the layer quantizes its input to e4m3 before the product; `None` for weight-only
    /// (W8A16) layers, whose inputs stay as they are.
    pub input: Option<ActivationQuant>,
}

impl Fp8Matrix {
    /// Checks the scale count against the block grid.
    pub fn new(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<f32>,
        [block_rows, block_cols]: [usize; 2],
        input: Option<ActivationQuant>,
    ) -> Result<Fp8Matrix, String> {
        if block_rows == 0 || block_cols == 0 {
            return Err(format!("an FP8 scale block of {block_rows}x{block_cols}"));
        }
        if codes.len() != rows * cols {
            return Err(format!("{} e4m3 bytes for a {rows}x{cols} weight", codes.len()));
        }
        let grid = rows.div_ceil(block_rows) * cols.div_ceil(block_cols);
        if scales.len() != grid {
            return Err(format!("{} scales for {grid} blocks of {block_rows}x{block_cols}", scales.len()));
        }
        Ok(Fp8Matrix { rows, cols, codes, scales, block_rows, block_cols, input })
    }

    /// `weights [rows, cols]` rounded to e4m3 with one scale per row from the row's largest
    /// magnitude: llm-compressor's FP8_DYNAMIC weights and vLLM's online FP8, the same values as
    /// [`fake_quantize`] per row.
    /// Runs on all cores: an 8B model's weights pass through here at load.
    pub fn quantize_rows(weights: &[f32], rows: usize, cols: usize, input: Option<ActivationQuant>) -> Fp8Matrix {
        use rayon::prelude::*;
        let mut codes = vec![0u8; rows * cols];
        let scales = codes
            .par_chunks_mut(cols.max(1))
            .zip(weights.par_chunks(cols.max(1)))
            .map(|(out, row)| {
                let scale = fp8_scale(row.iter().fold(0.0f32, |m, v| m.max(v.abs())));
                out.iter_mut().zip(row).for_each(|(o, &w)| *o = encode_e4m3((w / scale).clamp(-E4M3_MAX, E4M3_MAX)));
                scale
            })
            .collect();
        Fp8Matrix { rows, cols, codes, scales, block_rows: 1, block_cols: cols.max(1), input }
    }

    /// Whether a product may run in FP8 on both sides: the layer quantizes its whole input row
    /// with one scale (per token or fixed), as a W8A8 GEMM's inputs are.
    pub fn w8a8(&self) -> bool {
        matches!(self.input, Some(ActivationQuant::PerToken | ActivationQuant::Static(_)))
    }

    /// Whether CUDA keeps a weight `cols` inputs wide, in blocks `block_cols` wide, as bytes: its
    /// kernels load 16 weights at a time, and a block of scales covers whole loads.
    pub fn kernel_takes(rows: usize, cols: usize, block_cols: usize) -> bool {
        rows > 0 && cols > 0 && cols.is_multiple_of(16) && (block_cols >= cols || block_cols.is_multiple_of(16))
    }

    pub fn scale_cols(&self) -> usize {
        self.cols.div_ceil(self.block_cols)
    }

    /// Whether one scale covers each whole row (per tensor or per channel).
    pub fn per_row(&self) -> bool {
        self.block_rows == 1 && self.scale_cols() <= 1
    }

    pub fn scale(&self, r: usize, c: usize) -> f32 {
        self.scales[(r / self.block_rows) * self.scale_cols() + c / self.block_cols]
    }

    pub fn value(&self, r: usize, c: usize) -> f32 {
        e4m3_to_f32(self.codes[r * self.cols + c]) * self.scale(r, c)
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        (0..self.rows * self.cols).map(|i| self.value(i / self.cols, i % self.cols)).collect()
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    pub fn size_in_bytes(&self) -> usize {
        self.codes.len() + self.scales.len() * 4
    }

    /// The rows in `ranges`, concatenated; `None` where a range cuts through a block of rows
    /// that shares one scale (the caller dequantizes instead).
    pub fn select_rows(&self, ranges: &[std::ops::Range<usize>]) -> Option<Fp8Matrix> {
        let br = self.block_rows;
        let whole =
            |r: &std::ops::Range<usize>| r.start.is_multiple_of(br) && (r.end.is_multiple_of(br) || r.end == self.rows);
        if br > 1 && !ranges.iter().all(whole) {
            return None;
        }
        // A partial last block may only end the selection.
        if br > 1 && ranges.iter().rev().skip(1).any(|r| !r.end.is_multiple_of(br)) {
            return None;
        }
        let (cols, scale_cols) = (self.cols, self.scale_cols());
        let codes = ranges.iter().flat_map(|r| self.codes[r.start * cols..r.end * cols].iter().copied()).collect();
        let scales = ranges
            .iter()
            .flat_map(|r| self.scales[r.start / br * scale_cols..r.end.div_ceil(br) * scale_cols].iter().copied())
            .collect();
        let rows = ranges.iter().map(|r| r.len()).sum();
        Some(Fp8Matrix { rows, cols, codes, scales, block_rows: br, block_cols: self.block_cols, input: self.input })
    }
}

/// How the input of an FP8 W8A8 linear is quantized before the product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ActivationQuant {
    /// One scale per row (token), from the row's largest magnitude.
    PerToken,
    /// One scale per `group` consecutive elements of a row (FP8 block checkpoints use 128).
    PerGroup(usize),
    /// A scale fixed by the checkpoint (`input_scale`).
    Static(f32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e4m3_value_round_trips_and_midpoints_round_to_even() {
        let finite: Vec<(u8, f32)> = (0..=255u8).map(|b| (b, e4m3_to_f32(b))).filter(|(_, v)| !v.is_nan()).collect();
        assert_eq!(finite.len(), 254);
        for &(b, v) in &finite {
            assert_eq!(round_to_e4m3(v).to_bits(), v.to_bits(), "byte {b:#04x}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        // Between each pair of neighbours: the midpoint goes to the one with an even mantissa,
        // anything past it to the far one.
        let mut positives: Vec<(u8, f32)> = finite.iter().copied().filter(|&(b, _)| b < 0x80).collect();
        positives.sort_by(|a, b| a.1.total_cmp(&b.1));
        for pair in positives.windows(2) {
            let ((lb, lo), (hb, hi)) = (pair[0], pair[1]);
            let mid = (lo + hi) / 2.0;
            let even = if lb & 1 == 0 { lo } else { hi };
            assert_eq!(round_to_e4m3(mid), even, "tie between {lb:#04x} and {hb:#04x}");
            assert_eq!(round_to_e4m3(f32::from_bits(mid.to_bits() - 1)), lo);
            assert_eq!(round_to_e4m3(f32::from_bits(mid.to_bits() + 1)), hi);
            assert_eq!(round_to_e4m3(-f32::from_bits(mid.to_bits() + 1)), -hi);
        }
        assert_eq!(round_to_e4m3(1e6), 448.0);
        assert_eq!(round_to_e4m3(-460.0), -448.0);
    }

    #[test]
    fn encoding_gives_the_byte_of_the_rounded_value() {
        for b in 0..=255u8 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            // -0 and +0 are both zero; every other byte is the only one of its value.
            let expected = if v == 0.0 && b == 0x80 { 0x80 } else { b };
            assert_eq!(encode_e4m3(v), expected, "byte {b:#04x}");
        }
        for x in [0.3f32, -1.7, 1e-4, 300.0, 1e6, -2e-3, 0.0625 * 1.06] {
            assert_eq!(e4m3_to_f32(encode_e4m3(x)), round_to_e4m3(x), "{x}");
        }
    }

    #[test]
    fn row_quantized_matrices_hold_the_fake_quantized_weights() {
        let (rows, cols) = (3, 5);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 23) as f32 * 0.37 - 4.1).collect();
        let m = Fp8Matrix::quantize_rows(&w, rows, cols, Some(ActivationQuant::PerToken));
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            let scale = fp8_scale(row.iter().fold(0.0f32, |a, v| a.max(v.abs())));
            for (c, &w) in row.iter().enumerate() {
                assert_eq!(m.value(r, c), fake_quantize(w, scale), "({r}, {c})");
            }
        }
        assert!(m.per_row());
        let part = m.select_rows(&[2..3, 0..1]).unwrap();
        assert_eq!(part.to_f32_vec(), [&m.to_f32_vec()[10..15], &m.to_f32_vec()[0..5]].concat());
    }

    #[test]
    fn block_scaled_rows_split_only_on_block_edges() {
        let (rows, cols) = (5, 4);
        let codes: Vec<u8> = (0..rows * cols).map(|i| (i * 11 % 120) as u8).collect();
        let m = Fp8Matrix::new(rows, cols, codes, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 2], None).unwrap();
        assert_eq!(m.value(3, 3), e4m3_to_f32(m.codes[15]) * 4.0);
        assert_eq!(m.value(4, 0), e4m3_to_f32(m.codes[16]) * 5.0);
        let part = m.select_rows(&[2..4, 0..2, 4..5]).unwrap();
        let all = m.to_f32_vec();
        assert_eq!(part.to_f32_vec(), [&all[8..16], &all[0..8], &all[16..20]].concat());
        assert!(m.select_rows(std::slice::from_ref(&(1..3))).is_none());
        assert!(m.select_rows(&[4..5, 0..2]).is_none(), "a partial block in the middle");
        assert!(Fp8Matrix::new(rows, cols, vec![0; 20], vec![1.0; 5], [2, 2], None).is_err());
    }

    #[test]
    fn fake_quantization_keeps_the_block_maximum_and_zero() {
        let scale = fp8_scale(3.5);
        assert_eq!(fake_quantize(3.5, scale), 3.5);
        assert_eq!(fake_quantize(-3.5, scale), -3.5);
        assert_eq!(fake_quantize(0.0, fp8_scale(0.0)), 0.0);
        // 1.0 / (3.5 / 448) = 128 exactly: a power of two survives.
        assert_eq!(fake_quantize(1.0, scale), 1.0);
        // Values between e4m3 points move to one of them.
        let v = fake_quantize(1.1, scale);
        assert!(v != 1.1 && (v - 1.1).abs() < 0.07, "{v}");
    }
}
