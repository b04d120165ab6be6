"""Every endpoint, streaming and not, through the openai client and raw HTTP."""

import json
import math
import os
import subprocess
import time

import pytest

from conftest import MAX_MODEL_LEN, NAME, health_during, open_stream, sse_events

PROMPT = "The quick brown fox jumps over"
LONG = {"max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}


def greedy(client, prompt, **kw):
    args = dict(LONG, **kw)
    return client.completions.create(model=NAME, prompt=prompt, **args)


def test_health_version_models(server, client):
    status, _, body = server.request("GET", "/health")
    assert status == 200 and body == b""
    status, version = server.json("GET", "/version")
    assert status == 200 and isinstance(version["version"], str) and version["version"]
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    card = models.data[0]
    assert card.object == "model" and card.owned_by == "ferrite" and card.created > 0
    status, raw = server.json("GET", "/v1/models")
    assert raw["object"] == "list"
    assert raw["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert raw["data"][0]["root"].endswith("llama")


def test_tokenize_detokenize_roundtrip(server):
    status, t = server.json("POST", "/tokenize", {"model": NAME, "prompt": PROMPT, "return_token_strs": True})
    assert status == 200, t
    assert t["count"] == len(t["tokens"]) > 0
    assert t["max_model_len"] == MAX_MODEL_LEN
    assert len(t["token_strs"]) == t["count"] and all(isinstance(s, str) for s in t["token_strs"])
    status, plain = server.json("POST", "/tokenize", {"prompt": PROMPT})
    assert plain["tokens"] == t["tokens"] and plain["token_strs"] is None
    status, d = server.json("POST", "/detokenize", {"model": NAME, "tokens": t["tokens"]})
    assert status == 200 and d == {"prompt": PROMPT}
    messages = [{"role": "user", "content": "hi"}]
    status, chat = server.json("POST", "/tokenize", {"messages": messages})
    status, rendered = server.json("POST", "/detokenize", {"tokens": chat["tokens"]})
    assert rendered["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    status, no_gen = server.json("POST", "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert no_gen["count"] < chat["count"]


def test_completion_text_prompt_and_usage(server, client):
    r = greedy(client, PROMPT)
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == NAME
    assert r.created > 0 and r.system_fingerprint is None
    (choice,) = r.choices
    assert choice.index == 0 and choice.finish_reason == "length" and choice.text
    _, t = server.json("POST", "/tokenize", {"prompt": PROMPT})
    assert r.usage.prompt_tokens == t["count"]
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    # Greedy decoding is deterministic across requests.
    assert greedy(client, PROMPT).choices[0].text == choice.text


def test_completion_prompt_shapes_agree(server, client):
    other = "Once upon a time"
    a, b = greedy(client, PROMPT).choices[0].text, greedy(client, other).choices[0].text
    both = greedy(client, [PROMPT, other])
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [a, b]
    _, ta = server.json("POST", "/tokenize", {"prompt": PROMPT})
    _, tb = server.json("POST", "/tokenize", {"prompt": other})
    assert greedy(client, ta["tokens"]).choices[0].text == a
    ids = greedy(client, [ta["tokens"], tb["tokens"]])
    assert [c.text for c in ids.choices] == [a, b]
    assert ids.usage.prompt_tokens == ta["count"] + tb["count"]
    assert ids.usage.completion_tokens == 24


def test_completion_echo_and_logprobs(client):
    plain = greedy(client, PROMPT, logprobs=3)
    lp = plain.choices[0].logprobs
    n = plain.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    if not any("\ufffd" in t for t in lp.tokens):
        assert "".join(lp.tokens) == plain.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and 3 <= len(top) <= 4
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(logprob, max(top.values()), abs_tol=1e-5)
        assert token in top
    echoed = greedy(client, PROMPT, echo=True, logprobs=1)
    c = echoed.choices[0]
    assert c.text == PROMPT + plain.choices[0].text
    p = echoed.usage.prompt_tokens
    assert len(c.logprobs.tokens) == p + n
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert all(x is not None for x in c.logprobs.token_logprobs[1:])
    if not any("\ufffd" in t for t in c.logprobs.tokens):
        assert "".join(c.logprobs.tokens) == c.text


def test_completion_n_seed_and_sampling_params(client):
    kw = dict(max_tokens=8, n=3, temperature=1.0, top_p=0.9, seed=1234, extra_body={"top_k": 50})
    first = client.completions.create(model=NAME, prompt=PROMPT, **kw)
    again = client.completions.create(model=NAME, prompt=PROMPT, **kw)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    # Usage counts the tokens of every choice.
    assert 3 <= first.usage.completion_tokens <= 24
    extras = client.completions.create(
        model=NAME, prompt=PROMPT, max_tokens=6, temperature=0.8, seed=7, presence_penalty=0.5,
        frequency_penalty=0.5, extra_body={"min_p": 0.05, "repetition_penalty": 1.2, "min_tokens": 6, "ignore_eos": True},
    )
    assert extras.usage.completion_tokens == 6


def test_completion_stop_strings_and_stop_token_ids(server, client):
    base = greedy(client, PROMPT, max_tokens=16, logprobs=0)
    text, tokens = base.choices[0].text, base.choices[0].logprobs.tokens
    # A stop string taken from the middle of the greedy output cuts the text just before it.
    stop = next(t for t in tokens[3:] if t.strip())
    cut = greedy(client, PROMPT, max_tokens=16, stop=stop)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].stop_reason == stop
    assert text.startswith(cut.choices[0].text) and stop not in cut.choices[0].text
    listed = greedy(client, PROMPT, max_tokens=16, stop=["\u2603", stop])
    assert listed.choices[0].text == cut.choices[0].text
    # A stop token id: the id of a generated token, found by tokenizing its (clean) string alone.
    for pos, token in enumerate(tokens[2:], start=2):
        _, t = server.json("POST", "/tokenize", {"prompt": token, "add_special_tokens": False})
        if token.isascii() and token.strip() and len(t["tokens"]) == 1:
            break
    else:
        raise AssertionError(f"no clean single-token string in {tokens}")
    stop_id = t["tokens"][0]
    by_id = greedy(client, PROMPT, max_tokens=16, extra_body={"stop_token_ids": [stop_id], "ignore_eos": True})
    c = by_id.choices[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop_id
    assert by_id.usage.completion_tokens <= pos + 1


def test_completion_stream_matches_non_stream(server, client):
    expected = greedy(client, PROMPT).choices[0].text
    chunks = list(greedy(client, PROMPT, stream=True, stream_options={"include_usage": True}))
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert all(ch.id == chunks[0].id and ch.id.startswith("cmpl-") for ch in chunks)
    assert all(ch.object == "text_completion" for ch in chunks)
    assert "".join(ch.choices[0].text for ch in text_chunks) == expected
    assert [ch.choices[0].finish_reason for ch in text_chunks][-1] == "length"
    assert all(ch.choices[0].finish_reason is None for ch in text_chunks[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 12
    # The wire format itself: data: lines, no usage unless asked, ending with [DONE].
    conn, r = open_stream(server, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 4, "stream": True})
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    events = sse_events(r)
    conn.close()
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in b for b in bodies)
    assert bodies[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_completion_stream_n_and_prompts(client):
    chunks = list(client.completions.create(
        model=NAME, prompt=[PROMPT, "Hello"], max_tokens=5, n=2, temperature=1.0, seed=3, stream=True,
        extra_body={"ignore_eos": True},
    ))
    texts = {}
    finished = set()
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2, 3}
    full = client.completions.create(
        model=NAME, prompt=[PROMPT, "Hello"], max_tokens=5, n=2, temperature=1.0, seed=3,
        extra_body={"ignore_eos": True},
    )
    assert [texts[i] for i in range(4)] == [c.text for c in full.choices]


def test_chat_completion_basic(server, client):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something."},
        {"role": "assistant", "content": "Something."},
        {"role": "user", "content": "Again."},
    ]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=10, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == NAME
    assert r.system_fingerprint is None
    (c,) = r.choices
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    _, t = server.json("POST", "/tokenize", {"messages": messages})
    assert r.usage.prompt_tokens == t["count"]
    assert 0 < r.usage.completion_tokens <= 10


def test_chat_content_parts_equal_joined_string(client):
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    a = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": parts}], max_tokens=8, temperature=0)
    b = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "first\nsecond"}], max_tokens=8, temperature=0
    )
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_chat_stream_chunks_and_usage(client):
    kw = dict(model=NAME, messages=[{"role": "user", "content": "Tell me a story"}], max_completion_tokens=12,
              temperature=0, extra_body={"ignore_eos": True})
    expected = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    first, body, usage = chunks[0], chunks[1:-1], chunks[-1]
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert "".join(ch.choices[0].delta.content or "" for ch in body) == expected.choices[0].message.content
    assert body[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in body[:-1])
    assert usage.choices == [] and usage.usage.completion_tokens == 12
    assert usage.usage.prompt_tokens == expected.usage.prompt_tokens
    assert expected.usage.completion_tokens == 12


def test_chat_logprobs_n_and_stop(client):
    msgs = [{"role": "user", "content": "Count"}]
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert bytes(entry.bytes) == entry.token.encode()
        assert len(entry.top_logprobs) == 2
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-5)
    if not any("\ufffd" in e.token for e in content):
        assert "".join(e.token for e in content) == r.choices[0].message.content
    plain = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None
    many = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, n=3, temperature=1.0, seed=5)
    assert [c.index for c in many.choices] == [0, 1, 2]
    stream = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=4, n=2, temperature=1.0,
                                                 seed=5, stream=True))
    roles = [ch.choices[0].index for ch in stream if ch.choices and ch.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1]
    text = r.choices[0].message.content
    stop = next(e.token for e in content[2:] if e.token.strip())
    cut = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=6, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and text.startswith(cut.choices[0].message.content)


def test_metrics_exposition(server, client):
    before = server.metrics()
    greedy(client, PROMPT)
    # The engine publishes its counters after the step that sent the last token.
    after = server.wait_metrics(
        lambda m: m["vllm:generation_tokens_total"] >= before["vllm:generation_tokens_total"] + 12
    )
    for name in [
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum",
        "vllm:request_time_per_output_token_seconds_count", "vllm:inter_token_latency_seconds_count",
        "vllm:request_queue_time_seconds_count", "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count", "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count", "vllm:e2e_request_latency_seconds_count",
    ]:
        assert name in after, name
    assert after["vllm:generation_tokens_total"] >= before["vllm:generation_tokens_total"] + 12
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    assert after["vllm:time_to_first_token_seconds_count"] == before["vllm:time_to_first_token_seconds_count"] + 1
    assert after["vllm:e2e_request_latency_seconds_count"] == before["vllm:e2e_request_latency_seconds_count"] + 1
    # One request of 12 tokens: up to 11 gaps between their arrivals, each phase observed once.
    gaps = after["vllm:inter_token_latency_seconds_count"] - before["vllm:inter_token_latency_seconds_count"]
    assert 1 <= gaps <= 11, gaps
    for phase in ["queue_time", "prefill_time", "decode_time", "prompt_tokens", "generation_tokens"]:
        name = f"vllm:request_{phase}_count" if "tokens" in phase else f"vllm:request_{phase}_seconds_count"
        assert after[name] == before[name] + 1, name
    assert after["vllm:request_generation_tokens_sum"] == before["vllm:request_generation_tokens_sum"] + 12
    # Engine steps: the prompt's (at least its last token: the rest may be a prefix-cache hit),
    # then one per further token.
    steps = after["vllm:iteration_tokens_total_count"] - before["vllm:iteration_tokens_total_count"]
    computed = after["vllm:iteration_tokens_total_sum"] - before["vllm:iteration_tokens_total_sum"]
    assert steps >= 12 and computed >= 12, (steps, computed)
    key = f'vllm:request_success_total{{model_name="{NAME}",engine="0",finished_reason="length"}}'
    assert after[key] == before[key] + 1
    inf = f'vllm:e2e_request_latency_seconds_bucket{{model_name="{NAME}",engine="0",le="+Inf"}}'
    assert after[inf] == after["vllm:e2e_request_latency_seconds_count"]
    assert 0.0 <= after["vllm:kv_cache_usage_perc"] <= 1.0
    _, headers, text = server.request("GET", "/metrics")
    assert headers["content-type"].startswith("text/plain")
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text.decode()


def test_generation_config_supplies_sampling_defaults(spawn, client, tmp_path):
    # A model creator's recommendation of greedy decoding: requests that leave temperature out
    # decode greedily, and what a request sets still wins (vLLM's `--generation-config`).
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 50, "max_new_tokens": 5}))
    s = spawn("--generation-config", str(tmp_path))
    recommended = s.client()
    prompt = "the quick brown fox"
    greedy = client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    omitted = recommended.completions.create(model=NAME, prompt=prompt, max_tokens=24).choices[0].text
    assert omitted == greedy
    chat = [{"role": "user", "content": prompt}]
    greedy_chat = client.chat.completions.create(model=NAME, messages=chat, max_tokens=16, temperature=0)
    omitted_chat = recommended.chat.completions.create(model=NAME, messages=chat, max_tokens=16)
    assert omitted_chat.choices[0].message.content == greedy_chat.choices[0].message.content
    sampled = dict(model=NAME, prompt=prompt, max_tokens=24, temperature=1.0, seed=7)
    assert (
        recommended.completions.create(**sampled).choices[0].text
        == client.completions.create(**sampled).choices[0].text
    )
    # max_new_tokens is the default length of a chat reply; a request's max_tokens still wins,
    # and completions keep their default of 16.
    free = dict(model=NAME, messages=chat, extra_body={"ignore_eos": True})
    assert recommended.chat.completions.create(**free).usage.completion_tokens == 5
    assert recommended.chat.completions.create(**free, max_tokens=7).usage.completion_tokens == 7
    assert client.chat.completions.create(**free, max_tokens=9).usage.completion_tokens == 9
    completion = recommended.completions.create(model=NAME, prompt=prompt, extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 16


def test_ping_and_load(server):
    assert server.request("GET", "/ping")[0] == 200
    assert server.request("POST", "/ping")[0] == 200
    status, body = server.json("GET", "/load")
    assert status == 200 and body["server_load"] >= 0
    status, info = server.json("GET", "/server_info")
    assert status == 200 and info["served_model_names"] == [NAME] and info["max_model_len"] == MAX_MODEL_LEN
    assert info["generates"] is True and info["api_key_required"] is False


def test_long_prompts_do_not_stall_other_connections(server):
    # Two 10 MB prompts tokenize (then fail the context check) while /health is polled: the
    # tokenization runs beside the async runtime, so /health keeps answering at once.
    big = {"model": NAME, "prompt": "the quick brown fox " * 500_000, "max_tokens": 1}
    done, worst = health_during(server, "/v1/completions", big)
    assert [s for s, _ in done] == [400, 400], done
    busy = min(d for _, d in done)
    assert busy > 1.0, f"the prompts took only {busy:.2f} s: too short to show a stall"
    # A stalled runtime answers /health only when a tokenization ends (`worst` about `busy`); on
    # two cores that both tokenize, the scheduler alone may hold a poll back a few tenths of a
    # second, in proportion to how long the cores stay busy.
    bound = max(0.5, busy / 4)
    assert worst < bound, f"/health took {worst:.2f} s while long prompts were tokenized ({busy:.2f} s)"


def test_bench_with_vllm_bench_serve_flags(server, tmp_path):
    # `vllm bench serve`'s command line against the server: vLLM's table and result fields.
    r = subprocess.run(
        [os.environ["FERRITE_BIN"], "bench", "--base-url", server.base, "--backend", "vllm", "--dataset-name", "random",
         "--random-input-len", "16", "--random-output-len", "8", "--num-prompts", "6", "--max-concurrency", "2",
         "--request-rate", "50", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
         "--goodput", "ttft:60000", "--ignore-eos", "--save-result", "--result-dir", str(tmp_path),
         "--result-filename", "r.json"],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "============ Serving Benchmark Result ============" in r.stdout
    for line in ["Successful requests:", "Maximum request concurrency:", "Output token throughput (tok/s):",
                 "Mean TTFT (ms):", "P99 TPOT (ms):", "Median ITL (ms):", "P50 E2EL (ms):"]:
        assert line in r.stdout, (line, r.stdout)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["total_input_tokens"] == 6 * 16 and result["total_output_tokens"] == 6 * 8
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    for key in ["duration", "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_tpot_ms",
                "p99_itl_ms", "p50_e2el_ms", "std_ttft_ms"]:
        assert key in result, key
    assert result["output_lens"] == [8] * 6 and len(result["ttfts"]) == 6
    bad = subprocess.run([os.environ["FERRITE_BIN"], "bench", "--base-url", server.base, "--dataset-name", "bogus"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "random and sharegpt" in bad.stderr, bad.stderr


def test_bench_with_a_sharegpt_dataset(server, tmp_path):
    text = "Beautiful is better than ugly. Explicit is better than implicit. Simple is better than complex."
    conversations = [{"conversations": [{"from": "human", "value": f"{i}: {text}"},
                                        {"from": "gpt", "value": text[: 20 + 10 * i]}]} for i in range(5)]
    conversations.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": text}]})
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(conversations))
    r = subprocess.run(
        [os.environ["FERRITE_BIN"], "bench", "--base-url", server.base, "--dataset-name", "sharegpt", "--dataset-path",
         str(data), "--num-prompts", "10", "--max-concurrency", "2", "--save-result", "--result-dir", str(tmp_path),
         "--result-filename", "s.json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "s.json").read_text())
    # The "hi" conversation is under 4 tokens: skipped, as vLLM does.
    assert result["completed"] == 5 and result["failed"] == 0
    counted = [server.json("POST", "/tokenize", {"prompt": c["conversations"][0]["value"]})[1]["count"]
               for c in conversations[:5]]
    assert sorted(result["input_lens"]) == sorted(counted)
    assert result["total_output_tokens"] == sum(result["output_lens"])


def test_truncate_prompt_tokens_keeps_the_end_of_a_long_prompt(server):
    long = "hello " * 2000
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": long, "max_tokens": 2})
    assert status == 400 and "maximum context length" in body["error"]["message"]
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": long + "end", "max_tokens": 2,
                                                           "truncate_prompt_tokens": 10, "echo": True})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == 10
    assert body["choices"][0]["text"].startswith(" hello") and "end" in body["choices"][0]["text"]
    status, body = server.json("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": long}], "max_tokens": 2, "truncate_prompt_tokens": -1})
    # -1 keeps as many tokens as the context holds: none are left to generate, as in vLLM.
    assert status == 400 and f"{MAX_MODEL_LEN} tokens in the messages" in body["error"]["message"], body
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "truncate_prompt_tokens": 0})
    assert status == 400 and body["error"]["param"] == "truncate_prompt_tokens"


def test_continuous_usage_stats_count_each_choice_as_it_streams(server):
    for path, body in [("/v1/completions", {"prompt": "hello there"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]})]:
        conn, resp = open_stream(server, path, {
            "model": NAME, **body, "max_tokens": 6, "n": 2, "temperature": 1.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
        conn.close()
        counted = {}
        for c in chunks:
            if c["choices"] and c["choices"][0].get("delta", {}).get("role") is None:
                assert c["usage"] is not None, c
                i = c["choices"][0]["index"]
                assert c["usage"]["completion_tokens"] >= counted.get(i, 0)
                counted[i] = c["usage"]["completion_tokens"]
        assert counted == {0: 6, 1: 6}, counted
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


def test_return_token_ids_gives_prompt_and_output_ids_whole_and_streamed(server):
    status, tok = server.json("POST", "/tokenize", {"model": NAME, "prompt": "hello there"})
    prompt_ids = tok["tokens"]
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hello there", "max_tokens": 4,
                                                           "temperature": 0.0, "ignore_eos": True, "return_token_ids": True})
    assert status == 200, body
    c = body["choices"][0]
    assert c["prompt_token_ids"] == prompt_ids and len(c["token_ids"]) == 4
    status, detok = server.json("POST", "/detokenize", {"model": NAME, "tokens": c["token_ids"]})
    assert detok["prompt"] == c["text"]
    conn, resp = open_stream(server, "/v1/completions", {"model": NAME, "prompt": "hello there", "max_tokens": 4,
                                                        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
                                                        "stream": True})
    chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert [t for ch in chunks for t in ch["choices"][0]["token_ids"]] == c["token_ids"]
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    status, body = server.json("POST", "/v1/chat/completions", chat)
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"] and len(body["choices"][0]["token_ids"]) == 3
    conn, resp = open_stream(server, "/v1/chat/completions", {**chat, "stream": True})
    chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    assert [t for ch in chunks[1:] for t in ch["choices"][0]["token_ids"]] == body["choices"][0]["token_ids"]


def test_prompt_logprobs_and_tokens_as_ids(server):
    status, tok = server.json("POST", "/tokenize", {"model": NAME, "prompt": "hello there friend"})
    ids = tok["tokens"]
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hello there friend", "max_tokens": 2,
                                                           "prompt_logprobs": 2, "temperature": 0.0})
    assert status == 200, body
    plp = body["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for i, entry in enumerate(plp[1:], start=1):
        assert str(ids[i]) in entry and 1 <= len(entry) <= 3, entry
        own = entry[str(ids[i])]
        assert own["logprob"] <= 0 and own["rank"] >= 1 and isinstance(own["decoded_token"], str)
        assert sorted(e["rank"] for k, e in entry.items() if k != str(ids[i]))[:2] in ([1, 2], [1], [2], [])
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 1}
    status, body = server.json("POST", "/v1/chat/completions", chat)
    assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"] and body["prompt_logprobs"][0] is None
    conn, resp = open_stream(server, "/v1/chat/completions", {**chat, "stream": True})
    chunks = [json.loads(e) for e in sse_events(resp) if e != "[DONE]"]
    conn.close()
    assert sum(1 for c in chunks if c.get("prompt_logprobs")) == 1
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hello", "max_tokens": 3, "logprobs": 1,
                                                           "return_tokens_as_token_ids": True, "temperature": 0.0})
    tokens = body["choices"][0]["logprobs"]["tokens"]
    assert tokens and all(t.startswith("token_id:") and t[9:].isdigit() for t in tokens), tokens
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "prompt_logprobs": 99})
    assert status == 400 and body["error"]["param"] == "prompt_logprobs"


def test_echo_with_max_tokens_zero_scores_the_prompt(server):
    status, tok = server.json("POST", "/tokenize", {"model": NAME, "prompt": "hello there friend"})
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hello there friend", "echo": True,
                                                           "max_tokens": 0, "logprobs": 1})
    assert status == 200, body
    c = body["choices"][0]
    assert c["text"] == "hello there friend" and c["finish_reason"] == "length"
    assert len(c["logprobs"]["tokens"]) == len(tok["tokens"]) and c["logprobs"]["token_logprobs"][0] is None
    assert all(lp <= 0 for lp in c["logprobs"]["token_logprobs"][1:])
    assert body["usage"]["completion_tokens"] == 0
    status, body = server.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens"
