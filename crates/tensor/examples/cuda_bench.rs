//! Micro-benchmarks of the CUDA backend; prints one JSON object.
//!
//! `cargo build --release -p ferrite-tensor --example cuda_bench`, then run the binary on a GPU
//! machine (see notes/rust-cuda-recipe.md for LD_LIBRARY_PATH). Measures device copy bandwidth,
//! `matmul_t` (cuBLAS) at decode shapes and paged attention, each as the median of several
//! event-timed runs; where the op can be captured into a CUDA graph the graph replay is timed
//! too, which removes the host's launch overhead from the figure. Arguments pick sections
//! (`matmul`, `attention`; all by default) or `profile` (a few untimed launches for ncu).

use std::fmt::Write as _;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use ferrite_tensor::cuda::{self, CudaDevice};
use ferrite_tensor::ops::{self, AttentionParams};
use ferrite_tensor::{AttnMetadata, AttnSeq, CpuStorage, DType, Device, PagedKvLayer, Storage, Tensor};
use half::bf16;

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// Device copy bandwidth measured through PyTorch on this machine kind (read + write counted).
const REFERENCE_COPY_GBS: f64 = 4240.0;
const GPU: Device = Device::Cuda(0);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

fn random_bf16(rng: &mut Rng, shape: &[usize], scale: f32) -> R<Tensor> {
    let n = shape.iter().product();
    let data: Vec<bf16> = (0..n).map(|_| bf16::from_f32(rng.next() * scale)).collect();
    Ok(Tensor::from_storage(Storage::Cpu(CpuStorage::BF16(data)), shape.to_vec())?.to_device(GPU)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median over `reps` event-timed batches of `iters` calls, in microseconds per call.
fn time_us(dev: &CudaDevice, iters: usize, reps: usize, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    for i in 0..3 {
        f(i)?;
    }
    dev.synchronize()?;
    let ctx = dev.stream().context();
    let (e0, e1) =
        (ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?, ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
    let mut samples = Vec::new();
    for _ in 0..reps {
        e0.record(dev.stream())?;
        for i in 0..iters {
            f(i)?;
        }
        e1.record(dev.stream())?;
        samples.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / iters as f64);
    }
    Ok(median(samples))
}

/// As `time_us`, replaying `iters` calls captured into one CUDA graph; None if capture fails.
fn time_graph_us(dev: &CudaDevice, iters: usize, reps: usize, mut f: impl FnMut(usize) -> R<()>) -> R<Option<f64>> {
    for i in 0..3 {
        f(i)?;
    }
    dev.synchronize()?;
    let stream = dev.stream();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let mut ok = true;
    for i in 0..iters {
        if f(i).is_err() {
            ok = false;
            break;
        }
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    let graph = match (ok, graph) {
        (true, Ok(Some(g))) => g,
        _ => {
            // A failed capture can leave a sticky error; clear it so later figures still run.
            let _ = dev.synchronize();
            return Ok(None);
        }
    };
    graph.launch()?;
    dev.synchronize()?;
    let ctx = stream.context();
    let (e0, e1) =
        (ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?, ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
    let mut samples = Vec::new();
    for _ in 0..reps {
        e0.record(stream)?;
        graph.launch()?;
        e1.record(stream)?;
        samples.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / iters as f64);
    }
    Ok(Some(median(samples)))
}

fn opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "null".into())
}

fn copy_bandwidth(dev: &CudaDevice) -> R<f64> {
    let bytes = 2usize << 30;
    let stream = dev.stream();
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    let us = time_us(dev, 5, 5, |_| Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    Ok(2.0 * bytes as f64 / (us * 1e-6) / 1e9)
}

fn matmul_figures(dev: &CudaDevice, copy_gbs: f64, out: &mut String) -> R<()> {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let shapes = [
        ("qkv 4096->6144", 4096usize, 6144usize),
        ("gate_up 4096->28672", 4096, 28672),
        ("down 14336->4096", 14336, 4096),
    ];
    let mut rows = Vec::new();
    for (name, k, n) in shapes {
        // Three copies of the weight, used in turn, so that no call finds its weight in L2 (60 MB).
        let w0 = random_bf16(&mut rng, &[n, k], 0.02)?;
        let mut variants: Vec<(DType, Vec<Tensor>)> =
            vec![(DType::BF16, (0..3).map(|_| ops::scale(&w0, 1.0)).collect::<Result<_, _>>()?)];
        if name.starts_with("qkv") {
            // The f32 exactness path: plain fp32 cuBLAS, weights twice the bytes.
            variants.push((DType::F32, (0..3).map(|_| Ok(w0.to_dtype(DType::F32))).collect::<R<_>>()?));
        }
        drop(w0);
        for (dtype, ws) in &variants {
            let ms: &[usize] = if *dtype == DType::F32 { &[1, 8] } else { &[1, 2, 4, 8, 16, 32] };
            for &m in ms {
                let x = random_bf16(&mut rng, &[m, k], 1.0)?.to_dtype(*dtype);
                let elem = dtype.size_in_bytes() as f64;
                let bytes = (n * k + m * k + m * n) as f64 * elem;
                let run = |i: usize| -> R<()> {
                    ops::matmul_t(&x, &ws[i % 3], None)?;
                    Ok(())
                };
                let us = time_us(dev, 30, 5, run)?;
                let graph_us = time_graph_us(dev, 30, 5, run)?;
                let best = graph_us.unwrap_or(us).min(us);
                let gbs = bytes / (best * 1e-6) / 1e9;
                rows.push(format!(
                    "{{\"shape\":\"{name}\",\"dtype\":\"{dtype}\",\"m\":{m},\"us\":{us:.2},\"graph_us\":{},\"gbs\":{gbs:.0},\"frac_of_4240\":{:.3},\"frac_of_measured_copy\":{:.3}}}",
                    opt(graph_us),
                    gbs / REFERENCE_COPY_GBS,
                    gbs / copy_gbs
                ));
            }
        }
    }
    write!(out, "\"matmul_t_cublas\":[{}]", rows.join(","))?;
    Ok(())
}

/// With `profile`, runs a few representative launches once each, untimed, for `ncu`.
fn attention_figures(dev: &CudaDevice, copy_gbs: f64, profile: bool, out: &mut String) -> R<()> {
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let (hq, hkv, d, bs) = (32usize, 8usize, 128usize, 16usize);
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
    let mut rows = Vec::new();
    let cases: Vec<(usize, usize)> = if profile {
        vec![(1, 2048), (32, 2048)]
    } else {
        [1usize, 32, 128].iter().flat_map(|&b| [512usize, 1024, 2048].map(|c| (b, c))).collect()
    };
    for (batch, ctx) in cases {
        let blocks_per_seq = ctx.div_ceil(bs);
        let num_blocks = batch * blocks_per_seq;
        let mut cache = PagedKvLayer::new_on(GPU, DType::BF16, num_blocks, bs, hkv, d, d)?;
        // Fill the whole context as one prefill step, then time the decode of its last token.
        let prefill: Vec<AttnSeq> = (0..batch)
            .map(|b| AttnSeq {
                q_start: b * ctx,
                q_len: ctx,
                ctx_len: ctx,
                block_table: (0..blocks_per_seq as u32).map(|i| (b * blocks_per_seq) as u32 + i).collect(),
            })
            .collect();
        let meta = AttnMetadata::new(prefill.clone(), bs)?;
        let kv = random_bf16(&mut rng, &[batch * ctx, hkv * d], 1.0)?;
        ops::write_kv(&mut cache, &kv, &kv, &meta)?;
        let decode: Vec<AttnSeq> =
            prefill.iter().enumerate().map(|(b, s)| AttnSeq { q_start: b, q_len: 1, ..s.clone() }).collect();
        let meta = AttnMetadata::new(decode, bs)?;
        let q = random_bf16(&mut rng, &[batch, hq * d], 1.0)?;
        let run = |_: usize| -> R<()> {
            ops::paged_attention(&q, &cache, &meta, &params)?;
            Ok(())
        };
        if profile {
            run(0)?;
            continue;
        }
        let us = time_us(dev, 50, 5, run)?;
        let graph_us = time_graph_us(dev, 50, 5, run)?;
        let best = graph_us.unwrap_or(us).min(us);
        let bytes = (batch * ctx * hkv * 2 * d * 2) as f64;
        let gbs = bytes / (best * 1e-6) / 1e9;
        rows.push(format!(
                "{{\"batch\":{batch},\"ctx\":{ctx},\"us\":{us:.2},\"graph_us\":{},\"kv_gbs\":{gbs:.0},\"frac_of_4240\":{:.3},\"frac_of_measured_copy\":{:.3}}}",
                opt(graph_us),
                gbs / REFERENCE_COPY_GBS,
                gbs / copy_gbs
            ));
    }
    // Prefill of one 1024-token sequence (the CUDA-core kernel), as attention FLOP/s.
    let t = 1024usize;
    let blocks = t.div_ceil(bs);
    let mut cache = PagedKvLayer::new_on(GPU, DType::BF16, blocks, bs, hkv, d, d)?;
    let meta = AttnMetadata::new(
        vec![AttnSeq { q_start: 0, q_len: t, ctx_len: t, block_table: (0..blocks as u32).collect() }],
        bs,
    )?;
    let kv = random_bf16(&mut rng, &[t, hkv * d], 1.0)?;
    ops::write_kv(&mut cache, &kv, &kv, &meta)?;
    let q = random_bf16(&mut rng, &[t, hq * d], 1.0)?;
    if profile {
        ops::paged_attention(&q, &cache, &meta, &params)?;
        dev.synchronize()?;
        out.push_str("\"profiled\":true");
        return Ok(());
    }
    let us = time_us(dev, 10, 5, |_| {
        ops::paged_attention(&q, &cache, &meta, &params)?;
        Ok(())
    })?;
    let flops = 4.0 * (t * (t + 1) / 2) as f64 * d as f64 * hq as f64;
    write!(
        out,
        "\"paged_decode_attention_bf16\":[{}],\"prefill_attention_bf16\":{{\"tokens\":{t},\"us\":{us:.1},\"tflops\":{:.2}}}",
        rows.join(","),
        flops / (us * 1e-6) / 1e12
    )?;
    Ok(())
}

fn main() -> R<()> {
    if !cuda::is_available() {
        println!("{{\"skip\":\"no CUDA device\"}}");
        return Ok(());
    }
    // Sections to run after the copy bandwidth (matmul, attention), all by default; `profile`
    // runs a few attention launches once each for ncu.
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let want = |s: &str| wanted.is_empty() || wanted.iter().any(|w| w == s);
    let dev = cuda::device(0)?;
    let (major, minor) = dev.compute_capability();
    let copy_gbs = copy_bandwidth(&dev)?;
    let mut out = format!(
        "{{\"device\":\"{}\",\"cc\":\"{major}.{minor}\",\"copy_gbs\":{copy_gbs:.0},\"reference_copy_gbs\":{REFERENCE_COPY_GBS}",
        dev.name()
    );
    if want("matmul") {
        out.push(',');
        matmul_figures(&dev, copy_gbs, &mut out)?;
    }
    if want("attention") {
        out.push(',');
        attention_figures(&dev, copy_gbs, false, &mut out)?;
    }
    if wanted.iter().any(|w| w == "profile") {
        out.push(',');
        attention_figures(&dev, copy_gbs, true, &mut out)?;
    }
    out.push('}');
    println!("{out}");
    Ok(())
}
