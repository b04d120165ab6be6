//! Turning rows of logits into next tokens in vLLM V1's `Sampler` order: raw logprobs first, then
//! the logits processors (min-tokens masks, penalties), then one draw per row by
//! [`ops::sample_rows`]: greedy argmax, or temperature -> min-p -> top-k -> top-p and an
//! exponential race whose uniforms are a Philox stream keyed by the request's seed at counter
//! (output tokens so far, token id). Nothing else feeds the draw, so a seeded request draws the
//! same tokens on either backend, whatever it is batched with, whether or not it asks for
//! logprobs, and again when it is computed anew after a preemption.

use ferrite_tensor::ops::{self, RowSampling};
use ferrite_tensor::Tensor;
use rayon::prelude::*;

use crate::core::scheduler::SampledToken;
use crate::error::Result;
use crate::output::TokenLogprob;
use crate::params::RequestSampling;

/// One row of the batch to sample from, with the request state its processors read.
pub struct SampleRow<'a> {
    pub sampling: &'a RequestSampling,
    pub prompt: &'a [u32],
    pub output: &'a [u32],
}

impl SampleRow<'_> {
    /// Whether a logits processor may change the row before the draw.
    fn is_processed(&self) -> bool {
        self.masks_min_tokens()
            || self.sampling.params.has_penalties()
            || self.sampling.params.has_token_filters()
            || !self.sampling.bad_words_token_ids.is_empty()
    }

    fn masks_min_tokens(&self) -> bool {
        self.output.len() < self.sampling.params.min_tokens && !self.sampling.min_tokens_mask.is_empty()
    }

    /// vLLM V1's processors in its order: allowed token ids, bad words, min tokens, logit bias,
    /// penalties.
    fn process(&self, logits: &mut [f32]) {
        let p = &self.sampling.params;
        if let Some(allowed) = &p.allowed_token_ids {
            let mut keep = vec![false; logits.len()];
            for &id in allowed {
                if let Some(k) = keep.get_mut(id as usize) {
                    *k = true;
                }
            }
            for (l, _) in logits.iter_mut().zip(&keep).filter(|(_, &k)| !k) {
                *l = f32::NEG_INFINITY;
            }
        }
        for word in &self.sampling.bad_words_token_ids {
            let Some((&last, prefix)) = word.split_last() else { continue };
            if self.output.ends_with(prefix) {
                if let Some(l) = logits.get_mut(last as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if self.masks_min_tokens() {
            for &id in &self.sampling.min_tokens_mask {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.has_penalties() {
            apply_penalties(
                logits,
                self.prompt,
                self.output,
                p.repetition_penalty,
                p.presence_penalty,
                p.frequency_penalty,
            );
        }
    }

    /// The draw's parameters. The step is the number of output tokens so far: it names the
    /// token being drawn, not the engine step or the row's place in the batch, and it survives
    /// a preemption (the runner keeps the output tokens).
    fn plan(&self) -> RowSampling {
        let p = &self.sampling.params;
        RowSampling {
            temperature: if p.is_greedy() { 0.0 } else { p.temperature },
            top_k: u32::try_from(p.top_k).unwrap_or(0),
            top_p: p.top_p,
            min_p: p.min_p,
            seed: self.sampling.seed,
            step: self.output.len() as u64,
        }
    }
}

/// One token per row of `logits [rows.len(), vocab]`, on whatever device holds them. Only rows
/// asking for logprobs or changed by a processor cross to the host; the changed ones go back to
/// the logits' device, so that every token comes from the same `sample_rows`.
///
/// `token_masks` (structured outputs; `ceil(vocab / 32)` words a row) apply first, on the
/// logits' device, as vLLM applies its grammar bitmask before its sampler: logprobs are those of
/// the masked logits.
pub fn sample(logits: &Tensor, rows: &[SampleRow<'_>], token_masks: Option<&[u32]>) -> Result<Vec<SampledToken>> {
    sample_with(logits, rows, token_masks, true)
}

/// The tokens [`sample`] draws, without the logprobs (a draft model's draws).
pub fn draw_tokens(logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<u32>> {
    Ok(sample_with(logits, rows, None, false)?.into_iter().map(|s| s.token_id).collect())
}

fn sample_with(
    logits: &Tensor,
    rows: &[SampleRow<'_>],
    token_masks: Option<&[u32]>,
    with_logprobs: bool,
) -> Result<Vec<SampledToken>> {
    let wants_logprobs = |row: &SampleRow| with_logprobs && row.sampling.params.logprobs.is_some();
    let masked;
    let logits = match token_masks {
        Some(bitmask) => {
            masked = ops::mask_tokens(logits, bitmask)?;
            &masked
        }
        None => logits,
    };
    let vocab = logits.last_dim();
    let processed: Vec<bool> = rows.iter().map(SampleRow::is_processed).collect();
    let host_rows: Vec<usize> = (0..rows.len()).filter(|&i| processed[i] || wants_logprobs(&rows[i])).collect();
    let mut host = if host_rows.is_empty() { Vec::new() } else { ops::gather_rows(logits, &host_rows)?.to_f32_vec() };
    let mut raw_logprobs: Vec<Option<Vec<f32>>> = vec![None; rows.len()];
    let computed: Vec<Option<Vec<f32>>> = host
        .par_chunks_mut(vocab)
        .zip(host_rows.par_iter())
        .map(|(row, &i)| {
            let raw = wants_logprobs(&rows[i]).then(|| log_softmax(row));
            if processed[i] {
                rows[i].process(row);
            }
            raw
        })
        .collect();
    for (&i, raw) in host_rows.iter().zip(computed) {
        raw_logprobs[i] = raw;
    }

    let mut tokens = vec![0u32; rows.len()];
    let plain: Vec<usize> = (0..rows.len()).filter(|&i| !processed[i]).collect();
    if !plain.is_empty() {
        draw(&ops::gather_rows(logits, &plain)?, rows, &plain, &mut tokens)?;
    }
    let changed: Vec<usize> = host_rows.iter().copied().filter(|&i| processed[i]).collect();
    if !changed.is_empty() {
        let data: Vec<f32> = host
            .chunks(vocab)
            .zip(&host_rows)
            .filter(|&(_, &i)| processed[i])
            .flat_map(|(row, _)| row.iter().copied())
            .collect();
        let on_device = Tensor::from_f32(data, &[changed.len(), vocab])?.to_device(logits.device())?;
        draw(&on_device, rows, &changed, &mut tokens)?;
    }

    Ok(tokens
        .into_iter()
        .zip(raw_logprobs)
        .zip(rows)
        .map(|((token_id, raw), row)| SampledToken {
            token_id,
            logprob: raw.map(|lp| token_logprob(&lp, token_id, row.sampling.params.logprobs.unwrap_or(0))),
        })
        .collect())
}

/// Samples `logits` (the rows `which` of the batch, in order) into `tokens`.
fn draw(logits: &Tensor, rows: &[SampleRow<'_>], which: &[usize], tokens: &mut [u32]) -> Result<()> {
    let plans: Vec<RowSampling> = which.iter().map(|&i| rows[i].plan()).collect();
    // `sample_rows` takes a greedy row's argmax too; a batch of them skips its filters.
    let ids = if plans.iter().all(|p| p.temperature == 0.0) {
        ops::argmax_rows(logits)?
    } else {
        ops::sample_rows(logits, &plans)?
    };
    for (&i, id) in which.iter().zip(ids) {
        tokens[i] = id;
    }
    Ok(())
}

pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from((v - max).exp())).sum();
    let lse = sum.ln() as f32 + max;
    row.iter().map(|&v| v - lse).collect()
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::params::SamplingParams;

    fn sampling(params: SamplingParams, seed: u64) -> RequestSampling {
        RequestSampling {
            multimodal: None,
            max_tokens: 16,
            eos_token_id: Some(0),
            stop_token_ids: vec![],
            min_tokens_mask: vec![0],
            seed,
            params: params.normalized(),
            grammar: None,
            bad_words_token_ids: Vec::new(),
        }
    }

    fn draw(logits: &[f32], params: SamplingParams, output: &[u32], seed: u64) -> SampledToken {
        let s = sampling(params, seed);
        let t = Tensor::from_f32(logits.to_vec(), &[1, logits.len()]).unwrap();
        sample(&t, &[SampleRow { sampling: &s, prompt: &[], output }], None).unwrap().remove(0)
    }

    /// The tokens drawn at steps `0..steps` (an output of that many placeholder tokens each).
    fn draws(logits: &[f32], params: SamplingParams, steps: usize) -> Vec<u32> {
        let output = vec![1u32; steps];
        (0..steps).map(|n| draw(logits, params.clone(), &output[..n], 5).token_id).collect()
    }

    fn temperature(t: f32) -> SamplingParams {
        SamplingParams { temperature: t, ..Default::default() }
    }

    #[test]
    fn greedy_takes_the_lowest_index_on_ties() {
        assert_eq!(draw(&[0.0, 3.0, 3.0, 1.0], SamplingParams::greedy(1), &[], 0).token_id, 1);
    }

    #[test]
    fn top_k_keeps_boundary_ties_and_top_p_keeps_the_best() {
        let set = |logits: &[f32], params| draws(logits, params, 300).into_iter().collect::<HashSet<u32>>();
        let top_k = SamplingParams { top_k: 2, ..temperature(1.0) };
        assert_eq!(set(&[1.0, 4.0, 3.0, 3.0, 0.0], top_k), HashSet::from([1, 2, 3]));
        // probs ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.7 keeps the two best.
        assert_eq!(
            set(&[3.0, 2.0, 1.0, 0.0], SamplingParams { top_p: 0.7, ..temperature(1.0) }),
            HashSet::from([0, 1])
        );
        assert_eq!(set(&[3.0, 2.0, 1.0, 0.0], SamplingParams { top_p: 0.01, ..temperature(1.0) }), HashSet::from([0]));
    }

    #[test]
    fn min_p_drops_tokens_below_the_scaled_best() {
        let logits = [0.0, (0.5f32).ln(), (0.05f32).ln()];
        let seen: HashSet<u32> =
            draws(&logits, SamplingParams { min_p: 0.1, ..temperature(1.0) }, 300).into_iter().collect();
        assert_eq!(seen, HashSet::from([0, 1]));
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
    fn allowed_ids_bad_words_and_logit_bias_act_in_vllm_order() {
        let logits = [5.0, 4.0, 3.0, 2.0];
        let greedy = |params: SamplingParams, bad: Vec<Vec<u32>>, output: &[u32]| {
            let s = RequestSampling { bad_words_token_ids: bad, ..sampling(params, 0) };
            let t = Tensor::from_f32(logits.to_vec(), &[1, 4]).unwrap();
            sample(&t, &[SampleRow { sampling: &s, prompt: &[], output }], None).unwrap()[0].token_id
        };
        let allowed = SamplingParams { allowed_token_ids: Some(vec![2, 3]), ..SamplingParams::greedy(4) };
        assert_eq!(greedy(allowed, vec![], &[]), 2);
        let biased = SamplingParams { logit_bias: vec![(3, 10.0), (0, -100.0)], ..SamplingParams::greedy(4) };
        assert_eq!(greedy(biased, vec![], &[]), 3);
        // A one-token bad word is always banned; a longer one only where its prefix ends the output.
        assert_eq!(greedy(SamplingParams::greedy(4), vec![vec![0]], &[]), 1);
        assert_eq!(greedy(SamplingParams::greedy(4), vec![vec![2, 0]], &[1]), 0);
        assert_eq!(greedy(SamplingParams::greedy(4), vec![vec![2, 0]], &[1, 2]), 1);
    }

    #[test]
    fn seeded_draws_follow_the_distribution() {
        let logits = [0.0, (3.0f32).ln(), f32::NEG_INFINITY];
        let mut counts = [0usize; 3];
        for t in draws(&logits, temperature(1.0), 4000) {
            counts[t as usize] += 1;
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

    struct Case {
        logits: Vec<f32>,
        sampling: RequestSampling,
        prompt: Vec<u32>,
        output: Vec<u32>,
    }

    /// The host path (logprobs, masks, penalties, mixed batches) draws what `sample_rows` draws
    /// for the processed logits at step = output length: the CUDA kernel's definition, which
    /// `sample_rows_matches_cpu` in the tensor crate holds the device to.
    #[test]
    fn every_row_draws_what_sample_rows_draws() {
        let mut r = StdRng::seed_from_u64(3);
        for vocab in [7usize, 64, 1000] {
            let cases: Vec<Case> = (0..48)
                .map(|_| {
                    let params = SamplingParams {
                        temperature: [0.0, 0.005, 0.3, 0.9, 1.7][r.random_range(0..5)],
                        top_k: [-1, 0, 1, 3, 50][r.random_range(0..5)],
                        top_p: [1.0, 0.95, 0.5][r.random_range(0..3)],
                        min_p: [0.0, 0.0, 0.05][r.random_range(0..3)],
                        repetition_penalty: [1.0, 1.0, 1.3][r.random_range(0..3)],
                        presence_penalty: [0.0, 0.0, 0.5][r.random_range(0..3)],
                        min_tokens: [0, 0, 4][r.random_range(0..3)],
                        logprobs: [None, Some(0), Some(3)][r.random_range(0..3)],
                        ..Default::default()
                    };
                    let sampling = RequestSampling { min_tokens_mask: vec![0, 2], ..sampling(params, r.random()) };
                    let scale = [0.5f32, 4.0, 20.0][r.random_range(0..3)];
                    let logits = (0..vocab).map(|_| r.random_range(-scale..scale)).collect();
                    let prompt = (0..r.random_range(1..10)).map(|_| r.random_range(0..vocab as u32)).collect();
                    let output = (0..r.random_range(0..8)).map(|_| r.random_range(0..vocab as u32)).collect();
                    Case { logits, sampling, prompt, output }
                })
                .collect();
            let rows: Vec<SampleRow> = cases
                .iter()
                .map(|c| SampleRow { sampling: &c.sampling, prompt: &c.prompt, output: &c.output })
                .collect();
            let all: Vec<f32> = cases.iter().flat_map(|c| c.logits.iter().copied()).collect();
            let got = sample(&Tensor::from_f32(all, &[rows.len(), vocab]).unwrap(), &rows, None).unwrap();
            for (Case { logits, sampling: s, prompt, output }, got) in cases.iter().zip(got) {
                let p = &s.params;
                let mut want_logits = logits.clone();
                if output.len() < p.min_tokens {
                    want_logits[0] = f32::NEG_INFINITY;
                    want_logits[2] = f32::NEG_INFINITY;
                }
                let (rep, pres) = (p.repetition_penalty, p.presence_penalty);
                apply_penalties(&mut want_logits, prompt, output, rep, pres, 0.0);
                let plan = RowSampling {
                    temperature: p.temperature,
                    top_k: p.top_k.max(0) as u32,
                    top_p: p.top_p,
                    min_p: p.min_p,
                    seed: s.seed,
                    step: output.len() as u64,
                };
                let t = Tensor::from_f32(want_logits, &[1, vocab]).unwrap();
                let want = ops::sample_rows(&t, &[plan]).unwrap()[0];
                assert_eq!(got.token_id, want, "vocab {vocab}, {p:?}, output {output:?}");
                assert_eq!(got.logprob.map(|lp| lp.token_id), p.logprobs.map(|_| want));
            }
        }
    }
}
