//! `ferrite bench` with `vllm bench serve`'s flags: one run of `--num-prompts` random prompts,
//! sent at `--request-rate` with at most `--max-concurrency` in flight, reported with vLLM's
//! field names, table layout and percentiles (numpy's linear interpolation), so a result compares
//! line by line with vLLM's own tool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma};
use serde_json::{json, Map, Value};
use tokio::sync::Semaphore;

use super::{one_request, BenchArgs, HttpClient, RequestTiming};

/// vLLM's ShareGPT sampling: conversations shuffled by the seed, the first turn as the prompt
/// and the second's length (or `--sharegpt-output-len`) as the output, both counted by the
/// server's `/tokenize`; pairs under 4 tokens, prompts over 1024 and totals over 2048 are skipped.
async fn sharegpt(
    client: &HttpClient,
    args: &BenchArgs,
    model: &str,
    n: usize,
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Result<Vec<(Value, usize, usize)>> {
    use rand::seq::SliceRandom;
    let path = args.vllm.dataset_path.as_ref().context("--dataset-name sharegpt needs --dataset-path")?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let data: Vec<Value> =
        serde_json::from_str(&text).with_context(|| format!("{}: not a JSON list", path.display()))?;
    let mut pairs: Vec<(String, String)> = data
        .iter()
        .filter_map(|entry| {
            let turns = entry["conversations"].as_array()?;
            Some((turns.first()?["value"].as_str()?.to_owned(), turns.get(1)?["value"].as_str()?.to_owned()))
        })
        .collect();
    pairs.shuffle(rng);
    let mut out = Vec::with_capacity(n);
    for (prompt, reply) in pairs {
        if out.len() == n {
            break;
        }
        let prompt_len = count_tokens(client, args, model, &prompt).await?;
        let output_len = match args.vllm.sharegpt_output_len {
            Some(len) => len,
            None => count_tokens(client, args, model, &reply).await?,
        };
        let fixed = args.vllm.sharegpt_output_len.is_some();
        if prompt_len < 4 || (!fixed && output_len < 4) || prompt_len > 1024 || prompt_len + output_len > 2048 {
            continue;
        }
        out.push((json!(prompt), prompt_len, output_len));
    }
    if out.is_empty() {
        bail!("{}: no conversation fits vLLM's ShareGPT limits", path.display());
    }
    Ok(out)
}

/// Tokens of `text` as the server counts them (`/tokenize`, which vLLM serves too).
async fn count_tokens(client: &HttpClient, args: &BenchArgs, model: &str, text: &str) -> Result<usize> {
    let body = json!({"model": model, "prompt": text, "add_special_tokens": true});
    let mut req =
        hyper::Request::post(format!("{}/tokenize", args.base_url)).header("content-type", "application/json");
    if let Some(key) = &args.api_key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    let resp = client.request(req.body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))?).await?;
    let status = resp.status();
    let bytes = http_body_util::BodyExt::collect(resp.into_body()).await?.to_bytes();
    if !status.is_success() {
        bail!("POST /tokenize: {status}: {}", String::from_utf8_lossy(&bytes));
    }
    let value: Value = serde_json::from_slice(&bytes).context("/tokenize answered no JSON")?;
    value["count"].as_u64().map(|c| c as usize).context("/tokenize gave no count")
}

/// numpy's default percentile: linear interpolation between the closest ranks.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// numpy's `std` (population).
fn std_dev(v: &[f64]) -> f64 {
    let m = mean(v);
    if v.is_empty() {
        0.0
    } else {
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64).sqrt()
    }
}

/// `len * (1 - r) ..= len * (1 + r)`, as vLLM's random dataset draws lengths.
fn length(rng: &mut impl Rng, len: usize, ratio: f64) -> usize {
    let lo = ((len as f64 * (1.0 - ratio)) as usize).max(1);
    let hi = ((len as f64 * (1.0 + ratio)) as usize).max(lo);
    rng.random_range(lo..=hi)
}

/// `--goodput ttft:500 tpot:50`: the SLOs in milliseconds, by metric.
fn parse_goodput(specs: &[String]) -> Result<Vec<(String, f64)>> {
    specs
        .iter()
        .map(|spec| {
            let (name, ms) = spec.split_once(':').with_context(|| format!("--goodput {spec}: expected METRIC:MS"))?;
            if !["ttft", "tpot", "e2el"].contains(&name) {
                bail!("--goodput {spec}: the metric must be ttft, tpot or e2el");
            }
            let ms: f64 = ms.parse().ok().filter(|v: &f64| *v > 0.0).with_context(|| format!("--goodput {spec}"))?;
            Ok((name.to_owned(), ms))
        })
        .collect()
}

/// A request's values of `metric`, in seconds (none for the TPOT of a single token).
fn metric_of(t: &RequestTiming, metric: &str) -> Vec<f64> {
    match metric {
        "ttft" => vec![t.ttft],
        "tpot" => t.tpot().into_iter().collect(),
        "itl" => t.itls.clone(),
        "e2el" => vec![t.e2e],
        _ => Vec::new(),
    }
}

pub async fn run(client: &HttpClient, args: &BenchArgs, model: &str) -> Result<()> {
    let v = &args.vllm;
    let dataset = v.dataset_name.as_deref().unwrap_or(if v.dataset_path.is_some() { "sharegpt" } else { "random" });
    if !["random", "sharegpt"].contains(&dataset) {
        bail!("--dataset-name {dataset}: the random and sharegpt datasets are built");
    }
    let metrics: Vec<&str> = v.percentile_metrics.split(',').map(str::trim).collect();
    if let Some(bad) = metrics.iter().find(|m| !["ttft", "tpot", "itl", "e2el"].contains(m)) {
        bail!("--percentile-metrics: unknown metric {bad:?} (ttft, tpot, itl, e2el)");
    }
    let percentiles: Vec<f64> = v
        .metric_percentiles
        .split(',')
        .map(|p| p.trim().parse::<f64>().ok().filter(|p| (0.0..=100.0).contains(p)))
        .collect::<Option<_>>()
        .context("--metric-percentiles: numbers from 0 to 100, comma-separated")?;
    let goodput = parse_goodput(&v.goodput)?;
    let rate = v.request_rate.unwrap_or(f64::INFINITY);
    let positive = |x: f64| x > 0.0;
    if !positive(rate) || !positive(v.burstiness) || !(0.0..1.0).contains(&v.random_range_ratio) {
        bail!("--request-rate and --burstiness must be positive, --random-range-ratio in [0, 1)");
    }
    let n = args.num_prompts.unwrap_or(1000);
    let (input_len, output_len) =
        (v.random_input_len.unwrap_or(args.input_len), v.random_output_len.unwrap_or(args.output_len));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    // (prompt: token ids or text, its length in tokens, the tokens to generate)
    let requests: Vec<(Value, usize, usize)> = match dataset {
        "sharegpt" => sharegpt(client, args, model, n, &mut rng).await?,
        _ => (0..n)
            .map(|_| {
                let prompt_len = length(&mut rng, input_len, v.random_range_ratio);
                let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.random_range(0..args.vocab_size)).collect();
                (json!(prompt), prompt_len, length(&mut rng, output_len, v.random_range_ratio))
            })
            .collect(),
    };
    let n = requests.len();
    let arrivals = Gamma::new(v.burstiness, 1.0 / (rate * v.burstiness)).ok();
    let slots = Arc::new(Semaphore::new(v.max_concurrency.unwrap_or(Semaphore::MAX_PERMITS)));

    let shared = Arc::new(args.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for (prompt, _, max_tokens) in requests.iter().cloned() {
        if let (Some(gamma), true) = (&arrivals, rate.is_finite()) {
            tokio::time::sleep(Duration::from_secs_f64(gamma.sample(&mut rng))).await;
        }
        let permit = slots.clone().acquire_owned().await.context("the concurrency limit closed")?;
        let (client, args, model) = (client.clone(), shared.clone(), model.to_owned());
        tasks.push(tokio::spawn(async move {
            let result = one_request(&client, &args, &model, prompt, max_tokens).await;
            drop(permit);
            result
        }));
    }
    let mut timings = Vec::with_capacity(n);
    let mut errors = Vec::new();
    let mut input_lens = Vec::new();
    for (task, (_, prompt_len, _)) in tasks.into_iter().zip(&requests) {
        match task.await.context("a request task panicked")? {
            Ok(t) => {
                input_lens.push(*prompt_len);
                timings.push(t);
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    let duration = start.elapsed().as_secs_f64();

    let completed = timings.len();
    let total_input: usize = input_lens.iter().sum();
    let total_output: usize = timings.iter().map(|t| t.output_tokens).sum();
    let good = timings
        .iter()
        .filter(|t| goodput.iter().all(|(m, ms)| metric_of(t, m).first().is_none_or(|s| s * 1e3 <= *ms)))
        .count();
    let mut result = Map::new();
    let mut put = |k: &str, v: Value| {
        result.insert(k.to_owned(), v);
    };
    put("date", json!(chrono_like_now()));
    put("backend", json!(v.backend));
    put("model_id", json!(model));
    put("num_prompts", json!(n));
    put("request_rate", if rate.is_finite() { json!(rate) } else { json!("inf") });
    put("burstiness", json!(v.burstiness));
    put("max_concurrency", json!(v.max_concurrency));
    put("duration", json!(duration));
    put("completed", json!(completed));
    put("failed", json!(errors.len()));
    put("total_input_tokens", json!(total_input));
    put("total_output_tokens", json!(total_output));
    put("request_throughput", json!(completed as f64 / duration));
    put("request_goodput", if goodput.is_empty() { Value::Null } else { json!(good as f64 / duration) });
    put("output_throughput", json!(total_output as f64 / duration));
    put("total_token_throughput", json!((total_input + total_output) as f64 / duration));
    put("input_lens", json!(input_lens));
    put("output_lens", json!(timings.iter().map(|t| t.output_tokens).collect::<Vec<_>>()));
    put("ttfts", json!(timings.iter().map(|t| t.ttft).collect::<Vec<_>>()));
    put("itls", json!(timings.iter().map(|t| t.itls.clone()).collect::<Vec<_>>()));
    put("errors", json!(errors));

    let mut table = vec![
        "============ Serving Benchmark Result ============".to_string(),
        format!("{:<40} {:<10}", "Successful requests:", completed),
        format!("{:<40} {:<10}", "Failed requests:", errors.len()),
    ];
    if let Some(c) = v.max_concurrency {
        table.push(format!("{:<40} {:<10}", "Maximum request concurrency:", c));
    }
    table.extend([
        format!("{:<40} {:<10.2}", "Benchmark duration (s):", duration),
        format!("{:<40} {:<10}", "Total input tokens:", total_input),
        format!("{:<40} {:<10}", "Total generated tokens:", total_output),
        format!("{:<40} {:<10.2}", "Request throughput (req/s):", completed as f64 / duration),
    ]);
    if !goodput.is_empty() {
        table.push(format!("{:<40} {:<10.2}", "Request goodput (req/s):", good as f64 / duration));
    }
    table.extend([
        format!("{:<40} {:<10.2}", "Output token throughput (tok/s):", total_output as f64 / duration),
        format!("{:<40} {:<10.2}", "Total Token throughput (tok/s):", (total_input + total_output) as f64 / duration),
    ]);
    for (metric, title, label) in [
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    ] {
        if !metrics.contains(&metric) {
            continue;
        }
        let mut ms: Vec<f64> = timings.iter().flat_map(|t| metric_of(t, metric)).map(|s| s * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        table.push(format!("{title:-^50}"));
        let (m, med, sd) = (mean(&ms), percentile(&ms, 50.0), std_dev(&ms));
        put(&format!("mean_{metric}_ms"), json!(m));
        put(&format!("median_{metric}_ms"), json!(med));
        put(&format!("std_{metric}_ms"), json!(sd));
        table.push(format!("{:<40} {:<10.2}", format!("Mean {label} (ms):"), m));
        table.push(format!("{:<40} {:<10.2}", format!("Median {label} (ms):"), med));
        for &p in &percentiles {
            let name = format!("{p}").trim_end_matches(".0").to_string();
            let value = percentile(&ms, p);
            put(&format!("p{name}_{metric}_ms"), json!(value));
            table.push(format!("{:<40} {:<10.2}", format!("P{name} {label} (ms):"), value));
        }
    }
    table.push("=".repeat(50));
    println!("{}", table.join("\n"));
    if v.save_result {
        std::fs::create_dir_all(&v.result_dir).with_context(|| format!("creating {}", v.result_dir.display()))?;
        let name = v.result_filename.clone().unwrap_or_else(|| {
            let concurrency = v.max_concurrency.map_or("inf".to_string(), |c| c.to_string());
            format!(
                "ferrite-{}qps-concurrency{concurrency}-{}.json",
                if rate.is_finite() { rate.to_string() } else { "inf".into() },
                model.replace('/', "-")
            )
        });
        let path = v.result_dir.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(&Value::Object(result))?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("result saved to {}", path.display());
    }
    Ok(())
}

/// `YYYYMMDD-HHMMSS` (UTC), the form of vLLM's `date` field, without a date-time dependency.
fn chrono_like_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-from-civil, inverted.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_as_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!((std_dev(&v) - 1.118_033_988_749_895).abs() < 1e-12);
    }

    #[test]
    fn goodput_specs_are_checked() {
        assert_eq!(parse_goodput(&["ttft:500".into()]).unwrap(), [("ttft".to_string(), 500.0)]);
        assert!(parse_goodput(&["itl:5".into()]).is_err());
        assert!(parse_goodput(&["ttft".into()]).is_err());
    }
}
