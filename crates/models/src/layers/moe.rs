//! The mixture-of-experts feed-forward layer shared by the MoE families (Mixtral, Qwen2-MoE,
//! Qwen3-MoE, OLMoE, DeepSeek-V2/V3, Granite MoE, MiniMax-M2, ERNIE 4.5 MoE, Llama 4).
//!
//! A forward step is three plain stages, each a data structure the next consumes:
//! 1. [`Router::route`]: router logits -> per token, `top_k` experts and their weights
//!    ([`Routing`]; softmax or sigmoid scores, optional group limit and score-correction bias,
//!    optional renormalisation, routed scaling factor). It runs on the host over the small
//!    `[tokens, experts]` logits matrix.
//! 2. [`Routing::group_by_expert`]: the `(token, slot)` pairs sorted by expert, with offsets per
//!    expert ([`ExpertGroups`]). This is the grouped-GEMM layout: expert weights are stacked
//!    `[experts, out, in]` tensors, and [`ops::grouped_matmul_t`] runs one matmul per expert over
//!    its contiguous group of rows (never a loop over tokens).
//! 3. [`ops::combine_rows`]: each token's expert outputs, weighted and added in slot order,
//!    then the shared experts (optionally behind Qwen2-MoE's sigmoid gate).
//!
//! On CUDA, stage 1 reads the logits back to the host (`to_f32_vec`, one small copy per MoE
//! layer) and `grouped_matmul_t` / `combine_rows` have no CUDA arm yet: a device path needs those
//! two ops (a grouped GEMM over `offsets`, and a gather-weight-add) and, to stay graph-capturable,
//! routing and the counting sort moved on device with the same outputs as [`Routing`] and
//! [`ExpertGroups`].

use ferrite_tensor::{ops, Activation, CpuStorage, Device, Storage, Tensor};

use crate::layers::{GatedMlp, Linear};
use crate::loading::weights::Weights;
use crate::{ModelError, Result};

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scoring {
    Softmax,
    /// DeepSeek-V3 (`scoring_func: sigmoid`).
    Sigmoid,
    /// The top-k of the raw logits, weighted by the softmax over those k logits only (Granite
    /// MoE). The same choice as `Softmax` but not the same bits as its renormalised weights.
    SoftmaxOfTopK,
    /// The top-k of the raw logits, each weighted by its own sigmoid (Llama 4). Choosing on the
    /// logits keeps apart experts whose sigmoids round to the same f32.
    SigmoidOfTopK,
    /// PhiMoE's `sparsemixer` at inference, top-2 only: the best expert, weighted by the softmax
    /// over the logits within `2 jitter_eps` (relative) of its own, then the best of the rest,
    /// weighted by the softmax over the others within that distance of it.
    SparseMixer {
        jitter_eps: f64,
    },
}

/// How a group of experts is scored when routing is limited to `topk_group` of `n_group` groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupScore {
    /// DeepSeek-V2 `group_limited_greedy`: a group scores its best expert; experts of the other
    /// groups score 0.
    Max,
    /// DeepSeek-V3 `noaux_tc`: a group scores the sum of its two best bias-corrected scores;
    /// experts of the other groups are excluded (-inf).
    TopTwoSum,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLimit {
    pub n_group: usize,
    pub topk_group: usize,
    pub score: GroupScore,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub scoring: Scoring,
    /// Divide the chosen weights by their sum (`norm_topk_prob`; Mixtral always does).
    pub renormalize: bool,
    /// Added to that sum first (DeepSeek-V3: 1e-20; others 0).
    pub renormalize_eps: f32,
    /// Multiplies the final weights (`routed_scaling_factor`; 1 where a family has none).
    pub scaling: f32,
    pub group: Option<GroupLimit>,
}

/// The gate: `[experts, hidden]` logits weight, and DeepSeek-V3's `e_score_correction_bias`,
/// which steers the choice of experts but not their weights.
#[derive(Debug, Clone)]
pub struct Router {
    pub weight: Tensor,
    /// Added to the logits (gpt-oss's router is a biased Linear).
    pub bias: Option<Tensor>,
    pub correction_bias: Option<Vec<f32>>,
    pub cfg: RouterConfig,
}

/// Per token, `top_k` experts and their weights, row-major `[tokens, top_k]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    pub top_k: usize,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

/// The routing pairs sorted by expert: sorted row `i` is pair `pairs[i]` (`token * top_k + slot`)
/// and reads token `tokens[i]`; expert `e` owns sorted rows `offsets[e]..offsets[e + 1]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertGroups {
    pub pairs: Vec<usize>,
    pub tokens: Vec<usize>,
    pub offsets: Vec<usize>,
    /// The inverse of `pairs`: the sorted row of each pair.
    pub row_of_pair: Vec<usize>,
}

impl Routing {
    pub fn num_tokens(&self) -> usize {
        self.experts.len() / self.top_k.max(1)
    }

    /// Counting sort of the pairs by expert (stable: token order within an expert).
    pub fn group_by_expert(&self, num_experts: usize) -> ExpertGroups {
        let mut offsets = vec![0usize; num_experts + 1];
        for &e in &self.experts {
            offsets[e as usize + 1] += 1;
        }
        for e in 0..num_experts {
            offsets[e + 1] += offsets[e];
        }
        let mut next = offsets.clone();
        let mut pairs = vec![0usize; self.experts.len()];
        let mut row_of_pair = vec![0usize; self.experts.len()];
        for (pair, &e) in self.experts.iter().enumerate() {
            let row = next[e as usize];
            next[e as usize] += 1;
            pairs[row] = pair;
            row_of_pair[pair] = row;
        }
        let k = self.top_k.max(1);
        let tokens = pairs.iter().map(|p| p / k).collect();
        ExpertGroups { pairs, tokens, offsets, row_of_pair }
    }
}

/// Indices of the `k` largest values, largest first; ties go to the lower index.
fn top_k_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn softmax_row(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|v| v / sum).collect()
}

/// transformers' `sparsemixer` in eval mode (its comparisons and softmaxes in f32): the first
/// maximum, then the first maximum of the others; each weighted by the softmax over the logits `l`
/// whose `(best - l) / max(|l|, best)` is at most `2 jitter_eps`, the first expert left out of the
/// second softmax.
fn sparse_mixer(logits: &[f32], jitter_eps: f64) -> (Vec<u32>, Vec<f32>) {
    let threshold = (2.0 * jitter_eps) as f32;
    let first_max = |row: &[f32]| {
        row.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) })
    };
    let weight = |candidates: &[f32], best: usize, best_value: f32| {
        let masked: Vec<f32> = candidates
            .iter()
            .zip(logits)
            .map(|(&c, &l)| if (best_value - l) / l.abs().max(best_value) > threshold { f32::NEG_INFINITY } else { c })
            .collect();
        softmax_row(&masked)[best]
    };
    let (first, first_value) = first_max(logits);
    let w1 = weight(logits, first, first_value);
    let mut rest = logits.to_vec();
    rest[first] = f32::NEG_INFINITY;
    let (second, second_value) = first_max(&rest);
    let w2 = weight(&rest, second, second_value);
    (vec![first as u32, second as u32], vec![w1, w2])
}

fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

impl RouterConfig {
    /// Routes one token from its router logits.
    pub fn route_row(&self, logits: &[f32], bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
        let scores: Vec<f32> = match self.scoring {
            Scoring::Softmax => softmax_row(logits),
            Scoring::Sigmoid => logits.iter().map(|&v| sigmoid(v)).collect(),
            Scoring::SoftmaxOfTopK | Scoring::SigmoidOfTopK => logits.to_vec(),
            Scoring::SparseMixer { jitter_eps } => return sparse_mixer(logits, jitter_eps),
        };
        // What the choice is made on: the scores, plus the correction bias where there is one.
        let mut choice: Vec<f32> = match bias {
            Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => scores.clone(),
        };
        if let Some(g) = self.group {
            let size = self.num_experts / g.n_group;
            let group_scores: Vec<f32> = choice
                .chunks(size)
                .map(|grp| match g.score {
                    GroupScore::Max => grp.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    GroupScore::TopTwoSum => {
                        let best = top_k_indices(grp, 2);
                        grp[best[0]] + grp[best[1]]
                    }
                })
                .collect();
            let mut keep = vec![false; g.n_group];
            for i in top_k_indices(&group_scores, g.topk_group) {
                keep[i] = true;
            }
            let masked = match g.score {
                GroupScore::Max => 0.0,
                GroupScore::TopTwoSum => f32::NEG_INFINITY,
            };
            for (e, c) in choice.iter_mut().enumerate() {
                if !keep[e / size] {
                    *c = masked;
                }
            }
        }
        let chosen = top_k_indices(&choice, self.top_k);
        let mut weights: Vec<f32> = match (self.scoring, self.group.map(|g| g.score)) {
            (Scoring::SoftmaxOfTopK, _) => softmax_row(&chosen.iter().map(|&e| logits[e]).collect::<Vec<_>>()),
            (Scoring::SigmoidOfTopK, _) => chosen.iter().map(|&e| sigmoid(logits[e])).collect(),
            // group_limited_greedy weights by the (masked) scores it chose on.
            (_, Some(GroupScore::Max)) => chosen.iter().map(|&e| choice[e]).collect(),
            // Otherwise the weights are the scores without the correction bias.
            _ => chosen.iter().map(|&e| scores[e]).collect(),
        };
        if self.renormalize {
            let sum = weights.iter().sum::<f32>() + self.renormalize_eps;
            weights.iter_mut().for_each(|w| *w /= sum);
        }
        if self.scaling != 1.0 {
            weights.iter_mut().for_each(|w| *w *= self.scaling);
        }
        (chosen.into_iter().map(|e| e as u32).collect(), weights)
    }

    fn check(&self, name: &str) -> Result<()> {
        let bad = |m: String| ModelError::Config { path: name.into(), message: m };
        if self.num_experts == 0 || self.top_k == 0 || self.top_k > self.num_experts {
            return Err(bad(format!("top-{} routing over {} experts", self.top_k, self.num_experts)));
        }
        if matches!(self.scoring, Scoring::SparseMixer { .. }) && self.top_k != 2 {
            return Err(bad(format!("sparsemixer routes to 2 experts, not top-{}", self.top_k)));
        }
        if let Some(g) = self.group {
            if g.n_group == 0
                || !self.num_experts.is_multiple_of(g.n_group)
                || g.topk_group == 0
                || g.topk_group > g.n_group
            {
                return Err(bad(format!(
                    "{} experts in {} groups, {} groups chosen",
                    self.num_experts, g.n_group, g.topk_group
                )));
            }
            let size = self.num_experts / g.n_group;
            if g.score == GroupScore::TopTwoSum && size < 2 {
                return Err(bad(format!("groups of {size} expert cannot be scored by their top two")));
            }
            if g.score == GroupScore::TopTwoSum && g.topk_group * size < self.top_k {
                return Err(bad(format!(
                    "{} groups of {size} experts hold fewer than top-{}",
                    g.topk_group, self.top_k
                )));
            }
        }
        Ok(())
    }
}

impl Router {
    /// `name` is the gate's weight prefix (`...mlp.gate`); the correction bias is read from
    /// `{name}.e_score_correction_bias` when `correction_bias` is set. The gate is kept in f32, as
    /// DeepSeek does, for every family (see [`Router::route`]).
    pub fn load(w: &Weights, name: &str, hidden: usize, cfg: RouterConfig, correction_bias: bool) -> Result<Router> {
        cfg.check(name)?;
        let wname = format!("{name}.weight");
        let shape = [cfg.num_experts, hidden];
        let weight = w.get_f32(&wname, &shape)?;
        let correction_bias = if correction_bias {
            Some(w.get_f32(&format!("{name}.e_score_correction_bias"), &[cfg.num_experts])?.to_f32_vec())
        } else {
            None
        };
        Ok(Router { weight, bias: None, correction_bias, cfg })
    }

    /// The correction bias from the tensor `name` of `shape` (`num_experts` values), for
    /// checkpoints that keep it elsewhere than under the gate (MiniMax-M2, ERNIE 4.5).
    /// The logit bias `{name}.bias` (`[num_experts]`).
    pub fn with_bias(mut self, w: &Weights, name: &str) -> Result<Router> {
        self.bias = Some(w.get_f32(&format!("{name}.bias"), &[self.cfg.num_experts])?);
        Ok(self)
    }

    pub fn with_correction_bias(mut self, w: &Weights, name: &str, shape: &[usize]) -> Result<Router> {
        let bias = w.get_f32(name, shape)?;
        if bias.numel() != self.cfg.num_experts {
            return Err(ModelError::Config {
                path: name.into(),
                message: format!("{} correction biases for {} experts", bias.numel(), self.cfg.num_experts),
            });
        }
        self.correction_bias = Some(bias.to_f32_vec());
        Ok(self)
    }

    /// Router logits in f32 whatever the activation dtype: bf16 rounding makes close expert
    /// scores tie or swap, and a swapped expert changes the token's whole MLP output.
    pub fn route(&self, x: &Tensor) -> Result<Routing> {
        let logits = ops::matmul_t(&x.to_dtype(ferrite_tensor::DType::F32), &self.weight, self.bias.as_ref())?
            .try_to_f32_vec()?;
        let e = self.cfg.num_experts;
        let tokens = logits.len() / e;
        let mut experts = Vec::with_capacity(tokens * self.cfg.top_k);
        let mut weights = Vec::with_capacity(tokens * self.cfg.top_k);
        for row in logits.chunks(e) {
            let (ids, ws) = self.cfg.route_row(row, self.correction_bias.as_deref());
            experts.extend(ids);
            weights.extend(ws);
        }
        Ok(Routing { top_k: self.cfg.top_k, experts, weights })
    }
}

/// Concatenates tensors of one dtype along their first dimension into a tensor of `shape`, on
/// the device of the first (through host memory: this runs once, at load time).
fn stack(parts: &[Tensor], shape: &[usize]) -> Result<Tensor> {
    let device = parts.first().map_or(Device::Cpu, Tensor::device);
    let parts = parts.iter().map(|p| p.to_device(Device::Cpu)).collect::<std::result::Result<Vec<_>, _>>()?;
    let storage = match parts.first().and_then(|p| p.cpu()) {
        Some(CpuStorage::F32(_)) => CpuStorage::F32(parts.iter().flat_map(|p| p.to_f32_vec()).collect()),
        Some(CpuStorage::BF16(_)) => CpuStorage::BF16(
            parts
                .iter()
                .flat_map(|p| match p.cpu() {
                    Some(CpuStorage::BF16(v)) => v.clone(),
                    _ => p.to_f32_vec().into_iter().map(half::bf16::from_f32).collect(),
                })
                .collect(),
        ),
        Some(CpuStorage::F16(_)) => CpuStorage::F16(
            parts
                .iter()
                .flat_map(|p| match p.cpu() {
                    Some(CpuStorage::F16(v)) => v.clone(),
                    _ => p.to_f32_vec().into_iter().map(half::f16::from_f32).collect(),
                })
                .collect(),
        ),
        Some(CpuStorage::Ggml(first)) => {
            let mut bytes = Vec::new();
            for p in &parts {
                match p.cpu() {
                    Some(CpuStorage::Ggml(b)) if b.ty == first.ty => bytes.extend_from_slice(&b.bytes),
                    _ => return Err(mixed_blocks("stacking expert weights")),
                }
            }
            CpuStorage::Ggml(ferrite_tensor::ggml::GgmlBlocks { ty: first.ty, bytes })
        }
        Some(CpuStorage::Int4(_) | CpuStorage::Fp8(_)) => return Err(packed_experts()),
        None => {
            return Err(ferrite_tensor::TensorError::Device("stacking expert weights needs CPU tensors".into()).into())
        }
    };
    Ok(Tensor::from_storage(Storage::Cpu(storage), shape.to_vec())?.to_device(device)?)
}

/// Experts load through `Weights::get`, which dequantizes 4-bit weights: only linear layers keep them.
fn packed_experts() -> crate::ModelError {
    ferrite_tensor::TensorError::Unsupported { op: "moe", detail: "expert weights kept as 4-bit integers".into() }
        .into()
}

fn mixed_blocks(what: &'static str) -> crate::ModelError {
    ferrite_tensor::TensorError::Unsupported {
        op: "moe",
        detail: format!("{what} kept in ggml blocks needs every expert in one block type, stored [out, in]"),
    }
    .into()
}

/// `[n, a, b] -> [n, b, a]` of a stacked CPU tensor, at load time.
fn transpose_each(t: &Tensor) -> Result<Tensor> {
    let &[n, a, b] = t.shape() else {
        return Err(
            ferrite_tensor::TensorError::Shape { op: "transpose_each", detail: format!("{:?}", t.shape()) }.into()
        );
    };
    let host = t.to_device(Device::Cpu)?;
    fn flip<T: Copy>(v: &[T], n: usize, a: usize, b: usize) -> Vec<T> {
        (0..n).flat_map(|e| (0..b).flat_map(move |j| (0..a).map(move |i| v[(e * a + i) * b + j]))).collect()
    }
    let storage = match host.cpu() {
        Some(CpuStorage::F32(v)) => CpuStorage::F32(flip(v, n, a, b)),
        Some(CpuStorage::F16(v)) => CpuStorage::F16(flip(v, n, a, b)),
        Some(CpuStorage::BF16(v)) => CpuStorage::BF16(flip(v, n, a, b)),
        Some(CpuStorage::Ggml(_)) => return Err(mixed_blocks("transposing expert weights")),
        Some(CpuStorage::Int4(_) | CpuStorage::Fp8(_)) => return Err(packed_experts()),
        None => {
            return Err(
                ferrite_tensor::TensorError::Device("transposing expert weights needs CPU tensors".into()).into()
            )
        }
    };
    Ok(Tensor::from_storage(Storage::Cpu(storage), vec![n, b, a])?.to_device(t.device())?)
}

/// Checkpoint names of one expert's projections under `{prefix}.experts.{e}.`.
#[derive(Debug, Clone, Copy)]
pub struct ExpertNames {
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

impl ExpertNames {
    /// `gate_proj` / `up_proj` / `down_proj` (Qwen-MoE, OLMoE, DeepSeek).
    pub const HF: ExpertNames = ExpertNames { gate: "gate_proj", up: "up_proj", down: "down_proj" };
    /// `w1` / `w3` / `w2` (Mixtral).
    pub const MIXTRAL: ExpertNames = ExpertNames { gate: "w1", up: "w3", down: "w2" };
}

/// The routed experts as stacked weights: `gate_up [experts, 2 * intermediate, hidden]` (each
/// expert's gate rows, then its up rows) and `down [experts, hidden, intermediate]`, the layout
/// transformers 5 uses in memory and a grouped GEMM consumes.
#[derive(Debug, Clone)]
pub struct Experts {
    pub gate_up: Tensor,
    pub down: Tensor,
    pub num_experts: usize,
    pub intermediate: usize,
    pub act: Activation,
    /// Each token's input is multiplied by its routing weight and the expert's output added
    /// unweighted (Llama 4), instead of weighting the output.
    pub scale_inputs: bool,
    /// Per-expert biases of the two projections, `[experts, 2 * intermediate]` (gate then up,
    /// as `gate_up`'s rows) and `[experts, hidden]` (gpt-oss).
    pub biases: Option<(Tensor, Tensor)>,
    /// gpt-oss's clamped SwiGLU in place of `act(gate) * up`.
    pub clamped_swiglu: Option<ClampedSwiglu>,
}

/// `(clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)` (gpt-oss's
/// `swiglu_alpha` / `swiglu_limit`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClampedSwiglu {
    pub alpha: f32,
    pub limit: f32,
}

/// How a checkpoint stores its stacked expert tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackedLayout {
    /// `gate_up [experts, 2 * intermediate, hidden]`, `down [experts, hidden, intermediate]`
    /// (Granite MoE's `input_linear` / `output_linear`).
    OutIn,
    /// `gate_up [experts, hidden, 2 * intermediate]`, `down [experts, intermediate, hidden]`,
    /// multiplied as `x @ w` (Llama 4); transposed at load.
    InOut,
}

impl Experts {
    /// Plain experts over stacked weights: outputs weighted by the routing, `act(gate) * up`,
    /// no biases.
    pub fn new(gate_up: Tensor, down: Tensor, num_experts: usize, intermediate: usize, act: Activation) -> Experts {
        Experts {
            gate_up,
            down,
            num_experts,
            intermediate,
            act,
            scale_inputs: false,
            biases: None,
            clamped_swiglu: None,
        }
    }

    /// Reads `{prefix}.experts.{e}.{gate,up,down}.weight` (Hub layout), or the fused
    /// `{prefix}.experts.gate_up_proj` / `down_proj` tensors where a checkpoint has those: as
    /// transformers 5 holds them (`[experts, out, in]`) or as Qwen3-VL-MoE's Hub checkpoints store
    /// them (`[experts, in, out]`), told apart by shape as transformers' conversion does (the
    /// first where both fit).
    pub fn load(
        w: &Weights,
        prefix: &str,
        num_experts: usize,
        hidden: usize,
        intermediate: usize,
        act: Activation,
        names: ExpertNames,
    ) -> Result<Experts> {
        let (e, i, h) = (num_experts, intermediate, hidden);
        let fused = format!("{prefix}.experts.gate_up_proj");
        let (gate_up, down) = if w.contains(&fused) {
            let down = format!("{prefix}.experts.down_proj");
            let stored = w.get_any_shape(&fused)?;
            if stored.shape() == [e, 2 * i, h] {
                (stored, w.get(&down, &[e, h, i])?)
            } else if stored.shape() == [e, h, 2 * i] {
                (transpose_each(&stored)?, transpose_each(&w.get(&down, &[e, i, h])?)?)
            } else {
                // The error names the expected shape.
                (w.get(&fused, &[e, 2 * i, h])?, w.get(&down, &[e, h, i])?)
            }
        } else {
            let mut gu = Vec::with_capacity(2 * e);
            let mut dn = Vec::with_capacity(e);
            for x in 0..e {
                let p = format!("{prefix}.experts.{x}");
                gu.push(w.get(&format!("{p}.{}.weight", names.gate), &[i, h])?);
                gu.push(w.get(&format!("{p}.{}.weight", names.up), &[i, h])?);
                dn.push(w.get(&format!("{p}.{}.weight", names.down), &[h, i])?);
            }
            (stack(&gu, &[e, 2 * i, h])?, stack(&dn, &[e, h, i])?)
        };
        Ok(Experts::new(gate_up, down, num_experts, intermediate, act))
    }

    /// Reads stacked expert tensors named `gate_up` and `down`, each expert's gate rows before
    /// its up rows.
    #[allow(clippy::too_many_arguments)]
    pub fn load_stacked(
        w: &Weights,
        gate_up: &str,
        down: &str,
        num_experts: usize,
        hidden: usize,
        intermediate: usize,
        act: Activation,
        layout: StackedLayout,
    ) -> Result<Experts> {
        let (e, i, h) = (num_experts, intermediate, hidden);
        let (gate_up, down) = match layout {
            StackedLayout::OutIn => (w.get(gate_up, &[e, 2 * i, h])?, w.get(down, &[e, h, i])?),
            StackedLayout::InOut => {
                (transpose_each(&w.get(gate_up, &[e, h, 2 * i])?)?, transpose_each(&w.get(down, &[e, i, h])?)?)
            }
        };
        Ok(Experts::new(gate_up, down, num_experts, intermediate, act))
    }

    /// `sum_slot weight * down_e(act(gate_e(x)) * up_e(x))` per token, computed per expert over
    /// the token group the routing sends it.
    pub fn forward(&self, x: &Tensor, routing: &Routing) -> Result<Tensor> {
        let groups = routing.group_by_expert(self.num_experts);
        let (xs, out_weights) = match self.scale_inputs {
            false => (ops::gather_rows(x, &groups.tokens)?, std::borrow::Cow::Borrowed(&routing.weights)),
            true => {
                let in_weights: Vec<f32> = groups.pairs.iter().map(|&p| routing.weights[p]).collect();
                let ones = vec![1.0f32; routing.weights.len()];
                (ops::combine_rows(x, &groups.tokens, &in_weights, 1)?, std::borrow::Cow::Owned(ones))
            }
        };
        // The expert of each sorted row, to pick its bias rows (added after each product, as
        // transformers' grouped experts do).
        let expert_rows: Vec<usize> = match &self.biases {
            Some(_) => {
                groups.offsets.windows(2).enumerate().flat_map(|(e, r)| std::iter::repeat_n(e, r[1] - r[0])).collect()
            }
            None => Vec::new(),
        };
        let biased = |y: Tensor, b: Option<&Tensor>| -> Result<Tensor> {
            match b {
                Some(b) => Ok(ops::add(&y, &ops::gather_rows(b, &expert_rows)?)?),
                None => Ok(y),
            }
        };
        let gu = ops::grouped_matmul_t(&xs, &self.gate_up, &groups.offsets)?;
        let gu = biased(gu, self.biases.as_ref().map(|b| &b.0))?;
        let i = self.intermediate;
        let (gate, up) = (ops::narrow_cols(&gu, 0, i)?, ops::narrow_cols(&gu, i, i)?);
        let h = match self.clamped_swiglu {
            Some(c) => ops::clamped_swiglu(&gate, &up, c.alpha, c.limit)?,
            None => ops::act_mul(&gate, &up, self.act)?,
        };
        let y = ops::grouped_matmul_t(&h, &self.down, &groups.offsets)?;
        let y = biased(y, self.biases.as_ref().map(|b| &b.1))?;
        Ok(ops::combine_rows(&y, &groups.row_of_pair, &out_weights, routing.top_k)?)
    }

    pub fn weight_bytes(&self) -> usize {
        self.gate_up.size_in_bytes() + self.down.size_in_bytes()
    }
}

/// Experts every token goes through, optionally scaled per token by `sigmoid(gate(x))`
/// (Qwen2-MoE's `shared_expert_gate`).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    pub mlp: GatedMlp,
    pub gate: Option<Linear>,
}

impl SharedExpert {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let out = self.mlp.forward(x)?;
        let Some(gate) = &self.gate else {
            return Ok(out);
        };
        let scale: Vec<f32> = gate.forward(x)?.try_to_f32_vec()?.into_iter().map(sigmoid).collect();
        let rows: Vec<usize> = (0..out.rows()).collect();
        Ok(ops::combine_rows(&out, &rows, &scale, 1)?)
    }
}

/// Router + routed experts + optional shared experts.
#[derive(Debug, Clone)]
pub struct SparseMoe {
    pub router: Router,
    pub experts: Experts,
    pub shared: Option<SharedExpert>,
}

impl SparseMoe {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let routing = self.router.route(x)?;
        let routed = self.experts.forward(x, &routing)?;
        match &self.shared {
            Some(shared) => Ok(ops::add(&routed, &shared.forward(x)?)?),
            None => Ok(routed),
        }
    }

    pub fn weight_bytes(&self) -> usize {
        let shared = self
            .shared
            .as_ref()
            .map_or(0, |s| s.mlp.weight_bytes() + s.gate.as_ref().map_or(0, |g| g.weight.size_in_bytes()));
        self.router.weight.size_in_bytes() + self.experts.weight_bytes() + shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_mixer_weights_each_pick_by_the_logits_near_it() {
        let cfg = RouterConfig {
            num_experts: 4,
            top_k: 2,
            scoring: Scoring::SparseMixer { jitter_eps: 0.05 },
            renormalize: false,
            renormalize_eps: 0.0,
            scaling: 1.0,
            group: None,
        };
        // 2.9 is within 2 * 0.05 of 3.0 (relative); 1.0 and -1.0 are not.
        let (experts, weights) = cfg.route_row(&[3.0, 2.9, 1.0, -1.0], None);
        assert_eq!(experts, [0, 1]);
        assert_eq!(weights[0], 1.0 / (1.0 + (-0.1f32).exp()));
        // The second softmax leaves the first expert out, and 1.0 is too far from 2.9.
        assert_eq!(weights[1], 1.0);
        assert!(RouterConfig { top_k: 3, ..cfg }.check("m").is_err());
    }

    fn cfg(num_experts: usize, top_k: usize) -> RouterConfig {
        RouterConfig {
            num_experts,
            top_k,
            scoring: Scoring::Softmax,
            renormalize: false,
            renormalize_eps: 0.0,
            scaling: 1.0,
            group: None,
        }
    }

    #[test]
    fn softmax_top_k_with_and_without_renormalisation() {
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let probs = softmax_row(&logits);
        let (ids, ws) = cfg(4, 2).route_row(&logits, None);
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(ws, vec![probs[1], probs[2]]);
        let (_, ws) = RouterConfig { renormalize: true, ..cfg(4, 2) }.route_row(&logits, None);
        assert!((ws[0] + ws[1] - 1.0).abs() < 1e-6 && ws[0] > ws[1]);
        let (_, ws) = RouterConfig { scaling: 2.5, ..cfg(4, 2) }.route_row(&logits, None);
        assert_eq!(ws, vec![probs[1] * 2.5, probs[2] * 2.5]);
    }

    #[test]
    fn v2_group_limit_keeps_the_best_groups() {
        // Groups {0,1} and {2,3}: the best single expert is 0, so group 0 wins with topk_group 1,
        // even though experts 2 and 3 together beat expert 1.
        let logits = [3.0f32, -3.0, 2.5, 2.4];
        let group = Some(GroupLimit { n_group: 2, topk_group: 1, score: GroupScore::Max });
        let (ids, ws) = RouterConfig { group, ..cfg(4, 2) }.route_row(&logits, None);
        assert_eq!(ids, vec![0, 1]);
        let probs = softmax_row(&logits);
        assert_eq!(ws, vec![probs[0], probs[1]]);
        let (ids, _) = cfg(4, 2).route_row(&logits, None);
        assert_eq!(ids, vec![0, 2]);
    }

    #[test]
    fn v3_sigmoid_bias_chooses_but_does_not_weight() {
        let c = RouterConfig {
            scoring: Scoring::Sigmoid,
            renormalize: true,
            renormalize_eps: 1e-20,
            scaling: 2.5,
            group: Some(GroupLimit { n_group: 2, topk_group: 1, score: GroupScore::TopTwoSum }),
            ..cfg(4, 2)
        };
        let logits = [1.0f32, 0.0, 0.5, 0.4];
        // Unbiased: group 0 (1.0 + 0.0 -> sig sum 1.231) vs group 1 (0.5 + 0.4 -> 1.221): group 0.
        let (ids, _) = c.route_row(&logits, None);
        assert_eq!(ids, vec![0, 1]);
        // A bias on expert 3 moves the choice to group 1; the weights are the unbiased scores.
        let bias = [0.0f32, 0.0, 0.0, 0.5];
        let (ids, ws) = c.route_row(&logits, Some(&bias));
        assert_eq!(ids, vec![3, 2]);
        let (s3, s2) = (sigmoid(0.4), sigmoid(0.5));
        let sum = s3 + s2 + 1e-20;
        assert_eq!(ws, vec![s3 / sum * 2.5, s2 / sum * 2.5]);
    }

    #[test]
    fn grouping_sorts_pairs_by_expert_and_inverts() {
        let routing = Routing { top_k: 2, experts: vec![2, 0, 0, 1, 2, 1], weights: vec![0.0; 6] };
        let g = routing.group_by_expert(4);
        assert_eq!(g.offsets, vec![0, 2, 4, 6, 6]);
        assert_eq!(g.pairs, vec![1, 2, 3, 5, 0, 4]);
        assert_eq!(g.tokens, vec![0, 1, 1, 2, 0, 2]);
        for (row, &p) in g.pairs.iter().enumerate() {
            assert_eq!(g.row_of_pair[p], row);
        }
    }

    /// An in-memory weight source for layer tests.
    struct MapSource(std::collections::HashMap<String, Tensor>);

    impl crate::loading::weights::WeightSource for MapSource {
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
        fn load(&self, name: &str, dtype: ferrite_tensor::DType) -> Result<Option<Tensor>> {
            Ok(self.0.get(name).map(|t| t.to_dtype(dtype)))
        }
        fn describe(&self) -> String {
            "test map".into()
        }
        fn tensor_count(&self) -> usize {
            self.0.len()
        }
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i + seed) * 2654435761usize) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    #[test]
    fn experts_match_a_per_token_reference_in_both_checkpoint_layouts() {
        let (e, h, i, t) = (4usize, 8usize, 6usize, 5usize);
        let gate: Vec<Vec<f32>> = (0..e).map(|x| values(i * h, 10 + x)).collect();
        let up: Vec<Vec<f32>> = (0..e).map(|x| values(i * h, 20 + x)).collect();
        let down: Vec<Vec<f32>> = (0..e).map(|x| values(h * i, 30 + x)).collect();
        let mut per_expert = std::collections::HashMap::new();
        for x in 0..e {
            let p = format!("m.experts.{x}");
            per_expert.insert(format!("{p}.w1.weight"), Tensor::from_f32(gate[x].clone(), &[i, h]).unwrap());
            per_expert.insert(format!("{p}.w3.weight"), Tensor::from_f32(up[x].clone(), &[i, h]).unwrap());
            per_expert.insert(format!("{p}.w2.weight"), Tensor::from_f32(down[x].clone(), &[h, i]).unwrap());
        }
        let fused_gu: Vec<f32> =
            (0..e).flat_map(|x| gate[x].iter().chain(&up[x]).copied().collect::<Vec<_>>()).collect();
        let fused_dn: Vec<f32> = down.concat();
        let mut fused = std::collections::HashMap::new();
        fused.insert("m.experts.gate_up_proj".to_string(), Tensor::from_f32(fused_gu, &[e, 2 * i, h]).unwrap());
        fused.insert("m.experts.down_proj".to_string(), Tensor::from_f32(fused_dn, &[e, h, i]).unwrap());

        let x = values(t * h, 7);
        let routing = Routing {
            top_k: 2,
            experts: vec![0, 3, 3, 1, 2, 0, 1, 2, 3, 0],
            weights: vec![0.7, 0.3, 0.6, 0.4, 0.5, 0.5, 0.9, 0.1, 0.2, 0.8],
        };
        // Reference: per token, per slot, the expert MLP written out.
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let mut want = vec![0.0f32; t * h];
        for tok in 0..t {
            let xt = &x[tok * h..(tok + 1) * h];
            for slot in 0..2 {
                let ex = routing.experts[tok * 2 + slot] as usize;
                let act: Vec<f32> = (0..i)
                    .map(|r| {
                        let g: f32 = (0..h).map(|c| gate[ex][r * h + c] * xt[c]).sum();
                        let u: f32 = (0..h).map(|c| up[ex][r * h + c] * xt[c]).sum();
                        silu(g) * u
                    })
                    .collect();
                for o in 0..h {
                    let y: f32 = (0..i).map(|r| down[ex][o * i + r] * act[r]).sum();
                    want[tok * h + o] += routing.weights[tok * 2 + slot] * y;
                }
            }
        }
        for (label, map) in [("per-expert", per_expert), ("fused", fused)] {
            let w = Weights::new(Box::new(MapSource(map)), ferrite_tensor::DType::F32, None);
            let experts = Experts::load(&w, "m", e, h, i, Activation::Silu, ExpertNames::MIXTRAL).unwrap();
            assert_eq!(experts.gate_up.shape(), &[e, 2 * i, h]);
            let got = experts.forward(&Tensor::from_f32(x.clone(), &[t, h]).unwrap(), &routing).unwrap().to_f32_vec();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{label}: {g} vs {w}");
            }
        }
    }
}
