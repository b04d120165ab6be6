//! `/metrics` in the Prometheus text format under vLLM's names, labels (`model_name`, `engine`)
//! and histogram buckets, so dashboards built for vLLM read ferrite unchanged. Only what vLLM
//! has no metric for keeps a `ferrite:` name (the CUDA graph counters).
//!
//! Gauges and token counters come from the engine's own counters at scrape time; the latency and
//! size histograms and the per-reason success counter are recorded here, by the request
//! trackers, because only the server sees a request from arrival to its last byte.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrite_engine::{EngineStats, IterationTokens};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const TOKEN_LATENCY_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

/// vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `max`.
fn one_two_five_buckets(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1usize, 2, 5] {
            match m.checked_mul(scale).filter(|&v| v <= max) {
                Some(v) => out.push(v as f64),
                None => return out,
            }
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => return out,
        };
    }
}

/// How a choice ended, the `finished_reason` label of `request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    Abort,
    Error,
}

impl Finish {
    const ALL: [Finish; 4] = [Finish::Stop, Finish::Length, Finish::Abort, Finish::Error];

    fn label(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Abort => "abort",
            Finish::Error => "error",
        }
    }
}

struct Histogram {
    name: &'static str,
    help: &'static str,
    bounds: Vec<f64>,
    state: Mutex<HistogramState>,
}

#[derive(Default)]
struct HistogramState {
    /// Per-bucket (not cumulative) counts; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(name: &'static str, help: &'static str, bounds: Vec<f64>) -> Histogram {
        let counts = vec![0; bounds.len() + 1];
        Histogram { name, help, bounds, state: Mutex::new(HistogramState { counts, sum: 0.0 }) }
    }

    fn observe(&self, value: f64) {
        let slot = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        // A poisoned lock only means another thread panicked mid-update of two numbers; the
        // histogram is still usable.
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.counts[slot] += 1;
        s.sum += value;
    }

    fn render(&self, out: &mut String, labels: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        write_histogram(out, self.name, self.help, labels, &self.bounds, &s.counts, s.sum);
    }
}

/// One histogram in the exposition format from its per-bucket (not cumulative) counts, the last
/// of them past every bound.
fn write_histogram(out: &mut String, name: &str, help: &str, labels: &str, bounds: &[f64], counts: &[u64], sum: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (i, count) in counts.iter().enumerate() {
        cumulative += count;
        // `{:?}` prints 1.0 as "1.0", as Python's prometheus_client does.
        let le = bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| format!("{b:?}"));
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum:?}");
}

/// One finished choice, as the request tracker saw it.
#[derive(Debug, Clone, Copy)]
pub struct FinishedChoice {
    pub finish: Finish,
    pub arrival: Instant,
    /// When the engine first scheduled the request (`None`: it never ran).
    pub scheduled: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
}

pub struct Metrics {
    ttft: Histogram,
    itl: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    inference: Histogram,
    prefill: Histogram,
    decode: Histogram,
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
    success: [AtomicU64; 4],
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// Token-count histograms are bucketed up to `max_model_len`, as vLLM's.
    pub fn new(max_model_len: usize) -> Metrics {
        let latency = || REQUEST_LATENCY_BUCKETS.to_vec();
        Metrics {
            ttft: Histogram::new(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS.to_vec(),
            ),
            itl: Histogram::new(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                TOKEN_LATENCY_BUCKETS.to_vec(),
            ),
            request_tpot: Histogram::new(
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                TOKEN_LATENCY_BUCKETS.to_vec(),
            ),
            e2e: Histogram::new(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                latency(),
            ),
            queue: Histogram::new(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                latency(),
            ),
            inference: Histogram::new(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                latency(),
            ),
            prefill: Histogram::new(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                latency(),
            ),
            decode: Histogram::new(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                latency(),
            ),
            prompt_tokens: Histogram::new(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                one_two_five_buckets(max_model_len),
            ),
            generation_tokens: Histogram::new(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                one_two_five_buckets(max_model_len),
            ),
            success: Default::default(),
        }
    }

    pub fn record_first_token(&self, since_arrival: Duration) {
        self.ttft.observe(since_arrival.as_secs_f64());
    }

    /// The time between two consecutive token arrivals of one choice.
    pub fn record_inter_token(&self, gap: Duration) {
        self.itl.observe(gap.as_secs_f64());
    }

    /// One finished choice: latencies by phase (queued, prefill up to its first token, decode
    /// after it), its sizes, and its mean time per output token after the first.
    pub fn record_finished(&self, c: FinishedChoice) {
        let now = Instant::now();
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        self.e2e.observe(secs(c.arrival, now));
        if let Some(scheduled) = c.scheduled {
            self.queue.observe(secs(c.arrival, scheduled));
            let last = c.last_token.unwrap_or(now);
            self.inference.observe(secs(scheduled, last));
            if let Some(first) = c.first_token {
                self.prefill.observe(secs(scheduled, first));
                self.decode.observe(secs(first, last));
                if c.generation_tokens > 1 {
                    self.request_tpot.observe(secs(first, last) / (c.generation_tokens - 1) as f64);
                }
            }
        }
        self.prompt_tokens.observe(c.prompt_tokens as f64);
        self.generation_tokens.observe(c.generation_tokens as f64);
        self.success[c.finish as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, model_name: &str, g: &EngineStats) -> String {
        // vLLM labels every series with the model and the engine index (one engine here).
        let labels = format!("model_name=\"{}\",engine=\"0\"", escape_label(model_name));
        let mut out = String::with_capacity(16 * 1024);
        let mut scalar = |name: &str, kind: &str, help: &str, value: String| {
            // Counters are declared without `_total`, as prometheus_client (and so vLLM) does.
            let family = name.strip_suffix("_total").filter(|_| kind == "counter").unwrap_or(name);
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} {kind}\n{name}{{{labels}}} {value}");
        };
        let usage = if g.kv_blocks_total == 0 { 0.0 } else { g.kv_blocks_used as f64 / g.kv_blocks_total as f64 };
        for (name, kind, help, value) in [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                g.num_running.to_string(),
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                g.num_waiting.to_string(),
            ),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", format!("{usage:?}")),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                g.prefix_cache_queries.to_string(),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                g.prefix_cache_hits.to_string(),
            ),
            (
                "vllm:num_preemptions_total",
                "counter",
                "Cumulative number of preemption from the engine.",
                g.num_preemptions.to_string(),
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                g.prompt_tokens_total.to_string(),
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                g.generation_tokens_total.to_string(),
            ),
            (
                "ferrite:cuda_graph_captures_total",
                "counter",
                "Decode step shapes captured as CUDA graphs.",
                g.cuda_graphs.captured.to_string(),
            ),
            (
                "ferrite:cuda_graph_replays_total",
                "counter",
                "Decode steps run by replaying a CUDA graph.",
                g.cuda_graphs.replayed.to_string(),
            ),
        ] {
            scalar(name, kind, help, value);
        }
        let spec = &g.spec_decode;
        if spec.num_speculative_tokens > 0 {
            for (name, help, value) in [
                ("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", spec.num_drafts),
                ("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", spec.num_draft_tokens),
                ("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", spec.num_accepted_tokens),
            ] {
                scalar(name, "counter", help, value.to_string());
            }
            let _ = writeln!(
                out,
                "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.\n\
                 # TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"
            );
            for (pos, n) in spec.num_accepted_tokens_per_pos.iter().take(spec.num_speculative_tokens).enumerate() {
                let _ = writeln!(
                    out,
                    "vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position=\"{pos}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP vllm:request_success Count of successfully processed requests.\n# TYPE vllm:request_success counter"
        );
        for finish in Finish::ALL {
            let _ = writeln!(
                out,
                "vllm:request_success_total{{{labels},finished_reason=\"{}\"}} {}",
                finish.label(),
                self.success[finish as usize].load(Ordering::Relaxed)
            );
        }
        render_iteration_tokens(&mut out, &labels, &g.iteration_tokens);
        for h in [
            &self.ttft,
            &self.itl,
            &self.request_tpot,
            &self.e2e,
            &self.queue,
            &self.inference,
            &self.prefill,
            &self.decode,
            &self.prompt_tokens,
            &self.generation_tokens,
        ] {
            h.render(&mut out, &labels);
        }
        out
    }
}

/// The engine's tokens-per-step counts as vLLM's `iteration_tokens_total` histogram.
fn render_iteration_tokens(out: &mut String, labels: &str, h: &IterationTokens) {
    let bounds = IterationTokens::BOUNDS.map(|b| b as f64);
    let help = "Histogram of number of tokens per engine_step.";
    write_histogram(out, "vllm:iteration_tokens_total", help, labels, &bounds, &h.counts, h.sum as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vLLM series a stock dashboard reads, with its type (from vLLM's
    /// `vllm/v1/metrics/loggers.py`).
    const VLLM_SERIES: &[(&str, &str)] = &[
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prefix_cache_queries", "counter"),
        ("vllm:prefix_cache_hits", "counter"),
        ("vllm:num_preemptions", "counter"),
        ("vllm:prompt_tokens", "counter"),
        ("vllm:generation_tokens", "counter"),
        ("vllm:request_success", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:request_time_per_output_token_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_inference_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
        ("vllm:request_prompt_tokens", "histogram"),
        ("vllm:request_generation_tokens", "histogram"),
        ("vllm:iteration_tokens_total", "histogram"),
    ];

    #[test]
    fn token_buckets_follow_vllms_1_2_5_rule() {
        assert_eq!(one_two_five_buckets(100), [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(one_two_five_buckets(1024).last(), Some(&1000.0));
    }

    #[test]
    fn exposition_has_vllm_names_types_labels_and_cumulative_buckets() {
        let m = Metrics::new(1024);
        m.record_first_token(Duration::from_millis(3));
        m.record_first_token(Duration::from_secs(5000));
        m.record_inter_token(Duration::from_millis(20));
        let arrival = Instant::now() - Duration::from_secs(1);
        let scheduled = arrival + Duration::from_millis(100);
        let first = scheduled + Duration::from_millis(200);
        let last = first + Duration::from_millis(500);
        m.record_finished(FinishedChoice {
            finish: Finish::Length,
            arrival,
            scheduled: Some(scheduled),
            first_token: Some(first),
            last_token: Some(last),
            prompt_tokens: 7,
            generation_tokens: 11,
        });
        m.record_finished(FinishedChoice {
            finish: Finish::Abort,
            arrival,
            scheduled: None,
            first_token: None,
            last_token: None,
            prompt_tokens: 3,
            generation_tokens: 0,
        });
        let mut iteration_tokens = IterationTokens::default();
        // Two steps: a 10-token prefill (bucket 16) and a single decode (bucket 1).
        (iteration_tokens.counts[2], iteration_tokens.counts[0], iteration_tokens.sum) = (1, 1, 11);
        let g = EngineStats {
            kv_blocks_total: 8,
            kv_blocks_used: 2,
            prompt_tokens_total: 7,
            iteration_tokens,
            ..Default::default()
        };
        let text = m.render("my \"model\"", &g);
        let l = r#"model_name="my \"model\"",engine="0""#;
        for (name, kind) in VLLM_SERIES {
            assert!(text.lines().any(|x| x == format!("# TYPE {name} {kind}")), "no {kind} {name} in\n{text}");
        }
        for line in [
            format!("vllm:kv_cache_usage_perc{{{l}}} 0.25"),
            format!("vllm:prompt_tokens_total{{{l}}} 7"),
            format!("vllm:request_success_total{{{l},finished_reason=\"length\"}} 1"),
            format!("vllm:request_success_total{{{l},finished_reason=\"abort\"}} 1"),
            format!("vllm:request_success_total{{{l},finished_reason=\"stop\"}} 0"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.001\"}} 0"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"0.005\"}} 1"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"2560.0\"}} 1"),
            format!("vllm:time_to_first_token_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("vllm:time_to_first_token_seconds_count{{{l}}} 2"),
            format!("vllm:inter_token_latency_seconds_bucket{{{l},le=\"0.025\"}} 1"),
            // 0.5 s over 10 tokens after the first.
            format!("vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.05\"}} 1"),
            format!("vllm:request_time_per_output_token_seconds_bucket{{{l},le=\"0.025\"}} 0"),
            format!("vllm:request_queue_time_seconds_count{{{l}}} 1"),
            format!("vllm:request_prefill_time_seconds_bucket{{{l},le=\"0.3\"}} 1"),
            format!("vllm:request_decode_time_seconds_bucket{{{l},le=\"0.5\"}} 1"),
            format!("vllm:request_decode_time_seconds_bucket{{{l},le=\"0.3\"}} 0"),
            format!("vllm:request_prompt_tokens_bucket{{{l},le=\"5.0\"}} 1"),
            format!("vllm:request_prompt_tokens_bucket{{{l},le=\"10.0\"}} 2"),
            format!("vllm:request_generation_tokens_count{{{l}}} 2"),
            format!("vllm:e2e_request_latency_seconds_count{{{l}}} 2"),
            format!("ferrite:cuda_graph_replays_total{{{l}}} 0"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"1.0\"}} 1"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"8.0\"}} 1"),
            format!("vllm:iteration_tokens_total_bucket{{{l},le=\"16.0\"}} 2"),
            format!("vllm:iteration_tokens_total_count{{{l}}} 2"),
            format!("vllm:iteration_tokens_total_sum{{{l}}} 11.0"),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("ferrite:prompt_tokens"), "a vLLM metric kept a ferrite name");
    }
}
