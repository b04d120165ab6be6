//! Admission errors, cancellation, aborts and shutdown: the engine never panics on user input,
//! never hangs and never loses a request.

mod common;

use common::*;
use ferrite_engine::{EngineConfig, EngineError, FinishReason, PromptInput, SamplingParams};
use futures::StreamExt;

#[test]
fn admission_rejects_what_cannot_run() {
    let llm = llm("llama", EngineConfig { kv_cache_memory: kv_memory("llama", 4), ..config() });
    let client = llm.client();
    let max = client.max_model_len();
    assert_eq!(max, 2048);
    let add = |prompt: PromptInput, params: SamplingParams| {
        let err = client.add_request("r".into(), prompt, params).err().expect("must be rejected");
        assert!(err.is_request_error(), "{err}");
        err
    };

    let err = add(PromptInput::Tokens(vec![5; max]), SamplingParams::default());
    assert!(matches!(err, EngineError::PromptTooLong { prompt_tokens: 2048, max_model_len: 2048 }), "{err}");
    let err = add(PromptInput::Tokens(vec![5; 2000]), SamplingParams { max_tokens: Some(100), ..Default::default() });
    assert!(matches!(err, EngineError::ContextLengthExceeded { .. }), "{err}");
    assert!(err.to_string().contains("maximum context length is 2048"), "{err}");
    // 4 blocks hold 64 slots; 60 prompt tokens + 16 completion tokens need 75.
    let err = add(PromptInput::Tokens(vec![5; 60]), SamplingParams { max_tokens: Some(16), ..Default::default() });
    assert!(matches!(err, EngineError::CacheTooSmall { capacity_tokens: 64, .. }), "{err}");
    let err = add(PromptInput::Tokens(vec![]), SamplingParams::default());
    assert!(matches!(err, EngineError::InvalidPrompt(_)), "{err}");
    let err = add(PromptInput::Tokens(vec![1, 1_000_000]), SamplingParams::default());
    assert!(matches!(err, EngineError::InvalidPrompt(_)), "{err}");
    let err = add(PromptInput::Text("hi".into()), SamplingParams { top_p: 1.5, ..Default::default() });
    assert!(matches!(err, EngineError::InvalidParameter { param: "top_p", .. }), "{err}");
    let err = add(PromptInput::Text("hi".into()), SamplingParams { stop_token_ids: vec![5000], ..Default::default() });
    assert!(matches!(err, EngineError::InvalidParameter { param: "stop_token_ids", .. }), "{err}");
    // max_tokens None runs to max_model_len, which must then fit the cache too.
    let err = add(PromptInput::Tokens(vec![5; 10]), SamplingParams { max_tokens: None, ..Default::default() });
    assert!(matches!(err, EngineError::CacheTooSmall { .. }), "{err}");
    // The largest request that fits still runs.
    let out = llm
        .generate(vec![PromptInput::Tokens(vec![5; 49])], &SamplingParams { max_tokens: Some(16), ..greedy(16) })
        .unwrap();
    assert_eq!(out[0].outputs[0].token_ids.len(), 16);
    wait_idle(&client);
}

#[test]
fn dropping_streams_aborts_and_returns_every_block() {
    let llm = llm("llama", config());
    let client = llm.client();
    let total = client.stats().kv_blocks_total;
    let mut streams: Vec<_> = battery("llama")
        .into_iter()
        .enumerate()
        .map(|(i, p)| client.add_request(format!("r{i}"), p, greedy(1000)).unwrap())
        .collect();
    for s in &mut streams {
        let first = s.blocking_next().expect("a first output");
        assert!(!first.finished);
    }
    // The stats snapshot is published after the step that sent those outputs: poll for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while client.stats().kv_blocks_used == 0 {
        assert!(std::time::Instant::now() < deadline, "no KV block in use while 11 requests run");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    drop(streams);
    wait_idle(&client);
    let stats = client.stats();
    assert_eq!((stats.kv_blocks_used, stats.kv_blocks_total), (0, total));
    assert!(stats.finished_requests >= 11);
    // The engine still serves afterwards.
    let out = llm.generate(vec![battery("llama")[1].clone()], &greedy(4)).unwrap();
    assert_eq!(out[0].outputs[0].token_ids, oracle("llama").cases[1].output_ids[..4]);
}

#[test]
fn abort_by_id_finishes_the_stream_with_abort() {
    let llm = llm("llama", config());
    let client = llm.client();
    let mut s = client.add_request("to-abort".into(), battery("llama")[2].clone(), greedy(1000)).unwrap();
    let first = s.blocking_next().unwrap();
    assert_eq!(first.request_id, "to-abort");
    client.abort("to-abort");
    let last = std::iter::from_fn(|| s.blocking_next()).last().unwrap();
    assert!(last.finished);
    assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Abort));
    wait_idle(&client);
}

#[test]
fn async_streams_and_shutdown_with_requests_in_flight() {
    let llm = llm("llama", config());
    let client = llm.client();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (tokens, finish) = rt.block_on(async {
        let mut s = client.add_request("async".into(), battery("llama")[3].clone(), greedy(10)).unwrap();
        let mut tokens = Vec::new();
        let mut finish = None;
        while let Some(out) = s.next().await {
            tokens.extend(out.outputs[0].token_ids.iter().copied());
            finish = out.outputs[0].finish_reason;
        }
        (tokens, finish)
    });
    assert_eq!(tokens, oracle("llama").cases[3].output_ids[..10]);
    assert_eq!(finish, Some(FinishReason::Length));

    // Dropping the engine ends in-flight streams with an abort instead of leaving them hanging.
    let mut s = client.add_request("inflight".into(), battery("llama")[4].clone(), greedy(1000)).unwrap();
    s.blocking_next().unwrap();
    drop(llm);
    let last = std::iter::from_fn(|| s.blocking_next()).last().unwrap();
    assert!(last.finished);
    assert_eq!(last.outputs[0].finish_reason, Some(FinishReason::Abort));
    assert!(matches!(
        client.add_request("late".into(), PromptInput::Text("x".into()), greedy(1)),
        Err(EngineError::EngineStopped)
    ));
}

/// A reader that stops taking outputs (a stalled stream) gets its request aborted once
/// `max_unread_outputs` pile up: the engine frees the sequence instead of generating on, and the
/// stream, read later, ends without a finished output.
#[test]
fn a_stream_nobody_reads_is_aborted_at_the_unread_bound() {
    let llm = llm("llama", EngineConfig { max_unread_outputs: Some(8), ..config() });
    let client = llm.client();
    let mut stalled = client
        .add_request(
            "stalled".into(),
            PromptInput::Tokens(vec![5; 8]),
            SamplingParams { ignore_eos: true, ..greedy(500) },
        )
        .unwrap();
    // The request reaches the engine through its command queue: wait until it has run, then
    // until the engine is idle again, without reading.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while client.stats().generation_tokens_total == 0 {
        assert!(std::time::Instant::now() < deadline, "the request never ran");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    wait_idle(&client);
    let mut outputs = Vec::new();
    while let Some(out) = stalled.blocking_next() {
        outputs.push(out);
    }
    let sizes: Vec<usize> = outputs.iter().map(|o| o.outputs.iter().map(|c| c.token_ids.len()).sum()).collect();
    assert!(outputs.len() <= 9, "{} outputs were queued: {sizes:?}", outputs.len());
    assert!(outputs.iter().all(|o| !o.finished));
    // A reader that keeps up is not affected: its reads count down what it has waiting, so it
    // outlives several times the bound. On a loaded 2-core machine the reader thread can still be
    // descheduled for more steps than the bound, so it gets three tries; if reads did not count
    // down, every try would end at the bound.
    drop(llm);
    let engine = common::llm("llama", EngineConfig { max_unread_outputs: Some(64), ..config() });
    let client = engine.client();
    let mut counts = Vec::new();
    for attempt in 0..3 {
        let mut read = client
            .add_request(
                format!("read-{attempt}"),
                PromptInput::Tokens(vec![5; 8]),
                SamplingParams { ignore_eos: true, ..greedy(400) },
            )
            .unwrap();
        let mut tokens = 0;
        while let Some(out) = read.blocking_next() {
            tokens += out.outputs.iter().map(|o| o.token_ids.len()).sum::<usize>();
            if out.finished {
                assert_eq!(out.outputs[0].finish_reason, Some(FinishReason::Length));
            }
        }
        counts.push(tokens);
        if tokens == 400 {
            break;
        }
    }
    assert_eq!(counts.last(), Some(&400), "a reader that keeps up was cut short every time: {counts:?}");
}
