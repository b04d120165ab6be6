//! `ferrite bench`: a serving benchmark client for any OpenAI-compatible server (ours, vLLM, ...),
//! so that every engine is measured by the same client. It sends random token-id prompts to
//! `/v1/completions` with streaming and `ignore_eos`, at each concurrency level, and reports
//! median TTFT, TPOT and ITL and output tokens/s (the median over repeated runs), plus the
//! server's prefix-cache hit rate over the run (which must be 0 for random prompts).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use futures::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Server base URL (no trailing slash).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Model name to request; defaults to the first of `/v1/models`.
    #[arg(long)]
    pub model: Option<String>,
    /// Comma-separated concurrency levels.
    #[arg(long, default_value = "1,2,4,8")]
    pub concurrency: String,
    /// Requests per level (default: 4 x concurrency, at least 8).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    #[arg(long, default_value_t = 1024)]
    pub input_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Prompt token ids are drawn from [0, vocab_size).
    #[arg(long, default_value_t = 1000)]
    pub vocab_size: u32,
    /// Repetitions per level; the median run is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
    /// A label for the server under test, copied into the JSON.
    #[arg(long, default_value = "ferrite")]
    pub label: String,
    /// A JSON object merged into every request body (vLLM's `--extra-body`), e.g. a
    /// `response_format` to measure structured outputs.
    #[arg(long, value_parser = parse_extra_body)]
    pub extra_body: Option<serde_json::Map<String, Value>>,
    #[command(flatten)]
    pub vllm: VllmBenchArgs,
}

/// `vllm bench serve`'s flags. Any of the run-shaping ones switches to its mode: one run of
/// `--num-prompts` requests, arriving at `--request-rate` (Poisson, or gamma with
/// `--burstiness`), at most `--max-concurrency` at once, reported as vLLM's result table and
/// (`--save-result`) JSON, so the two tools' results compare line by line.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct VllmBenchArgs {
    /// Requests in flight at once (vLLM mode); default: no limit.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Requests per second; `inf` sends them all at once.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Gamma shape of the arrival times (1 is Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// `random` (token ids) or `sharegpt` (the first two turns of conversations from
    /// --dataset-path, as vLLM samples them).
    #[arg(long)]
    pub dataset_name: Option<String>,
    /// A ShareGPT JSON file (a list of `{"conversations": [{"from", "value"}, ...]}`).
    #[arg(long)]
    pub dataset_path: Option<std::path::PathBuf>,
    /// The output length of every ShareGPT request, instead of its reply's length.
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Prompt length (vLLM's name for --input-len).
    #[arg(long)]
    pub random_input_len: Option<usize>,
    /// Output length (vLLM's name for --output-len).
    #[arg(long)]
    pub random_output_len: Option<usize>,
    /// Lengths are drawn from [len * (1 - r), len * (1 + r)].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Metrics to report percentiles of: ttft, tpot, itl, e2el.
    #[arg(long, default_value = "ttft,tpot,itl")]
    pub percentile_metrics: String,
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// SLOs (`ttft:500 tpot:50`, milliseconds) for the goodput: requests per second that meet all.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    #[arg(long)]
    pub save_result: bool,
    #[arg(long, default_value = ".")]
    pub result_dir: std::path::PathBuf,
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Accepted: ferrite always talks to an OpenAI-compatible completions endpoint.
    #[arg(long, default_value = "vllm")]
    pub backend: String,
    /// Accepted: EOS is always ignored, so every request generates its full length.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl VllmBenchArgs {
    fn is_set(&self) -> bool {
        self.max_concurrency.is_some()
            || self.request_rate.is_some()
            || self.dataset_name.is_some()
            || self.dataset_path.is_some()
            || self.random_input_len.is_some()
            || self.random_output_len.is_some()
            || self.save_result
    }
}

struct RequestTiming {
    ttft: f64,
    itls: Vec<f64>,
    e2e: f64,
    output_tokens: usize,
}

impl RequestTiming {
    /// Seconds per output token after the first; none for a single token.
    fn tpot(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| (self.e2e - self.ttft) / (self.output_tokens - 1) as f64)
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

async fn get_text(client: &HttpClient, url: &str, api_key: Option<&str>) -> Result<String> {
    let mut req = hyper::Request::get(url);
    if let Some(key) = api_key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let resp = client.request(req.body(Full::new(Bytes::new()))?).await.with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("GET {url}: {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Sum of the Prometheus samples whose name ends with `suffix` (works for `ferrite:` and `vllm:`).
fn metric_sum(text: &str, suffix: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            let bare = name.split('{').next()?;
            bare.ends_with(suffix).then(|| value.parse().ok()).flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn parse_extra_body(text: &str) -> std::result::Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("must be a JSON object, got {other}")),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// One streamed completion; `prompt` is token ids or text.
async fn one_request(
    client: &HttpClient,
    args: &BenchArgs,
    model: &str,
    prompt: Value,
    max_tokens: usize,
) -> Result<RequestTiming> {
    let mut body = json!({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
    });
    if let (Some(extra), Some(body)) = (&args.extra_body, body.as_object_mut()) {
        body.extend(extra.clone());
    }
    let mut req =
        hyper::Request::post(format!("{}/v1/completions", args.base_url)).header("content-type", "application/json");
    if let Some(key) = &args.api_key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let start = Instant::now();
    let resp = client.request(req.body(Full::new(Bytes::from(body.to_string())))?).await?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.into_body().collect().await?.to_bytes();
        bail!("completion failed: {status}: {}", String::from_utf8_lossy(&text));
    }
    let mut body = resp.into_body();
    let mut buffer = String::new();
    let (mut first, mut last) = (None::<Instant>, start);
    let mut itls = Vec::new();
    let mut usage_tokens = None;
    let mut chunks_with_text = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buffer.push_str(&String::from_utf8_lossy(data));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            for line in event.lines() {
                let Some(payload) = line.strip_prefix("data: ") else {
                    continue;
                };
                if payload == "[DONE]" {
                    continue;
                }
                let chunk: Value = serde_json::from_str(payload).context("invalid SSE chunk")?;
                if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
                    usage_tokens = Some(tokens as usize);
                }
                let has_text = chunk["choices"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
                if has_text {
                    let now = Instant::now();
                    match first {
                        None => first = Some(now),
                        Some(_) => itls.push((now - last).as_secs_f64()),
                    }
                    last = now;
                    chunks_with_text += 1;
                }
            }
        }
    }
    let e2e = start.elapsed().as_secs_f64();
    let first = first.context("the stream carried no text")?;
    Ok(RequestTiming {
        ttft: (first - start).as_secs_f64(),
        itls,
        e2e,
        output_tokens: usage_tokens.unwrap_or(chunks_with_text),
    })
}

async fn run_level(
    client: &HttpClient,
    args: &BenchArgs,
    model: &str,
    concurrency: usize,
    run: usize,
) -> Result<Value> {
    let n = args.num_prompts.unwrap_or((concurrency * 4).max(8));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed ^ ((concurrency as u64) << 32) ^ run as u64);
    let prompts: Vec<Vec<u32>> =
        (0..n).map(|_| (0..args.input_len).map(|_| rng.random_range(0..args.vocab_size)).collect()).collect();
    let queue = std::sync::Mutex::new(prompts.into_iter());
    let start = Instant::now();
    let workers = (0..concurrency).map(|_| async {
        let mut timings = Vec::new();
        loop {
            let next = queue.lock().expect("queue lock").next();
            let Some(prompt) = next else { break };
            timings.push(one_request(client, args, model, json!(prompt), args.output_len).await?);
        }
        Ok::<_, anyhow::Error>(timings)
    });
    let mut timings = Vec::new();
    for r in join_all(workers).await {
        timings.extend(r?);
    }
    let wall = start.elapsed().as_secs_f64();
    let output_tokens: usize = timings.iter().map(|t| t.output_tokens).sum();
    let mut ttft: Vec<f64> = timings.iter().map(|t| t.ttft).collect();
    let mut tpot: Vec<f64> = timings.iter().filter_map(RequestTiming::tpot).collect();
    let mut itl: Vec<f64> = timings.iter().flat_map(|t| t.itls.iter().copied()).collect();
    Ok(json!({
        "requests": timings.len(),
        "wall_s": wall,
        "output_tokens": output_tokens,
        "output_tok_per_s": output_tokens as f64 / wall,
        "median_ttft_ms": median(&mut ttft) * 1e3,
        "median_tpot_ms": median(&mut tpot) * 1e3,
        "median_itl_ms": median(&mut itl) * 1e3,
    }))
}

pub fn run(args: BenchArgs) -> Result<()> {
    let levels: Vec<usize> = args
        .concurrency
        .split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("--concurrency: `{s}` is not a number")))
        .collect::<Result<_>>()?;
    if levels.contains(&0) || args.runs == 0 || args.output_len == 0 || args.input_len == 0 {
        bail!("--concurrency levels, --runs, --input-len and --output-len must be positive");
    }
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        // As browsers and the OpenAI SDKs' HTTP stacks do: small request writes are not held back.
        connector.set_nodelay(true);
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
        let key = args.api_key.as_deref();
        let model = match &args.model {
            Some(m) => m.clone(),
            None => {
                let models: Value =
                    serde_json::from_str(&get_text(&client, &format!("{}/v1/models", args.base_url), key).await?)?;
                models["data"][0]["id"].as_str().context("/v1/models lists no model")?.to_owned()
            }
        };
        if args.vllm.is_set() {
            return vllm_mode::run(&client, &args, &model).await;
        }
        let metrics_url = format!("{}/metrics", args.base_url);
        let mut results = Vec::new();
        for &c in &levels {
            let before = get_text(&client, &metrics_url, key).await.ok();
            let mut runs = Vec::new();
            for r in 0..args.runs {
                runs.push(run_level(&client, &args, &model, c, r).await?);
            }
            let after = get_text(&client, &metrics_url, key).await.ok();
            let hit_rate = match (before, after) {
                (Some(b), Some(a)) => {
                    let delta = |s: &str| Some(metric_sum(&a, s)? - metric_sum(&b, s)?);
                    match (delta("prefix_cache_hits_total"), delta("prefix_cache_queries_total")) {
                        (Some(h), Some(q)) if q > 0.0 => Some(h / q),
                        _ => None,
                    }
                }
                _ => None,
            };
            let mut by_throughput: Vec<(f64, Value)> =
                runs.into_iter().map(|r| (r["output_tok_per_s"].as_f64().unwrap_or(0.0), r)).collect();
            by_throughput.sort_by(|a, b| a.0.total_cmp(&b.0));
            let median_run = by_throughput[by_throughput.len() / 2].1.clone();
            results.push(json!({
                "concurrency": c,
                "median_run": median_run,
                "runs_output_tok_per_s": by_throughput.iter().map(|r| r.0).collect::<Vec<_>>(),
                "prefix_cache_hit_rate": hit_rate,
            }));
        }
        let report = json!({
            "bench": "serving",
            "label": args.label,
            "base_url": args.base_url,
            "model": model,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "runs": args.runs,
            "extra_body": args.extra_body,
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        Ok(())
    })
}

mod vllm_mode;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sum_reads_labelled_samples_of_either_prefix() {
        let text =
            "# HELP x\nferrite:prefix_cache_hits_total{model_name=\"m\"} 3\nvllm:prefix_cache_hits_total 2\nother 9\n";
        assert_eq!(metric_sum(text, "prefix_cache_hits_total"), Some(5.0));
        assert_eq!(metric_sum(text, "missing_total"), None);
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
