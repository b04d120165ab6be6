//! Integer weight-only checkpoints (compressed-tensors pack-quantized: W4A16, W8A16, written by
//! llm-compressor) against transformers on CPU, which decompresses them as it loads; NVFP4A16
//! (compressed-tensors nvfp4-pack-quantized, llm-compressor's NVFP4A16 scheme) against transformers
//! on CPU dequantizing it at load (`dequantize=True`: its default route leaves bf16 weights that an
//! f32 model cannot multiply); GPTQ and AWQ
//! checkpoints against transformers' Llama on their weights dequantized as gptqmodel's torch
//! kernels do (gptqmodel, which transformers runs them through, needs compiled extensions). Each
//! fixture's greedy tokens token-exact and logprobs within the f32 gate's tolerance, and each way
//! of reading the format wrong caught.

use ferrite_tensor::DType;
use ferrite_testing::gate::{
    edit_config, edit_f32_tensors, edit_tensor_bytes, fixture_copy, fixtures_dir, rename_tensors, run_fixture,
    summarize, CaseReport,
};

const LOGPROB_TOLERANCE: f32 = 2e-3;

fn reports(dir: &std::path::Path) -> Vec<CaseReport> {
    let (oracle, reports) = run_fixture(dir, DType::F32).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    println!("{} ({}): {}", dir.display(), oracle.architecture, summarize(&reports));
    reports
}

fn gate(name: &str) {
    let reports = reports(&fixtures_dir().join("models").join(name));
    for r in &reports {
        assert!(r.strict, "{name}/{}: diverged at {:?}", r.name, r.divergence);
        assert!(r.max_logprob_error < LOGPROB_TOLERANCE, "{name}/{}: logprob error {}", r.name, r.max_logprob_error);
    }
    assert!(reports.len() >= 8);
}

#[test]
fn compressed_tensors_w4a16() {
    gate("llama-w4a16");
}

#[test]
fn compressed_tensors_w8a16() {
    gate("llama-w8a16");
}

#[test]
fn compressed_tensors_nvfp4a16() {
    gate("llama-nvfp4a16");
}

#[test]
fn gptq_4bit() {
    gate("llama-gptq");
}

#[test]
fn gptq_act_order_asymmetric() {
    gate("llama-gptq-act");
}

#[test]
fn gptq_8bit_one_group() {
    gate("llama-gptq-w8");
}

#[test]
fn awq_gemm() {
    gate("llama-awq");
}

/// `dir`'s reports, and the copy removed.
fn reports_of_copy(dir: std::path::PathBuf) -> Vec<CaseReport> {
    let reports = reports(&dir);
    std::fs::remove_dir_all(&dir).ok();
    reports
}

#[test]
fn gate_catches_gptq_breaks() {
    // A v1 checkpoint read as v2: its stored zero - 1 taken as the zero.
    let dir = fixture_copy("llama-gptq", "zeros-as-v2");
    edit_config(&dir, |c| c["quantization_config"]["checkpoint_format"] = "gptq_v2".into());
    let reports = reports_of_copy(dir);
    assert!(reports.iter().any(|r| !r.strict), "v1 zeros read as v2 went unnoticed");
    // The act-order permutation ignored: input i read as in group i / 32.
    let dir = fixture_copy("llama-gptq-act", "g_idx-ignored");
    edit_config(&dir, |c| c["quantization_config"]["desc_act"] = false.into());
    rename_tensors(&dir, |n| n.replace(".g_idx", ".g_idx_unread"));
    let reports = reports_of_copy(dir);
    assert!(reports.iter().any(|r| !r.strict), "g_idx ignored went unnoticed");
}

#[test]
fn gate_catches_int_weight_breaks() {
    type Edit = fn(&mut [f32]);
    let breaks: &[(&str, &str, Edit)] = &[
        ("llama-w4a16", "group scales ignored", |s| s.fill(1.0)),
        ("llama-w4a16", "group scales on the wrong groups", |s| s.reverse()),
        ("llama-w8a16", "channel scales on the wrong rows", |s| s.reverse()),
    ];
    for (fixture, what, edit) in breaks {
        let dir = fixture_copy(fixture, &what.replace(' ', "-"));
        edit_f32_tensors(&dir, |name| {
            name.ends_with(".weight_scale").then(|| Box::new(*edit) as Box<dyn Fn(&mut [f32])>)
        });
        let reports = reports(&dir);
        std::fs::remove_dir_all(&dir).ok();
        let strict = reports.iter().filter(|r| r.strict).count();
        assert!(strict < reports.len(), "{fixture}: {what} went unnoticed ({strict}/{} strict)", reports.len());
    }
}

#[test]
fn gate_catches_nvfp4_breaks() {
    let not_strict = |dir: std::path::PathBuf, what: &str| {
        let reports = reports_of_copy(dir);
        let strict = reports.iter().filter(|r| r.strict).count();
        assert!(strict < reports.len(), "llama-nvfp4a16: {what} went unnoticed ({strict}/{} strict)", reports.len());
    };
    // The global scale multiplied in where compressed-tensors divides by it.
    let dir = fixture_copy("llama-nvfp4a16", "global-scale-multiplied");
    edit_f32_tensors(&dir, |name| {
        name.ends_with(".weight_global_scale")
            .then(|| Box::new(|g: &mut [f32]| g[0] = 1.0 / g[0]) as Box<dyn Fn(&mut [f32])>)
    });
    not_strict(dir, "the global scale multiplied");
    // Each byte's high nibble read as the even column.
    let dir = fixture_copy("llama-nvfp4a16", "nibbles-swapped");
    edit_tensor_bytes(&dir, |name| {
        name.ends_with(".weight_packed").then(|| {
            Box::new(|b: &mut [u8]| b.iter_mut().for_each(|v| *v = v.rotate_left(4))) as Box<dyn Fn(&mut [u8])>
        })
    });
    not_strict(dir, "nibbles read high first");
    // The e4m3 group scales (one byte each) on the wrong groups.
    let dir = fixture_copy("llama-nvfp4a16", "group-scales-reversed");
    edit_tensor_bytes(&dir, |name| {
        name.ends_with(".weight_scale").then(|| Box::new(|b: &mut [u8]| b.reverse()) as Box<dyn Fn(&mut [u8])>)
    });
    not_strict(dir, "group scales on the wrong groups");
}
