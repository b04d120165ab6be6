//! Turning a row of logits into the next token with vLLM V1's `Sampler` order: raw logprobs
//! first, then min-tokens masking and penalties, then greedy argmax, or temperature -> min-p ->
//! top-k -> top-p and an exponential race (`argmax(p / Exp(1))`) driven by the request's own
//! generator, so a seeded request draws the same stream whatever it is batched with.

use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rayon::prelude::*;

use crate::core::scheduler::SampledToken;
use crate::output::TokenLogprob;
use crate::params::RequestSampling;

/// One row of the batch to sample from, with the request state its processors read.
pub struct SampleRow<'a> {
    pub logits: &'a mut [f32],
    pub sampling: &'a RequestSampling,
    pub prompt: &'a [u32],
    pub output: &'a [u32],
    pub rng: &'a mut ChaCha20Rng,
}

/// Samples every row (rows are independent, so they run in parallel).
pub fn sample(rows: Vec<SampleRow<'_>>) -> Vec<SampledToken> {
    rows.into_par_iter().map(sample_row).collect()
}

fn sample_row(row: SampleRow<'_>) -> SampledToken {
    let SampleRow { logits, sampling, prompt, output, rng } = row;
    let params = &sampling.params;
    let raw_logprobs = params.logprobs.map(|_| log_softmax(logits));

    if output.len() < params.min_tokens {
        for &id in &sampling.min_tokens_mask {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    if params.has_penalties() {
        apply_penalties(
            logits,
            prompt,
            output,
            params.repetition_penalty,
            params.presence_penalty,
            params.frequency_penalty,
        );
    }

    let token_id = if params.is_greedy() {
        argmax(logits)
    } else {
        let inv_t = 1.0 / params.temperature;
        logits.iter_mut().for_each(|l| *l *= inv_t);
        if params.min_p > 0.0 {
            apply_min_p(logits, params.min_p);
        }
        if params.top_k > 0 && (params.top_k as usize) < logits.len() {
            apply_top_k(logits, params.top_k as usize);
        }
        if params.top_p < 1.0 {
            apply_top_p(logits, params.top_p);
        }
        exponential_race(logits, rng)
    };
    let logprob = raw_logprobs.map(|lp| token_logprob(&lp, token_id, params.logprobs.unwrap_or(0)));
    SampledToken { token_id, logprob }
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

pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from((v - max).exp())).sum();
    let lse = sum.ln() as f32 + max;
    row.iter().map(|&v| v - lse).collect()
}

fn softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut out: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = out.iter().sum();
    out.iter_mut().for_each(|p| *p /= sum);
    out
}

/// `token`'s logprob and rank in `logprobs`, and the `top_n` best entries (ties: lower id first).
pub fn token_logprob(logprobs: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let logprob = logprobs.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let rank = logprobs.iter().filter(|&&v| v >= logprob).count().max(1);
    TokenLogprob { token_id: token, logprob, rank, top: top_entries(logprobs, top_n) }
}

fn top_entries(values: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &v) in values.iter().enumerate() {
        if top.len() == n && v <= top[n - 1].1 {
            continue;
        }
        let at = top.partition_point(|&(_, t)| t >= v);
        top.insert(at, (i as u32, v));
        top.truncate(n);
    }
    top
}

/// vLLM's `apply_penalties`: repetition over prompt and output (divide positive logits,
/// multiply negative ones), then frequency and presence over the output only.
fn apply_penalties(logits: &mut [f32], prompt: &[u32], output: &[u32], repetition: f32, presence: f32, frequency: f32) {
    let vocab = logits.len();
    let mut output_counts = vec![0u32; vocab];
    for &t in output {
        if let Some(c) = output_counts.get_mut(t as usize) {
            *c += 1;
        }
    }
    if repetition != 1.0 {
        let mut seen = vec![false; vocab];
        for &t in prompt.iter().chain(output) {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (l, _) in logits.iter_mut().zip(&seen).filter(|(_, &s)| s) {
            *l = if *l > 0.0 { *l / repetition } else { *l * repetition };
        }
    }
    for (l, &c) in logits.iter_mut().zip(&output_counts).filter(|(_, &c)| c > 0) {
        *l -= frequency * c as f32 + presence;
    }
}

fn apply_min_p(logits: &mut [f32], min_p: f32) {
    let probs = softmax(logits);
    let threshold = probs.iter().copied().fold(0.0f32, f32::max) * min_p;
    for (l, p) in logits.iter_mut().zip(probs) {
        if p < threshold {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Keeps logits at least the k-th largest (ties at the boundary all stay, as in vLLM).
fn apply_top_k(logits: &mut [f32], k: usize) {
    let mut sorted = logits.to_vec();
    let idx = sorted.len() - k;
    let (_, kth, _) = sorted.select_nth_unstable_by(idx, f32::total_cmp);
    let kth = *kth;
    logits.iter_mut().filter(|l| **l < kth).for_each(|l| *l = f32::NEG_INFINITY);
}

/// Drops the least likely tokens whose cumulative probability stays within `1 - p`; the most
/// likely token always survives.
fn apply_top_p(logits: &mut [f32], p: f32) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]));
    let sorted: Vec<f32> = order.iter().map(|&i| logits[i as usize]).collect();
    let probs = softmax(&sorted);
    let mut cum = 0.0f32;
    let last = order.len() - 1;
    for (rank, (&i, prob)) in order.iter().zip(probs).enumerate() {
        cum += prob;
        if rank < last && cum <= 1.0 - p {
            logits[i as usize] = f32::NEG_INFINITY;
        } else if cum > 1.0 - p {
            break;
        }
    }
}

/// `argmax(softmax(logits) / q)` with `q ~ Exp(1)` per vocabulary entry: a draw from the
/// distribution. Every entry consumes one draw, so the generator advances by the same amount
/// each step whatever the truncation.
fn exponential_race(logits: &[f32], rng: &mut ChaCha20Rng) -> u32 {
    let probs = softmax(logits);
    let mut best = (0u32, f32::NEG_INFINITY);
    for (i, p) in probs.into_iter().enumerate() {
        let u: f32 = rng.random();
        let q = -(1.0 - u).ln();
        if p > 0.0 {
            let score = if q > 0.0 { p / q } else { f32::INFINITY };
            if score > best.1 {
                best = (i as u32, score);
            }
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::params::SamplingParams;

    fn sampling(params: SamplingParams) -> RequestSampling {
        RequestSampling {
            max_tokens: 16,
            eos_token_id: Some(0),
            stop_token_ids: vec![],
            min_tokens_mask: vec![0],
            seed: 0,
            params: params.normalized(),
        }
    }

    fn draw(logits: &[f32], params: SamplingParams, output: &[u32], seed: u64) -> SampledToken {
        let s = sampling(params);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut row = logits.to_vec();
        sample_row(SampleRow { logits: &mut row, sampling: &s, prompt: &[], output, rng: &mut rng })
    }

    #[test]
    fn greedy_takes_the_lowest_index_on_ties() {
        assert_eq!(draw(&[0.0, 3.0, 3.0, 1.0], SamplingParams::greedy(1), &[], 0).token_id, 1);
    }

    #[test]
    fn top_k_keeps_boundary_ties_and_top_p_keeps_the_best() {
        let mut l = vec![1.0, 4.0, 3.0, 3.0, 0.0];
        apply_top_k(&mut l, 2);
        assert_eq!(l, vec![f32::NEG_INFINITY, 4.0, 3.0, 3.0, f32::NEG_INFINITY]);
        // probs ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the two best.
        let mut l = vec![3.0, 2.0, 1.0, 0.0];
        apply_top_p(&mut l, 0.7);
        assert_eq!(l, vec![3.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        let mut l = vec![3.0, 2.0, 1.0, 0.0];
        apply_top_p(&mut l, 0.01);
        assert_eq!(l, vec![3.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_best() {
        let mut l = vec![0.0, (0.5f32).ln(), (0.05f32).ln()];
        apply_min_p(&mut l, 0.1);
        assert!(l[0].is_finite() && l[1].is_finite() && l[2] == f32::NEG_INFINITY);
    }

    #[test]
    fn penalties_follow_vllm_definitions() {
        let mut l = vec![2.0, -2.0, 2.0, 1.0];
        // token 0 in the prompt, token 1 in the output twice, token 3 untouched.
        apply_penalties(&mut l, &[0], &[1, 1], 2.0, 0.5, 0.25);
        assert_eq!(l, vec![1.0, -4.0 - 0.5 - 0.5, 2.0, 1.0]);
    }

    #[test]
    fn min_tokens_masks_eos_until_reached() {
        let logits = [10.0, 0.0, 1.0];
        assert_eq!(draw(&logits, SamplingParams { min_tokens: 2, ..SamplingParams::greedy(4) }, &[2], 0).token_id, 2);
        assert_eq!(
            draw(&logits, SamplingParams { min_tokens: 2, ..SamplingParams::greedy(4) }, &[2, 2], 0).token_id,
            0
        );
    }

    #[test]
    fn seeded_draws_follow_the_distribution() {
        let logits = [0.0, (3.0f32).ln(), f32::NEG_INFINITY];
        let params = SamplingParams { temperature: 1.0, ..Default::default() };
        let s = sampling(params);
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut counts = [0usize; 3];
        for _ in 0..4000 {
            let mut row = logits.to_vec();
            let t = sample_row(SampleRow { logits: &mut row, sampling: &s, prompt: &[], output: &[], rng: &mut rng });
            counts[t.token_id as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        let frac = counts[1] as f32 / 4000.0;
        assert!((frac - 0.75).abs() < 0.03, "{counts:?}");
    }

    #[test]
    fn logprobs_are_raw_with_rank_and_top_n() {
        let logits = [1.0, 3.0, 2.0, 3.0];
        let t = draw(
            &logits,
            SamplingParams { logprobs: Some(2), temperature: 0.0, repetition_penalty: 1.5, ..Default::default() },
            &[],
            0,
        );
        let lp = t.logprob.unwrap();
        let want = log_softmax(&logits);
        assert_eq!(lp.token_id, 1);
        assert_eq!(lp.logprob, want[1]);
        assert_eq!(lp.rank, 2, "ties count toward the rank");
        assert_eq!(lp.top, vec![(1, want[1]), (3, want[3])]);
    }
}
