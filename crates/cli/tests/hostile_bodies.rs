//! Hostile request bodies against the real `ferrite serve` (issue 34): every POST endpoint of a
//! generation server (tool calling, a reasoning parser and request chat templates switched on)
//! and of two pooling servers gets bodies that proptest derives from valid ones (the seed
//! corpus below): values replaced by wrong types, extremes, long or odd strings, real chat
//! templates and deep nesting; fields removed or added from any endpoint's vocabulary; now and
//! then the bytes cut or spoiled. Every answer must be a success or an OpenAI-style JSON error
//! with a 4xx (or an overload 503) status, never a 5xx, a hang or a dropped connection; a
//! streamed success must end as its API ends a stream. Afterwards the server is healthy, idle
//! in `/metrics` (no request left running or waiting) and exits cleanly on SIGTERM.
//!
//! 400 cases per server by default (each case sends one body to every endpoint of its server);
//! `PROPTEST_CASES=N` runs more (`scripts/fuzz.sh`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

const MODEL_NAME: &str = "m";
/// The tiny fixtures serve in about 100 MiB (64 MiB of it KV cache); a body that makes the
/// server hold this much is an unbounded allocation (one such request once took 24 GB).
const PEAK_RSS_LIMIT: u64 = 1 << 30;
/// A request of the tiny fixture that takes longer than this has hung.
const ANSWER_LIMIT: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Server {
    child: std::cell::RefCell<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// A server on a free port. The port is free when picked, not when the server binds it: a test
    /// beside this one can take it in between, so a lost port is picked again.
    fn start(name: &str, model: &Path, extra: &[&str]) -> Server {
        for _ in 0..4 {
            if let Some(server) = Server::try_start(name, model, extra) {
                return server;
            }
        }
        panic!("ferrite serve lost its port four times in a row");
    }

    /// `None` where another process bound the port first.
    fn try_start(name: &str, model: &Path, extra: &[&str]) -> Option<Server> {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::env::temp_dir().join(format!("ferrite-hostile-{name}-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .args(["serve", "--model"])
            .arg(model)
            .args(["--port", &port.to_string(), "--served-model-name", MODEL_NAME, "--kv-cache-memory", "64MiB"])
            .args(extra)
            .env("FERRITE_LOG", "warn")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let server = Server { child: child.into(), port, log };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let exited = server.child.borrow_mut().try_wait().unwrap().is_some();
            if exited && server.logs().contains("Address already in use") {
                return None;
            }
            server.assert_running("starting");
            if server.send("GET", "/health", b"").is_ok_and(|r| r.status == 200) {
                return Some(server);
            }
            assert!(Instant::now() < deadline, "ferrite serve did not become healthy:\n{}", server.logs());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A server that died cannot be shrunk against: the body that killed it is the finding.
    fn assert_running(&self, after: &str) {
        if let Some(code) = self.child.borrow_mut().try_wait().unwrap() {
            panic!("ferrite serve exited with {code} after {after}:\n{}", self.logs());
        }
    }

    fn logs(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text[text.len().saturating_sub(6000)..].to_string()
    }

    /// One HTTP/1.1 exchange on a fresh connection.
    fn send(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<Answer> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(ANSWER_LIMIT))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Answer::parse(&raw)
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {:?}", String::from_utf8_lossy(&raw))))
    }

    /// `vllm:num_requests_running` and `vllm:num_requests_waiting`.
    fn load(&self) -> (f64, f64) {
        let metrics = self.send("GET", "/metrics", b"").unwrap();
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        let sample = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from /metrics"))
        };
        (sample("vllm:num_requests_running"), sample("vllm:num_requests_waiting"))
    }

    /// The most memory the server has held (`VmHWM`), where Linux reports it.
    fn peak_rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.borrow().id())).ok()?;
        let kib: u64 =
            status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kib << 10)
    }

    /// The server answers, never held more than `PEAK_RSS_LIMIT`, has no request left running
    /// or waiting, and exits 0 on SIGTERM.
    fn check_idle_and_stop(self) {
        if let Some(peak) = self.peak_rss_bytes() {
            eprintln!("peak RSS {} MiB", peak >> 20);
            assert!(peak < PEAK_RSS_LIMIT, "the server held {} MiB at its peak", peak >> 20);
        }
        assert_eq!(self.send("GET", "/health", b"").unwrap().status, 200, "{}", self.logs());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.load() != (0.0, 0.0) {
            assert!(Instant::now() < deadline, "requests left behind: {:?}\n{}", self.load(), self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
        let pid = self.child.borrow().id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let status = self.child.borrow_mut().wait().unwrap();
        assert!(status.success(), "ferrite serve exited with {status}:\n{}", self.logs());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

struct Answer {
    status: u16,
    chunked: bool,
    body: Vec<u8>,
}

impl Answer {
    fn parse(raw: &[u8]) -> Option<Answer> {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = std::str::from_utf8(&raw[..split]).ok()?.to_ascii_lowercase();
        let status = head.get(9..12)?.parse().ok()?;
        let chunked = head.contains("\r\ntransfer-encoding: chunked");
        let rest = &raw[split + 4..];
        let body = if chunked { dechunk(rest)? } else { rest.to_vec() };
        Some(Answer { status, chunked, body })
    }
}

/// The payload of a chunked body; `None` when it is cut short (a dropped stream).
fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// What a server must answer to any body: a success that reads as its endpoint's, or an
/// OpenAI-style error whose `code` is the status.
fn judge(path: &str, answer: &Answer) -> Result<(), String> {
    let text = String::from_utf8_lossy(&answer.body);
    if answer.status == 200 {
        let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        if events.is_empty() {
            return serde_json::from_slice::<Value>(&answer.body)
                .map(drop)
                .map_err(|e| format!("a 200 that is not JSON ({e}): {text}"));
        }
        if !answer.chunked {
            return Err(format!("a stream sent without chunked encoding: {text}"));
        }
        for event in &events {
            if *event != "[DONE]" {
                serde_json::from_str::<Value>(event)
                    .map_err(|e| format!("an SSE event that is not JSON ({e}): {event}"))?;
            }
        }
        let last = events.last().copied().unwrap_or_default();
        let ended = if path == "/v1/responses" {
            serde_json::from_str::<Value>(last)
                .ok()
                .and_then(|v| {
                    v["type"].as_str().map(|t| {
                        matches!(t, "response.completed" | "response.failed" | "response.incomplete" | "error")
                    })
                })
                .unwrap_or(false)
        } else {
            last == "[DONE]"
        };
        return if ended { Ok(()) } else { Err(format!("a stream that does not end as {path} ends one: {text}")) };
    }
    if !matches!(answer.status, 400 | 404 | 413 | 503) {
        return Err(format!("status {}: {text}", answer.status));
    }
    let v: Value =
        serde_json::from_slice(&answer.body).map_err(|e| format!("an error that is not JSON ({e}): {text}"))?;
    let error = &v["error"];
    if error["message"].as_str().is_none_or(str::is_empty) || error["code"] != answer.status {
        return Err(format!("an error without a message or with the wrong code: {text}"));
    }
    Ok(())
}

fn chat_templates() -> Vec<String> {
    ["llama3_2", "qwen3"]
        .iter()
        .map(|name| {
            let path = repo().join(format!("fixtures/chat_templates/{name}.json"));
            let spec: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            spec["chat_template"].as_str().unwrap().to_string()
        })
        .collect()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                       "required": ["city"]}}})
}

/// Valid bodies for each endpoint of the generation server: the seed corpus.
fn generation_seeds() -> Vec<(&'static str, Value)> {
    let user = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let tool_turns = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    vec![
        ("/v1/completions", json!({"prompt": "Hello", "max_tokens": 4})),
        (
            "/v1/completions",
            json!({"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 2, "echo": true, "n": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"], "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 4, "stop": ["a", "b"], "seed": 3, "temperature": 0.8, "top_p": 0.9,
                                   "top_k": 5, "min_p": 0.1, "logit_bias": {"5": 10}, "presence_penalty": 0.5, "prompt_logprobs": 1}),
        ),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": 6, "structured_outputs": {"regex": "[0-9]+"}})),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 6, "response_format": {"type": "json_object"}, "guided_whitespace_pattern": " ?"}),
        ),
        ("/v1/chat/completions", json!({"messages": user, "max_tokens": 4})),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 8, "tools": [weather_tool()], "tool_choice": "auto"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 8, "tools": [weather_tool()], "tool_choice": "required", "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 8, "tools": [weather_tool()],
                                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": tool_turns, "max_tokens": 4, "logprobs": true, "top_logprobs": 2, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 8,
                                        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "max_tokens": 4, "chat_template": chat_templates()[0],
                                        "chat_template_kwargs": {"date_string": "6 Dec 2026"}, "n": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
                                        "max_tokens": 4, "continue_final_message": true, "add_generation_prompt": false}),
        ),
        ("/v1/responses", json!({"input": "hi", "max_output_tokens": 4})),
        (
            "/v1/responses",
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                 "instructions": "be brief", "max_output_tokens": 4, "stream": true}),
        ),
        (
            "/v1/responses",
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
                                           {"type": "function_call_output", "call_id": "c", "output": "rain"}],
                                 "tools": [{"type": "function", "name": "get_weather", "parameters": schema}], "max_output_tokens": 4,
                                 "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}),
        ),
        ("/tokenize", json!({"prompt": "hi there", "return_token_strs": true})),
        ("/tokenize", json!({"messages": user, "add_generation_prompt": true})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
    ]
}

fn pooling_seeds() -> Vec<(&'static str, Value)> {
    vec![
        ("/v1/embeddings", json!({"input": "hello", "encoding_format": "float"})),
        (
            "/v1/embeddings",
            json!({"input": [[1, 2, 3], [4, 5]], "encoding_format": "base64", "truncate_prompt_tokens": 2}),
        ),
        ("/v1/embeddings", json!({"input": ["a", "b"], "dimensions": 8, "normalize": false})),
    ]
}

fn cross_encoder_seeds() -> Vec<(&'static str, Value)> {
    vec![
        ("/score", json!({"model": MODEL_NAME, "text_1": "what is it", "text_2": ["a thing", "another"]})),
        ("/v1/score", json!({"text_1": ["a", "b"], "text_2": ["c", "d"], "truncate_prompt_tokens": 4})),
        // Two long texts cut to a few tokens: tokenizers' truncation once paired every overflow
        // piece of one with every piece of the other (24 GB).
        (
            "/v1/score",
            json!({"text_1": "word ".repeat(3000), "text_2": "other ".repeat(4000), "truncate_prompt_tokens": 5}),
        ),
        ("/rerank", json!({"query": "q", "documents": ["a", "b", "c"], "top_n": 2, "return_documents": true})),
        ("/v2/rerank", json!({"query": "q", "documents": []})),
        ("/classify", json!({"input": ["one", "two"]})),
    ]
}

/// Field names of every endpoint, for additions anywhere in a body.
const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template",
    "chat_template_kwargs",
    "continue_final_message",
    "add_generation_prompt",
    "add_special_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "best_of",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "prompt_logprobs",
    "truncate_prompt_tokens",
    "truncation_side",
    "return_token_ids",
    "reasoning_effort",
    "include_reasoning",
    "instructions",
    "previous_response_id",
    "text",
    "store",
    "tokens",
    "return_token_strs",
    "encoding_format",
    "dimensions",
    "normalize",
    "text_1",
    "text_2",
    "query",
    "documents",
    "top_n",
    "return_documents",
    "priority",
    "use_beam_search",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "type",
    "function",
    "name",
    "arguments",
    "parameters",
    "schema",
    "json_schema",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
];

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop_oneof![Just(0i64), Just(-1), Just(1), Just(2), Just(7), Just(i64::MAX), Just(i64::MIN), Just(1 << 40)]
            .prop_map(Value::from),
        Just(json!(u64::MAX)),
        prop_oneof![Just(0.5f64), Just(-0.0), Just(1e308), Just(-1e-300), Just(2.5)].prop_map(Value::from),
        "[a-z0-9 ]{0,12}".prop_map(Value::from),
        "\\PC{0,16}".prop_map(Value::from),
        prop_oneof![
            Just("<|im_start|>assistant\n<think>"),
            Just("</tool_call>[TOOL_CALLS]<tool_call>{\"name\""),
            Just("{{ raise_exception('x') }}"),
            Just("{% for m in messages %}{{ m.content[::-1] }}{% endfor %}"),
            Just("data: [DONE]\n\n"),
            Just("\u{0}\u{FEFF}\r\n"),
            Just(MODEL_NAME),
            Just("auto"),
            Just("none"),
            Just("required"),
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("function"),
            Just("text"),
            Just("json_schema"),
            Just("base64"),
        ]
        .prop_map(Value::from),
        Just(Value::from("a".repeat(20_000))),
    ]
    .boxed()
}

fn value(depth: u32) -> BoxedStrategy<Value> {
    if depth == 0 {
        return leaf();
    }
    prop_oneof![
        4 => leaf(),
        1 => prop::collection::vec(value(depth - 1), 0..4).prop_map(Value::from),
        1 => prop::collection::vec((prop::sample::select(FIELDS), value(depth - 1)), 0..4)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>())),
        1 => Just(json!((0..3000).collect::<Vec<i64>>())),
        1 => (1usize..140).prop_map(|depth| (0..depth).fold(json!(1), |v, _| json!([v]))),
        1 => prop::sample::select(chat_templates()).prop_map(Value::from),
    ]
    .boxed()
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace { path: Vec<usize>, with: Value },
    Remove { path: Vec<usize> },
    Add { path: Vec<usize>, key: &'static str, with: Value },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<usize>(), 0..5);
    prop_oneof![
        3 => (path.clone(), value(2)).prop_map(|(path, with)| Mutation::Replace { path, with }),
        1 => path.clone().prop_map(|path| Mutation::Remove { path }),
        2 => (path, prop::sample::select(FIELDS), value(2)).prop_map(|(path, key, with)| Mutation::Add { path, key, with }),
    ]
}

/// The node `path` leads to: each step picks a child of an object or array by position, and
/// the walk stops early at a leaf or an empty container.
fn walk<'a>(mut node: &'a mut Value, path: &[usize]) -> &'a mut Value {
    for &step in path {
        let len = match node {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if len == 0 {
            break;
        }
        node = match node {
            Value::Object(m) => m.values_mut().nth(step % len).unwrap(),
            Value::Array(a) => &mut a[step % len],
            _ => unreachable!(),
        };
    }
    node
}

fn mutate(mut body: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        match m {
            Mutation::Replace { path, with } => *walk(&mut body, path) = with.clone(),
            Mutation::Remove { path } if !path.is_empty() => {
                let parent = walk(&mut body, &path[..path.len() - 1]);
                let last = path[path.len() - 1];
                match parent {
                    Value::Object(m) if !m.is_empty() => {
                        let key = m.keys().nth(last % m.len()).unwrap().clone();
                        m.remove(&key);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let at = last % a.len();
                        a.remove(at);
                    }
                    _ => {}
                }
            }
            Mutation::Remove { .. } => {}
            Mutation::Add { path, key, with } => {
                if let Value::Object(m) = walk(&mut body, path) {
                    m.insert(key.to_string(), with.clone());
                }
            }
        }
    }
    body
}

/// How the serialized body is spoiled, now and then.
#[derive(Debug, Clone)]
enum Bytes {
    Whole,
    Cut(usize),
    Byte(usize, u8),
}

fn bytes() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        12 => Just(Bytes::Whole),
        1 => any::<usize>().prop_map(Bytes::Cut),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Bytes::Byte(at, b)),
    ]
}

fn encode(body: &Value, how: &Bytes) -> Vec<u8> {
    let mut raw = serde_json::to_vec(body).unwrap();
    match *how {
        Bytes::Whole => {}
        Bytes::Cut(at) => raw.truncate(at % (raw.len() + 1)),
        Bytes::Byte(at, b) => {
            let at = at % raw.len();
            raw[at] = b;
        }
    }
    raw
}

/// Sends, for each case, one mutated seed to every endpoint the seeds name.
fn fuzz(server: Server, seeds: Vec<(&'static str, Value)>) {
    let mut endpoints: Vec<&str> = seeds.iter().map(|(p, _)| *p).collect();
    endpoints.dedup();
    let per_endpoint = (any::<usize>(), prop::collection::vec(mutation(), 0..4), bytes());
    let strategy = prop::collection::vec(per_endpoint, endpoints.len());
    // At least 400 cases; more when PROPTEST_CASES asks (`Config::default` reads it).
    let cases = Config::default().cases.max(400);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let (answered, succeeded) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    let result = runner.run(&strategy, |picks| {
        for (endpoint, (seed, mutations, how)) in endpoints.iter().zip(picks) {
            let options: Vec<&Value> = seeds.iter().filter(|(p, _)| p == endpoint).map(|(_, b)| b).collect();
            let body = encode(&mutate(options[seed % options.len()].clone(), &mutations), &how);
            let answer = server.send("POST", endpoint, &body);
            server.assert_running(&format!("{endpoint} got {}", String::from_utf8_lossy(&body)));
            let answer = answer.map_err(|e| {
                TestCaseError::fail(format!("{endpoint}: no answer ({e}) to {}", String::from_utf8_lossy(&body)))
            })?;
            judge(endpoint, &answer).map_err(|why| {
                TestCaseError::fail(format!("{endpoint}: {why}\nbody: {}", String::from_utf8_lossy(&body)))
            })?;
            answered.set(answered.get() + 1);
            succeeded.set(succeeded.get() + usize::from(answer.status == 200));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}\nserver log:\n{}", server.logs());
    }
    let (answered, succeeded) = (answered.get(), succeeded.get());
    eprintln!("{answered} hostile bodies answered, {succeeded} of them with 200");
    // Mutations that leave most bodies valid would not reach the error paths, and the reverse
    // would not reach generation.
    assert!(succeeded * 10 >= answered && succeeded * 10 <= answered * 9, "{succeeded} of {answered} succeeded");
    server.check_idle_and_stop();
}

#[test]
fn generation_endpoints_answer_every_hostile_body() {
    let model = repo().join("fixtures/models/llama");
    let flags = [
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "16",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "deepseek_r1",
        "--trust-request-chat-template",
    ];
    fuzz(Server::start("generate", &model, &flags), generation_seeds());
}

#[test]
fn pooling_endpoints_answer_every_hostile_body() {
    let embed =
        Server::start("embed", &repo().join("fixtures/models/llama"), &["--task", "embed", "--max-model-len", "256"]);
    fuzz(embed, pooling_seeds());
    let rerank = Server::start("rerank", &repo().join("fixtures/pooling/bert-rerank"), &[]);
    fuzz(rerank, cross_encoder_seeds());
}
