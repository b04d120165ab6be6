//! The parity gate against oracle fixtures (`fixtures/models/*/oracle.json`, written by
//! `tools/oracle/generate_fixtures.py`): greedy generation at batch 1 compared token for token
//! with transformers, and top-5 logprobs compared within a tolerance.
//!
//! STRICT passes when every token equals the oracle's. Where it does not, the near-tie rule of
//! the model matrix applies: the sequences agree up to the first divergence, so the oracle's
//! distribution at that step is exactly the recorded one, and the case passes iff our token's
//! oracle logprob is within [`NEAR_TIE_NATS`] of the oracle's best.

use std::path::{Path, PathBuf};

use ferrite_tensor::{attention_pieces, AttnMetadata, AttnSeq, DType, Device, PagedKvLayer};
use serde::Deserialize;

use ferrite_models::{CausalLM, ModelError, Result, Visual, VisualGrid};

pub const NEAR_TIE_NATS: f32 = 0.5;

#[derive(Debug, Clone, Deserialize)]
pub struct OracleCase {
    pub name: String,
    pub prompt: String,
    #[serde(default)]
    pub chat: bool,
    pub prompt_ids: Vec<u32>,
    /// The prompt's images and videos, in prompt order (vision-language fixtures).
    #[serde(default)]
    pub images: Vec<OracleImage>,
    pub output_ids: Vec<u32>,
    /// Per generated step, the oracle's top-5 `(token, logprob)`, best first.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// One image or video of a case: its patch grid and the processed pixels transformers' processor
/// made (`pixels`: a file of f32 little-endian `[patches, patch_dim]`, relative to the fixture).
#[derive(Debug, Clone, Deserialize)]
pub struct OracleImage {
    pub grid_thw: [usize; 3],
    pub pixels: String,
    pub patch_dim: usize,
    /// The rows of `patch_dim` values, where the grid does not count them: a LLaVA-NeXT image's
    /// whole image and tiles (its grid is its size in pixels).
    #[serde(default)]
    pub patches: Option<usize>,
    /// A video's `second_per_grid_ts`; absent for an image.
    #[serde(default)]
    pub video_seconds_per_grid: Option<f64>,
}

impl OracleImage {
    /// The processed pixels, and the kind and grid, read from the fixture in `dir`.
    pub fn load(&self, dir: &Path) -> Result<(Vec<f32>, VisualGrid)> {
        let path = dir.join(&self.pixels);
        let bytes = std::fs::read(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let [t, h, w] = self.grid_thw;
        if bytes.len() != self.patches.unwrap_or(t * h * w) * self.patch_dim * 4 {
            return Err(ModelError::Config {
                path,
                message: format!("{} bytes for a {:?} grid of {} values", bytes.len(), self.grid_thw, self.patch_dim),
            });
        }
        let visual = match self.video_seconds_per_grid {
            Some(seconds_per_grid) => Visual::Video { seconds_per_grid },
            None => Visual::Image,
        };
        let pixels = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        Ok((pixels, VisualGrid { visual, grid_thw: self.grid_thw }))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Oracle {
    pub architecture: String,
    pub cases: Vec<OracleCase>,
}

impl Oracle {
    pub fn load(path: &Path) -> Result<Oracle> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        serde_json::from_str(&text).map_err(|e| ModelError::Config { path: path.to_path_buf(), message: e.to_string() })
    }
}

/// Greedy tokens and, per step, the full log-softmax row they were chosen from.
pub struct Generation {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Vec<f32>>,
}

pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = row.iter().map(|v| (v - max).exp()).sum::<f32>().ln() + max;
    row.iter().map(|v| v - lse).collect()
}

/// Lowest index among the maxima, as `torch.argmax` breaks ties.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Batch-1 greedy generation over a private paged cache (prefill in one step, then decode):
/// the model alone, without the engine's scheduler.
pub fn greedy(model: &dyn CausalLM, prompt: &[u32], new_tokens: usize, block_size: usize) -> Result<Generation> {
    greedy_on(model, prompt, new_tokens, block_size, Device::Cpu, DType::F32)
}

/// [`greedy`] with the KV cache on `device` in `kv_dtype` (where the model's weights live, in the
/// dtype of its activations).
pub fn greedy_on(
    model: &dyn CausalLM,
    prompt: &[u32],
    new_tokens: usize,
    block_size: usize,
    device: Device,
    kv_dtype: DType,
) -> Result<Generation> {
    greedy_with_images(model, prompt, &[], new_tokens, block_size, device, kv_dtype)
}

/// [`greedy_on`] for a prompt with images and videos (processed pixels and kind and patch grid
/// each, in prompt order): the vision encoder's embeddings take the placeholders' rows at
/// prefill, and a model with MRoPE gets the prompt's positions from it and offsets its decode
/// positions.
pub fn greedy_with_images(
    model: &dyn CausalLM,
    prompt: &[u32],
    images: &[(Vec<f32>, VisualGrid)],
    new_tokens: usize,
    block_size: usize,
    device: Device,
    kv_dtype: DType,
) -> Result<Generation> {
    let (embeds, mrope) = match model.vision() {
        Some(vision) => {
            let grids: Vec<VisualGrid> = images.iter().map(|i| i.1).collect();
            let mrope = vision.mrope_positions(prompt, &grids)?;
            let embeds = if images.is_empty() {
                None
            } else {
                let encoded = images
                    .iter()
                    .map(|(pixels, visual)| vision.encode(pixels, visual.grid_thw))
                    .collect::<Result<Vec<_>>>()?;
                let concat = |parts: Vec<&ferrite_tensor::Tensor>| ferrite_tensor::ops::concat_rows(&parts);
                let values = concat(encoded.iter().map(|e| &e.embeddings).collect())?;
                let layers = encoded.first().map_or(0, |e| e.deepstack.len());
                let deepstack = (0..layers)
                    .map(|layer| concat(encoded.iter().map(|e| &e.deepstack[layer]).collect()))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let info = model.info().vision.as_ref().ok_or_else(|| ModelError::Config {
                    path: "config.json".into(),
                    message: "a vision encoder without vision info".into(),
                })?;
                // Features in prompt order fill image and video placeholders in prompt order.
                let placeholder = |t: u32| t == info.image_token_id || Some(t) == info.video_token_id;
                let rows = prompt.iter().enumerate().filter(|(_, &t)| placeholder(t)).map(|(i, _)| i).collect();
                Some(ferrite_models::InputEmbeds { rows, values, deepstack })
            };
            (embeds, mrope)
        }
        None if images.is_empty() => (None, None),
        None => {
            return Err(ferrite_tensor::TensorError::Unsupported {
                op: "images",
                detail: format!("{} has no vision encoder", model.info().architecture),
            }
            .into())
        }
    };
    // Where image tokens attend to one another both ways: each run of them, as the engine cuts it.
    let bidirectional_runs = match &model.info().vision {
        Some(info) if info.bidirectional => ferrite_models::placeholder_runs(prompt, info.image_token_id),
        _ => Vec::new(),
    };
    let total = prompt.len() + new_tokens;
    let blocks = total.div_ceil(block_size);
    let mut kv: Vec<PagedKvLayer> = model.info().allocate_caches(device, kv_dtype, blocks, block_size, 1)?;
    // Reversed block order: the model must follow the block table, not assume contiguity.
    let block_table: Vec<u32> = (0..blocks as u32).rev().collect();
    let mut tokens = Vec::with_capacity(new_tokens);
    let mut logprobs = Vec::with_capacity(new_tokens);
    let mut step_tokens = prompt.to_vec();
    let mut ctx = 0;
    let recompute_at = model.rotary_recompute_at();
    while tokens.len() < new_tokens {
        // transformers' Phi-3 generate drops its cache the first time the sequence outgrows the
        // rotary switch with no more than the switch cached, and runs the whole sequence again.
        if let Some(switch) = recompute_at {
            if ctx > 0 && ctx <= switch && ctx + step_tokens.len() > switch {
                step_tokens = prompt.iter().chain(&tokens).copied().collect();
                ctx = 0;
            }
        }
        let prefill = ctx == 0;
        ctx += step_tokens.len();
        let seq = AttnSeq { q_start: 0, q_len: step_tokens.len(), ctx_len: ctx, block_table: block_table.clone() };
        let (seqs, bidirectional): (Vec<AttnSeq>, Vec<bool>) =
            attention_pieces(seq, if prefill { bidirectional_runs.clone() } else { Vec::new() })?.into_iter().unzip();
        let mut meta = AttnMetadata::new(seqs, block_size)?.with_state_slots(vec![0; bidirectional.len()])?;
        if bidirectional.contains(&true) {
            meta = meta.with_bidirectional(bidirectional)?;
        }
        if let Some((positions, delta)) = &mrope {
            meta = meta.with_mrope_positions(if prefill {
                positions.clone()
            } else {
                vec![[(ctx as i64 - 1 + delta) as usize; 3]]
            })?;
        }
        let logits = model.forward(
            &ferrite_models::ForwardInput {
                tokens: &step_tokens,
                meta: &meta,
                logit_rows: &[step_tokens.len() - 1],
                embeds: embeds.as_ref().filter(|_| prefill),
            },
            &mut kv,
        )?;
        let row = logits.to_f32_vec();
        let next = argmax(&row);
        logprobs.push(log_softmax(&row));
        tokens.push(next);
        step_tokens = vec![next];
    }
    Ok(Generation { tokens, logprobs })
}

#[derive(Debug, Clone)]
pub struct CaseReport {
    pub name: String,
    pub strict: bool,
    /// For a non-strict case: step of the first divergence and the oracle's gap in nats there.
    pub divergence: Option<(usize, f32)>,
    /// Largest |our logprob - oracle logprob| over the oracle's top-5, up to the divergence.
    pub max_logprob_error: f32,
    /// The same per step, up to the divergence.
    pub step_logprob_errors: Vec<f32>,
}

impl CaseReport {
    pub fn near_tie(&self) -> bool {
        matches!(self.divergence, Some((_, gap)) if gap <= NEAR_TIE_NATS)
    }
}

/// Per case, the leading tokens an oracle reproduces under a float64 run and under f32 runs with
/// every parameter moved by up to 2 ulps (`robustness.stable_prefix` in oracle.json, written for
/// W8A8 fixtures, where a last-bit difference can cross an e4m3 rounding boundary). Empty where
/// the oracle records none: every token is then held.
pub fn stable_prefixes(oracle_json: &Path) -> Result<std::collections::HashMap<String, usize>> {
    let path = oracle_json.to_path_buf();
    let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
    let oracle: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config { path, message: e.to_string() })?;
    Ok(oracle["robustness"]["stable_prefix"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as usize))).collect())
        .unwrap_or_default())
}

impl CaseReport {
    /// Tokens exact and logprobs within `tolerance` through the first `prefix` tokens.
    pub fn holds_through(&self, prefix: usize, tolerance: f32) -> bool {
        let tokens = self.divergence.is_none_or(|(step, _)| step >= prefix);
        tokens && self.step_logprob_errors.iter().take(prefix).all(|&e| e < tolerance)
    }
}

/// Whether `token` at `step` of `case` differs from the oracle's only at a near tie: the oracle
/// gave it a logprob within `NEAR_TIE_NATS` of its own choice.
pub fn near_tie_at(case: &OracleCase, step: usize, token: u32) -> bool {
    let Some(top) = case.top_logprobs.get(step) else { return false };
    let best = top.first().map_or(f32::NEG_INFINITY, |t| t.1);
    top.iter().any(|&(id, lp)| id == token && best - lp <= NEAR_TIE_NATS)
}

pub fn judge(case: &OracleCase, ours: &Generation) -> CaseReport {
    let mut step_errors = Vec::new();
    let mut divergence = None;
    for (step, (&want, top)) in case.output_ids.iter().zip(&case.top_logprobs).enumerate() {
        let Some(&got) = ours.tokens.get(step) else {
            break;
        };
        let mut err = 0.0f32;
        for &(id, lp) in top {
            if let Some(&ours_lp) = ours.logprobs[step].get(id as usize) {
                err = err.max((ours_lp - lp).abs());
            }
        }
        step_errors.push(err);
        if got != want {
            let best = top.first().map(|t| t.1).unwrap_or(0.0);
            // Not in the oracle's top-5: its gap is at least the top-1 to top-5 spread.
            let ours_in_oracle = top.iter().find(|t| t.0 == got).map(|t| t.1);
            let gap = match ours_in_oracle {
                Some(lp) => best - lp,
                None => f32::INFINITY,
            };
            divergence = Some((step, gap));
            break;
        }
    }
    let strict = divergence.is_none() && ours.tokens.len() >= case.output_ids.len();
    let max_logprob_error = step_errors.iter().copied().fold(0.0f32, f32::max);
    CaseReport { name: case.name.clone(), strict, divergence, max_logprob_error, step_logprob_errors: step_errors }
}

/// How far a GGUF kept in its blocks may move a top-5 logprob before its first divergence:
/// inputs rounded to 8 bits per 32 values (llama.cpp's precision) move a small model's logprobs
/// by tenths of a nat over its layers.
pub const KEPT_BLOCKS_LOGPROB_NATS: f32 = 0.75;

/// The rule for a GGUF kept in its blocks against transformers' dequantized run: each case STRICT
/// or leaving the oracle's path only at a near tie, logprobs within [`KEPT_BLOCKS_LOGPROB_NATS`]
/// until then, and at least a quarter of the cases STRICT.
pub fn assert_within_llama_cpp_precision(reports: &[CaseReport]) {
    for r in reports {
        println!("{}: strict {} {:?} error {:.3}", r.name, r.strict, r.divergence, r.max_logprob_error);
    }
    for r in reports {
        assert!(r.strict || r.near_tie(), "{}: diverged at {:?}", r.name, r.divergence);
        assert!(r.max_logprob_error < KEPT_BLOCKS_LOGPROB_NATS, "{}: logprob error {}", r.name, r.max_logprob_error);
    }
    let strict = reports.iter().filter(|r| r.strict).count();
    assert!(strict * 4 >= reports.len(), "only {strict} of {} cases STRICT", reports.len());
}

/// Summary line in the matrix's format, e.g. `11/11 (STRICT 11 + near-tie 0, max gap 0.00 nats)`.
pub fn summarize(reports: &[CaseReport]) -> String {
    let strict = reports.iter().filter(|r| r.strict).count();
    let near = reports.iter().filter(|r| r.near_tie()).count();
    let gap = reports.iter().filter_map(|r| r.divergence.map(|d| d.1)).fold(0.0f32, f32::max);
    format!("{}/{} (STRICT {strict} + near-tie {near}, max gap {gap:.2} nats)", strict + near, reports.len())
}

/// A copy of fixture `name` in a fresh temporary directory, for a test to break; `tag` tells
/// apart copies of one fixture that tests may hold at once.
pub fn fixture_copy(name: &str, tag: &str) -> PathBuf {
    let src = fixtures_dir().join("models").join(name);
    let tag: String = tag.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let dst = std::env::temp_dir().join(format!("ferrite-{tag}-{name}-{}", std::process::id()));
    copy_tree(&src, &dst);
    dst
}

fn copy_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let to = dst.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &to);
        } else {
            std::fs::copy(&path, to).unwrap();
        }
    }
}

/// Rewrites `dir/config.json` through `edit`.
pub fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    // Read as the loader reads it (Python's non-finite literals included).
    let mut config = ferrite_models::loading::config::RawConfig::from_file(&path).unwrap().value;
    edit(&mut config);
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// Rewrites the f32 tensors of `dir/model.safetensors` whose names `edit` selects: `edit(name)`
/// returns the change to apply to that tensor's values, or `None` to keep it.
pub fn edit_f32_tensors(dir: &Path, edit: impl Fn(&str) -> Option<Box<dyn Fn(&mut [f32])>>) {
    rewrite_tensors(dir, |name, dtype, _, data| {
        if let Some(change) = edit(name) {
            assert_eq!(dtype, safetensors::Dtype::F32, "{name}");
            let mut values: Vec<f32> =
                data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            change(&mut values);
            *data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        }
        name.to_string()
    });
}

/// Rewrites the stored bytes of the tensors of `dir/model.safetensors` whose names `edit` selects
/// (one-byte dtypes such as packed codes or e4m3 scales, whose bytes are their values).
pub fn edit_tensor_bytes(dir: &Path, edit: impl Fn(&str) -> Option<Box<dyn Fn(&mut [u8])>>) {
    rewrite_tensors(dir, |name, _, _, data| {
        if let Some(change) = edit(name) {
            change(data);
        }
        name.to_string()
    });
}

/// Renames the tensors of `dir/model.safetensors` (another checkpoint layout of the same model).
pub fn rename_tensors(dir: &Path, rename: impl Fn(&str) -> String) {
    rewrite_tensors(dir, |name, _, _, _| rename(name));
}

/// Stores the 3-D f32 tensors of `dir/model.safetensors` that `select` picks with their last two
/// dimensions swapped (stacked expert matrices as `[experts, in, out]` instead of `[experts,
/// out, in]`).
pub fn transpose_f32_tensors(dir: &Path, select: impl Fn(&str) -> bool) {
    rewrite_tensors(dir, |name, dtype, shape, data| {
        if select(name) {
            assert_eq!((dtype, shape.len()), (safetensors::Dtype::F32, 3), "{name}");
            let (n, rows, cols) = (shape[0], shape[1], shape[2]);
            let mut out = vec![0u8; data.len()];
            for (k, value) in data.chunks_exact(4).enumerate() {
                let (m, r, c) = (k / (rows * cols), k / cols % rows, k % cols);
                let to = (m * cols + c) * rows + r;
                out[to * 4..to * 4 + 4].copy_from_slice(value);
            }
            *data = out;
            *shape = vec![n, cols, rows];
        }
        name.to_string()
    });
}

/// Rewrites `dir/model.safetensors` tensor by tensor: `rewrite(name, dtype, shape, bytes)` may
/// change the shape and bytes in place and returns the tensor's new name.
fn rewrite_tensors(dir: &Path, rewrite: impl Fn(&str, safetensors::Dtype, &mut Vec<usize>, &mut Vec<u8>) -> String) {
    use safetensors::tensor::TensorView;
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        let mut shape = view.shape().to_vec();
        let name = rewrite(&name, view.dtype(), &mut shape, &mut data);
        tensors.push((name, view.dtype(), shape, data));
    }
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

/// The workspace's `fixtures/` directory.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// Runs one fixture's whole battery on CPU at `dtype`; returns the per-case reports.
pub fn run_fixture(dir: &Path, dtype: DType) -> Result<(Oracle, Vec<CaseReport>)> {
    run_fixture_on(dir, dtype, Device::Cpu)
}

/// [`run_fixture`] with the weights and the KV cache on `device`.
pub fn run_fixture_on(dir: &Path, dtype: DType, device: Device) -> Result<(Oracle, Vec<CaseReport>)> {
    run_fixture_opts(dir, &ferrite_models::LoadOptions { dtype, device, progress: false, ..Default::default() })
}

/// [`run_fixture`] with the model loaded by `opts`.
pub fn run_fixture_opts(dir: &Path, opts: &ferrite_models::LoadOptions) -> Result<(Oracle, Vec<CaseReport>)> {
    let oracle = Oracle::load(&dir.join("oracle.json"))?;
    let loaded = ferrite_models::load_model(dir, opts)?;
    let reports = run_battery(dir, &oracle, loaded.model.as_ref(), opts.dtype, opts.device)?;
    Ok((oracle, reports))
}

/// Every case of `oracle` through `model`, whose weights are on `device` in `dtype` (the KV
/// cache takes that dtype too; a CPU cache is always f32).
fn run_battery(
    dir: &Path,
    oracle: &Oracle,
    model: &dyn CausalLM,
    dtype: DType,
    device: Device,
) -> Result<Vec<CaseReport>> {
    oracle
        .cases
        .iter()
        .map(|case| {
            let images = case.images.iter().map(|i| i.load(dir)).collect::<Result<Vec<_>>>()?;
            let ours = greedy_with_images(model, &case.prompt_ids, &images, case.output_ids.len(), 16, device, dtype)?;
            Ok(judge(case, &ours))
        })
        .collect()
}

/// [`run_fixture`] with the model built by `build` instead of the registry (to gate a
/// non-default configuration of a family, e.g. MLA's latent KV cache), on `device`.
pub fn run_fixture_with(
    dir: &Path,
    dtype: DType,
    device: Device,
    build: impl Fn(
        &ferrite_models::loading::config::RawConfig,
        &ferrite_models::loading::weights::Weights,
    ) -> Result<Box<dyn CausalLM>>,
) -> Result<(Oracle, Vec<CaseReport>)> {
    let oracle = Oracle::load(&dir.join("oracle.json"))?;
    let raw = ferrite_models::loading::config::RawConfig::from_file(&dir.join("config.json"))?;
    let weights = ferrite_models::loading::weights::Weights::new(
        Box::new(ferrite_models::loading::weights::SafetensorsWeights::open(dir)?),
        dtype,
        None,
    )
    .on_device(device);
    let model = build(&raw, &weights)?;
    let reports = run_battery(dir, &oracle, model.as_ref(), dtype, device)?;
    Ok((oracle, reports))
}
