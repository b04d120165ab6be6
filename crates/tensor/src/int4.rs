//! Weight matrices of symmetric 4-bit integers with a bf16 scale per group of inputs
//! (compressed-tensors `pack-quantized` W4A16), kept packed so that a product reads half a byte
//! per weight.
//!
//! On the host an [`Int4Matrix`] is in the checkpoint's order; on CUDA it is repacked into the
//! order the W4A16 kernel's tensor-core fragments want ([`kernel_layout`]).

use half::bf16;
use rayon::prelude::*;

/// The CUDA kernel takes a matrix whose rows come in strips of 16 and whose inputs come in
/// chunks of 64, with groups of whole 32-input blocks.
pub const STRIP_ROWS: usize = 16;
pub const CHUNK_COLS: usize = 64;
const BLOCK_COLS: usize = 32;

/// `rows x cols` weights, `value = (nibble - 8) * scale` rounded to bf16 (as transformers
/// computes `q * scale` in the scale's dtype bf16, and as vLLM's kernels do).
///
/// `packed` holds each row's `cols / 8` little-endian words, input `j` in bits `4 (j % 8)` of
/// word `j / 8`, offset by 8 (compressed-tensors' `pack_to_int32`); `scales` is `[rows, cols /
/// group]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Matrix {
    pub rows: usize,
    pub cols: usize,
    pub group: usize,
    pub packed: Vec<u32>,
    pub scales: Vec<bf16>,
}

impl Int4Matrix {
    pub fn new(rows: usize, cols: usize, group: usize, packed: Vec<u32>, scales: Vec<bf16>) -> Result<Self, String> {
        if group == 0 || !cols.is_multiple_of(8) || !cols.is_multiple_of(group) {
            return Err(format!("{rows}x{cols} 4-bit weights in groups of {group}: need 8 | cols and group | cols"));
        }
        if packed.len() != rows * cols / 8 || scales.len() != rows * (cols / group) {
            return Err(format!(
                "{rows}x{cols} 4-bit weights in groups of {group}: {} packed words and {} scales; expected {} and {}",
                packed.len(),
                scales.len(),
                rows * cols / 8,
                rows * (cols / group)
            ));
        }
        Ok(Int4Matrix { rows, cols, group, packed, scales })
    }

    /// Whether the CUDA kernel takes this shape (else the weight is dequantized at load).
    pub fn kernel_takes(rows: usize, cols: usize, group: usize) -> bool {
        rows > 0
            && cols > 0
            && rows.is_multiple_of(STRIP_ROWS)
            && cols.is_multiple_of(CHUNK_COLS)
            && group > 0
            && group.is_multiple_of(BLOCK_COLS)
            && cols.is_multiple_of(group)
    }

    fn nibble(&self, r: usize, c: usize) -> u32 {
        (self.packed[r * self.cols / 8 + c / 8] >> (4 * (c % 8))) & 0xf
    }

    fn scale(&self, r: usize, c: usize) -> bf16 {
        self.scales[r * (self.cols / self.group) + c / self.group]
    }

    pub fn value(&self, r: usize, c: usize) -> f32 {
        let q = self.nibble(r, c) as f32 - 8.0;
        bf16::from_f32(q * self.scale(r, c).to_f32()).to_f32()
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        (0..self.rows).flat_map(|r| (0..self.cols).map(move |c| (r, c))).map(|(r, c)| self.value(r, c)).collect()
    }

    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_in_bytes(&self) -> usize {
        self.packed.len() * 4 + self.scales.len() * 2
    }

    /// Rows `ranges`, concatenated (each row is whole words and whole groups).
    pub fn select_rows(&self, ranges: &[std::ops::Range<usize>]) -> Int4Matrix {
        let (words, groups) = (self.cols / 8, self.cols / self.group);
        let packed = ranges.iter().flat_map(|r| self.packed[r.start * words..r.end * words].iter().copied()).collect();
        let scales =
            ranges.iter().flat_map(|r| self.scales[r.start * groups..r.end * groups].iter().copied()).collect();
        let rows = ranges.iter().map(|r| r.len()).sum();
        Int4Matrix { rows, cols: self.cols, group: self.group, packed, scales }
    }
}

/// Where the kernel finds each weight: word `((strip * chunks + chunk) * 32 + lane) * 4 + step`
/// holds the eight nibbles that lane `lane` feeds to the two `m16n8k16` B fragments (rows
/// `strip * 16 + lane / 4` and 8 rows on) of 16-input step `step` of 64-input chunk `chunk`.
///
/// The inputs of a step are permuted so that lane `t = lane % 4` multiplies inputs `8t + 4j ..
/// 8t + 4j + 4` of a 32-input block (`j` = `step % 2`): its A fragment is then one 16-byte load
/// of the activations for two steps. Nibble order in a word: for the first row inputs 0, 2 at
/// bits 0, 4 and 1, 3 at bits 16, 20; for the second row at bits 8, 12 and 24, 28, so that
/// masking `0x000f000f` after a shift of 0, 4, 8 or 12 gives a bf16x2 register pair.
fn source_of(word: usize, nibble: usize, cols: usize) -> (usize, usize) {
    let (row, col) = word_origin(word, cols);
    let (row_offset, input) = NIBBLE_OFFSETS[nibble];
    (row + row_offset, col + input)
}

/// Where word `word`'s nibble 0 comes from (see [`source_of`]).
fn word_origin(word: usize, cols: usize) -> (usize, usize) {
    let chunks = cols / CHUNK_COLS;
    let step = word % 4;
    let lane = (word / 4) % 32;
    let chunk = (word / 128) % chunks;
    let strip = word / (128 * chunks);
    let (g, t) = (lane / 4, lane % 4);
    let (block, j) = (step / 2, step % 2);
    (strip * STRIP_ROWS + g, chunk * CHUNK_COLS + block * BLOCK_COLS + 8 * t + 4 * j)
}

/// (row, input) of each nibble of a word relative to its origin: bit 1 of the nibble index picks
/// the second row (8 rows on), bits 0 and 2 the input (`2 * bit0 + bit2`).
const NIBBLE_OFFSETS: [(usize, usize); 8] = [(0, 0), (0, 2), (8, 0), (8, 2), (0, 1), (0, 3), (8, 1), (8, 3)];

/// The packed words and scale pairs in the CUDA kernel's order (see [`source_of`]); scale word
/// `(strip * groups + group) * 8 + g` holds rows `strip * 16 + g` (low half) and `+ 8` (high).
/// Runs once per weight at load, over all cores.
pub fn kernel_layout(m: &Int4Matrix) -> (Vec<u32>, Vec<u32>) {
    assert!(
        Int4Matrix::kernel_takes(m.rows, m.cols, m.group),
        "{}x{} / {} is not a kernel shape",
        m.rows,
        m.cols,
        m.group
    );
    let words = m.rows * m.cols / 8;
    let packed = (0..words)
        .into_par_iter()
        .map(|w| {
            let (row, col) = word_origin(w, m.cols);
            NIBBLE_OFFSETS
                .iter()
                .enumerate()
                .fold(0u32, |acc, (nib, &(dr, dc))| acc | m.nibble(row + dr, col + dc) << (4 * nib))
        })
        .collect();
    let groups = m.cols / m.group;
    let scales = (0..m.rows / STRIP_ROWS * groups * 8)
        .map(|i| {
            let (g, group, strip) = (i % 8, (i / 8) % groups, i / (8 * groups));
            let row = strip * STRIP_ROWS + g;
            let lo = m.scales[row * groups + group].to_bits() as u32;
            let hi = m.scales[(row + 8) * groups + group].to_bits() as u32;
            lo | hi << 16
        })
        .collect();
    (packed, scales)
}

/// The inverse of [`kernel_layout`].
pub fn from_kernel_layout(rows: usize, cols: usize, group: usize, packed: &[u32], scales: &[u32]) -> Int4Matrix {
    let mut out = vec![0u32; rows * cols / 8];
    for (w, &word) in packed.iter().enumerate() {
        for nib in 0..8 {
            let (r, c) = source_of(w, nib, cols);
            out[r * cols / 8 + c / 8] |= ((word >> (4 * nib)) & 0xf) << (4 * (c % 8));
        }
    }
    let groups = cols / group;
    let mut row_scales = vec![bf16::ZERO; rows * groups];
    for (i, &pair) in scales.iter().enumerate() {
        let (g, group, strip) = (i % 8, (i / 8) % groups, i / (8 * groups));
        let row = strip * STRIP_ROWS + g;
        row_scales[row * groups + group] = bf16::from_bits(pair as u16);
        row_scales[(row + 8) * groups + group] = bf16::from_bits((pair >> 16) as u16);
    }
    Int4Matrix { rows, cols, group, packed: out, scales: row_scales }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rows: usize, cols: usize, group: usize) -> Int4Matrix {
        let packed = (0..rows * cols / 8).map(|i| (i as u32).wrapping_mul(2654435761)).collect();
        let scales = (0..rows * (cols / group)).map(|i| bf16::from_f32(0.01 * (1 + i % 7) as f32)).collect();
        Int4Matrix::new(rows, cols, group, packed, scales).unwrap()
    }

    #[test]
    fn kernel_layout_is_a_permutation_of_every_nibble_and_scale() {
        for (rows, cols, group) in [(16, 64, 32), (32, 128, 128), (48, 192, 64), (16, 256, 256)] {
            let m = sample(rows, cols, group);
            let (packed, scales) = kernel_layout(&m);
            assert_eq!(from_kernel_layout(rows, cols, group, &packed, &scales), m, "{rows}x{cols}/{group}");
        }
    }

    #[test]
    fn kernel_words_feed_the_fragment_pairs_of_their_lane() {
        // Lane 5 (g = 1, t = 1), step 3 (block 1, j = 1) of chunk 0: inputs 32 + 8 + 4 = 44..48.
        let word = 5 * 4 + 3;
        assert_eq!(source_of(word, 0, 64), (1, 44));
        assert_eq!(source_of(word, 4, 64), (1, 45));
        assert_eq!(source_of(word, 1, 64), (1, 46));
        assert_eq!(source_of(word, 5, 64), (1, 47));
        assert_eq!(source_of(word, 2, 64), (9, 44));
        assert_eq!(source_of(word, 7, 64), (9, 47));
    }

    #[test]
    fn values_are_nibbles_less_eight_times_the_scale_rounded_to_bf16() {
        let m = Int4Matrix::new(1, 8, 8, vec![0xf710_2a8e], vec![bf16::from_f32(0.3)]).unwrap();
        let s = bf16::from_f32(0.3).to_f32();
        let expect: Vec<f32> = [0xe, 0x8, 0xa, 0x2, 0x0, 0x1, 0x7, 0xf]
            .iter()
            .map(|&n| bf16::from_f32((n as f32 - 8.0) * s).to_f32())
            .collect();
        assert_eq!(m.to_f32_vec(), expect);
        assert!(Int4Matrix::new(1, 8, 8, vec![0], vec![]).is_err());
        assert!(Int4Matrix::new(1, 12, 4, vec![0], vec![bf16::ONE; 3]).is_err());
    }

    #[test]
    fn kernel_shapes() {
        assert!(Int4Matrix::kernel_takes(16, 64, 32));
        assert!(Int4Matrix::kernel_takes(4096, 14336, 128));
        assert!(!Int4Matrix::kernel_takes(8, 64, 32));
        assert!(!Int4Matrix::kernel_takes(16, 0, 32));
        assert!(!Int4Matrix::kernel_takes(16, 96, 32));
        assert!(!Int4Matrix::kernel_takes(16, 128, 16));
        assert!(!Int4Matrix::kernel_takes(16, 192, 128));
    }
}
