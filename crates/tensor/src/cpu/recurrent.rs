//! Recurrent token mixers on the CPU, following transformers' torch fallbacks step for step (the
//! oracle): the causal depthwise conv1d in front of a linear-attention or state-space layer, the
//! gated delta rule (Gated DeltaNet, and Kimi Delta Attention's per-channel-decay form), chunked
//! for prompts and one token at a time for decode, and Mamba2's selective scan (its recurrence;
//! the reference's chunked SSD form is an exact rewrite of it that rounds differently).
//!
//! Each sequence's state lives in its slot of a state layer ([`PagedKvLayer`] with one slot per
//! sequence): the conv's last `K - 1` inputs in `k`, the `[heads, k_dim, v_dim]` delta-rule state
//! in `v`, both f32 as the references keep them.

use rayon::prelude::*;

use super::elementwise::activate;
use super::f32_tensor;
use crate::error::{Result, TensorError};
use crate::kv::{AttnMetadata, KvStorage, PagedKvLayer};
use crate::ops::{Activation, GdnParams, SelectiveScanParams};
use crate::tensor::Tensor;

fn state_slices<'a>(op: &'static str, cache: &'a mut PagedKvLayer) -> Result<(&'a mut [f32], &'a mut [f32])> {
    match &mut cache.storage {
        KvStorage::Cpu { k, v } => Ok((k, v)),
        _ => Err(TensorError::Device(format!("{op}: CPU activations with a CUDA state cache"))),
    }
}

/// One sequence of a step, as the recurrent ops see it.
struct StateSeq {
    rows: std::ops::Range<usize>,
    slot: usize,
    /// Its first chunk: the state starts from zeros.
    fresh: bool,
    /// Its tokens are prompt tokens: transformers runs a prompt through the chunked forms (with
    /// their own rounding and, for Mamba2, the dt clamp) and generated tokens one at a time.
    prefill: bool,
}

fn sequences(meta: &AttnMetadata) -> impl Iterator<Item = StateSeq> + '_ {
    meta.seqs.iter().zip(&meta.state_slots).enumerate().map(|(i, (s, &slot))| {
        let fresh = s.ctx_len == s.q_len;
        StateSeq { rows: s.q_start..s.q_start + s.q_len, slot, fresh, prefill: crate::kv::is_prefill(meta, i) }
    })
}

/// `x [tokens, channels]` through a causal depthwise conv of `weight [channels, kernel]` whose
/// left context is each sequence's cached last `kernel - 1` inputs (zeros for a new sequence);
/// the cache then holds the sequence's last `kernel - 1` inputs.
pub fn causal_conv1d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    act: Option<Activation>,
    cache: &mut PagedKvLayer,
    meta: &AttnMetadata,
) -> Result<Tensor> {
    let (xs, ws) = (x.as_f32_slice()?, weight.as_f32_slice()?);
    let bias = bias.map(|b| b.as_f32_slice()).transpose()?;
    let (channels, kernel) = (weight.shape()[0], weight.shape()[1]);
    let hist = kernel - 1;
    let (conv_state, _) = state_slices("causal_conv1d", cache)?;
    let mut out = vec![0f32; xs.len()];
    for StateSeq { rows, slot, fresh, .. } in sequences(meta) {
        let state = &mut conv_state[slot * hist * channels..(slot + 1) * hist * channels];
        if fresh {
            state.fill(0.0);
        }
        // The sequence's inputs with their left context: [hist + rows, channels].
        let mut window = Vec::with_capacity((hist + rows.len()) * channels);
        window.extend_from_slice(state);
        window.extend_from_slice(&xs[rows.start * channels..rows.end * channels]);
        for (t, row) in rows.clone().enumerate() {
            let o = &mut out[row * channels..(row + 1) * channels];
            for (c, o) in o.iter_mut().enumerate() {
                let mut acc = bias.map_or(0.0, |b| b[c]);
                for j in 0..kernel {
                    acc += ws[c * kernel + j] * window[(t + j) * channels + c];
                }
                *o = act.map_or(acc, |a| activate(a, acc));
            }
        }
        let n = window.len() / channels;
        state.copy_from_slice(&window[(n - hist) * channels..]);
    }
    Ok(f32_tensor(out, x.shape().to_vec()))
}

fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// KDA's l2norm: divides by the norm where Gated DeltaNet's multiplies by its inverse.
fn l2norm_div(x: &mut [f32]) {
    let norm = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v /= norm);
}

fn softplus(x: f32) -> f32 {
    // torch's softplus (beta 1, threshold 20).
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One value head of one sequence: its inputs gathered per token.
struct HeadInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Log decays, `gw` per token: one for the head, or one per key channel (KDA).
    g: Vec<f32>,
    gw: usize,
    beta: Vec<f32>,
}

/// The gated delta rule over `q, k [tokens, k_heads * k_dim]`, `v [tokens, v_heads * v_dim]`, with
/// the gates computed here from the raw projections: `beta = sigmoid(b)` and
/// `g = -exp(a_log) * softplus(a + dt_bias)` (`a, b [tokens, v_heads]`). Queries and keys are
/// L2-normalised; each key head serves `v_heads / k_heads` consecutive value heads.
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
    let (qs, ks, vs) = (q.as_f32_slice()?, k.as_f32_slice()?, v.as_f32_slice()?);
    let (as_, bs) = (a.as_f32_slice()?, b.as_f32_slice()?);
    let (a_log, dt_bias) = (a_log.as_f32_slice()?, dt_bias.as_f32_slice()?);
    let (hk, hv, dk, dv) = (p.num_k_heads, p.num_v_heads, p.k_dim, p.v_dim);
    let group = hv / hk;
    let gw = p.gate_width();
    let tokens = q.rows();
    let state_len = dk * dv;
    let (_, states) = state_slices("gated_delta_rule", cache)?;
    let mut out = vec![0f32; tokens * hv * dv];
    for StateSeq { rows, slot, fresh, prefill } in sequences(meta) {
        let seq_states = &mut states[slot * hv * state_len..(slot + 1) * hv * state_len];
        if fresh {
            seq_states.fill(0.0);
        }
        // transformers runs a single cached token through the recurrent rule, anything else
        // (a prompt, a prompt chunk) through the chunked one.
        let recurrent = !prefill;
        let heads: Vec<Vec<f32>> = seq_states
            .par_chunks_mut(state_len)
            .enumerate()
            .map(|(h, state)| {
                let kh = h / group;
                let mut inp = HeadInputs {
                    q: Vec::with_capacity(rows.len() * dk),
                    k: Vec::with_capacity(rows.len() * dk),
                    v: Vec::with_capacity(rows.len() * dv),
                    g: Vec::with_capacity(rows.len() * gw),
                    gw,
                    beta: Vec::with_capacity(rows.len()),
                };
                for r in rows.clone() {
                    let (mut qr, mut kr) = (
                        qs[(r * hk + kh) * dk..(r * hk + kh + 1) * dk].to_vec(),
                        ks[(r * hk + kh) * dk..(r * hk + kh + 1) * dk].to_vec(),
                    );
                    // transformers: Gated DeltaNet's recurrent form (one cached token) divides
                    // the query by sqrt(dk), its chunked one multiplies it by dk^-0.5; KDA's
                    // forms both multiply by 1 / sqrt(dk).
                    if p.channel_decay {
                        l2norm_div(&mut qr);
                        l2norm_div(&mut kr);
                        let scale = (1.0 / (dk as f64).sqrt()) as f32;
                        qr.iter_mut().for_each(|x| *x *= scale);
                    } else if recurrent {
                        l2norm(&mut qr);
                        l2norm(&mut kr);
                        let root = (dk as f32).sqrt();
                        qr.iter_mut().for_each(|x| *x /= root);
                    } else {
                        l2norm(&mut qr);
                        l2norm(&mut kr);
                        let scale = (dk as f64).powf(-0.5) as f32;
                        qr.iter_mut().for_each(|x| *x *= scale);
                    }
                    inp.q.extend_from_slice(&qr);
                    inp.k.extend_from_slice(&kr);
                    inp.v.extend_from_slice(&vs[(r * hv + h) * dv..(r * hv + h + 1) * dv]);
                    if p.channel_decay {
                        // KDA's gate: `-exp(A_log) * log(1 + exp(f + dt_bias))` per channel.
                        let rate = -a_log[h].exp();
                        for c in 0..dk {
                            let x = as_[(r * hv + h) * dk + c] + dt_bias[h * dk + c];
                            inp.g.push(rate * if x > 20.0 { x } else { (1.0 + x.exp()).ln() });
                        }
                    } else {
                        inp.g.push(-a_log[h].exp() * softplus(as_[r * hv + h] + dt_bias[h]));
                    }
                    inp.beta.push(1.0 / (1.0 + (-bs[r * hv + h]).exp()) * p.beta_scale);
                }
                if recurrent {
                    (0..inp.beta.len()).flat_map(|t| recurrent_step(&inp.token(t, dk, dv), state, dk, dv)).collect()
                } else if p.channel_decay {
                    chunked_channel(&inp, state, dk, dv, p.chunk_size)
                } else {
                    chunked(&inp, state, dk, dv, p.chunk_size)
                }
            })
            .collect();
        for (h, head_out) in heads.iter().enumerate() {
            for (t, r) in rows.clone().enumerate() {
                out[(r * hv + h) * dv..(r * hv + h + 1) * dv].copy_from_slice(&head_out[t * dv..(t + 1) * dv]);
            }
        }
    }
    Ok(f32_tensor(out, vec![tokens, hv * dv]))
}

impl HeadInputs {
    /// Token `t` alone.
    fn token(&self, t: usize, dk: usize, dv: usize) -> HeadInputs {
        HeadInputs {
            q: self.q[t * dk..(t + 1) * dk].to_vec(),
            k: self.k[t * dk..(t + 1) * dk].to_vec(),
            v: self.v[t * dv..(t + 1) * dv].to_vec(),
            g: self.g[t * self.gw..(t + 1) * self.gw].to_vec(),
            gw: self.gw,
            beta: vec![self.beta[t]],
        }
    }
}

/// transformers' `torch_recurrent_gated_delta_rule` (and KDA's `recurrent_kimi_delta_attention`,
/// whose decay is per state row) for one token.
fn recurrent_step(inp: &HeadInputs, state: &mut [f32], dk: usize, dv: usize) -> Vec<f32> {
    for (i, row) in state.chunks_mut(dv).enumerate() {
        let decay = inp.g[if inp.gw == 1 { 0 } else { i }].exp();
        row.iter_mut().for_each(|s| *s *= decay);
    }
    let mut delta = vec![0f32; dv];
    for (j, d) in delta.iter_mut().enumerate() {
        let mem: f32 = (0..dk).map(|i| state[i * dv + j] * inp.k[i]).sum();
        *d = (inp.v[j] - mem) * inp.beta[0];
    }
    for i in 0..dk {
        for j in 0..dv {
            state[i * dv + j] += inp.k[i] * delta[j];
        }
    }
    (0..dv).map(|j| (0..dk).map(|i| state[i * dv + j] * inp.q[i]).sum()).collect()
}

/// transformers' `torch_chunk_gated_delta_rule`: within a chunk the delta-rule updates are solved
/// as one unit-lower-triangular system (the UT transform), and the state is carried between
/// chunks. A short last chunk is computed at its own length: the reference's zero padding adds
/// nothing to the state or to the real rows.
fn chunked(inp: &HeadInputs, state: &mut [f32], dk: usize, dv: usize, chunk_size: usize) -> Vec<f32> {
    let n = inp.g.len();
    let mut out = vec![0f32; n * dv];
    let dot = |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| x * y).sum() };
    for start in (0..n).step_by(chunk_size) {
        let c = chunk_size.min(n - start);
        let row = |m: &[f32], w: usize, i: usize| m[(start + i) * w..(start + i + 1) * w].to_vec();
        let rows = |m: &[f32], w: usize| -> Vec<Vec<f32>> { (0..c).map(|i| row(m, w, i)).collect() };
        let (q, k, v) = (rows(&inp.q, dk), rows(&inp.k, dk), rows(&inp.v, dv));
        let beta = &inp.beta[start..start + c];
        let mut cum = vec![0f32; c];
        let mut acc = 0f32;
        for (i, cu) in cum.iter_mut().enumerate() {
            acc += inp.g[start + i];
            *cu = acc;
        }
        let k_beta: Vec<Vec<f32>> = k.iter().zip(beta).map(|(r, &b)| r.iter().map(|x| x * b).collect()).collect();
        let v_beta: Vec<Vec<f32>> = v.iter().zip(beta).map(|(r, &b)| r.iter().map(|x| x * b).collect()).collect();
        let decay = |i: usize, j: usize| if j <= i { (cum[i] - cum[j]).exp() } else { 0.0 };
        // Forward substitution with the strictly lower part of (k_beta k^T) * decay (the unit
        // diagonal is implied, as solve_triangular's unitriangular reads it).
        let ut = |i: usize, j: usize| dot(&k_beta[i], &k[j]) * decay(i, j);
        let mut new_values: Vec<Vec<f32>> = Vec::with_capacity(c);
        let mut k_cumdecay: Vec<Vec<f32>> = Vec::with_capacity(c);
        for i in 0..c {
            let e = cum[i].exp();
            let mut xv = v_beta[i].clone();
            let mut xk: Vec<f32> = k_beta[i].iter().map(|x| x * e).collect();
            for j in 0..i {
                let a = ut(i, j);
                xv.iter_mut().zip(&new_values[j]).for_each(|(x, y)| *x -= a * y);
                xk.iter_mut().zip(&k_cumdecay[j]).for_each(|(x, y): (&mut f32, &f32)| *x -= a * y);
            }
            new_values.push(xv);
            k_cumdecay.push(xk);
        }
        let intra: Vec<Vec<f32>> = (0..c).map(|i| (0..c).map(|j| dot(&q[i], &k[j]) * decay(i, j)).collect()).collect();
        let last = cum[c - 1];
        // v_new = new_values - k_cumdecay @ S
        let v_new = state_corrected(&new_values, &k_cumdecay, state, dk, dv);
        for i in 0..c {
            let e = cum[i].exp();
            let qd: Vec<f32> = q[i].iter().map(|x| x * e).collect();
            chunk_row_output(&mut out[(start + i) * dv..(start + i + 1) * dv], &qd, &intra[i], &v_new, state);
        }
        let chunk_decay = last.exp();
        let k_dec: Vec<Vec<f32>> = (0..c).map(|i| k[i].iter().map(|x| x * (last - cum[i]).exp()).collect()).collect();
        for m in 0..dk {
            for j in 0..dv {
                let upd: f32 = (0..c).map(|t| k_dec[t][m] * v_new[t][j]).sum();
                state[m * dv + j] = state[m * dv + j] * chunk_decay + upd;
            }
        }
    }
    out
}

/// The chunk's values less what the state entering the chunk already predicts of them:
/// `new_values - k_cumdecay @ state` (`state` is `[dk, dv]`).
fn state_corrected(
    new_values: &[Vec<f32>],
    k_cumdecay: &[Vec<f32>],
    state: &[f32],
    dk: usize,
    dv: usize,
) -> Vec<Vec<f32>> {
    new_values
        .iter()
        .zip(k_cumdecay)
        .map(|(nv, kc)| (0..dv).map(|j| nv[j] - (0..dk).map(|m| kc[m] * state[m * dv + j]).sum::<f32>()).collect())
        .collect()
}

/// One token's output row in a chunk: its decayed query against the state entering the chunk,
/// plus its causal attention weights (`intra`) over the chunk's corrected values.
fn chunk_row_output(out: &mut [f32], q_decayed: &[f32], intra: &[f32], v_new: &[Vec<f32>], state: &[f32]) {
    let dv = out.len();
    for (j, o) in out.iter_mut().enumerate() {
        let inter: f32 = q_decayed.iter().enumerate().map(|(m, q)| q * state[m * dv + j]).sum();
        let local: f32 = intra.iter().zip(v_new).map(|(w, v)| w * v[j]).sum();
        *o = inter + local;
    }
}

/// KDA's `chunk_kimi_delta_attention`: [`chunked`] with a decay per key channel, so the decays
/// sit inside the key products (`sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d])`) instead of scaling
/// them, and the state's rows decay apart.
fn chunked_channel(inp: &HeadInputs, state: &mut [f32], dk: usize, dv: usize, chunk_size: usize) -> Vec<f32> {
    let n = inp.beta.len();
    let mut out = vec![0f32; n * dv];
    for start in (0..n).step_by(chunk_size) {
        let c = chunk_size.min(n - start);
        let row = |m: &[f32], w: usize, i: usize| m[(start + i) * w..(start + i + 1) * w].to_vec();
        let rows = |m: &[f32], w: usize| -> Vec<Vec<f32>> { (0..c).map(|i| row(m, w, i)).collect() };
        let (q, k, v) = (rows(&inp.q, dk), rows(&inp.k, dk), rows(&inp.v, dv));
        let beta = &inp.beta[start..start + c];
        // Cumulative log decays per channel: [c][dk].
        let mut cum = rows(&inp.g, dk);
        for i in 1..c {
            let (done, rest) = cum.split_at_mut(i);
            rest[0].iter_mut().zip(&done[i - 1]).for_each(|(x, prev)| *x += prev);
        }
        let k_beta: Vec<Vec<f32>> = k.iter().zip(beta).map(|(r, &b)| r.iter().map(|x| x * b).collect()).collect();
        let v_beta: Vec<Vec<f32>> = v.iter().zip(beta).map(|(r, &b)| r.iter().map(|x| x * b).collect()).collect();
        let decayed = |a: &[f32], i: usize, j: usize| -> f32 {
            (0..dk).map(|d| a[d] * k[j][d] * (cum[i][d] - cum[j][d]).exp()).sum()
        };
        let mut new_values: Vec<Vec<f32>> = Vec::with_capacity(c);
        let mut k_cumdecay: Vec<Vec<f32>> = Vec::with_capacity(c);
        for i in 0..c {
            let mut xv = v_beta[i].clone();
            let mut xk: Vec<f32> = k_beta[i].iter().zip(&cum[i]).map(|(x, g)| x * g.exp()).collect();
            for j in 0..i {
                let a = decayed(&k_beta[i], i, j);
                xv.iter_mut().zip(&new_values[j]).for_each(|(x, y)| *x -= a * y);
                xk.iter_mut().zip(&k_cumdecay[j]).for_each(|(x, y): (&mut f32, &f32)| *x -= a * y);
            }
            new_values.push(xv);
            k_cumdecay.push(xk);
        }
        let intra: Vec<Vec<f32>> =
            (0..c).map(|i| (0..c).map(|j| if j <= i { decayed(&q[i], i, j) } else { 0.0 }).collect()).collect();
        let v_new = state_corrected(&new_values, &k_cumdecay, state, dk, dv);
        for i in 0..c {
            let qd: Vec<f32> = q[i].iter().zip(&cum[i]).map(|(x, g)| x * g.exp()).collect();
            chunk_row_output(&mut out[(start + i) * dv..(start + i + 1) * dv], &qd, &intra[i], &v_new, state);
        }
        let last = &cum[c - 1];
        let k_dec: Vec<Vec<f32>> =
            (0..c).map(|i| k[i].iter().enumerate().map(|(m, x)| x * (last[m] - cum[i][m]).exp()).collect()).collect();
        for m in 0..dk {
            let chunk_decay = last[m].exp();
            for j in 0..dv {
                let upd: f32 = (0..c).map(|t| k_dec[t][m] * v_new[t][j]).sum();
                state[m * dv + j] = state[m * dv + j] * chunk_decay + upd;
            }
        }
    }
    out
}

/// Mamba2's selective scan over `x [tokens, heads * head_dim]`, `dt [tokens, heads]` (raw),
/// `b, c [tokens, groups * state]`: per head `dt = softplus(dt + dt_bias)` (clamped to
/// `p.dt_limit` where transformers runs its chunked form, i.e. for prompts), then
/// `h = exp(dt * A) h + dt B x`, `y = C h + D x` with `A = -exp(a_log)`. Each sequence's
/// `[heads, head_dim, state]` state is read from and written back to its slot of `cache`.
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
    let (xs, dts, bs, cs) = (x.as_f32_slice()?, dt.as_f32_slice()?, b.as_f32_slice()?, c.as_f32_slice()?);
    let (a_log, dt_bias, ds) = (a_log.as_f32_slice()?, dt_bias.as_f32_slice()?, d.as_f32_slice()?);
    let (heads, hd, groups, n) = (p.num_heads, p.head_dim, p.num_groups, p.state_size);
    let per_group = heads / groups;
    let tokens = x.rows();
    let (_, states) = state_slices("selective_scan", cache)?;
    let state_len = hd * n;
    let mut out = vec![0f32; tokens * heads * hd];
    for StateSeq { rows, slot, fresh, prefill } in sequences(meta) {
        let seq_states = &mut states[slot * heads * state_len..(slot + 1) * heads * state_len];
        if fresh {
            seq_states.fill(0.0);
        }
        let chunked = prefill;
        let heads_out: Vec<Vec<f32>> = seq_states
            .par_chunks_mut(state_len)
            .enumerate()
            .map(|(h, state)| {
                let g = h / per_group;
                let mut y = Vec::with_capacity(rows.len() * hd);
                for r in rows.clone() {
                    let (bg, cg) = (
                        &bs[(r * groups + g) * n..(r * groups + g + 1) * n],
                        &cs[(r * groups + g) * n..(r * groups + g + 1) * n],
                    );
                    for i in 0..hd {
                        // The parameters' index: the head (Mamba2) or the channel (Mamba).
                        let (at, width) = if p.per_channel { (h * hd + i, heads * hd) } else { (h, heads) };
                        let mut delta = softplus(dts[r * width + at] + dt_bias[at]);
                        if chunked {
                            delta = delta.clamp(p.dt_limit.0, p.dt_limit.1);
                        }
                        let xi = xs[(r * heads + h) * hd + i];
                        let row = &mut state[i * n..(i + 1) * n];
                        let mut acc = 0f32;
                        let head_decay = (delta * -a_log[h].exp()).exp();
                        for (k, ((s, &bv), &cv)) in row.iter_mut().zip(bg).zip(cg).enumerate() {
                            let decay =
                                if p.per_channel { (delta * -a_log[at * n + k].exp()).exp() } else { head_decay };
                            *s = *s * decay + delta * bv * xi;
                            acc += cv * *s;
                        }
                        y.push(acc + xi * ds[at]);
                    }
                }
                y
            })
            .collect();
        for (h, head_out) in heads_out.iter().enumerate() {
            for (t, r) in rows.clone().enumerate() {
                out[(r * heads + h) * hd..(r * heads + h + 1) * hd].copy_from_slice(&head_out[t * hd..(t + 1) * hd]);
            }
        }
    }
    Ok(f32_tensor(out, vec![tokens, heads * hd]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::AttnSeq;

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    /// `gw` log decays per token: 1 (a head's), or `dk` (KDA's per channel).
    fn head(n: usize, dk: usize, dv: usize, gw: usize) -> HeadInputs {
        let mut q = rand(n * dk, 1);
        let mut k = rand(n * dk, 2);
        for r in 0..n {
            l2norm(&mut q[r * dk..(r + 1) * dk]);
            l2norm(&mut k[r * dk..(r + 1) * dk]);
        }
        HeadInputs {
            q,
            k,
            v: rand(n * dv, 3),
            g: rand(n * gw, 4).iter().map(|x| -(x + 0.6)).collect(),
            gw,
            beta: rand(n, 5).iter().map(|x| x + 0.5).collect(),
        }
    }

    /// The chunked form is an exact rewrite of the token-by-token recurrence: outputs and final
    /// state agree for any chunk size, including chunks that split the sequence unevenly.
    #[test]
    fn chunked_rule_equals_the_recurrence() {
        chunked_form_equals_the_recurrence(1, chunked);
    }

    /// The same for KDA's per-channel decay and its chunked form.
    #[test]
    fn channel_chunked_rule_equals_the_recurrence() {
        chunked_form_equals_the_recurrence(8, chunked_channel);
    }

    type ChunkedForm = fn(&HeadInputs, &mut [f32], usize, usize, usize) -> Vec<f32>;

    fn chunked_form_equals_the_recurrence(gw: usize, form: ChunkedForm) {
        let (n, dk, dv) = (37, 8, 6);
        let inp = head(n, dk, dv, gw);
        let mut s_rec = vec![0f32; dk * dv];
        let mut rec = Vec::new();
        for t in 0..n {
            rec.extend(recurrent_step(&inp.token(t, dk, dv), &mut s_rec, dk, dv));
        }
        for chunk in [1, 5, 16, 64] {
            let mut s = vec![0f32; dk * dv];
            let out = form(&inp, &mut s, dk, dv, chunk);
            let err = out.iter().zip(&rec).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let serr = s.iter().zip(&s_rec).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4 && serr < 1e-4, "chunk {chunk}: output error {err}, state error {serr}");
        }
    }

    /// A prompt run in two steps (state carried through the cache slot) gives the same outputs as
    /// one step, and a fresh sequence in a reused slot ignores what the slot held.
    #[test]
    fn carried_state_equals_one_pass() {
        let (channels, kernel, n) = (6, 4, 11);
        let x = rand(n * channels, 7);
        let w = Tensor::from_f32(rand(channels * kernel, 8), &[channels, kernel]).unwrap();
        let mut cache = PagedKvLayer::new_cpu(2, 1, 1, (kernel - 1) * channels, 1);
        let run = |cache: &mut PagedKvLayer, rows: std::ops::Range<usize>, ctx: usize| {
            let seq = AttnSeq { q_start: 0, q_len: rows.len(), ctx_len: ctx, block_table: vec![0; ctx] };
            let meta = AttnMetadata::new(vec![seq], 1).unwrap().with_state_slots(vec![1]).unwrap();
            let t = Tensor::from_f32(x[rows.start * channels..rows.end * channels].to_vec(), &[rows.len(), channels])
                .unwrap();
            causal_conv1d(&t, &w, None, Some(Activation::Silu), cache, &meta).unwrap().to_f32_vec()
        };
        if let KvStorage::Cpu { k, .. } = &mut cache.storage {
            k.fill(3.0);
        }
        let whole = run(&mut cache, 0..n, n);
        let mut split = run(&mut cache, 0..4, 4);
        split.extend(run(&mut cache, 4..5, 5));
        split.extend(run(&mut cache, 5..n, n));
        assert_eq!(whole, split);
    }
}
