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
