//! Every CUDA op against the CPU op on random inputs, in f32 and bf16.
//!
//! Both backends get identical inputs: data is rounded to the tested dtype first, the CPU op runs
//! on those values in f32, the CUDA op on the rounded tensor in the tested dtype. The error of an
//! op is `max |cuda - cpu| / max |cpu|` over its output; the bound is stated per dtype:
//! - f32: 1e-5 (summation order only: no TF32, no reduced-precision paths),
//! - bf16: 1e-2 (the CUDA output is rounded to bf16 once, 2^-9 relative, plus the rounding of
//!   intermediates that a bf16 model also rounds, such as the residual in `add_rms_norm`),
//! - pure data movement (copies, gathers, casts, argmax): exact,
//! - f32 softmax over long rows: 2e-4, the CPU reference's own error (it adds up to 150K
//!   exponentials one after another in f32, about sqrt(n) ulps, where the GPU sums a tree).
//!
//! Without a GPU every test prints "SKIP: no CUDA device" and returns.

use ferrite_tensor::cuda;
use ferrite_tensor::fp8::Fp8Matrix;
use ferrite_tensor::int4::Int4Matrix;
use ferrite_tensor::kv::{Fp8KvScales, KvStorage};
use ferrite_tensor::ops::{self, Activation, AttentionParams, RopeStyle};
use ferrite_tensor::{
    ActivationQuant, AttnMetadata, AttnSeq, CpuStorage, DType, Device, PagedKvLayer, RowSampling, Storage, Tensor,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const GPU: Device = Device::Cuda(0);
const DTYPES: [DType; 2] = [DType::F32, DType::BF16];

macro_rules! require_gpu {
    () => {
        if !cuda::is_available() {
            println!("SKIP: no CUDA device");
            return;
        }
    };
}

fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn random(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0) * scale).collect()
}

/// Values as the tested dtype holds them.
fn round(data: &[f32], dtype: DType) -> Vec<f32> {
    Tensor::from_f32_as(data.to_vec(), &[data.len()], dtype).unwrap().to_f32_vec()
}

/// The CPU reference input (f32 holding the rounded values) and the CUDA input (in `dtype`).
fn pair(data: &[f32], shape: &[usize], dtype: DType) -> (Tensor, Tensor) {
    let cpu = Tensor::from_f32(round(data, dtype), shape).unwrap();
    let gpu = Tensor::from_f32_as(data.to_vec(), shape, dtype).unwrap().to_device(GPU).unwrap();
    (cpu, gpu)
}

/// Asserts `got` (CUDA) matches `want` (CPU) within `bound` and returns the error.
fn check(name: &str, dtype: DType, got: &Tensor, want: &Tensor, bound: f32) -> f32 {
    assert_eq!(got.device(), GPU, "{name}: result left the GPU");
    assert_eq!(got.dtype(), dtype, "{name}: output dtype");
    assert_eq!(got.shape(), want.shape(), "{name}: shape");
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let mut max_abs = 0.0f32;
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(!a.is_nan() || b.is_nan(), "{name} {dtype}: NaN at {i} (cpu {b})");
        max_abs = max_abs.max((a - b).abs());
    }
    let err = max_abs / scale;
    println!("CHECK {name} {dtype}: max_abs_err={max_abs:.3e} rel_err={err:.3e} bound={bound:.0e}");
    assert!(err <= bound, "{name} {dtype}: error {err:.3e} > {bound:.0e} (max abs {max_abs:.3e}, scale {scale:.3e})");
    err
}

#[test]
fn transfers_and_casts_round_trip() {
    require_gpu!();
    let mut r = rng(1);
    let data = random(&mut r, 1000, 3.0);
    for dtype in DTYPES {
        let t = Tensor::from_f32_as(data.clone(), &[10, 100], dtype).unwrap();
        let g = t.to_device(GPU).unwrap();
        assert_eq!((g.device(), g.dtype(), g.shape()), (GPU, dtype, &[10usize, 100][..]));
        assert_eq!(g.to_f32_vec(), t.to_f32_vec(), "{dtype} round trip");
        let back = g.to_device(Device::Cpu).unwrap();
        assert_eq!(back.dtype(), dtype);
        assert_eq!(back.to_f32_vec(), t.to_f32_vec());
    }
    // Rounding on the device is the CPU's round-to-nearest-even, bit for bit.
    let g = Tensor::from_f32(data.clone(), &[1000]).unwrap().to_device(GPU).unwrap();
    let narrowed = g.to_dtype(DType::BF16);
    assert_eq!(narrowed.dtype(), DType::BF16);
    assert_eq!(narrowed.to_f32_vec(), round(&data, DType::BF16), "device f32 -> bf16 rounding");
    assert_eq!(narrowed.to_dtype(DType::F32).to_f32_vec(), round(&data, DType::BF16));
    // Empty tensors.
    let e = Tensor::from_f32(vec![], &[0, 7]).unwrap().to_device(GPU).unwrap();
    assert_eq!(e.shape(), &[0, 7]);
    assert!(e.to_f32_vec().is_empty());
    println!("CHECK transfers: exact");
}

/// Weights copied as stored through the pinned staging buffers: tensors larger than both
/// buffers (the DMA of one overlapping the fill of the other) arrive bit for bit, in order with
/// ops issued after them, and a wrong byte count is an error.
#[test]
fn staged_uploads_arrive_exactly() {
    require_gpu!();
    let dev = cuda::device(0).unwrap();
    let mut uploader = cuda::Uploader::new(&dev).unwrap();
    // 150M bf16 values: 300 MB, over four 64 MiB stages, the last one partial.
    let n = 150_000_001usize;
    let bits: Vec<u16> =
        (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(7) as u16 & 0x7f7f).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let g = uploader.tensor(DType::BF16, &[n], &bytes).unwrap();
    let small = uploader
        .tensor(DType::F32, &[2, 3], &[1.5f32, -2.0, 0.25, 8.0, 0.0, -0.5].map(f32::to_le_bytes).concat())
        .unwrap();
    drop(uploader);
    assert_eq!((g.device(), g.dtype(), g.shape()), (GPU, DType::BF16, &[n][..]));
    let back = g.to_device(Device::Cpu).unwrap().to_f32_vec();
    let want: Vec<f32> = bits.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect();
    assert!(back == want, "a staged upload differs");
    assert_eq!(small.to_f32_vec(), [1.5, -2.0, 0.25, 8.0, 0.0, -0.5]);
    let mut uploader = cuda::Uploader::new(&dev).unwrap();
    assert!(uploader.tensor(DType::F32, &[3], &[0u8; 8]).is_err());
    println!("CHECK staged uploads: exact");
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    require_gpu!();
    let x = Tensor::from_f32(vec![1.0; 8], &[2, 4]).unwrap();
    let w = x.to_device(GPU).unwrap();
    assert!(ops::matmul_t(&x, &w, None).is_err(), "CPU x with a CUDA weight");
    assert!(ops::add(&w, &x).is_err(), "CUDA a with a CPU b");
    assert!(w.as_f32_slice().is_err());
    let f16 = Tensor::from_f32_as(vec![1.0; 8], &[8], DType::F16).unwrap();
    assert!(f16.to_device(GPU).is_err(), "f16 is not a CUDA dtype");
    assert!(Tensor::zeros(&[1]).to_device(Device::Cuda(cuda::device_count())).is_err(), "missing ordinal");
    let bf = x.to_dtype(DType::BF16).to_device(GPU).unwrap();
    assert!(ops::add(&w, &bf).is_err(), "mixed activation dtypes");
    println!("CHECK misuse: errors");
}

#[test]
fn matmul_t_matches_cpu() {
    require_gpu!();
    let mut r = rng(2);
    let mut worst = [0.0f32; 2];
    // (m, k, n): decode-sized and prefill-sized m, odd k and n.
    let shapes = [
        (1, 64, 96),
        (2, 256, 130),
        (3, 512, 77),
        (5, 1024, 256),
        (8, 4096, 300),
        (4, 14336, 40),
        (16, 768, 129),
        (1, 67, 33),
        (7, 100, 50),
        (33, 320, 700),
        (128, 2048, 512),
    ];
    for &(m, k, n) in &shapes {
        let x = random(&mut r, m * k, 1.0);
        let w = random(&mut r, n * k, 0.5);
        let b = random(&mut r, n, 1.0);
        for (di, dtype) in DTYPES.into_iter().enumerate() {
            let (xc, xg) = pair(&x, &[m, k], dtype);
            let (wc, wg) = pair(&w, &[n, k], dtype);
            let (bc, bg) = pair(&b, &[n], dtype);
            for bias in [false, true] {
                let want = ops::matmul_t(&xc, &wc, bias.then_some(&bc)).unwrap();
                let got = ops::matmul_t(&xg, &wg, bias.then_some(&bg)).unwrap();
                let name = format!("matmul_t m={m} k={k} n={n} bias={bias}");
                worst[di] = worst[di].max(check(&name, dtype, &got, &want, tol(dtype)));
            }
        }
        // f32 activations over bf16 weights: the weight is widened exactly, so f32 bounds hold.
        let (xc, xg) = pair(&x, &[m, k], DType::F32);
        let (wc, wg) = pair(&w, &[n, k], DType::BF16);
        let got = ops::matmul_t(&xg, &wg, None).unwrap();
        check(
            &format!("matmul_t mixed m={m} k={k} n={n}"),
            DType::F32,
            &got,
            &ops::matmul_t(&xc, &wc, None).unwrap(),
            1e-5,
        );
    }
    println!("WORST matmul_t f32={:.3e} bf16={:.3e}", worst[0], worst[1]);
}

/// A random 4-bit matrix: nibbles uniform, scales in bf16 around `scale / 8`.
fn random_int4(r: &mut ChaCha8Rng, n: usize, k: usize, group: usize, scale: f32) -> Int4Matrix {
    let packed = (0..n * k / 8).map(|_| r.random::<u32>()).collect();
    let scales =
        (0..n * (k / group)).map(|_| half::bf16::from_f32(scale / 8.0 * r.random_range(0.5f32..1.5))).collect();
    Int4Matrix::new(n, k, group, packed, scales).unwrap()
}

/// The W4A16 kernel (m <= 64) and the dequantize-then-cuBLAS path (m > 64) against the CPU
/// product with the dequantized weight (the values transformers' dequantized bf16 model holds);
/// every row's result is the same whatever m, and repeated calls give the same bits.
#[test]
fn int4_matmul_t_matches_dequantized_cpu() {
    require_gpu!();
    let mut r = rng(21);
    let mut worst = 0.0f32;
    // (m, k, n, group): one to four 16-row tiles and past them, split and unsplit inputs,
    // channel-wise (group = k) and grouped scales.
    let shapes = [
        (1, 64, 16, 32),
        (1, 4096, 4096, 128),
        (3, 4096, 1024, 128),
        (16, 1024, 4096, 64),
        (17, 512, 48, 512),
        (40, 14336, 256, 128),
        (64, 256, 4096, 32),
        (65, 1024, 256, 128),
        (200, 512, 160, 64),
    ];
    for &(m, k, n, group) in &shapes {
        let w = random_int4(&mut r, n, k, group, 0.5);
        let x = random(&mut r, m * k, 1.0);
        let b = random(&mut r, n, 1.0);
        let wc = Tensor::from_f32(w.to_f32_vec(), &[n, k]).unwrap();
        let wg = Tensor::from_storage(Storage::Cpu(CpuStorage::Int4(w.clone())), vec![n, k])
            .unwrap()
            .to_device(GPU)
            .unwrap();
        assert_eq!(wg.dtype(), DType::Int4 { group });
        assert!(wg.size_in_bytes() < n * k, "packed: {} bytes for {n}x{k}", wg.size_in_bytes());
        let (xc, xg) = pair(&x, &[m, k], DType::BF16);
        let (bc, bg) = pair(&b, &[n], DType::BF16);
        for bias in [false, true] {
            let want = ops::matmul_t(&xc, &wc, bias.then_some(&bc)).unwrap();
            let got = ops::matmul_t(&xg, &wg, bias.then_some(&bg)).unwrap();
            let name = format!("int4 matmul_t m={m} k={k} n={n} group={group} bias={bias}");
            worst = worst.max(check(&name, DType::BF16, &got, &want, tol(DType::BF16)));
            let again = ops::matmul_t(&xg, &wg, bias.then_some(&bg)).unwrap();
            assert_eq!(got.to_f32_vec(), again.to_f32_vec(), "{name}: not deterministic");
        }
        if m <= 64 {
            let all = ops::matmul_t(&xg, &wg, None).unwrap().to_f32_vec();
            let last =
                Tensor::from_f32_as(x[(m - 1) * k..].to_vec(), &[1, k], DType::BF16).unwrap().to_device(GPU).unwrap();
            let alone = ops::matmul_t(&last, &wg, None).unwrap().to_f32_vec();
            assert_eq!(alone, all[(m - 1) * n..], "m={m} k={k} n={n}: the last row depends on the batch");
        }
        // The fused entry points give each product's bits alone (q/k/v of other widths too).
        let narrow = random_int4(&mut r, 32, k, group, 0.5);
        let ng =
            Tensor::from_storage(Storage::Cpu(CpuStorage::Int4(narrow)), vec![32, k]).unwrap().to_device(GPU).unwrap();
        let many = ops::matmul_t_many(&xg, &[(&wg, None), (&ng, None), (&wg, Some(&bg))]).unwrap();
        assert_eq!(many[0].to_f32_vec(), ops::matmul_t(&xg, &wg, None).unwrap().to_f32_vec());
        assert_eq!(many[1].to_f32_vec(), ops::matmul_t(&xg, &ng, None).unwrap().to_f32_vec());
        assert_eq!(many[2].to_f32_vec(), ops::matmul_t(&xg, &wg, Some(&bg)).unwrap().to_f32_vec());
        let gated = ops::gated_matmul_t(&xg, &wg, &wg, Activation::Silu).unwrap();
        let plain = ops::matmul_t(&xg, &wg, None).unwrap();
        assert_eq!(gated.to_f32_vec(), ops::act_mul(&plain, &plain, Activation::Silu).unwrap().to_f32_vec());
        // The packed words come back as they went.
        let back = wg.to_device(Device::Cpu).unwrap();
        assert!(matches!(back.cpu(), Some(CpuStorage::Int4(b)) if *b == w), "round trip of {n}x{k}/{group}");
    }
    // f32 activations are refused, not miscomputed.
    let w = random_int4(&mut r, 16, 64, 32, 0.5);
    let wg = Tensor::from_storage(Storage::Cpu(CpuStorage::Int4(w)), vec![16, 64]).unwrap().to_device(GPU).unwrap();
    let x = Tensor::from_f32(vec![1.0; 64], &[1, 64]).unwrap().to_device(GPU).unwrap();
    assert!(ops::matmul_t(&x, &wg, None).is_err());
    assert!(ops::embedding(&wg, &[0]).is_err());
    println!("WORST int4 matmul_t bf16={worst:.3e}");
}

/// A random FP8 matrix in `block` blocks: bytes uniform over the finite e4m3 values, scales
/// around `scale / 448`.
fn random_fp8(
    r: &mut ChaCha8Rng,
    n: usize,
    k: usize,
    block: [usize; 2],
    input: Option<ActivationQuant>,
    scale: f32,
) -> Fp8Matrix {
    let codes = (0..n * k).map(|_| r.random::<u8>() & !0x78u8 | (r.random_range(0u8..15) << 3)).collect();
    let blocks = n.div_ceil(block[0]) * k.div_ceil(block[1]);
    let scales = (0..blocks).map(|_| scale / 448.0 * r.random_range(0.5f32..1.5)).collect();
    Fp8Matrix::new(n, k, codes, scales, block, input).unwrap()
}

/// FP8 weights kept as bytes on CUDA against the CPU product with the dequantized weight: the
/// GEMV kernels (m <= 4), W8A8 per-row layers past that on FP8 tensor cores (the MMA kernels up
/// to 8 rows, the cuBLASLt GEMM past that), the others dequantized for cuBLAS. The W8A8 products
/// quantize their input rows to e4m3, so their reference input is `fp8_fake_quant` of the same
/// rows with the layer's own input quantization (per token or a fixed scale); the GEMV takes
/// them as the layer gives them, quantized the same way.
#[test]
fn fp8_matmul_t_matches_dequantized_cpu() {
    require_gpu!();
    let mut r = rng(23);
    let mut worst = 0.0f32;
    let per_row = |k: usize| [1, k];
    let dynamic = Some(ActivationQuant::PerToken);
    let fixed = Some(ActivationQuant::Static(4.0 / 448.0));
    // (m, k, n, block, input): per-row and 128x128 blocks (a partial last block each way), the
    // GEMV's rows, the MMA kernels' row counts from edge to edge with a k that is not a whole
    // number of MMA steps, rows past them (the GEMM), weight-only layers (the GEMV and the
    // dequantizing path).
    let shapes = [
        (1, 4096, 1024, per_row(4096), dynamic),
        (3, 256, 48, per_row(256), None),
        (4, 2048, 4096, per_row(2048), dynamic),
        (1, 320, 200, [128, 128], None),
        (4, 1024, 384, [128, 128], None),
        (5, 1024, 512, per_row(1024), dynamic),
        (8, 1040, 200, per_row(1040), dynamic),
        (2, 528, 72, per_row(528), fixed),
        (6, 528, 72, per_row(528), fixed),
        (7, 4096, 4096, per_row(4096), fixed),
        (9, 1024, 512, per_row(1024), dynamic),
        (40, 4096, 1024, per_row(4096), dynamic),
        (130, 512, 256, per_row(512), fixed),
        (33, 320, 200, [128, 128], None),
        (17, 256, 64, per_row(256), None),
    ];
    for &(m, k, n, block, input) in &shapes {
        let w = random_fp8(&mut r, n, k, block, input, 0.5);
        let x = random(&mut r, m * k, 1.0);
        let b = random(&mut r, n, 1.0);
        let wc = Tensor::from_f32(w.to_f32_vec(), &[n, k]).unwrap();
        let wg =
            Tensor::from_storage(Storage::Cpu(CpuStorage::Fp8(w.clone())), vec![n, k]).unwrap().to_device(GPU).unwrap();
        assert_eq!(wg.dtype(), DType::Fp8);
        assert!(wg.size_in_bytes() < 2 * n * k, "one byte a weight: {} bytes for {n}x{k}", wg.size_in_bytes());
        let (xc, xg) = pair(&x, &[m, k], DType::BF16);
        let xc = match input {
            Some(q) if block[0] == 1 && m > 4 => ops::fp8_fake_quant(&xc, q).unwrap(),
            _ => xc,
        };
        let (bc, bg) = pair(&b, &[n], DType::BF16);
        for bias in [false, true] {
            let want = ops::matmul_t(&xc, &wc, bias.then_some(&bc)).unwrap();
            let got = ops::matmul_t(&xg, &wg, bias.then_some(&bg)).unwrap();
            let name = format!("fp8 matmul_t m={m} k={k} n={n} block={block:?} input={input:?} bias={bias}");
            worst = worst.max(check(&name, DType::BF16, &got, &want, tol(DType::BF16)));
            let again = ops::matmul_t(&xg, &wg, bias.then_some(&bg)).unwrap();
            assert_eq!(got.to_f32_vec(), again.to_f32_vec(), "{name}: not deterministic");
        }
        // The fused entry points give each product's bits alone.
        let narrow = random_fp8(&mut r, 32, k, block, input, 0.5);
        let ng =
            Tensor::from_storage(Storage::Cpu(CpuStorage::Fp8(narrow)), vec![32, k]).unwrap().to_device(GPU).unwrap();
        let many = ops::matmul_t_many(&xg, &[(&wg, None), (&ng, None), (&wg, Some(&bg))]).unwrap();
        assert_eq!(many[0].to_f32_vec(), ops::matmul_t(&xg, &wg, None).unwrap().to_f32_vec());
        assert_eq!(many[1].to_f32_vec(), ops::matmul_t(&xg, &ng, None).unwrap().to_f32_vec());
        assert_eq!(many[2].to_f32_vec(), ops::matmul_t(&xg, &wg, Some(&bg)).unwrap().to_f32_vec());
        let gated = ops::gated_matmul_t(&xg, &wg, &wg, Activation::Silu).unwrap();
        let plain = ops::matmul_t(&xg, &wg, None).unwrap();
        assert_eq!(gated.to_f32_vec(), ops::act_mul(&plain, &plain, Activation::Silu).unwrap().to_f32_vec());
        let back = wg.to_device(Device::Cpu).unwrap();
        assert!(matches!(back.cpu(), Some(CpuStorage::Fp8(b)) if *b == w), "round trip of {n}x{k} {block:?}");
    }
    let w = random_fp8(&mut r, 16, 64, [1, 64], Some(ActivationQuant::PerToken), 0.5);
    let wg = Tensor::from_storage(Storage::Cpu(CpuStorage::Fp8(w)), vec![16, 64]).unwrap().to_device(GPU).unwrap();
    let x = Tensor::from_f32(vec![1.0; 64], &[1, 64]).unwrap().to_device(GPU).unwrap();
    assert!(ops::matmul_t(&x, &wg, None).is_err(), "f32 activations are refused, not miscomputed");
    assert!(ops::embedding(&wg, &[0]).is_err());
    println!("WORST fp8 matmul_t bf16={worst:.3e}");
}

/// The fused decode products give the bits of the ops they replace on the same device (and so
/// the CPU bounds of those ops), in both dtypes, with and without their GEMV kernels' shapes.
#[test]
fn fused_products_match_unfused() {
    require_gpu!();
    let mut r = rng(12);
    // (m, k, [n of each product]): GEMV rows with q/k/v-like widths, odd widths, an empty
    // product, and rows past the GEMV (cuBLAS).
    let shapes: [(usize, usize, &[usize]); 5] = [
        (1, 512, &[256, 64, 64]),
        (3, 256, &[130, 7, 33]),
        (4, 1024, &[96, 0, 40]),
        (2, 64, &[50]),
        (9, 128, &[40, 24]),
    ];
    for (m, k, widths) in shapes {
        let x = random(&mut r, m * k, 1.0);
        let ws: Vec<Vec<f32>> = widths.iter().map(|&n| random(&mut r, n * k, 0.5)).collect();
        let bs: Vec<Vec<f32>> = widths.iter().map(|&n| random(&mut r, n, 1.0)).collect();
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[m, k], dtype);
            let wpairs: Vec<(Tensor, Tensor)> = ws.iter().zip(widths).map(|(w, &n)| pair(w, &[n, k], dtype)).collect();
            let bpairs: Vec<(Tensor, Tensor)> = bs.iter().zip(widths).map(|(b, &n)| pair(b, &[n], dtype)).collect();
            for bias in [false, true] {
                let operands: Vec<(&Tensor, Option<&Tensor>)> =
                    wpairs.iter().zip(&bpairs).map(|(w, b)| (&w.1, bias.then_some(&b.1))).collect();
                let fused = ops::matmul_t_many(&xg, &operands).unwrap();
                assert_eq!(fused.len(), widths.len());
                for (i, got) in fused.iter().enumerate() {
                    let name = format!("matmul_t_many m={m} k={k} part {i} bias={bias}");
                    let (w, b) = (&wpairs[i], &bpairs[i]);
                    let alone = ops::matmul_t(&xg, &w.1, bias.then_some(&b.1)).unwrap();
                    check(&name, dtype, got, &alone, 0.0);
                    check(&name, dtype, got, &ops::matmul_t(&xc, &w.0, bias.then_some(&b.0)).unwrap(), tol(dtype));
                }
            }
            let up = pair(&ws[0].iter().rev().copied().collect::<Vec<f32>>(), &[widths[0], k], dtype);
            for act in [Activation::Silu, Activation::GeluTanh] {
                let name = format!("gated_matmul_t m={m} k={k} n={} {act:?}", widths[0]);
                let gate = &wpairs[0];
                let got = ops::gated_matmul_t(&xg, &gate.1, &up.1, act).unwrap();
                let unfused = ops::act_mul(
                    &ops::matmul_t(&xg, &gate.1, None).unwrap(),
                    &ops::matmul_t(&xg, &up.1, None).unwrap(),
                    act,
                )
                .unwrap();
                check(&name, dtype, &got, &unfused, 0.0);
                let cpu = ops::gated_matmul_t(&xc, &gate.0, &up.0, act).unwrap();
                check(&name, dtype, &got, &cpu, 4.0 * tol(dtype));
            }
        }
    }
    let x = Tensor::from_f32(vec![0.0; 8], &[1, 8]).unwrap().to_device(Device::Cuda(0)).unwrap();
    let w = Tensor::from_f32(vec![0.0; 16], &[2, 8]).unwrap().to_device(Device::Cuda(0)).unwrap();
    let narrow = Tensor::from_f32(vec![0.0; 8], &[2, 4]).unwrap().to_device(Device::Cuda(0)).unwrap();
    assert!(ops::matmul_t_many(&x, &[(&w, None), (&narrow, None)]).is_err(), "a weight of another width");
    assert!(ops::gated_matmul_t(&x, &w, &narrow, Activation::Silu).is_err(), "gate and up of other shapes");
}

#[test]
fn gathers_and_copies_are_exact() {
    require_gpu!();
    let mut r = rng(3);
    for dtype in DTYPES {
        let table = random(&mut r, 50 * 24, 2.0);
        let (tc, tg) = pair(&table, &[50, 24], dtype);
        let ids = [3u32, 0, 49, 3, 17];
        check("embedding", dtype, &ops::embedding(&tg, &ids).unwrap(), &ops::embedding(&tc, &ids).unwrap(), 0.0);
        let rows = [4usize, 4, 0, 49];
        check(
            "gather_rows",
            dtype,
            &ops::gather_rows(&tg, &rows).unwrap(),
            &ops::gather_rows(&tc, &rows).unwrap(),
            0.0,
        );
        check(
            "narrow_cols",
            dtype,
            &ops::narrow_cols(&tg, 5, 13).unwrap(),
            &ops::narrow_cols(&tc, 5, 13).unwrap(),
            0.0,
        );
        let other = random(&mut r, 50 * 7, 1.0);
        let (oc, og) = pair(&other, &[50, 7], dtype);
        let got = ops::concat_cols(&[&tg, &og, &tg]).unwrap();
        check("concat_cols", dtype, &got, &ops::concat_cols(&[&tc, &oc, &tc]).unwrap(), 0.0);
        check("embedding (no ids)", dtype, &ops::embedding(&tg, &[]).unwrap(), &ops::embedding(&tc, &[]).unwrap(), 0.0);
    }
    // EAGLE-3's draft logits into the target vocabulary: 24 columns spread over 61, -inf elsewhere.
    let logits = random(&mut r, 5 * 24, 3.0);
    let (lc, lg) = pair(&logits, &[5, 24], DType::F32);
    let map: Vec<f32> = (0..61).map(|c| if c % 5 == 2 && c / 5 < 24 { (c / 5) as f32 } else { -1.0 }).collect();
    let mc = Tensor::from_f32(map, &[61]).unwrap();
    let mg = mc.to_device(Device::Cuda(0)).unwrap();
    let (got, want) = (
        ops::gather_cols(&lg, &mg, f32::NEG_INFINITY).unwrap(),
        ops::gather_cols(&lc, &mc, f32::NEG_INFINITY).unwrap(),
    );
    assert_eq!(got.to_f32_vec(), want.to_f32_vec(), "gather_cols");
}

#[test]
fn norms_match_cpu() {
    require_gpu!();
    let mut r = rng(4);
    // bf16 rows of a multiple of 8 up to 8192 take the one-chunk-per-thread kernel; the rest the strided one.
    for (rows, cols) in [(1, 64), (7, 4096), (3, 1000), (2, 8192), (1, 1004), (2, 20000)] {
        let x = random(&mut r, rows * cols, 2.0);
        let res = random(&mut r, rows * cols, 2.0);
        let w = random(&mut r, cols, 1.0);
        let b = random(&mut r, cols, 1.0);
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, cols], dtype);
            let (rc, rg) = pair(&res, &[rows, cols], dtype);
            for wdtype in DTYPES {
                let (wc, wg) = pair(&w, &[cols], wdtype);
                let (bc, bg) = pair(&b, &[cols], wdtype);
                for offset in [0.0, 1.0] {
                    let name = format!("rms_norm {rows}x{cols} w={wdtype} offset={offset}");
                    let want = ops::rms_norm(&xc, &wc, 1e-6, offset).unwrap();
                    check(&name, dtype, &ops::rms_norm(&xg, &wg, 1e-6, offset).unwrap(), &want, tol(dtype));
                    let (n_got, s_got) = ops::add_rms_norm(&xg, &rg, &wg, 1e-5, offset).unwrap();
                    let (n_want, s_want) = ops::add_rms_norm(&xc, &rc, &wc, 1e-5, offset).unwrap();
                    check(&format!("add_rms_norm.sum {rows}x{cols} w={wdtype}"), dtype, &s_got, &s_want, tol(dtype));
                    check(
                        &format!("add_rms_norm.normed {rows}x{cols} w={wdtype} offset={offset}"),
                        dtype,
                        &n_got,
                        &n_want,
                        tol(dtype),
                    );
                }
                for (wo, bo) in [(true, true), (true, false), (false, true), (false, false)] {
                    let name = format!("layer_norm {rows}x{cols} w={wdtype} weight={wo} bias={bo}");
                    let want = ops::layer_norm(&xc, wo.then_some(&wc), bo.then_some(&bc), 1e-5).unwrap();
                    let got = ops::layer_norm(&xg, wo.then_some(&wg), bo.then_some(&bg), 1e-5).unwrap();
                    check(&name, dtype, &got, &want, tol(dtype));
                }
            }
        }
    }
}

#[test]
fn elementwise_matches_cpu() {
    require_gpu!();
    let mut r = rng(5);
    let acts = [Activation::Silu, Activation::Gelu, Activation::GeluTanh, Activation::Relu, Activation::Relu2];
    for (rows, cols) in [(1, 5), (33, 1000), (4, 14336)] {
        let a = random(&mut r, rows * cols, 4.0);
        let b = random(&mut r, rows * cols, 4.0);
        let row = random(&mut r, cols, 2.0);
        for dtype in DTYPES {
            let (ac, ag) = pair(&a, &[rows, cols], dtype);
            let (bc, bg) = pair(&b, &[rows, cols], dtype);
            let t = tol(dtype);
            check("add", dtype, &ops::add(&ag, &bg).unwrap(), &ops::add(&ac, &bc).unwrap(), t);
            check("mul", dtype, &ops::mul(&ag, &bg).unwrap(), &ops::mul(&ac, &bc).unwrap(), t);
            check("scale", dtype, &ops::scale(&ag, -0.37).unwrap(), &ops::scale(&ac, -0.37).unwrap(), t);
            check("softcap", dtype, &ops::softcap(&ag, 2.5).unwrap(), &ops::softcap(&ac, 2.5).unwrap(), t);
            for wdtype in DTYPES {
                let (rc, rg) = pair(&row, &[cols], wdtype);
                check(
                    &format!("mul_row w={wdtype}"),
                    dtype,
                    &ops::mul_row(&ag, &rg).unwrap(),
                    &ops::mul_row(&ac, &rc).unwrap(),
                    t,
                );
            }
            for act in acts {
                let name = format!("activation {act:?}");
                check(&name, dtype, &ops::activation(&ag, act).unwrap(), &ops::activation(&ac, act).unwrap(), t);
                let name = format!("act_mul {act:?}");
                check(&name, dtype, &ops::act_mul(&ag, &bg, act).unwrap(), &ops::act_mul(&ac, &bc, act).unwrap(), t);
            }
            let p = ferrite_tensor::Xielu { alpha_p: 0.7, alpha_n: 1.3, beta: 0.5, eps: -1e-6 };
            check("xielu", dtype, &ops::xielu(&ag, p).unwrap(), &ops::xielu(&ac, p).unwrap(), t);
        }
    }
}

/// Gemma 3n's row ops: the gaussian top-k of MLP gates, AltUp's magnitude matching (one row all
/// zeros, held up by the floor) and its stream mixing (four streams into four, one into four).
#[test]
fn altup_ops_match_cpu() {
    require_gpu!();
    let mut r = rng(12);
    for (rows, cols) in [(1, 64), (5, 1000), (3, 8192)] {
        let x = random(&mut r, rows * cols, 3.0);
        let mut reference = random(&mut r, rows * cols, 0.5);
        reference[..cols].fill(0.0);
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, cols], dtype);
            let (rc, rg) = pair(&reference, &[rows, cols], dtype);
            let t = tol(dtype);
            // Outputs are differences x - cutoff, the cutoff (mean + multiplier * std, about 3
            // here) summed in another order on each side: an ulp or two of it is 2e-5 of an
            // output of 0.03 (H100, 2026-12-07: 1.7e-5 at 1x64), so f32 is held to 1e-4.
            let topk_tol = if dtype == DType::F32 { 1e-4 } else { t };
            for multiplier in [1.6448536, 0.0, -0.5244005] {
                let name = format!("gaussian_topk {rows}x{cols} multiplier={multiplier}");
                let want = ops::gaussian_topk(&xc, multiplier).unwrap();
                check(&name, dtype, &ops::gaussian_topk(&xg, multiplier).unwrap(), &want, topk_tol);
            }
            let name = format!("match_rms {rows}x{cols}");
            let want = ops::match_rms(&rc, &xc, 1e-5).unwrap();
            check(&name, dtype, &ops::match_rms(&rg, &xg, 1e-5).unwrap(), &want, t);
            for (n, m) in [(4, 4), (4, 1)] {
                let d = cols / m;
                let coefs = random(&mut r, rows * n * m, 1.0);
                let (cc, cg) = pair(&coefs, &[rows, n * m], dtype);
                let (sc, sg) = (xc.reshape(&[rows, m * d]).unwrap(), xg.reshape(&[rows, m * d]).unwrap());
                let name = format!("mix_streams {rows}x{cols} {m} into {n}");
                let want = ops::mix_streams(&sc, &cc, n).unwrap();
                check(&name, dtype, &ops::mix_streams(&sg, &cg, n).unwrap(), &want, t);
            }
        }
    }
}

/// FP8 activation quantization: in f32 both sides do the same IEEE operations (the largest
/// magnitude is order-free), so they agree bit for bit; rows span e4m3's subnormals, and one row
/// is all zeros.
#[test]
fn fp8_fake_quant_matches_cpu() {
    require_gpu!();
    use ferrite_tensor::ActivationQuant;
    let mut r = rng(17);
    for (rows, cols) in [(1, 128), (7, 512), (3, 4096)] {
        let mut a = random(&mut r, rows * cols, 3.0);
        a.iter_mut().step_by(5).for_each(|v| *v *= 1e-4);
        a[..cols].iter_mut().for_each(|v| *v = 0.0);
        for dtype in DTYPES {
            let (ac, ag) = pair(&a, &[rows, cols], dtype);
            for quant in [ActivationQuant::PerToken, ActivationQuant::PerGroup(128), ActivationQuant::Static(0.0123)] {
                let name = format!("fp8_fake_quant {quant:?} {rows}x{cols}");
                let want = ops::fp8_fake_quant(&ac, quant).unwrap();
                let bound = if dtype == DType::F32 { 0.0 } else { tol(dtype) };
                check(&name, dtype, &ops::fp8_fake_quant(&ag, quant).unwrap(), &want, bound);
            }
        }
    }
}

#[test]
fn softmax_and_argmax_match_cpu() {
    require_gpu!();
    let mut r = rng(6);
    for (rows, cols) in [(3, 7), (5, 1000), (2, 32000), (1, 151936)] {
        let x = random(&mut r, rows * cols, 8.0);
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, cols], dtype);
            let bound = if dtype == DType::F32 { 2e-4 } else { tol(dtype) };
            check(
                &format!("softmax {rows}x{cols}"),
                dtype,
                &ops::softmax(&xg).unwrap(),
                &ops::softmax(&xc).unwrap(),
                bound,
            );
            assert_eq!(ops::argmax_rows(&xg).unwrap(), ops::argmax_rows(&xc).unwrap(), "argmax {rows}x{cols} {dtype}");
        }
    }
    // Ties go to the lowest index; NaN is the largest value (torch.argmax).
    let rows = [
        vec![1.0, 3.0, 3.0, 2.0, 3.0],
        vec![f32::NEG_INFINITY; 5],
        vec![0.0, f32::NAN, 5.0, f32::NAN, 1.0],
        vec![-2.0, -1.0, -1.0, -3.0, f32::INFINITY],
    ];
    let flat: Vec<f32> = rows.concat();
    for dtype in DTYPES {
        let (xc, xg) = pair(&flat, &[4, 5], dtype);
        let want = ops::argmax_rows(&xc).unwrap();
        assert_eq!(want, vec![1, 0, 1, 4], "CPU argmax semantics");
        assert_eq!(ops::argmax_rows(&xg).unwrap(), want, "CUDA argmax {dtype}");
    }
    // The same across the parts a long row is split into (4096 columns or more each).
    let cols = 20000;
    let mut long = vec![vec![0.0f32; cols]; 3];
    (long[0][15000], long[0][5000]) = (7.0, 7.0);
    (long[1][17000], long[1][9000], long[1][100]) = (f32::NAN, f32::NAN, 9.0);
    long[2].fill(f32::NEG_INFINITY);
    for dtype in DTYPES {
        let (xc, xg) = pair(&long.concat(), &[3, cols], dtype);
        assert_eq!(ops::argmax_rows(&xc).unwrap(), vec![5000, 9000, 0], "CPU argmax semantics, long rows");
        assert_eq!(ops::argmax_rows(&xg).unwrap(), vec![5000, 9000, 0], "CUDA argmax {dtype}, long rows");
    }
    println!("CHECK argmax_rows: exact");
}

#[test]
fn rope_matches_cpu() {
    require_gpu!();
    let mut r = rng(7);
    for (tokens, heads, head_dim, rotary) in [(5, 4, 64, 64), (17, 8, 128, 128), (3, 2, 80, 32), (9, 3, 256, 128)] {
        let half = rotary / 2;
        let x = random(&mut r, tokens * heads * head_dim, 3.0);
        let angles: Vec<f32> = (0..tokens * half).map(|i| (i / half) as f32 * 0.9f32.powi((i % half) as i32)).collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[tokens, heads * head_dim], dtype);
            for cdtype in DTYPES {
                let (cc, cg) = pair(&cos, &[tokens, half], cdtype);
                let (sc, sg) = pair(&sin, &[tokens, half], cdtype);
                for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
                    let name = format!("rope {style:?} t={tokens} h={heads} d={head_dim} rot={rotary} cos={cdtype}");
                    let want = ops::rope(&xc, &cc, &sc, head_dim, style).unwrap();
                    let alone = ops::rope(&xg, &cg, &sg, head_dim, style).unwrap();
                    check(&name, dtype, &alone, &want, tol(dtype));
                    // Keys of fewer heads (GQA) rotated into the cache with the values, in
                    // one launch: the same bits as rope + write_kv, the padding row unwritten.
                    let kv_heads = heads.div_ceil(2);
                    let kg = ops::narrow_cols(&xg, 0, kv_heads * head_dim).unwrap();
                    let vg = ops::narrow_cols(&xg, (heads - kv_heads) * head_dim, kv_heads * head_dim).unwrap();
                    let mut meta = AttnMetadata::new(
                        vec![AttnSeq { q_start: 0, q_len: tokens, ctx_len: tokens, block_table: vec![1, 0] }],
                        16,
                    )
                    .unwrap();
                    meta.slot_mapping[tokens / 2] = ferrite_tensor::kv::PAD_SLOT;
                    let cache = || PagedKvLayer::new_on(GPU, dtype, 2, 16, kv_heads, head_dim, head_dim).unwrap();
                    let (mut fused, mut apart) = (cache(), cache());
                    let q2 = ops::rope_write_kv(&xg, &kg, &vg, &cg, &sg, head_dim, style, &mut fused, &meta).unwrap();
                    check(&format!("{name} rope_write_kv q"), dtype, &q2, &alone, 0.0);
                    let k_rot = ops::rope(&kg, &cg, &sg, head_dim, style).unwrap();
                    ops::write_kv(&mut apart, &k_rot, &vg, &meta).unwrap();
                    assert_eq!(cache_contents(&fused), cache_contents(&apart), "{name} rope_write_kv cache {dtype}");
                    let unwritten =
                        cache_contents(&fused).0[meta.seqs[0].block_table[0] as usize * 16 * kv_heads * head_dim
                            + (tokens / 2) * kv_heads * head_dim];
                    assert_eq!(unwritten, 0.0, "{name}: the padding row's key stays out of the cache");
                    // Into FP8 caches: the same bytes fused as apart.
                    let fp8_cache = || {
                        let scales = Fp8KvScales { k: 0.1, v: 0.2 };
                        let c = PagedKvLayer::new_on(GPU, DType::Fp8, 2, 16, kv_heads, head_dim, head_dim).unwrap();
                        c.with_fp8_scales(scales).unwrap()
                    };
                    let (mut fused, mut apart) = (fp8_cache(), fp8_cache());
                    let q8 = ops::rope_write_kv(&xg, &kg, &vg, &cg, &sg, head_dim, style, &mut fused, &meta).unwrap();
                    check(&format!("{name} rope_write_kv q, FP8 cache"), dtype, &q8, &alone, 0.0);
                    ops::write_kv(&mut apart, &k_rot, &vg, &meta).unwrap();
                    assert!(cache_contents(&fused) == cache_contents(&apart), "{name} rope_write_kv FP8 cache {dtype}");
                }
            }
        }
    }
}

/// A cache's keys and values as the values attention reads: an FP8 cache's bytes times its
/// scales, a CPU one's floats.
fn cache_contents(c: &PagedKvLayer) -> (Vec<f32>, Vec<f32>) {
    let host = |s: &ferrite_tensor::CudaStorage| {
        let cpu = s.to_cpu().unwrap();
        let len = cpu.len();
        Tensor::from_storage(ferrite_tensor::Storage::Cpu(cpu), vec![len]).unwrap().to_f32_vec()
    };
    match &c.storage {
        KvStorage::Cuda { k, v } => (host(k), host(v)),
        KvStorage::CudaFp8 { .. } => {
            let (k, v) = cuda::download_fp8_cache(c).unwrap();
            let scales = c.fp8.expect("an FP8 cache has scales");
            let values = |bytes: Vec<u8>, scale: f32| {
                bytes.into_iter().map(|b| ferrite_tensor::fp8::e4m3_to_f32(b) * scale).collect()
            };
            (values(k, scales.k), values(v, scales.v))
        }
        KvStorage::Cpu { k, v } => (k.clone(), v.clone()),
    }
}

/// One sequence of an attention test: `cached` tokens already in the cache, `new` this step;
/// `both_ways`: every new row sees all the keys (an image's tokens in Gemma 3).
struct Seq {
    cached: usize,
    new: usize,
    both_ways: bool,
}

struct AttnCase {
    name: &'static str,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    block_size: usize,
    window: Option<usize>,
    /// Llama 4's chunked local attention.
    chunk: Option<usize>,
    softcap: Option<f32>,
    /// gpt-oss's per-head attention sinks (random logits).
    sinks: bool,
    seqs: Vec<Seq>,
}

/// Fills the cache with every sequence's cached prefix (one earlier step), then runs this step's
/// write_kv + paged_attention on both backends and compares; with `fp8`, over FP8 caches of those
/// scales, whose contents must agree exactly.
fn run_attention_case(c: &AttnCase, seed: u64, fp8: Option<Fp8KvScales>) -> [f32; 2] {
    let mut r = rng(seed);
    let blocks_per_seq: Vec<usize> = c.seqs.iter().map(|s| (s.cached + s.new).div_ceil(c.block_size)).collect();
    let num_blocks = blocks_per_seq.iter().sum::<usize>() + 3;
    // Block tables drawn from a shuffled pool: order in the pool must not matter.
    let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
    pool.shuffle(&mut r);
    let mut tables = Vec::new();
    let mut next = 0;
    for &n in &blocks_per_seq {
        tables.push(pool[next..next + n].to_vec());
        next += n;
    }
    let kw = c.hkv * c.d;
    let vw = c.hkv * c.dv;
    let step_meta = |lens: &dyn Fn(&Seq) -> (usize, usize)| {
        let mut seqs = Vec::new();
        let mut q_start = 0;
        for (s, t) in c.seqs.iter().zip(&tables) {
            let (q_len, ctx_len) = lens(s);
            if q_len > 0 {
                seqs.push(AttnSeq { q_start, q_len, ctx_len, block_table: t.clone() });
                q_start += q_len;
            }
        }
        AttnMetadata::new(seqs, c.block_size).unwrap()
    };
    let prefix = step_meta(&|s| (s.cached, s.cached));
    let mut step = step_meta(&|s| (s.new, s.cached + s.new));
    if c.seqs.iter().any(|s| s.both_ways) {
        let flags = c.seqs.iter().filter(|s| s.new > 0).map(|s| s.both_ways).collect();
        step = step.with_bidirectional(flags).unwrap();
    }
    let params = AttentionParams {
        num_heads: c.hq,
        num_kv_heads: c.hkv,
        head_dim: c.d,
        v_head_dim: c.dv,
        scale: 1.0 / (c.d as f32).sqrt(),
        sliding_window: c.window,
        attention_chunk: c.chunk,
        softcap: c.softcap,
    };
    let (n0, n1) = (prefix.num_tokens(), step.num_tokens());
    let (k0, v0) = (random(&mut r, n0 * kw, 1.0), random(&mut r, n0 * vw, 1.0));
    let (k1, v1) = (random(&mut r, n1 * kw, 1.0), random(&mut r, n1 * vw, 1.0));
    // Large enough queries that the softmax is far from uniform.
    let q = random(&mut r, n1 * c.hq * c.d, 3.0);
    let sinks = random(&mut r, c.hq, 4.0);
    let mut worst = [0.0f32; 2];
    for (di, dtype) in DTYPES.into_iter().enumerate() {
        let new_cache = |device, dtype| {
            let cache = PagedKvLayer::new_on(device, dtype, num_blocks, c.block_size, c.hkv, c.d, c.dv).unwrap();
            match fp8 {
                Some(scales) => cache.with_fp8_scales(scales).unwrap(),
                None => cache,
            }
        };
        let cache_dtype = if fp8.is_some() { DType::Fp8 } else { dtype };
        let mut cpu_cache = new_cache(Device::Cpu, cache_dtype);
        let mut gpu_cache = new_cache(GPU, cache_dtype);
        for (meta, k, v) in [(&prefix, &k0, &v0), (&step, &k1, &v1)] {
            if meta.num_tokens() == 0 {
                continue;
            }
            let (kc, kg) = pair(k, &[meta.num_tokens(), kw], dtype);
            let (vc, vg) = pair(v, &[meta.num_tokens(), vw], dtype);
            ops::write_kv(&mut cpu_cache, &kc, &vc, meta).unwrap();
            ops::write_kv(&mut gpu_cache, &kg, &vg, meta).unwrap();
        }
        if fp8.is_some() {
            assert!(cache_contents(&cpu_cache) == cache_contents(&gpu_cache), "{}: FP8 cache bytes {dtype}", c.name);
        }
        let (qc, qg) = pair(&q, &[n1, c.hq * c.d], dtype);
        let (sc, sg) = pair(&sinks, &[c.hq], DType::F32);
        let (sc, sg) = if c.sinks { (Some(&sc), Some(&sg)) } else { (None, None) };
        let want = ops::paged_attention_sinks(&qc, &cpu_cache, &step, &params, sc).unwrap();
        let got = ops::paged_attention_sinks(&qg, &gpu_cache, &step, &params, sg).unwrap();
        worst[di] = check(&format!("paged_attention {}", c.name), dtype, &got, &want, tol(dtype));
        // A second call on the same metadata reuses the device copy of it.
        let again = ops::paged_attention_sinks(&qg, &gpu_cache, &step, &params, sg).unwrap();
        assert_eq!(again.to_f32_vec(), got.to_f32_vec(), "{}: repeat call differs", c.name);
    }
    worst
}

fn seqs(list: &[(usize, usize)]) -> Vec<Seq> {
    list.iter().map(|&(cached, new)| Seq { cached, new, both_ways: false }).collect()
}

#[test]
fn paged_attention_matches_cpu() {
    require_gpu!();
    let mixed = [(0, 20), (44, 1), (37, 13), (0, 1), (100, 1), (5, 40)];
    // Causal text, image runs whose rows see the whole run (one after a cached prefix), decodes.
    let images = || {
        [(0, 20, false), (20, 16, true), (5, 40, true), (37, 13, false), (44, 1, false), (90, 64, true)]
            .map(|(cached, new, both_ways)| Seq { cached, new, both_ways })
            .into()
    };
    let cases = [
        AttnCase {
            name: "bidirectional image rows GQA 8/2 d64 (tensor-core prefill in bf16)",
            hq: 8,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: images(),
        },
        AttnCase {
            name: "bidirectional image rows GQA 4/2 d16 window 24 (CUDA cores)",
            hq: 4,
            hkv: 2,
            d: 16,
            dv: 16,
            block_size: 16,
            window: Some(24),
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: images(),
        },
        AttnCase {
            name: "mixed prefill/decode GQA 8/2 d64 bs16",
            hq: 8,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&mixed),
        },
        AttnCase {
            name: "mixed, sliding window 24 + softcap 30",
            hq: 8,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: Some(24),
            chunk: None,
            softcap: Some(30.0),
            sinks: false,
            seqs: seqs(&mixed),
        },
        AttnCase {
            name: "MHA 4/4 d128 bs8 chunked prefill",
            hq: 4,
            hkv: 4,
            d: 128,
            dv: 128,
            block_size: 8,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(0, 37), (64, 23)]),
        },
        AttnCase {
            name: "decode batch 2 ctx ~1500 GQA 32/8 d128 (split keys)",
            hq: 32,
            hkv: 8,
            d: 128,
            dv: 128,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(1499, 1), (1203, 1)]),
        },
        AttnCase {
            name: "decode batch 1 ctx 3000 GQA 32/8 window 1000",
            hq: 32,
            hkv: 8,
            d: 128,
            dv: 128,
            block_size: 16,
            window: Some(1000),
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(2999, 1)]),
        },
        AttnCase {
            name: "MQA 20/1 (head chunks) d96 mixed",
            hq: 20,
            hkv: 1,
            d: 96,
            dv: 96,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: Some(50.0),
            sinks: false,
            seqs: seqs(&[(0, 9), (30, 1), (12, 5)]),
        },
        AttnCase {
            name: "GQA 6/2 d66 (scalar tile loads) bs4",
            hq: 6,
            hkv: 2,
            d: 66,
            dv: 66,
            block_size: 4,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(0, 11), (9, 1), (3, 4)]),
        },
        AttnCase {
            name: "GQA 8/4 d256 Gemma-like window 16 softcap 50",
            hq: 8,
            hkv: 4,
            d: 256,
            dv: 256,
            block_size: 16,
            window: Some(16),
            chunk: None,
            softcap: Some(50.0),
            sinks: false,
            seqs: seqs(&[(0, 30), (70, 1), (20, 7)]),
        },
        AttnCase {
            name: "GQA 4/2 k_dim 64 v_dim 32",
            hq: 4,
            hkv: 2,
            d: 64,
            dv: 32,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(0, 10), (17, 1)]),
        },
        AttnCase {
            name: "mixed, Llama 4 chunks of 32 (row blocks and decodes across chunk starts)",
            hq: 8,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: None,
            chunk: Some(32),
            softcap: None,
            sinks: false,
            seqs: seqs(&[(0, 70), (63, 1), (64, 1), (20, 30), (100, 1)]),
        },
        AttnCase {
            name: "decode ctx 3000 GQA 40/8 d128 chunks of 1024 (split keys)",
            hq: 40,
            hkv: 8,
            d: 128,
            dv: 128,
            block_size: 16,
            window: None,
            chunk: Some(1024),
            softcap: None,
            sinks: false,
            seqs: seqs(&[(2999, 1), (2047, 1)]),
        },
        AttnCase {
            name: "gpt-oss-like sinks, GQA 8/2 d64 mixed prefill/decode, window 24",
            hq: 8,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: Some(24),
            chunk: None,
            softcap: None,
            sinks: true,
            seqs: seqs(&mixed),
        },
        AttnCase {
            name: "sinks, long prefill rows GQA 16/2 d64 (tensor-core prefill)",
            hq: 16,
            hkv: 2,
            d: 64,
            dv: 64,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: true,
            seqs: seqs(&[(0, 200), (150, 90)]),
        },
        AttnCase {
            name:
                "Llama-shaped chunk over a long cached prefix GQA 32/8 d128 (16-row tensor-core items, a partial last one)",
            hq: 32,
            hkv: 8,
            d: 128,
            dv: 128,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: false,
            seqs: seqs(&[(1100, 77), (0, 3), (40, 130)]),
        },
        AttnCase {
            name: "sinks, decode ctx 3000 GQA 64/8 d64 (split keys, combine)",
            hq: 64,
            hkv: 8,
            d: 64,
            dv: 64,
            block_size: 16,
            window: None,
            chunk: None,
            softcap: None,
            sinks: true,
            seqs: seqs(&[(2999, 1), (1500, 1)]),
        },
    ];
    let mut worst = [0.0f32; 2];
    for (i, c) in cases.iter().enumerate() {
        let w = run_attention_case(c, 100 + i as u64, None);
        worst = [worst[0].max(w[0]), worst[1].max(w[1])];
    }
    println!("WORST paged_attention f32={:.3e} bf16={:.3e}", worst[0], worst[1]);
    // FP8 caches (`--kv-cache-dtype fp8`): the same writes round the same values to the same
    // bytes on both backends, then attention reads them as it reads any cache (bf16 prefill rows
    // on the tensor-core kernel where FERRITE_FP8_KV_TC_PREFILL=1 is set, else on CUDA cores). Scales other than
    // 1 (a checkpoint's) and 1 itself; prefill rows, split decodes, scalar loads, sinks.
    let fp8_cases = [2, 5, 7, 8, 13, 14, 15];
    for (n, i) in fp8_cases.into_iter().enumerate() {
        let scales = if n % 2 == 0 { Fp8KvScales { k: 0.0375, v: 0.3 } } else { Fp8KvScales::default() };
        let w = run_attention_case(&cases[i], 200 + i as u64, Some(scales));
        worst = [worst[0].max(w[0]), worst[1].max(w[1])];
    }
    println!("WORST paged_attention with FP8 caches too f32={:.3e} bf16={:.3e}", worst[0], worst[1]);
}

/// DeepSeek-V3.2's sparse MLA: key rows wider than attention reads (the indexer's keys follow
/// MLA's), those columns read back with `gather_cached_keys`, and attention over the keys each
/// query keeps, as one-token blocks (a sequence per query whose block table lists its slots).
#[test]
fn chosen_keys_in_wide_key_rows_match_cpu() {
    require_gpu!();
    let mut r = rng(11);
    let (bs, k_dim, v_dim, d, hq, tokens) = (4, 24, 8, 16, 4, 13);
    let table = vec![2u32, 0, 3, 1];
    let slot = |p: usize| table[p / bs] as usize * bs + p % bs;
    let seq = AttnSeq { q_start: 0, q_len: tokens, ctx_len: tokens, block_table: table.clone() };
    let meta = AttnMetadata::new(vec![seq], bs).unwrap();
    // Each query keeps the keys of its own parity up to itself.
    let chosen: Vec<AttnSeq> = (0..tokens)
        .map(|i| {
            let kept: Vec<u32> = (i % 2..=i).step_by(2).map(|p| slot(p) as u32).collect();
            AttnSeq { q_start: i, q_len: 1, ctx_len: kept.len(), block_table: kept }
        })
        .collect();
    let chosen = AttnMetadata::new(chosen, 1).unwrap();
    let params = AttentionParams {
        num_heads: hq,
        num_kv_heads: 1,
        head_dim: d,
        v_head_dim: v_dim,
        scale: 0.25,
        sliding_window: None,
        attention_chunk: None,
        softcap: None,
    };
    let (k, v, q) = (
        random(&mut r, tokens * k_dim, 1.0),
        random(&mut r, tokens * v_dim, 1.0),
        random(&mut r, tokens * hq * d, 3.0),
    );
    for dtype in DTYPES {
        let mut cpu_cache = PagedKvLayer::new_cpu(table.len(), bs, 1, k_dim, v_dim);
        let mut gpu_cache = PagedKvLayer::new_on(GPU, dtype, table.len(), bs, 1, k_dim, v_dim).unwrap();
        let ((kc, kg), (vc, vg)) = (pair(&k, &[tokens, k_dim], dtype), pair(&v, &[tokens, v_dim], dtype));
        ops::write_kv(&mut cpu_cache, &kc, &vc, &meta).unwrap();
        ops::write_kv(&mut gpu_cache, &kg, &vg, &meta).unwrap();
        let rows = [slot(5), slot(0), slot(12), slot(7)];
        check(
            "gather_cached_keys",
            dtype,
            &ops::gather_cached_keys(&gpu_cache, &rows, d, k_dim - d).unwrap(),
            &ops::gather_cached_keys(&cpu_cache, &rows, d, k_dim - d).unwrap(),
            0.0,
        );
        let (qc, qg) = pair(&q, &[tokens, hq * d], dtype);
        let want = ops::paged_attention(&qc, &cpu_cache, &chosen, &params).unwrap();
        let got = ops::paged_attention(&qg, &gpu_cache, &chosen, &params).unwrap();
        check("paged_attention over chosen keys", dtype, &got, &want, tol(dtype));
    }
}

#[test]
fn mixture_of_experts_ops_match_cpu() {
    require_gpu!();
    let mut r = rng(8);
    let (experts, k, n) = (6, 256, 96);
    let w = random(&mut r, experts * n * k, 0.5);
    // Rows per expert, empty groups included.
    let counts = [3usize, 0, 1, 17, 0, 2];
    let mut offsets = vec![0usize];
    for c in counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let rows = *offsets.last().unwrap();
    let x = random(&mut r, rows * k, 1.0);
    let picks: Vec<usize> = (0..rows * 2).map(|i| (i * 7 + 3) % rows).collect();
    let weights = random(&mut r, rows * 2, 1.0);
    for dtype in DTYPES {
        let (xc, xg) = pair(&x, &[rows, k], dtype);
        let (wc, wg) = pair(&w, &[experts, n, k], dtype);
        let want = ops::grouped_matmul_t(&xc, &wc, &offsets).unwrap();
        let got = ops::grouped_matmul_t(&xg, &wg, &offsets).unwrap();
        check("grouped_matmul_t", dtype, &got, &want, tol(dtype));
        // combine_rows reads the expert outputs: both backends get the CUDA ones.
        let (yc, yg) = (Tensor::from_f32(got.to_f32_vec(), got.shape()).unwrap(), got);
        for per_row in [1, 2] {
            let n_out = rows * 2 / per_row;
            let (p, wts) = (&picks[..n_out * per_row], &weights[..n_out * per_row]);
            let want = ops::combine_rows(&yc, p, wts, per_row).unwrap();
            check(
                &format!("combine_rows per_row={per_row}"),
                dtype,
                &ops::combine_rows(&yg, p, wts, per_row).unwrap(),
                &want,
                tol(dtype),
            );
        }
    }
}

#[test]
fn attention_dense_matches_cpu() {
    require_gpu!();
    let mut r = rng(9);
    let seq_lens = [7usize, 1, 30, 12];
    let tokens: usize = seq_lens.iter().sum();
    for (hq, hkv, d, window, softcap) in
        [(8, 2, 64, None, None), (4, 4, 128, Some(5), Some(20.0)), (6, 2, 66, None, None)]
    {
        let params = AttentionParams {
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            v_head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            sliding_window: window,
            attention_chunk: None,
            softcap,
        };
        let q = random(&mut r, tokens * hq * d, 3.0);
        let k = random(&mut r, tokens * hkv * d, 1.0);
        let v = random(&mut r, tokens * hkv * d, 1.0);
        for dtype in DTYPES {
            let (qc, qg) = pair(&q, &[tokens, hq * d], dtype);
            let (kc, kg) = pair(&k, &[tokens, hkv * d], dtype);
            let (vc, vg) = pair(&v, &[tokens, hkv * d], dtype);
            for causal in [true, false] {
                let want = ops::attention_dense(&qc, &kc, &vc, &params, &seq_lens, causal).unwrap();
                let got = ops::attention_dense(&qg, &kg, &vg, &params, &seq_lens, causal).unwrap();
                let name =
                    format!("attention_dense {hq}/{hkv} d{d} window={window:?} softcap={softcap:?} causal={causal}");
                check(&name, dtype, &got, &want, tol(dtype));
            }
        }
    }
}

/// A vision tower's attention: bidirectional over whole images and windows, 16 heads of 80 (Qwen2-VL
/// and Qwen2.5-VL's towers), rows long enough for the tensor-core prefill kernel once it takes
/// head dim 80 (today the CUDA-core one runs them).
#[test]
fn vision_attention_dense_matches_cpu() {
    require_gpu!();
    let mut r = rng(12);
    let seq_lens = [256usize, 64, 64, 32, 300];
    let tokens: usize = seq_lens.iter().sum();
    let (heads, d) = (16, 80);
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: d,
        v_head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        sliding_window: None,
        attention_chunk: None,
        softcap: None,
    };
    let q = random(&mut r, tokens * heads * d, 3.0);
    let k = random(&mut r, tokens * heads * d, 1.0);
    let v = random(&mut r, tokens * heads * d, 1.0);
    for dtype in DTYPES {
        let (qc, qg) = pair(&q, &[tokens, heads * d], dtype);
        let (kc, kg) = pair(&k, &[tokens, heads * d], dtype);
        let (vc, vg) = pair(&v, &[tokens, heads * d], dtype);
        for causal in [false, true] {
            let want = ops::attention_dense(&qc, &kc, &vc, &params, &seq_lens, causal).unwrap();
            let got = ops::attention_dense(&qg, &kg, &vg, &params, &seq_lens, causal).unwrap();
            check(&format!("vision attention_dense d80 causal={causal}"), dtype, &got, &want, tol(dtype));
        }
    }
}

/// The CPU semantics the CUDA ops are held to, checked on any machine.
#[test]
fn cpu_reference_semantics() {
    let rows = [vec![1.0, 3.0, 3.0, 2.0], vec![f32::NEG_INFINITY; 4], vec![0.0, f32::NAN, 5.0, f32::NAN]];
    let x = Tensor::from_f32(rows.concat(), &[3, 4]).unwrap();
    assert_eq!(ops::argmax_rows(&x).unwrap(), vec![1, 0, 1]);
    let mut r = rng(10);
    let (a, b, w) = (random(&mut r, 2 * 64, 2.0), random(&mut r, 2 * 64, 2.0), random(&mut r, 64, 1.0));
    let (a, b) = (Tensor::from_f32(a, &[2, 64]).unwrap(), Tensor::from_f32(b, &[2, 64]).unwrap());
    let w = Tensor::from_f32(w, &[64]).unwrap();
    let (normed, sum) = ops::add_rms_norm(&a, &b, &w, 1e-6, 1.0).unwrap();
    let want_sum = ops::add(&b, &a).unwrap();
    assert_eq!(sum.to_f32_vec(), want_sum.to_f32_vec());
    assert_eq!(normed.to_f32_vec(), ops::rms_norm(&want_sum, &w, 1e-6, 1.0).unwrap().to_f32_vec());
}

/// A batch's worth of row parameters: greedy rows, plain sampling, each filter alone and
/// together, cold and hot temperatures, and the tightest settings (top_k 1, tiny top_p, min_p 1).
fn sampling_mix(r: &mut ChaCha8Rng, rows: usize, step: u64) -> Vec<RowSampling> {
    let temps = [0.0, 1.0, 0.7, 1.3, 0.3, 2.0];
    let top_ks = [0, 0, 1, 5, 50, 1000];
    let top_ps = [1.0, 1.0, 0.9, 0.5, 0.99, 1e-6];
    let min_ps = [0.0, 0.0, 0.0, 0.05, 0.3, 1.0];
    (0..rows)
        .map(|i| RowSampling {
            temperature: temps[if i % 8 == 0 { 0 } else { r.random_range(1..temps.len()) }],
            top_k: top_ks[r.random_range(0..top_ks.len())],
            top_p: top_ps[r.random_range(0..top_ps.len())],
            min_p: min_ps[r.random_range(0..min_ps.len())],
            seed: r.random(),
            step,
        })
        .collect()
}

/// Rows of logits with different spreads: nearly flat (the filters keep thousands of tokens)
/// to peaked (a few tokens hold the mass).
fn sampling_logits(r: &mut ChaCha8Rng, rows: usize, vocab: usize) -> Vec<f32> {
    (0..rows).flat_map(|i| random(r, vocab, [1.0, 4.0, 8.0, 16.0][i % 4])).collect()
}

#[test]
fn sample_rows_matches_cpu() {
    require_gpu!();
    let mut r = rng(11);
    let rows = 64;
    for vocab in [32000, 151936] {
        let x = sampling_logits(&mut r, rows, vocab);
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, vocab], dtype);
            for step in [0, 1, 12345] {
                let params = sampling_mix(&mut r, rows, step);
                let want = ops::sample_rows(&xc, &params).unwrap();
                let got = ops::sample_rows(&xg, &params).unwrap();
                let (mut greedy_bad, mut sampled_bad) = (0, 0);
                for (i, p) in params.iter().enumerate() {
                    if got[i] != want[i] {
                        println!(
                            "MISMATCH vocab={vocab} {dtype} step={step} row {i}: cuda {} cpu {} {p:?}",
                            got[i], want[i]
                        );
                        if p.temperature == 0.0 {
                            greedy_bad += 1;
                        } else {
                            sampled_bad += 1;
                        }
                    }
                }
                println!("CHECK sample_rows vocab={vocab} {dtype} step={step}: mismatches greedy={greedy_bad} sampled={sampled_bad}");
                assert_eq!(greedy_bad, 0, "greedy rows are exact");
                // The arms differ only in the order (and width) of the probability-mass sums behind
                // top-p and the last ulp of exp/ln: that can move a threshold by the one token whose
                // cumulative mass sits on it, or swap a race won by a few ulps. Either changes the
                // token rarely; more than one row in 64 means a real divergence.
                assert!(sampled_bad <= 1, "{sampled_bad} sampled rows of {rows} differ");
            }
        }
    }
}

/// Token masks are data movement: the masked logits must equal the CPU's bit for bit, with a
/// vocab that is not a multiple of 32 (the last word's high bits past it are set and ignored).
#[test]
fn mask_tokens_matches_cpu_exactly() {
    require_gpu!();
    let mut r = rng(5);
    for (rows, vocab) in [(1, 49152), (7, 151_665), (33, 1000)] {
        let x = sampling_logits(&mut r, rows, vocab);
        let words = vocab.div_ceil(32);
        let bitmask: Vec<u32> = (0..rows * words)
            .map(|i| match i % 3 {
                0 => r.random(),
                1 => 0,
                _ => u32::MAX,
            })
            .collect();
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, vocab], dtype);
            let want = ops::mask_tokens(&xc, &bitmask).unwrap();
            let got = ops::mask_tokens(&xg, &bitmask).unwrap();
            assert_eq!(got.device(), GPU);
            let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
            let masked = w.iter().filter(|v| **v == f32::NEG_INFINITY).count();
            println!("CHECK mask_tokens rows={rows} vocab={vocab} {dtype}: {masked} masked");
            assert!(masked > 0 && masked < w.len());
            assert!(g.iter().zip(&w).all(|(a, b)| a.to_bits() == b.to_bits()), "mask_tokens {dtype} differs");
        }
    }
}

#[test]
fn sample_rows_handles_batch_sizes_and_edge_rows() {
    require_gpu!();
    let mut r = rng(12);
    let vocab = 32000;
    for rows in [1, 256] {
        let x = sampling_logits(&mut r, rows, vocab);
        for dtype in DTYPES {
            let (xc, xg) = pair(&x, &[rows, vocab], dtype);
            let params = sampling_mix(&mut r, rows, 3);
            let got = ops::sample_rows(&xg, &params).unwrap();
            assert_eq!(got.len(), rows);
            assert!(got.iter().all(|&id| (id as usize) < vocab), "ids inside the vocab");
            assert_eq!(ops::sample_rows(&xg, &params).unwrap(), got, "the same draws on every run");
            let greedy: Vec<RowSampling> = params.iter().map(|p| RowSampling { temperature: 0.0, ..*p }).collect();
            assert_eq!(ops::sample_rows(&xg, &greedy).unwrap(), ops::argmax_rows(&xc).unwrap(), "greedy {rows} rows");
            let want = ops::sample_rows(&xc, &params).unwrap();
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            println!("CHECK sample_rows rows={rows} {dtype}: {bad} of {rows} differ from the CPU");
            assert!(bad <= rows.div_ceil(64), "{bad} of {rows} rows differ from the CPU");
        }
    }
    // Ties, NaN and rows without any probability, greedy and sampled.
    let rows = [
        vec![1.0, 3.0, 3.0, 2.0, 3.0],
        vec![f32::NEG_INFINITY; 5],
        vec![0.0, f32::NAN, 5.0, f32::NAN, 1.0],
        vec![f32::NAN, 4.0, 4.0, f32::NEG_INFINITY, 2.0],
    ];
    let flat = rows.concat();
    let plain = RowSampling { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 5, step: 0 };
    for dtype in DTYPES {
        let (xc, xg) = pair(&flat, &[4, 5], dtype);
        let greedy = [plain; 4];
        assert_eq!(ops::sample_rows(&xg, &greedy).unwrap(), vec![1, 0, 1, 0], "greedy edge rows {dtype}");
        for step in 0..20 {
            let sampled = [RowSampling { temperature: 1.0, step, ..plain }; 4];
            let (got, want) = (ops::sample_rows(&xg, &sampled).unwrap(), ops::sample_rows(&xc, &sampled).unwrap());
            assert_eq!(got, want, "sampled edge rows {dtype} step {step}");
            assert!(got[1] == 0 && got[2] != 1 && got[2] != 3 && got[3] != 0 && got[3] != 3, "{got:?}");
        }
    }
    println!("CHECK sample_rows edge rows: exact");
}

/// A decode step small enough to follow by hand: embed, scale by a host table of positions,
/// write the keys, attend, project, keep the logit rows.
fn graph_step(
    table: &Tensor,
    w: &Tensor,
    cache: &mut PagedKvLayer,
    step: cuda::StepInput<'_>,
    p: &AttentionParams,
) -> ferrite_tensor::Result<Tensor> {
    let width = table.last_dim();
    let x = ops::embedding(table, step.tokens)?;
    let fill: cuda::HostFill = std::sync::Arc::new(move |m: &AttnMetadata| {
        m.positions().iter().flat_map(|&pos| (0..width).map(move |c| 1.0 + 0.01 * (pos + c) as f32)).collect()
    });
    let x = ops::mul(&x, &ops::step_tensor(step.meta, GPU, width, fill)?)?;
    ops::write_kv(cache, &x, &x, step.meta)?;
    let attended = ops::paged_attention(&x, cache, step.meta, p)?;
    ops::gather_rows(&ops::matmul_t(&attended, w, None)?, step.logit_rows)
}

/// Decode rows at `ctx_lens` (tables `blocks` wide, sequence `i` owning blocks `i * blocks..`),
/// then `pads` padding rows that write nothing.
fn graph_meta(ctx_lens: &[usize], pads: usize, blocks: usize, block_size: usize) -> AttnMetadata {
    let mut seqs: Vec<AttnSeq> = ctx_lens
        .iter()
        .enumerate()
        .map(|(i, &ctx)| AttnSeq {
            q_start: i,
            q_len: 1,
            ctx_len: ctx,
            block_table: ((i * blocks) as u32..((i + 1) * blocks) as u32).collect(),
        })
        .collect();
    let real = seqs.len();
    seqs.extend((0..pads).map(|j| AttnSeq { q_start: real + j, q_len: 1, ctx_len: 1, block_table: vec![0; blocks] }));
    let mut meta = AttnMetadata::new(seqs, block_size).unwrap();
    meta.slot_mapping[real..].fill(ferrite_tensor::kv::PAD_SLOT);
    meta
}

/// A captured step replayed for later steps (new tokens, longer contexts, other slots) gives
/// what running it eagerly gives. Its padding row would land on sequence 0's first key if it
/// wrote one, which later steps of sequence 0 read.
#[test]
fn graph_replay_matches_eager() {
    require_gpu!();
    let dev = cuda::device(0).unwrap();
    let mut r = rng(21);
    let (heads, d, vocab, bs, blocks) = (4, 32, 50, 4, 8);
    let p = AttentionParams {
        num_heads: heads,
        num_kv_heads: heads,
        head_dim: d,
        v_head_dim: d,
        scale: 0.2,
        sliding_window: None,
        attention_chunk: None,
        softcap: None,
    };
    let table =
        Tensor::from_f32(random(&mut r, vocab * heads * d, 1.0), &[vocab, heads * d]).unwrap().to_device(GPU).unwrap();
    let w =
        Tensor::from_f32(random(&mut r, vocab * heads * d, 0.3), &[vocab, heads * d]).unwrap().to_device(GPU).unwrap();
    let new_cache = || PagedKvLayer::new_on(GPU, DType::F32, 4 * blocks, bs, heads, d, d).unwrap();
    let (mut eager_cache, mut graph_cache) = (new_cache(), new_cache());
    let mut graph: Option<cuda::StepGraph> = None;
    for step_no in 0..6usize {
        let ctx_lens = [3 + step_no, 9 + 2 * step_no, 1 + step_no];
        let meta = graph_meta(&ctx_lens, 1, blocks, bs);
        let tokens: Vec<u32> = (0..4).map(|i| ((7 * step_no + 3 * i) % vocab) as u32).collect();
        let rows = [0usize, 1, 2, 3];
        let step = cuda::StepInput { tokens: &tokens, meta: &meta, logit_rows: &rows };
        let want = graph_step(&table, &w, &mut eager_cache, step, &p).unwrap();
        if graph.is_none() {
            graph = Some(
                cuda::StepGraph::capture(&dev, step, || graph_step(&table, &w, &mut graph_cache, step, &p)).unwrap(),
            );
        }
        let got = graph.as_ref().unwrap().replay(step).unwrap();
        let (got, want) = (got.to_f32_vec(), want.to_f32_vec());
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= 1e-4, "step {step_no}: replay differs from eager by {err}");
    }
}

/// A forward that reads back to the host mid-step cannot be replayed: the capture says so and
/// the device goes on working eagerly.
#[test]
fn graph_capture_refuses_host_round_trips() {
    require_gpu!();
    let dev = cuda::device(0).unwrap();
    let table = Tensor::from_f32((0..40).map(|i| i as f32).collect(), &[10, 4]).unwrap().to_device(GPU).unwrap();
    let meta = graph_meta(&[2], 0, 1, 4);
    let (tokens, rows) = ([3u32], [0usize]);
    let step = cuda::StepInput { tokens: &tokens, meta: &meta, logit_rows: &rows };
    let forward = || -> ferrite_tensor::Result<Tensor> {
        let x = ops::embedding(&table, step.tokens)?;
        let best = ops::argmax_rows(&x)?;
        ops::embedding(&table, &best)
    };
    let err = cuda::StepGraph::capture(&dev, step, forward).unwrap_err().to_string();
    assert!(err.contains("reading token ids back"), "{err}");
    assert_eq!(ops::embedding(&table, &[3]).unwrap().to_f32_vec(), vec![12.0, 13.0, 14.0, 15.0]);
    // A forward that panics on such a read (the infallible to_f32_vec) is an error too, and the
    // capture it was in is over.
    let panicking = || -> ferrite_tensor::Result<Tensor> {
        let x = ops::embedding(&table, step.tokens)?;
        let v = x.to_f32_vec();
        Tensor::from_f32(v, &[1, 4])
    };
    let err = cuda::StepGraph::capture(&dev, step, panicking).unwrap_err().to_string();
    assert!(err.contains("panicked under capture"), "{err}");
    assert_eq!(ops::embedding(&table, &[3]).unwrap().to_f32_vec(), vec![12.0, 13.0, 14.0, 15.0]);
}

/// Two steps of the recurrent-op tests, `(q_len, ctx_len, state slot)` per sequence: fresh
/// prompts of 70, 1 and 5 tokens in slots 2, 0 and 3, then a decode token each and a 9-token chunk.
const STATE_STEPS: [&[(usize, usize, usize)]; 2] =
    [&[(70, 70, 2), (1, 1, 0), (5, 5, 3)], &[(1, 71, 2), (9, 10, 0), (1, 6, 3)]];

/// A step's metadata (blocks of one slot, state slots as given) and its token count.
fn state_step_meta(seqs: &[(usize, usize, usize)]) -> (AttnMetadata, usize) {
    let mut q_start = 0;
    let attn_seqs: Vec<AttnSeq> = seqs
        .iter()
        .map(|&(q_len, ctx_len, _)| {
            let s = AttnSeq { q_start, q_len, ctx_len, block_table: vec![0; ctx_len] };
            q_start += q_len;
            s
        })
        .collect();
    let meta = AttnMetadata::new(attn_seqs, 1).unwrap().with_state_slots(seqs.iter().map(|s| s.2).collect()).unwrap();
    (meta, q_start)
}

/// Kimi Delta Attention's per-channel decay (`GdnParams::channel_decay`) through the steps of
/// `recurrent_ops_match_cpu`: the CUDA kernel walks prompts token by token where the CPU reference
/// runs KDA's chunked form, so f32 agrees to 1e-4.
#[test]
fn kimi_delta_rule_matches_cpu() {
    require_gpu!();
    let (heads, dim) = (2, 16);
    let width = heads * dim;
    let params = ops::GdnParams {
        num_k_heads: heads,
        num_v_heads: heads,
        k_dim: dim,
        v_dim: dim,
        chunk_size: 64,
        beta_scale: 1.0,
        channel_decay: true,
    };
    let state = |device| PagedKvLayer::new_on(device, DType::F32, 4, 1, 1, 1, heads * dim * dim).unwrap();
    let mut r = rng(37);
    let (a_log, dt_bias) = (random(&mut r, heads, 1.0), random(&mut r, width, 2.0));
    let param =
        |v: &[f32], shape: &[usize], device| Tensor::from_f32(v.to_vec(), shape).unwrap().to_device(device).unwrap();
    for dtype in DTYPES {
        let (mut cpu_state, mut gpu_state) = (state(Device::Cpu), state(GPU));
        for (step, seqs) in STATE_STEPS.iter().enumerate() {
            let (meta, t) = state_step_meta(seqs);
            let [(q, qg), (k, kg), (v, vg), (a, ag)] =
                [1.0, 1.0, 1.0, 3.0].map(|scale| pair(&random(&mut r, t * width, scale), &[t, width], dtype));
            let (b, bg) = pair(&random(&mut r, t * heads, 2.0), &[t, heads], dtype);
            let want = ops::gated_delta_rule(
                &q,
                &k,
                &v,
                &a,
                &b,
                &param(&a_log, &[heads], Device::Cpu),
                &param(&dt_bias, &[width], Device::Cpu),
                &mut cpu_state,
                &meta,
                &params,
            )
            .unwrap();
            let got = ops::gated_delta_rule(
                &qg,
                &kg,
                &vg,
                &ag,
                &bg,
                &param(&a_log, &[heads], GPU),
                &param(&dt_bias, &[width], GPU),
                &mut gpu_state,
                &meta,
                &params,
            )
            .unwrap();
            let bound = if dtype == DType::F32 { 1e-4 } else { tol(dtype) };
            check(&format!("kimi delta rule step {step}"), dtype, &got, &want, bound);
        }
    }
}

/// The recurrent mixers of hybrid models: two steps (fresh prompts of 70, 1 and 5 tokens in
/// slots 2, 0 and 3, then a decode token each and a 9-token chunk) with the state carried in the
/// slots. The CUDA delta rule walks prompts token by token where the CPU reference runs the
/// chunked form, an exact rewrite that rounds differently: 1e-4 in f32.
#[test]
fn recurrent_ops_match_cpu() {
    require_gpu!();
    let (hk, hv, dk, dv, kernel) = (2, 4, 16, 8, 4);
    let channels = 2 * hk * dk + hv * dv;
    let params = ops::GdnParams {
        num_k_heads: hk,
        num_v_heads: hv,
        k_dim: dk,
        v_dim: dv,
        chunk_size: 64,
        beta_scale: 2.0,
        channel_decay: false,
    };
    let state =
        |device| PagedKvLayer::new_on(device, DType::F32, 4, 1, 1, (kernel - 1) * channels, hv * dk * dv).unwrap();
    let mut r = rng(31);
    let (conv_w, a_log, dt_bias) =
        (random(&mut r, channels * kernel, 0.5), random(&mut r, hv, 1.0), random(&mut r, hv, 1.0));
    let conv_b = random(&mut r, channels, 0.5);
    let param =
        |v: &[f32], shape: &[usize], device| Tensor::from_f32(v.to_vec(), shape).unwrap().to_device(device).unwrap();
    for dtype in DTYPES {
        let (mut cpu_state, mut gpu_state) = (state(Device::Cpu), state(GPU));
        for (step, seqs) in STATE_STEPS.iter().enumerate() {
            let (meta, t) = state_step_meta(seqs);
            let (x_cpu, x_gpu) = pair(&random(&mut r, t * channels, 1.0), &[t, channels], dtype);
            let conv_cpu = ops::causal_conv1d(
                &x_cpu,
                &param(&conv_w, &[channels, kernel], Device::Cpu),
                Some(&param(&conv_b, &[channels], Device::Cpu)),
                Some(Activation::Silu),
                &mut cpu_state,
                &meta,
            )
            .unwrap();
            let conv_gpu = ops::causal_conv1d(
                &x_gpu,
                &param(&conv_w, &[channels, kernel], GPU),
                Some(&param(&conv_b, &[channels], GPU)),
                Some(Activation::Silu),
                &mut gpu_state,
                &meta,
            )
            .unwrap();
            check(&format!("causal_conv1d step {step}"), dtype, &conv_gpu, &conv_cpu, tol(dtype));
            let kw = hk * dk;
            let split = |x: &Tensor| {
                [
                    ops::narrow_cols(x, 0, kw).unwrap(),
                    ops::narrow_cols(x, kw, kw).unwrap(),
                    ops::narrow_cols(x, 2 * kw, hv * dv).unwrap(),
                ]
            };
            // The CPU reference reads the values the GPU op got (rounded to the dtype).
            let conv_in = Tensor::from_f32(round(&conv_gpu.to_f32_vec(), dtype), &[t, channels]).unwrap();
            let ([q, k, v], [qg, kg, vg]) = (split(&conv_in), split(&conv_gpu));
            let (a_cpu, a_gpu) = pair(&random(&mut r, t * hv, 2.0), &[t, hv], dtype);
            let (b_cpu, b_gpu) = pair(&random(&mut r, t * hv, 2.0), &[t, hv], dtype);
            let want = ops::gated_delta_rule(
                &q,
                &k,
                &v,
                &a_cpu,
                &b_cpu,
                &param(&a_log, &[hv], Device::Cpu),
                &param(&dt_bias, &[hv], Device::Cpu),
                &mut cpu_state,
                &meta,
                &params,
            )
            .unwrap();
            let got = ops::gated_delta_rule(
                &qg,
                &kg,
                &vg,
                &a_gpu,
                &b_gpu,
                &param(&a_log, &[hv], GPU),
                &param(&dt_bias, &[hv], GPU),
                &mut gpu_state,
                &meta,
                &params,
            )
            .unwrap();
            let bound = if dtype == DType::F32 { 1e-4 } else { tol(dtype) };
            check(&format!("gated_delta_rule step {step}"), dtype, &got, &want, bound);
        }
        // Prefix caching's slot copies: a kept state out of slot 2, and back over slot 0.
        for cache in [&mut cpu_state, &mut gpu_state] {
            ops::copy_state_slots(cache, &[(2, 1)]).unwrap();
            ops::copy_state_slots(cache, &[(1, 0), (3, 2)]).unwrap();
        }
        let (conv_state, delta_state) = cache_contents(&gpu_state);
        let ferrite_tensor::kv::KvStorage::Cpu { k, v } = &cpu_state.storage else { unreachable!() };
        let err = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        println!("CHECK recurrent states {dtype}: conv {:.1e} delta {:.1e}", err(&conv_state, k), err(&delta_state, v));
        assert!(err(&conv_state, k) <= 1e-5 && err(&delta_state, v) <= 1e-3, "{dtype}: states differ");
    }
}

/// The selective scan of Mamba2 (parameters per head) and Mamba (per channel, `A` per channel and
/// state): fresh prompts of 70, 1 and 5 tokens (dt clamped from below, as on prompts), then a
/// decode token each (unclamped) and a 9-token chunk, state carried in the slots.
#[test]
fn selective_scan_matches_cpu() {
    require_gpu!();
    let (heads, head_dim, groups, n) = (4, 8, 2, 16);
    for per_channel in [false, true] {
        let params = ops::SelectiveScanParams {
            num_heads: heads,
            head_dim,
            num_groups: groups,
            state_size: n,
            dt_limit: (0.05, f32::INFINITY),
            per_channel,
        };
        let per = if per_channel { heads * head_dim } else { heads };
        let a_len = if per_channel { per * n } else { per };
        let state = |device| PagedKvLayer::new_on(device, DType::F32, 4, 1, 1, 3, heads * head_dim * n).unwrap();
        let mut r = rng(37);
        let (a_log, dt_bias, d) = (random(&mut r, a_len, 1.0), random(&mut r, per, 1.0), random(&mut r, per, 1.0));
        let param = |v: &[f32], device| Tensor::from_f32(v.to_vec(), &[v.len()]).unwrap().to_device(device).unwrap();
        for dtype in DTYPES {
            let (mut cpu_state, mut gpu_state) = (state(Device::Cpu), state(GPU));
            for (step, seqs) in STATE_STEPS.iter().enumerate() {
                let (meta, t) = state_step_meta(seqs);
                let (x, xg) = pair(&random(&mut r, t * heads * head_dim, 1.0), &[t, heads * head_dim], dtype);
                let (dt, dtg) = pair(&random(&mut r, t * per, 3.0), &[t, per], dtype);
                let (b, bg) = pair(&random(&mut r, t * groups * n, 1.0), &[t, groups * n], dtype);
                let (c, cg) = pair(&random(&mut r, t * groups * n, 1.0), &[t, groups * n], dtype);
                let want = ops::selective_scan(
                    &x,
                    &dt,
                    &b,
                    &c,
                    &param(&a_log, Device::Cpu),
                    &param(&dt_bias, Device::Cpu),
                    &param(&d, Device::Cpu),
                    &mut cpu_state,
                    &meta,
                    &params,
                )
                .unwrap();
                let got = ops::selective_scan(
                    &xg,
                    &dtg,
                    &bg,
                    &cg,
                    &param(&a_log, GPU),
                    &param(&dt_bias, GPU),
                    &param(&d, GPU),
                    &mut gpu_state,
                    &meta,
                    &params,
                )
                .unwrap();
                let name = format!("selective_scan per_channel={per_channel} step {step}");
                check(&name, dtype, &got, &want, tol(dtype));
            }
            let (_, ssm) = cache_contents(&gpu_state);
            let ferrite_tensor::kv::KvStorage::Cpu { v, .. } = &cpu_state.storage else { unreachable!() };
            let err = ssm.iter().zip(v).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            println!("CHECK selective scan states per_channel={per_channel} {dtype}: {err:.1e}");
            assert!(err <= 1e-4, "per_channel={per_channel} {dtype}: states differ by {err}");
        }
    }
}
