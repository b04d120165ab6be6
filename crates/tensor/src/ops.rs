//! The op set. Each op validates shapes, then dispatches on where its input lives.

use crate::cpu;
use crate::cuda;
use crate::error::{shape_err, Result, TensorError};
use crate::kv::{AttnMetadata, PagedKvLayer, PAD_SLOT};
use crate::tensor::{Device, Storage, Tensor};
use crate::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// erf-based GELU (`gelu` in HF configs).
    Gelu,
    /// tanh approximation (`gelu_pytorch_tanh`, `gelu_new`, `gelu_fast`).
    GeluTanh,
    Relu,
    /// `relu(x)^2` (`relu2`, Arcee).
    Relu2,
    /// `1 / (1 + exp(-x))` (the output gate of Qwen3-Next's attention).
    Sigmoid,
    /// `x * sigmoid(1.702 x)` (`quick_gelu`, CLIP's and Qwen2-VL's vision MLPs).
    QuickGelu,
}

impl Activation {
    /// Maps a Hugging Face `hidden_act` / `activation_function` name.
    pub fn from_hf(name: &str) -> Option<Activation> {
        match name {
            "silu" | "swish" => Some(Activation::Silu),
            "gelu" => Some(Activation::Gelu),
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            "relu2" => Some(Activation::Relu2),
            "sigmoid" => Some(Activation::Sigmoid),
            "quick_gelu" => Some(Activation::QuickGelu),
            _ => None,
        }
    }
}

/// The xIELU activation's per-layer constants (Apertus), with the softplus of the learned
/// parameters already taken: `alpha_p = softplus(a_p)`, `alpha_n = beta + softplus(a_n)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Xielu {
    pub alpha_p: f32,
    pub alpha_n: f32,
    pub beta: f32,
    pub eps: f32,
}

impl Xielu {
    /// `alpha_p x x + beta x` for `x > 0`, else `(expm1(min(x, eps)) - x) alpha_n + beta x`, with
    /// every product and sum rounded separately, as torch evaluates transformers' expression.
    pub fn apply(&self, x: f32) -> f32 {
        if x > 0.0 {
            self.alpha_p * x * x + self.beta * x
        } else {
            (x.min(self.eps).exp_m1() - x) * self.alpha_n + self.beta * x
        }
    }
}

/// How rotary embeddings pair the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Rotate the two halves of the rotary span against each other (HF `rotate_half`, GPT-NeoX).
    Neox,
    /// Rotate adjacent pairs (GPT-J, the original paper).
    Interleaved,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttentionParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    pub scale: f32,
    /// Keys older than this many positions (counting the query itself) are not seen.
    pub sliding_window: Option<usize>,
    /// Positions fall in chunks of this many (`0..c`, `c..2c`, ...) and a query sees only the keys
    /// of its own chunk (Llama 4's chunked local attention, `attention_chunk_size`).
    pub attention_chunk: Option<usize>,
    /// Attention logits pass through `cap * tanh(x / cap)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

impl AttentionParams {
    /// The first key position a causal query at `pos` sees, by the sliding window and the chunk.
    pub fn first_key(&self, pos: usize) -> usize {
        let window = self.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let chunk = self.attention_chunk.map_or(0, |c| pos - pos % c.max(1));
        window.max(chunk)
    }
}

/// Every operand must live where the op's first input does: ops never move data implicitly.
fn same_device(op: &'static str, first: &Tensor, others: &[Option<&Tensor>]) -> Result<()> {
    for t in others.iter().flatten() {
        if t.device() != first.device() {
            return Err(TensorError::Device(format!(
                "{op}: an operand is on {:?} but the input is on {:?}",
                t.device(),
                first.device()
            )));
        }
    }
    Ok(())
}

fn same_rows(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(shape_err(op, format!("{:?} vs {:?}", a.shape(), b.shape())));
    }
    Ok(())
}

fn check_matmul(op: &'static str, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<()> {
    if w.rank() != 2 || x.last_dim() != w.shape()[1] {
        return Err(shape_err(op, format!("x {:?} w {:?}", x.shape(), w.shape())));
    }
    if let Some(b) = bias {
        if b.numel() != w.shape()[0] {
            return Err(shape_err(op, format!("bias {:?} for w {:?}", b.shape(), w.shape())));
        }
    }
    same_device(op, x, &[Some(w), bias])
}

/// `x [m, k] @ w[n, k]^T (+ bias[n])` — weights in the Hugging Face `Linear` layout.
pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    check_matmul("matmul_t", x, w, bias)?;
    match x.storage() {
        Storage::Cpu(_) => cpu::matmul::matmul_t(x, w, bias),
        Storage::Cuda(_) => cuda::matmul::matmul_t(x, w, bias),
    }
}

/// `matmul_t` of one input by each `(weight, bias)` (the q/k/v projections): the same results,
/// in one launch where the backend has a kernel for the shape.
pub fn matmul_t_many(x: &Tensor, weights: &[(&Tensor, Option<&Tensor>)]) -> Result<Vec<Tensor>> {
    for &(w, b) in weights {
        check_matmul("matmul_t_many", x, w, b)?;
    }
    match x.storage() {
        Storage::Cpu(_) => weights.iter().map(|&(w, b)| cpu::matmul::matmul_t(x, w, b)).collect(),
        Storage::Cuda(_) => cuda::matmul::matmul_t_many(x, weights),
    }
}

/// `act(x @ gate^T) * (x @ up^T)`, the input half of a gated MLP, with each product rounded to
/// x's dtype as `matmul_t` would before `act_mul`: the same result as those three ops.
pub fn gated_matmul_t(x: &Tensor, gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    check_matmul("gated_matmul_t", x, gate, None)?;
    check_matmul("gated_matmul_t", x, up, None)?;
    same_rows("gated_matmul_t", gate, up)?;
    match x.storage() {
        Storage::Cpu(_) => act_mul(&cpu::matmul::matmul_t(x, gate, None)?, &cpu::matmul::matmul_t(x, up, None)?, act),
        Storage::Cuda(_) => cuda::matmul::gated_matmul_t(x, gate, up, act),
    }
}

/// Rows of `table [vocab, hidden]` for each id.
pub fn embedding(table: &Tensor, ids: &[u32]) -> Result<Tensor> {
    if table.rank() != 2 {
        return Err(shape_err("embedding", format!("table {:?}", table.shape())));
    }
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.shape()[0]) {
        return Err(shape_err("embedding", format!("token id {bad} >= vocab {}", table.shape()[0])));
    }
    match table.storage() {
        Storage::Cpu(_) => cpu::elementwise::embedding(table, ids),
        Storage::Cuda(_) => cuda::ops::embedding(table, ids),
    }
}

/// `x / rms(x) * (offset + w)`; offset is 1 for Gemma's `(1 + w)` norms, else 0.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    if w.numel() != x.last_dim() {
        return Err(shape_err("rms_norm", format!("x {:?} w {:?}", x.shape(), w.shape())));
    }
    same_device("rms_norm", x, &[Some(w)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::rms_norm(x, w, eps, offset),
        Storage::Cuda(_) => cuda::norm::rms_norm(x, w, eps, offset),
    }
}

/// `residual + x` and its [`rms_norm`] in one pass: returns `(normed, new_residual)`. In bf16 the
/// sum is rounded before it is normalised, as separate ops would.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32, offset: f32) -> Result<(Tensor, Tensor)> {
    same_rows("add_rms_norm", x, residual)?;
    if w.numel() != x.last_dim() {
        return Err(shape_err("add_rms_norm", format!("x {:?} w {:?}", x.shape(), w.shape())));
    }
    same_device("add_rms_norm", x, &[Some(residual), Some(w)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::add_rms_norm(x, residual, w, eps, offset),
        Storage::Cuda(_) => cuda::norm::add_rms_norm(x, residual, w, eps, offset),
    }
}

pub fn layer_norm(x: &Tensor, w: Option<&Tensor>, b: Option<&Tensor>, eps: f32) -> Result<Tensor> {
    for t in [w, b].into_iter().flatten() {
        if t.numel() != x.last_dim() {
            return Err(shape_err("layer_norm", format!("x {:?} param {:?}", x.shape(), t.shape())));
        }
    }
    same_device("layer_norm", x, &[w, b])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::layer_norm(x, w, b, eps),
        Storage::Cuda(_) => cuda::norm::layer_norm(x, w, b, eps),
    }
}

/// `relu(x - (mean + std * multiplier))` over each row, with the row's mean and population
/// standard deviation: Gemma 3n's gaussian top-k, which keeps about the largest `1 - p` of a row
/// when `multiplier` is the standard normal's `p` quantile.
pub fn gaussian_topk(x: &Tensor, multiplier: f32) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::gaussian_topk(x, multiplier),
        Storage::Cuda(_) => cuda::norm::gaussian_topk(x, multiplier),
    }
}

/// Each row of `x` brought to the RMS of the same row of `reference`:
/// `x * rms(reference) / sqrt(max(mean(x^2), min_mean_square))` (AltUp's magnitude matching).
pub fn match_rms(x: &Tensor, reference: &Tensor, min_mean_square: f32) -> Result<Tensor> {
    if x.rows() != reference.rows() {
        return Err(shape_err("match_rms", format!("x {:?} reference {:?}", x.shape(), reference.shape())));
    }
    same_device("match_rms", x, &[Some(reference)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::match_rms(x, reference, min_mean_square),
        Storage::Cuda(_) => cuda::norm::match_rms(x, reference, min_mean_square),
    }
}

pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    same_rows("add", a, b)?;
    same_device("add", a, &[Some(b)])?;
    match a.storage() {
        Storage::Cpu(_) => cpu::elementwise::binary(a, b, |x, y| x + y),
        Storage::Cuda(_) => cuda::ops::add(a, b),
    }
}

pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    same_rows("mul", a, b)?;
    same_device("mul", a, &[Some(b)])?;
    match a.storage() {
        Storage::Cpu(_) => cpu::elementwise::binary(a, b, |x, y| x * y),
        Storage::Cuda(_) => cuda::ops::mul(a, b),
    }
}

/// `x * row` broadcast over rows (`row` has `last_dim` elements).
pub fn mul_row(x: &Tensor, row: &Tensor) -> Result<Tensor> {
    if row.numel() != x.last_dim() {
        return Err(shape_err("mul_row", format!("x {:?} row {:?}", x.shape(), row.shape())));
    }
    same_device("mul_row", x, &[Some(row)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::mul_row(x, row),
        Storage::Cuda(_) => cuda::ops::mul_row(x, row),
    }
}

/// Per row, `n` weighted sums of the `m` equal column blocks (streams) of `x [rows, m * d]`,
/// with `coefs [rows, n * m]`: `out[r, i * d + c] = sum_j coefs[r, i * m + j] * x[r, j * d + c]`,
/// added in `j` order, each product rounded (AltUp's predictions and corrections). Returns
/// `[rows, n * d]`.
pub fn mix_streams(x: &Tensor, coefs: &Tensor, n: usize) -> Result<Tensor> {
    let m = coefs.last_dim().checked_div(n).unwrap_or(0);
    if m == 0
        || m * n != coefs.last_dim()
        || coefs.rows() != x.rows()
        || x.last_dim() == 0
        || !x.last_dim().is_multiple_of(m)
    {
        return Err(shape_err("mix_streams", format!("x {:?} coefs {:?} into {n} streams", x.shape(), coefs.shape())));
    }
    same_device("mix_streams", x, &[Some(coefs)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::mix_streams(x, coefs, n),
        Storage::Cuda(_) => cuda::ops::mix_streams(x, coefs, n),
    }
}

pub fn scale(x: &Tensor, factor: f32) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::unary(x, move |v| v * factor),
        Storage::Cuda(_) => cuda::ops::scale(x, factor),
    }
}

/// `cap * tanh(x / cap)`.
pub fn softcap(x: &Tensor, cap: f32) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::unary(x, move |v| (v / cap).tanh() * cap),
        Storage::Cuda(_) => cuda::ops::softcap(x, cap),
    }
}

pub fn activation(x: &Tensor, act: Activation) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::unary(x, move |v| cpu::elementwise::activate(act, v)),
        Storage::Cuda(_) => cuda::ops::activation(x, act),
    }
}

pub fn xielu(x: &Tensor, p: Xielu) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::unary(x, move |v| p.apply(v)),
        Storage::Cuda(_) => cuda::ops::xielu(x, p),
    }
}

/// `act(gate) * up`: the gated MLP of Llama-style models.
pub fn act_mul(gate: &Tensor, up: &Tensor, act: Activation) -> Result<Tensor> {
    same_rows("act_mul", gate, up)?;
    same_device("act_mul", gate, &[Some(up)])?;
    match gate.storage() {
        Storage::Cpu(_) => cpu::elementwise::binary(gate, up, move |g, u| cpu::elementwise::activate(act, g) * u),
        Storage::Cuda(_) => cuda::ops::act_mul(gate, up, act),
    }
}

/// gpt-oss's expert activation: with `g = min(gate, limit)` and `u = clamp(up, -limit, limit)`,
/// `(u + 1) * g * sigmoid(g * alpha)`, each step rounded as transformers' separate ops.
pub fn clamped_swiglu(gate: &Tensor, up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
    same_rows("clamped_swiglu", gate, up)?;
    same_device("clamped_swiglu", gate, &[Some(up)])?;
    match gate.storage() {
        Storage::Cpu(_) => cpu::elementwise::binary(gate, up, move |g, u| {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            (u + 1.0) * (g * (1.0 / (1.0 + (-(g * alpha)).exp())))
        }),
        Storage::Cuda(_) => cuda::ops::clamped_swiglu(gate, up, alpha, limit),
    }
}

/// Softmax over the last dimension.
/// The input of an FP8 W8A8 linear: `x` quantized to e4m3 and back, per token, per group of a
/// row or with a fixed scale (see [`crate::fp8`]).
pub fn fp8_fake_quant(x: &Tensor, quant: crate::ActivationQuant) -> Result<Tensor> {
    match quant {
        crate::ActivationQuant::PerGroup(g) if g == 0 || !x.last_dim().is_multiple_of(g) => {
            return Err(shape_err("fp8_fake_quant", format!("rows of {} in groups of {g}", x.last_dim())));
        }
        crate::ActivationQuant::Static(s) if !(s.is_finite() && s > 0.0) => {
            return Err(shape_err("fp8_fake_quant", format!("input scale {s}")));
        }
        _ => {}
    }
    match x.storage() {
        Storage::Cpu(_) => cpu::norm::fp8_fake_quant(x, quant),
        Storage::Cuda(_) => cuda::norm::fp8_fake_quant(x, quant),
    }
}

pub fn softmax(x: &Tensor) -> Result<Tensor> {
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::softmax(x),
        Storage::Cuda(_) => cuda::norm::softmax(x),
    }
}

/// The index of the largest value of each row (greedy sampling); the lowest index wins ties and
/// NaN counts as the largest value, as in `torch.argmax`.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    if logits.last_dim() == 0 {
        return Err(shape_err("argmax_rows", format!("rows of no columns {:?}", logits.shape())));
    }
    match logits.storage() {
        Storage::Cpu(_) => cpu::elementwise::argmax_rows(logits),
        Storage::Cuda(_) => cuda::ops::argmax_rows(logits),
    }
}

/// How one row of [`sample_rows`] turns into a token, in vLLM V1's order: temperature, then
/// min-p, top-k and top-p on the probabilities, then a seeded exponential race.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSampling {
    /// Below 1e-5 (0 included) the row is greedy, as [`argmax_rows`].
    pub temperature: f32,
    /// Keeps the `top_k` most likely tokens and every token tied with the last of them; 0 is off.
    pub top_k: u32,
    /// Keeps the smallest set of most likely tokens whose probability (renormalised after min-p
    /// and top-k) reaches `top_p`, ties with its least likely token included; 1 is off.
    pub top_p: f32,
    /// Keeps tokens at least `min_p` times as likely as the most likely one; 0 is off.
    pub min_p: f32,
    /// With `step`, names the draws: the same logits, parameters, seed and step give the same
    /// token on either backend, whatever else is in the batch.
    pub seed: u64,
    pub step: u64,
}

/// One token id per row of `logits [rows, vocab]` (f32 or bf16); on CUDA only the ids come back
/// to the host. See [`RowSampling`] for what each row does; `cpu::sampling` is the reference.
pub fn sample_rows(logits: &Tensor, rows: &[RowSampling]) -> Result<Vec<u32>> {
    if logits.last_dim() == 0 || logits.rows() != rows.len() {
        return Err(shape_err(
            "sample_rows",
            format!("{} rows of parameters for logits {:?}", rows.len(), logits.shape()),
        ));
    }
    if u32::try_from(logits.last_dim()).is_err() {
        return Err(shape_err("sample_rows", format!("vocab {} beyond 32-bit token ids", logits.last_dim())));
    }
    match logits.storage() {
        Storage::Cpu(_) => cpu::sampling::sample_rows(logits, rows),
        Storage::Cuda(_) => cuda::sampling::sample_rows(logits, rows),
    }
}

/// Structured outputs' token masks: `logits [rows, vocab]` with every token whose bit is clear
/// set to -inf. `bitmask` holds `ceil(vocab / 32)` words a row, bit `c % 32` of word `c / 32`
/// for token `c`; on CUDA it is uploaded once for the whole batch.
pub fn mask_tokens(logits: &Tensor, bitmask: &[u32]) -> Result<Tensor> {
    let words = logits.last_dim().div_ceil(32);
    if bitmask.len() != logits.rows() * words {
        return Err(shape_err(
            "mask_tokens",
            format!("{} mask words for logits {:?} ({words} a row)", bitmask.len(), logits.shape()),
        ));
    }
    match logits.storage() {
        Storage::Cpu(_) => cpu::sampling::mask_tokens(logits, bitmask),
        Storage::Cuda(_) => cuda::sampling::mask_tokens(logits, bitmask),
    }
}

/// Columns `[start, start + len)` of every row.
pub fn narrow_cols(x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    if start + len > x.last_dim() {
        return Err(shape_err("narrow_cols", format!("[{start}, {}) of {:?}", start + len, x.shape())));
    }
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::narrow_cols(x, start, len),
        Storage::Cuda(_) => cuda::ops::narrow_cols(x, start, len),
    }
}

/// Concatenates matrices with the same number of rows along the columns.
pub fn concat_cols(parts: &[&Tensor]) -> Result<Tensor> {
    let rows = parts.first().map(|p| p.rows()).unwrap_or(0);
    if parts.iter().any(|p| p.rows() != rows) {
        return Err(shape_err("concat_cols", "row counts differ"));
    }
    same_device("concat_cols", parts[0], &parts.iter().map(|p| Some(*p)).collect::<Vec<_>>())?;
    match parts[0].storage() {
        Storage::Cpu(_) => cpu::elementwise::concat_cols(parts),
        Storage::Cuda(_) => cuda::ops::concat_cols(parts),
    }
}

/// Stacks matrices with the same number of columns, in order.
pub fn concat_rows(parts: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = parts.first() else {
        return Err(shape_err("concat_rows", "no parts"));
    };
    let cols = first.last_dim();
    if parts.iter().any(|p| p.shape().len() != 2 || p.last_dim() != cols || p.dtype() != first.dtype()) {
        return Err(shape_err("concat_rows", "parts differ in columns or dtype"));
    }
    same_device("concat_rows", first, &parts.iter().map(|p| Some(*p)).collect::<Vec<_>>())?;
    match first.storage() {
        Storage::Cpu(_) => cpu::elementwise::concat_rows(parts),
        Storage::Cuda(_) => cuda::ops::concat_rows(parts),
    }
}

/// `out[r][c] = x[r][cols[c]]`, or `fill` where `cols[c]` is negative: an f32 matrix's columns
/// laid out anew (EAGLE-3's draft-vocabulary logits in the target's vocabulary, `-inf` elsewhere).
/// `cols` is an f32 vector on `x`'s device holding whole numbers below `x`'s width, made once and
/// reused.
pub fn gather_cols(x: &Tensor, cols: &Tensor, fill: f32) -> Result<Tensor> {
    if x.shape().len() != 2 || x.dtype() != DType::F32 || cols.dtype() != DType::F32 {
        return Err(shape_err("gather_cols", format!("an f32 matrix and map, got {:?} {:?}", x.shape(), x.dtype())));
    }
    same_device("gather_cols", x, &[Some(cols)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::gather_cols(x, cols, fill),
        Storage::Cuda(_) => cuda::ops::gather_cols(x, cols, fill),
    }
}

/// Selects rows of a matrix (e.g. the last token of each sequence before the LM head).
pub fn gather_rows(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
    if let Some(&bad) = rows.iter().find(|&&r| r >= x.rows()) {
        return Err(shape_err("gather_rows", format!("row {bad} of {:?}", x.shape())));
    }
    // Every row in order (the logit rows of a decode step) is the tensor itself.
    if x.shape().len() == 2 && rows.len() == x.rows() && rows.iter().enumerate().all(|(i, &r)| i == r) {
        return Ok(x.clone());
    }
    match x.storage() {
        Storage::Cpu(_) => cpu::elementwise::gather_rows(x, rows),
        Storage::Cuda(_) => cuda::ops::gather_rows(x, rows),
    }
}

/// Applies rotary embeddings to `x [tokens, heads * head_dim]` over the first `cos.last_dim() * 2`
/// dimensions of every head. `cos`/`sin` are `[tokens, rotary_dim / 2]`, one row per token.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize, style: RopeStyle) -> Result<Tensor> {
    check_rope("rope", x, cos, sin, head_dim)?;
    match x.storage() {
        Storage::Cpu(_) => cpu::rope::rope(x, cos, sin, head_dim, style),
        Storage::Cuda(_) => cuda::rope_kv::rope(x, cos, sin, head_dim, style),
    }
}

fn check_rope(op: &'static str, x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize) -> Result<()> {
    let half = cos.last_dim();
    if head_dim == 0
        || !x.last_dim().is_multiple_of(head_dim)
        || half * 2 > head_dim
        || cos.rows() != x.rows()
        || sin.shape() != cos.shape()
    {
        return Err(shape_err(op, format!("x {:?} cos {:?} head_dim {head_dim}", x.shape(), cos.shape())));
    }
    same_device(op, x, &[Some(cos), Some(sin)])
}

fn check_write_kv(op: &'static str, cache: &PagedKvLayer, k: &Tensor, v: &Tensor, meta: &AttnMetadata) -> Result<()> {
    let tokens = meta.num_tokens();
    if k.rows() != tokens
        || v.rows() != tokens
        || k.last_dim() != cache.num_kv_heads * cache.k_dim
        || v.last_dim() != cache.num_kv_heads * cache.v_dim
    {
        return Err(shape_err(op, format!("k {:?} v {:?} for {tokens} tokens", k.shape(), v.shape())));
    }
    if let Some(&bad) = meta.slot_mapping.iter().find(|&&s| s >= cache.num_slots() && s != PAD_SLOT) {
        return Err(shape_err(op, format!("slot {bad} >= {}", cache.num_slots())));
    }
    same_device(op, k, &[Some(v)])
}

/// Writes this step's keys `[tokens, kv_heads * k_dim]` and values into their cache slots.
pub fn write_kv(cache: &mut PagedKvLayer, k: &Tensor, v: &Tensor, meta: &AttnMetadata) -> Result<()> {
    check_write_kv("write_kv", cache, k, v, meta)?;
    match k.storage() {
        Storage::Cpu(_) => cpu::attention::write_kv(cache, k, v, meta),
        Storage::Cuda(_) => cuda::rope_kv::write_kv(cache, k, v, meta),
    }
}

/// `rope` of the queries, and `write_kv` of the keys after the same `rope`, in one launch where
/// the backend can: returns the rotated queries; the rotated keys exist only in the cache.
#[allow(clippy::too_many_arguments)]
pub fn rope_write_kv(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    head_dim: usize,
    style: RopeStyle,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
) -> Result<Tensor> {
    check_rope("rope_write_kv", q, cos, sin, head_dim)?;
    check_rope("rope_write_kv", k, cos, sin, head_dim)?;
    check_write_kv("rope_write_kv", cache, k, v, meta)?;
    same_device("rope_write_kv", q, &[Some(k), Some(v)])?;
    match q.storage() {
        Storage::Cpu(_) => {
            cpu::attention::write_kv(cache, &cpu::rope::rope(k, cos, sin, head_dim, style)?, v, meta)?;
            cpu::rope::rope(q, cos, sin, head_dim, style)
        }
        Storage::Cuda(_) => cuda::rope_kv::rope_write_kv(q, k, v, cos, sin, head_dim, style, cache, meta),
    }
}

/// Columns `[start, start + len)` of the cached key rows `rows`, the keys read as a matrix of
/// `num_slots * num_kv_heads` rows of `k_dim` (row `slot * num_kv_heads + head`): what a layer
/// keeps beside its attention keys (DeepSeek-V3.2's indexer keys), read back for a context.
/// Returns `[rows.len(), len]` in the cache's dtype.
pub fn gather_cached_keys(cache: &PagedKvLayer, rows: &[usize], start: usize, len: usize) -> Result<Tensor> {
    let total = cache.num_slots() * cache.num_kv_heads;
    if start + len > cache.k_dim {
        return Err(shape_err("gather_cached_keys", format!("columns [{start}, {}) of {}", start + len, cache.k_dim)));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= total) {
        return Err(shape_err("gather_cached_keys", format!("row {bad} of {total}")));
    }
    if cache.fp8.is_some() {
        // The keys kept beside attention's (DeepSeek-V3.2's indexer keys) are not quantized in
        // vLLM's FP8 cache either; storing them apart is not built.
        return Err(TensorError::Unsupported {
            op: "gather_cached_keys",
            detail: "keys kept beside attention's in an FP8 KV cache (--kv-cache-dtype fp8)".into(),
        });
    }
    match &cache.storage {
        crate::kv::KvStorage::Cpu { .. } => cpu::attention::gather_cached_keys(cache, rows, start, len),
        _ => cuda::ops::gather_cached_keys(cache, rows, start, len),
    }
}

/// A `[tokens, cols]` f32 table the host computes from a step's metadata (rotary cos/sin, say),
/// on `device`. Inside a CUDA graph capture it becomes an input of the graph that `fill`
/// recomputes before every replay, so `fill` must depend on nothing but the metadata.
pub fn step_tensor(meta: &AttnMetadata, device: Device, cols: usize, fill: cuda::HostFill) -> Result<Tensor> {
    if let Device::Cuda(o) = device {
        if let Some(input) = cuda::device(o)?.step_tensor(meta, cols, &fill)? {
            return Ok(input);
        }
    }
    Tensor::from_f32(fill(meta), &[meta.num_tokens(), cols])?.to_device(device)
}

/// Causal attention of `q [tokens, heads * head_dim]` over each sequence's cached keys and values
/// (which must already include this step's). Returns `[tokens, heads * v_head_dim]`.
pub fn paged_attention(q: &Tensor, cache: &PagedKvLayer, meta: &AttnMetadata, p: &AttentionParams) -> Result<Tensor> {
    paged_attention_sinks(q, cache, meta, p, None)
}

/// [`paged_attention`] with an attention sink per query head (gpt-oss): `sinks [num_heads]`, f32
/// logits that join each softmax's denominator but weight no value.
pub fn paged_attention_sinks(
    q: &Tensor,
    cache: &PagedKvLayer,
    meta: &AttnMetadata,
    p: &AttentionParams,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    if let Some(s) = sinks {
        if s.dtype() != DType::F32 || s.numel() != p.num_heads {
            return Err(shape_err(
                "paged_attention",
                format!("sinks {:?} {} for {} heads", s.shape(), s.dtype(), p.num_heads),
            ));
        }
        same_device("paged_attention", q, &[Some(s)])?;
    }
    if q.rows() != meta.num_tokens() || q.last_dim() != p.num_heads * p.head_dim {
        return Err(shape_err("paged_attention", format!("q {:?} for {} tokens", q.shape(), meta.num_tokens())));
    }
    if p.num_kv_heads == 0 || !p.num_heads.is_multiple_of(p.num_kv_heads) || cache.num_kv_heads != p.num_kv_heads {
        return Err(shape_err("paged_attention", format!("{} heads over {} kv heads", p.num_heads, p.num_kv_heads)));
    }
    match q.storage() {
        Storage::Cpu(_) => {
            let sinks = sinks.map(|s| s.as_f32_slice()).transpose()?;
            cpu::attention::paged_attention(q, cache, meta, p, sinks)
        }
        Storage::Cuda(_) => cuda::attention::paged_attention(q, cache, meta, p, sinks),
    }
}

/// Grouped `x @ w[e]^T` for mixture-of-experts layers: `w` is `[experts, n, k]` (each expert in
/// the `Linear` layout), `x [rows, k]` holds the rows sorted by expert, and `offsets` (one more
/// than the number of experts, from 0 to `rows`, non-decreasing) says which rows go to which
/// expert: rows `offsets[e]..offsets[e + 1]` use `w[e]`. Returns `[rows, n]`.
pub fn grouped_matmul_t(x: &Tensor, w: &Tensor, offsets: &[usize]) -> Result<Tensor> {
    if w.rank() != 3 || x.last_dim() != w.shape()[2] {
        return Err(shape_err("grouped_matmul_t", format!("x {:?} w {:?}", x.shape(), w.shape())));
    }
    let rows: usize = x.shape().iter().rev().skip(1).product();
    if offsets.len() != w.shape()[0] + 1
        || offsets[0] != 0
        || offsets[offsets.len() - 1] != rows
        || offsets.windows(2).any(|p| p[0] > p[1])
    {
        return Err(shape_err("grouped_matmul_t", format!("offsets {offsets:?} for {rows} rows, w {:?}", w.shape())));
    }
    same_device("grouped_matmul_t", x, &[Some(w)])?;
    match x.storage() {
        Storage::Cpu(_) => cpu::matmul::grouped_matmul_t(x, w, offsets),
        Storage::Cuda(_) => cuda::matmul::grouped_matmul_t(x, w, offsets),
    }
}

/// `out[i] = sum_j weights[i * per_row + j] * y[rows[i * per_row + j]]`: gathers `per_row` rows
/// of `y` for each output row, scales each by its weight and adds them in `j` order (the
/// combine step of a mixture-of-experts layer; with `per_row` 1 it scales rows). Returns
/// `[rows.len() / per_row, y.last_dim()]`.
pub fn combine_rows(y: &Tensor, rows: &[usize], weights: &[f32], per_row: usize) -> Result<Tensor> {
    if per_row == 0 || !rows.len().is_multiple_of(per_row) || weights.len() != rows.len() {
        return Err(shape_err(
            "combine_rows",
            format!("{} rows, {} weights, {per_row} per output row", rows.len(), weights.len()),
        ));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= y.rows()) {
        return Err(shape_err("combine_rows", format!("row {bad} of {:?}", y.shape())));
    }
    match y.storage() {
        Storage::Cpu(_) => cpu::elementwise::combine_rows(y, rows, weights, per_row),
        Storage::Cuda(_) => cuda::ops::combine_rows(y, rows, weights, per_row),
    }
}

/// Attention without a KV cache over the contiguous sequences of a flattened batch: sequence
/// `s` owns rows `sum(seq_lens[..s])..sum(seq_lens[..=s])` of `q [tokens, heads * head_dim]`,
/// `k [tokens, kv_heads * head_dim]` and `v [tokens, kv_heads * v_head_dim]`, and attends only
/// to itself. `causal: false` is the bidirectional attention of encoders (BERT); `causal: true`
/// matches [`paged_attention`] (sliding window and softcap included). Returns
/// `[tokens, heads * v_head_dim]`.
pub fn attention_dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &AttentionParams,
    seq_lens: &[usize],
    causal: bool,
) -> Result<Tensor> {
    let tokens: usize = seq_lens.iter().sum();
    if p.num_kv_heads == 0 || !p.num_heads.is_multiple_of(p.num_kv_heads) {
        return Err(shape_err("attention_dense", format!("{} heads over {} kv heads", p.num_heads, p.num_kv_heads)));
    }
    if q.rows() != tokens
        || k.rows() != tokens
        || v.rows() != tokens
        || q.last_dim() != p.num_heads * p.head_dim
        || k.last_dim() != p.num_kv_heads * p.head_dim
        || v.last_dim() != p.num_kv_heads * p.v_head_dim
    {
        return Err(shape_err(
            "attention_dense",
            format!("q {:?} k {:?} v {:?} for {tokens} tokens", q.shape(), k.shape(), v.shape()),
        ));
    }
    same_device("attention_dense", q, &[Some(k), Some(v)])?;
    match q.storage() {
        Storage::Cpu(_) => cpu::attention::attention_dense(q, k, v, p, seq_lens, causal),
        Storage::Cuda(_) => cuda::attention::attention_dense(q, k, v, p, seq_lens, causal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_f32(v.to_vec(), shape).unwrap()
    }

    #[test]
    fn gather_cols_lays_columns_out_anew() {
        let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let map = t(&[-1.0, 2.0, 0.0, -1.0, 1.0], &[5]);
        let out = gather_cols(&x, &map, f32::NEG_INFINITY).unwrap();
        assert_eq!(out.shape(), [2, 5]);
        let inf = f32::NEG_INFINITY;
        assert_eq!(out.to_f32_vec(), [inf, 3.0, 1.0, inf, 2.0, inf, 6.0, 4.0, inf, 5.0]);
        assert!(gather_cols(&x.to_dtype(DType::BF16), &map, 0.0).is_err(), "f32 only");
    }

    #[test]
    fn cached_key_columns_read_back() {
        // 2 blocks of 2 slots, 2 KV heads of 3 key columns; tokens at positions 0..3 in block 1, then 0.
        let seq = crate::kv::AttnSeq { q_start: 0, q_len: 3, ctx_len: 3, block_table: vec![1, 0] };
        let meta = AttnMetadata::new(vec![seq], 2).unwrap();
        let mut cache = PagedKvLayer::new_cpu(2, 2, 2, 3, 1);
        let k: Vec<f32> = (0..18).map(|i| i as f32).collect();
        write_kv(&mut cache, &t(&k, &[3, 6]), &t(&[0.0; 6], &[3, 2]), &meta).unwrap();
        // Slot 2 holds token 0, slot 0 token 2: rows (slot * 2 + head).
        let got = gather_cached_keys(&cache, &[2 * 2 + 1, 0], 1, 2).unwrap();
        assert_eq!(got.shape(), [2, 2]);
        assert_eq!(got.to_f32_vec(), [4.0, 5.0, 13.0, 14.0]);
        assert!(gather_cached_keys(&cache, &[8], 0, 1).is_err(), "row past the cache");
        assert!(gather_cached_keys(&cache, &[0], 2, 2).is_err(), "columns past the row");
    }

    #[test]
    fn an_fp8_cache_keeps_what_e4m3_holds() {
        let seq = crate::kv::AttnSeq { q_start: 0, q_len: 2, ctx_len: 2, block_table: vec![0] };
        let meta = AttnMetadata::new(vec![seq], 2).unwrap();
        let cache = PagedKvLayer::new_on(Device::Cpu, DType::Fp8, 1, 2, 1, 2, 2).unwrap();
        let mut cache = cache.with_fp8_scales(crate::kv::Fp8KvScales { k: 0.5, v: 2.0 }).unwrap();
        let k = t(&[0.3, -1000.0, 1.0, 0.0], &[2, 2]);
        let v = t(&[3.3, 5.0, -900.0, 0.01], &[2, 2]);
        write_kv(&mut cache, &k, &v, &meta).unwrap();
        let crate::kv::KvStorage::Cpu { k: kc, v: vc } = &cache.storage else { unreachable!("a CPU cache") };
        // Divided by the scale, rounded to e4m3 (saturating at 448; 0.005 a subnormal, 3 * 2^-9)
        // and multiplied back.
        assert_eq!(kc, &[0.3125, -224.0, 1.0, 0.0]);
        assert_eq!(vc, &[3.25, 5.0, -896.0, 0.01171875]);
        // Attention reads those values: the second row sees both keys and weighs the second
        // (score 100 against 31.25) all but alone.
        let p = AttentionParams {
            num_heads: 1,
            num_kv_heads: 1,
            head_dim: 2,
            v_head_dim: 2,
            scale: 1.0,
            sliding_window: None,
            attention_chunk: None,
            softcap: None,
        };
        let q = t(&[0.0, 0.0, 100.0, 0.0], &[2, 2]);
        assert_eq!(paged_attention(&q, &cache, &meta, &p).unwrap().to_f32_vec()[2..], [-896.0, 0.01171875]);
        // Scales a checkpoint could not mean, or for a cache that is not FP8.
        let fp8 = || PagedKvLayer::new_on(Device::Cpu, DType::Fp8, 1, 2, 1, 2, 2).unwrap();
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(fp8().with_fp8_scales(crate::kv::Fp8KvScales { k: 1.0, v: bad }).is_err(), "{bad}");
        }
        let plain = PagedKvLayer::new_cpu(1, 2, 1, 2, 2);
        assert!(plain.with_fp8_scales(crate::kv::Fp8KvScales::default()).is_err());
        // DeepSeek-V3.2's indexer keys are not kept in an FP8 cache.
        assert!(gather_cached_keys(&fp8(), &[0], 0, 1).is_err());
    }

    #[test]
    fn fused_forms_equal_the_ops_they_stand_for() {
        let x = t(&[1.0, -2.0, 0.5, 3.0, 0.25, -1.0], &[2, 3]);
        let a = t(&[0.5, 1.0, -1.0, 2.0, 0.0, 1.0], &[2, 3]);
        let b = t(&[1.0, 1.0, 1.0], &[1, 3]);
        let bias = t(&[10.0], &[1]);
        let many = matmul_t_many(&x, &[(&a, None), (&b, Some(&bias))]).unwrap();
        assert_eq!(many[0].to_f32_vec(), matmul_t(&x, &a, None).unwrap().to_f32_vec());
        assert_eq!(many[1].to_f32_vec(), [9.5, 12.25]);
        let gated = gated_matmul_t(&x, &a, &a, Activation::Relu).unwrap();
        let h = matmul_t(&x, &a, None).unwrap().to_f32_vec();
        assert_eq!(gated.to_f32_vec(), h.iter().map(|v| v.max(0.0) * v).collect::<Vec<_>>());
        assert!(matmul_t_many(&x, &[(&a, None), (&t(&[1.0; 4], &[2, 2]), None)]).is_err());
        assert!(gated_matmul_t(&x, &a, &b, Activation::Silu).is_err(), "gate and up of other shapes");

        let (q, k) = (t(&[1.0, 2.0, 3.0, 4.0], &[1, 4]), t(&[5.0, 6.0], &[1, 2]));
        let (cos, sin) = (t(&[0.0], &[1, 1]), t(&[1.0], &[1, 1]));
        let v = t(&[7.0, 8.0], &[1, 2]);
        // One token at position 1 of a one-head cache of one 2-slot block: slot 1.
        let seq = crate::kv::AttnSeq { q_start: 0, q_len: 1, ctx_len: 2, block_table: vec![0] };
        let meta = AttnMetadata::new(vec![seq], 2).unwrap();
        let mut fused = PagedKvLayer::new_cpu(1, 2, 1, 2, 2);
        let mut apart = PagedKvLayer::new_cpu(1, 2, 1, 2, 2);
        let rq = rope_write_kv(&q, &k, &v, &cos, &sin, 2, RopeStyle::Neox, &mut fused, &meta).unwrap();
        assert_eq!(rq.to_f32_vec(), [-2.0, 1.0, -4.0, 3.0]);
        write_kv(&mut apart, &rope(&k, &cos, &sin, 2, RopeStyle::Neox).unwrap(), &v, &meta).unwrap();
        let contents = |c: &PagedKvLayer| match &c.storage {
            crate::kv::KvStorage::Cpu { k, v } => (k.clone(), v.clone()),
            _ => unreachable!("a CPU cache"),
        };
        assert_eq!(contents(&fused), (vec![0.0, 0.0, -6.0, 5.0], vec![0.0, 0.0, 7.0, 8.0]));
        assert_eq!(contents(&fused), contents(&apart));
        let bad_sin = t(&[1.0; 2], &[1, 2]);
        assert!(rope_write_kv(&q, &k, &v, &cos, &bad_sin, 2, RopeStyle::Neox, &mut fused, &meta).is_err());
        assert!(rope_write_kv(&q, &q, &v, &cos, &sin, 2, RopeStyle::Neox, &mut fused, &meta).is_err(), "keys too wide");
    }

    #[test]
    fn gathering_every_row_in_order_shares_the_tensor() {
        let x = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]);
        let all = gather_rows(&x, &[0, 1, 2]).unwrap();
        assert!(std::ptr::eq(all.storage(), x.storage()), "no copy for the identity");
        assert_eq!(all.shape(), [3, 2]);
        let picked = gather_rows(&x, &[2, 0]).unwrap();
        assert!(!std::ptr::eq(picked.storage(), x.storage()));
        assert_eq!(picked.to_f32_vec(), [5.0, 6.0, 1.0, 2.0]);
        assert_eq!(gather_rows(&x, &[1, 0, 2]).unwrap().to_f32_vec(), [3.0, 4.0, 1.0, 2.0, 5.0, 6.0]);
        let wide = t(&[1.0; 8], &[2, 2, 2]);
        assert_eq!(gather_rows(&wide, &[0, 1, 2, 3]).unwrap().shape(), [4, 2], "a 3-D input still comes back 2-D");
    }
}

/// The shapes of a Gated DeltaNet layer's delta rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnParams {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// Tokens per chunk of the chunked prefill form (64 in the references).
    pub chunk_size: usize,
    /// Multiplies `beta = sigmoid(b)`: 2 where the layer allows negative eigenvalues (OLMo
    /// Hybrid's `linear_allow_neg_eigval`, beta in [0, 2]), else 1.
    pub beta_scale: f32,
    /// Kimi Delta Attention's per-channel decay: `a` is `[tokens, v_heads * k_dim]` and `dt_bias`
    /// has one value per (value head, key channel), so each row of a head's state decays at its
    /// own rate. KDA's reference also spells softplus `log(1 + exp(x))`, divides q and k by their
    /// norms and scales queries by `1 / sqrt(k_dim)` in both forms; those follow this switch.
    pub channel_decay: bool,
}

impl GdnParams {
    /// Gate inputs per token and value head: 1, or `k_dim` with [`GdnParams::channel_decay`].
    pub fn gate_width(&self) -> usize {
        if self.channel_decay {
            self.k_dim
        } else {
            1
        }
    }
}

fn check_state_layer(op: &'static str, cache: &PagedKvLayer, meta: &AttnMetadata, k: usize, v: usize) -> Result<()> {
    if meta.state_slots.len() != meta.seqs.len() {
        return Err(shape_err(op, format!("{} state slots for {} sequences", meta.state_slots.len(), meta.seqs.len())));
    }
    if cache.block_size != 1 || cache.num_kv_heads != 1 || cache.k_dim != k || cache.v_dim != v {
        return Err(shape_err(
            op,
            format!(
                "state layer of {}x{} slots of ({}, {}) floats, expected single slots of ({k}, {v})",
                cache.num_blocks, cache.block_size, cache.k_dim, cache.v_dim
            ),
        ));
    }
    if let Some(&slot) = meta.state_slots.iter().find(|&&s| s >= cache.num_blocks) {
        return Err(shape_err(op, format!("state slot {slot} of {}", cache.num_blocks)));
    }
    Ok(())
}

/// A causal depthwise conv1d over `x [tokens, channels]` with `weight [channels, kernel]` (and a
/// bias per channel), then `act`. Each sequence's left context is its last `kernel - 1` inputs,
/// kept in its slot of the state layer `cache` (the conv state; zeros where a sequence starts).
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    act: Option<Activation>,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
) -> Result<Tensor> {
    let (channels, kernel) = match *weight.shape() {
        [c, k] if k >= 1 => (c, k),
        _ => return Err(shape_err("causal_conv1d", format!("weight {:?} is not [channels, kernel]", weight.shape()))),
    };
    if x.last_dim() != channels || x.rows() != meta.num_tokens() {
        return Err(shape_err("causal_conv1d", format!("x {:?} for {channels} channels", x.shape())));
    }
    check_state_layer("causal_conv1d", cache, meta, (kernel - 1) * channels, cache.v_dim)?;
    match x.storage() {
        Storage::Cpu(_) => cpu::recurrent::causal_conv1d(x, weight, bias, act, cache, meta),
        Storage::Cuda(_) => cuda::recurrent::causal_conv1d(x, weight, bias, act, cache, meta),
    }
}

/// The gated delta rule (Gated DeltaNet) with its gates: `beta = sigmoid(b)`,
/// `g = -exp(a_log) * softplus(a + dt_bias)`; `q, k [tokens, k_heads * k_dim]`,
/// `v [tokens, v_heads * v_dim]`, `a [tokens, v_heads * gate_width]`, `b [tokens, v_heads]` (see
/// [`GdnParams::channel_decay`]). Queries and keys are L2-normalised here. Each sequence's
/// `[v_heads, k_dim, v_dim]` state is read from and written back to its slot of the state layer
/// `cache`. Returns `[tokens, v_heads * v_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    a: &Tensor,
    b: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
    p: &GdnParams,
) -> Result<Tensor> {
    let t = meta.num_tokens();
    let (kw, vw) = (p.num_k_heads * p.k_dim, p.num_v_heads * p.v_dim);
    let gates = p.num_v_heads * p.gate_width();
    let shapes = [(q, [t, kw]), (k, [t, kw]), (v, [t, vw]), (a, [t, gates]), (b, [t, p.num_v_heads])];
    if let Some((x, want)) = shapes.iter().find(|(x, want)| x.shape() != want) {
        return Err(shape_err("gated_delta_rule", format!("input {:?}, expected {want:?}", x.shape())));
    }
    if a_log.numel() != p.num_v_heads || dt_bias.numel() != gates || p.chunk_size == 0 {
        return Err(shape_err("gated_delta_rule", "A_log is not one value per value head, or dt_bias one per gate"));
    }
    if p.num_k_heads == 0 || !p.num_v_heads.is_multiple_of(p.num_k_heads) {
        return Err(shape_err(
            "gated_delta_rule",
            format!("{} value heads over {} key heads", p.num_v_heads, p.num_k_heads),
        ));
    }
    check_state_layer("gated_delta_rule", cache, meta, cache.k_dim, p.num_v_heads * p.k_dim * p.v_dim)?;
    match q.storage() {
        Storage::Cpu(_) => cpu::recurrent::gated_delta_rule(q, k, v, a, b, a_log, dt_bias, cache, meta, p),
        Storage::Cuda(_) => cuda::recurrent::gated_delta_rule(q, k, v, a, b, a_log, dt_bias, cache, meta, p),
    }
}

/// Copies whole state slots `(from, to)` of the state layer `cache`, in order (conv and recurrent
/// state both).
pub fn copy_state_slots(cache: &mut PagedKvLayer, copies: &[(usize, usize)]) -> Result<()> {
    if cache.block_size != 1 {
        return Err(shape_err("copy_state_slots", "not a state layer (blocks of one slot)"));
    }
    if let Some(&(from, to)) = copies.iter().find(|&&(f, t)| f >= cache.num_blocks || t >= cache.num_blocks) {
        return Err(shape_err("copy_state_slots", format!("slots {from} -> {to} of {}", cache.num_blocks)));
    }
    if copies.is_empty() {
        return Ok(());
    }
    let (kw, vw) = (cache.num_kv_heads * cache.k_dim, cache.num_kv_heads * cache.v_dim);
    match &mut cache.storage {
        crate::kv::KvStorage::Cpu { k, v } => {
            for &(from, to) in copies {
                k.copy_within(from * kw..(from + 1) * kw, to * kw);
                v.copy_within(from * vw..(from + 1) * vw, to * vw);
            }
            Ok(())
        }
        crate::kv::KvStorage::Cuda { k, v } => cuda::recurrent::copy_state_slots(k, v, kw, vw, copies),
        crate::kv::KvStorage::CudaFp8 { .. } => Err(shape_err("copy_state_slots", "not a state layer (FP8)")),
    }
}

/// The shapes and dt limits of a Mamba mixer's selective scan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectiveScanParams {
    pub num_heads: usize,
    pub head_dim: usize,
    /// Groups of heads sharing B and C.
    pub num_groups: usize,
    pub state_size: usize,
    /// `(min, max)` of `dt` where transformers runs the chunked scan (prompts); its single-token
    /// update applies none.
    pub dt_limit: (f32, f32),
    /// Mamba (1): `dt`, `dt_bias` and `D` per channel (`heads * head_dim` of them) and `A`
    /// `[channels, state]`, where Mamba2 has one of each (and a scalar `A`) per head; heads are
    /// then only how the channels are spread over the GPU.
    pub per_channel: bool,
}

/// A Mamba mixer's selective scan (see `cpu::recurrent::selective_scan`): `x [tokens, heads *
/// head_dim]`, raw `dt [tokens, heads]` (per channel: `[tokens, channels]`), `b, c [tokens,
/// groups * state]`, `a_log`, `dt_bias`, `d` per head (per channel, `a_log` `[channels, state]`).
/// Each sequence's `[heads, head_dim, state]` state lives in its slot of the state layer `cache`.
#[allow(clippy::too_many_arguments)]
pub fn selective_scan(
    x: &Tensor,
    dt: &Tensor,
    b: &Tensor,
    c: &Tensor,
    a_log: &Tensor,
    dt_bias: &Tensor,
    d: &Tensor,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
    p: &SelectiveScanParams,
) -> Result<Tensor> {
    let t = meta.num_tokens();
    let bc = p.num_groups * p.state_size;
    let channels = p.num_heads * p.head_dim;
    let per = if p.per_channel { channels } else { p.num_heads };
    let shapes = [(x, [t, channels]), (dt, [t, per]), (b, [t, bc]), (c, [t, bc])];
    if let Some((x, want)) = shapes.iter().find(|(x, want)| x.shape() != want) {
        return Err(shape_err("selective_scan", format!("input {:?}, expected {want:?}", x.shape())));
    }
    let a_len = if p.per_channel { channels * p.state_size } else { p.num_heads };
    if [dt_bias, d].iter().any(|v| v.numel() != per)
        || a_log.numel() != a_len
        || p.num_groups == 0
        || !p.num_heads.is_multiple_of(p.num_groups)
    {
        return Err(shape_err(
            "selective_scan",
            "A_log / dt_bias / D are not one value per head (per channel), or heads / groups",
        ));
    }
    check_state_layer("selective_scan", cache, meta, cache.k_dim, channels * p.state_size)?;
    match x.storage() {
        Storage::Cpu(_) => cpu::recurrent::selective_scan(x, dt, b, c, a_log, dt_bias, d, cache, meta, p),
        Storage::Cuda(_) => cuda::recurrent::selective_scan(x, dt, b, c, a_log, dt_bias, d, cache, meta, p),
    }
}
