//! What the real-weights GGUF gates share: where the joined file is, a run of its goldens
//! (transformers' greedy outputs from the same file) through the model ferrite loads from it,
//! and the two judgements of that run.

use std::path::{Path, PathBuf};

use ferrite_models::{load_model, LoadOptions};
use ferrite_tensor::DType;
use ferrite_testing::gate::{assert_within_llama_cpp_precision, greedy, judge, summarize, CaseReport, Oracle};
use ferrite_tokenizer::Tokenizer;

/// One real-weights GGUF file and its goldens.
pub struct Gate {
    /// Shown in the test output.
    pub label: &'static str,
    /// The variable that may name the file.
    pub env_var: &'static str,
    /// Where the packages' join step writes the file, under the home directory.
    pub cached: &'static str,
    /// Its goldens, under `fixtures/goldens`.
    pub golden: &'static str,
    pub architecture: &'static str,
    /// Printed when the file is absent, saying how to get it.
    pub skip: &'static str,
}

impl Gate {
    /// The joined file, or `None` (after printing the skip line) when it is absent.
    fn file(&self) -> Option<PathBuf> {
        let path = gguf_path(self.env_var, self.cached);
        if path.is_none() {
            println!("{}", self.skip);
        }
        path
    }

    /// Dequantized at load, as transformers reads the file (the exact path): every case
    /// token-exact, logprobs within 2e-3.
    pub fn assert_exact_dequantized(&self) {
        let Some(gguf) = self.file() else { return };
        let reports = run_cases(&gguf, self.golden, self.architecture, true);
        for report in &reports {
            assert!(report.strict, "{}: diverged at {:?}", report.name, report.divergence);
            assert!(report.max_logprob_error < 2e-3, "{}: logprob error {}", report.name, report.max_logprob_error);
        }
        println!("{} GGUF f32: {}", self.label, summarize(&reports));
    }

    /// The file as the CPU serves it by default, its quantized matrices kept in their blocks:
    /// held to llama.cpp's precision.
    pub fn assert_kept_in_blocks_within_llama_cpp_precision(&self) {
        let Some(gguf) = self.file() else { return };
        let reports = run_cases(&gguf, self.golden, self.architecture, false);
        assert_within_llama_cpp_precision(&reports);
        println!("{} GGUF kept in blocks: {}", self.label, summarize(&reports));
    }
}

/// The file `env_var` names, else `cached` under the home directory (where the packages' join
/// step writes it), whichever exists first.
pub fn gguf_path(env_var: &str, cached: &str) -> Option<PathBuf> {
    let from_env = std::env::var_os(env_var).map(PathBuf::from);
    let in_home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(cached));
    from_env.into_iter().chain(in_home).find(|p| p.exists())
}

/// Every case of `fixtures/goldens/<golden>`, generated greedily by the model loaded from `gguf`
/// with `dequantize_weights`; the model must be `architecture` and the GGUF's own tokenizer must
/// give the goldens' prompt ids.
pub fn run_cases(gguf: &Path, golden: &str, architecture: &str, dequantize_weights: bool) -> Vec<CaseReport> {
    let oracle =
        Oracle::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/goldens").join(golden)).unwrap();
    let opts = LoadOptions { dtype: DType::F32, progress: false, dequantize_weights, ..Default::default() };
    let loaded = load_model(gguf, &opts).unwrap();
    assert_eq!(loaded.model.info().architecture, architecture);
    let (tokenizer_json, tokenizer_config) = loaded.gguf_tokenizer.clone().expect("GGUF carries a tokenizer");
    let tok = Tokenizer::from_parts(&tokenizer_json, &tokenizer_config, None, None).unwrap();
    let mut reports = Vec::new();
    for case in &oracle.cases {
        if !case.chat {
            assert_eq!(tok.encode(&case.prompt, true).unwrap(), case.prompt_ids, "{}: prompt ids differ", case.name);
        }
        let ours = greedy(loaded.model.as_ref(), &case.prompt_ids, case.output_ids.len(), 16).unwrap();
        reports.push(judge(case, &ours));
    }
    assert!(reports.len() >= 12);
    reports
}
