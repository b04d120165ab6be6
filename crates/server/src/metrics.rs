//! `/metrics` in the Prometheus text format, with vLLM's metric names under the `ferrite:`
//! prefix and vLLM's histogram buckets, so dashboards built for vLLM read ferrite unchanged.
//!
//! Gauges and token counters come from the engine's own counters at scrape time; the latency
//! histograms and the per-reason success counter are recorded here, by the request trackers,
//! because only the server sees a request from arrival to its last byte.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferrite_engine::EngineStats;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const TPOT_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

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
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Default)]
struct HistogramState {
    /// Per-bucket (not cumulative) counts; the last slot is +Inf.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, state: Mutex::new(HistogramState { counts: vec![0; bounds.len() + 1], sum: 0.0 }) }
    }

    fn observe(&self, value: f64) {
        let slot = self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len());
        // A poisoned lock only means another thread panicked mid-update of two numbers; the
        // histogram is still usable.
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.counts[slot] += 1;
        s.sum += value;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in s.counts.iter().enumerate() {
            cumulative += count;
            // `{:?}` prints 1.0 as "1.0", as Python's prometheus_client does.
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| format!("{b:?}"));
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\",{labels}}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", s.sum);
    }
}

pub struct Metrics {
    ttft: Histogram,
    tpot: Histogram,
    e2e: Histogram,
    success: [AtomicU64; 4],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            success: Default::default(),
        }
    }
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    pub fn record_first_token(&self, since_arrival: Duration) {
        self.ttft.observe(since_arrival.as_secs_f64());
    }

    /// One finished choice: its end-to-end latency, and (when it produced more than one token)
    /// the mean time per output token after the first.
    pub fn record_finished(&self, finish: Finish, arrival: Instant, first_token: Option<Instant>, tokens: usize) {
        let now = Instant::now();
        self.e2e.observe(now.duration_since(arrival).as_secs_f64());
        if let (Some(first), true) = (first_token, tokens > 1) {
            self.tpot.observe(now.duration_since(first).as_secs_f64() / (tokens - 1) as f64);
        }
        self.success[finish as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, model_name: &str, g: &EngineStats) -> String {
        let labels = format!("model_name=\"{}\"", escape_label(model_name));
        let mut out = String::with_capacity(8 * 1024);
        let mut scalar = |name: &str, kind: &str, help: &str, value: String| {
            // Counters are declared without `_total`, as prometheus_client (and so vLLM) does.
            let family = name.strip_suffix("_total").filter(|_| kind == "counter").unwrap_or(name);
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} {kind}\n{name}{{{labels}}} {value}");
        };
        scalar(
            "ferrite:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            g.num_running.to_string(),
        );
        scalar(
            "ferrite:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            g.num_waiting.to_string(),
        );
        let usage = if g.kv_blocks_total == 0 { 0.0 } else { g.kv_blocks_used as f64 / g.kv_blocks_total as f64 };
        scalar(
            "ferrite:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            format!("{usage:?}"),
        );
        scalar(
            "ferrite:prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            g.prefix_cache_queries.to_string(),
        );
        scalar(
            "ferrite:prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            g.prefix_cache_hits.to_string(),
        );
        scalar(
            "ferrite:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            g.num_preemptions.to_string(),
        );
        scalar(
            "ferrite:cuda_graph_captures_total",
            "counter",
            "Decode step shapes captured as CUDA graphs.",
            g.cuda_graphs.captured.to_string(),
        );
        scalar(
            "ferrite:cuda_graph_replays_total",
            "counter",
            "Decode steps run by replaying a CUDA graph.",
            g.cuda_graphs.replayed.to_string(),
        );
        scalar(
            "ferrite:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            g.prompt_tokens_total.to_string(),
        );
        scalar(
            "ferrite:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            g.generation_tokens_total.to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP ferrite:request_success Count of successfully processed requests.\n# TYPE ferrite:request_success counter"
        );
        for finish in Finish::ALL {
            let _ = writeln!(
                out,
                "ferrite:request_success_total{{finished_reason=\"{}\",{labels}}} {}",
                finish.label(),
                self.success[finish as usize].load(Ordering::Relaxed)
            );
        }
        self.ttft.render(
            &mut out,
            "ferrite:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &labels,
        );
        self.tpot.render(
            &mut out,
            "ferrite:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            &labels,
        );
        self.e2e.render(
            &mut out,
            "ferrite:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &labels,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_vllm_names_and_cumulative_buckets() {
        let m = Metrics::default();
        m.record_first_token(Duration::from_millis(3));
        m.record_first_token(Duration::from_secs(5000));
        let arrival = Instant::now() - Duration::from_secs(1);
        m.record_finished(Finish::Length, arrival, Some(arrival), 11);
        m.record_finished(Finish::Abort, arrival, None, 0);
        let g = EngineStats { kv_blocks_total: 8, kv_blocks_used: 2, prompt_tokens_total: 7, ..Default::default() };
        let text = m.render("my \"model\"", &g);
        let l = r#"model_name="my \"model\"""#;
        for line in [
            format!("ferrite:kv_cache_usage_perc{{{l}}} 0.25"),
            format!("ferrite:prompt_tokens_total{{{l}}} 7"),
            "# TYPE ferrite:prompt_tokens counter".to_string(),
            format!("ferrite:request_success_total{{finished_reason=\"length\",{l}}} 1"),
            format!("ferrite:request_success_total{{finished_reason=\"abort\",{l}}} 1"),
            format!("ferrite:request_success_total{{finished_reason=\"stop\",{l}}} 0"),
            format!("ferrite:time_to_first_token_seconds_bucket{{le=\"0.001\",{l}}} 0"),
            format!("ferrite:time_to_first_token_seconds_bucket{{le=\"0.005\",{l}}} 1"),
            format!("ferrite:time_to_first_token_seconds_bucket{{le=\"2560.0\",{l}}} 1"),
            format!("ferrite:time_to_first_token_seconds_bucket{{le=\"+Inf\",{l}}} 2"),
            format!("ferrite:time_to_first_token_seconds_count{{{l}}} 2"),
            format!("ferrite:time_per_output_token_seconds_count{{{l}}} 1"),
            format!("ferrite:e2e_request_latency_seconds_count{{{l}}} 2"),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line:?} in\n{text}");
        }
    }
}
