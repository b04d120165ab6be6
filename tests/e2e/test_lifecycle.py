"""The server under load and over its life: API keys, the queue bound, clients that vanish
mid-stream, 64 concurrent streams, shutdown on SIGTERM / SIGINT, CORS and request-id headers."""

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from conftest import MODEL, NAME, free_port, open_stream, sse_events


def test_api_key_guards_v1_only(spawn):
    s = spawn("--api-key", "sekrit")
    assert s.json("GET", "/v1/models")[0] == 401
    status, body = s.json("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and body["error"]["code"] == 401
    status, _ = s.json("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "sekrit"})
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").models.list()
    good = s.client(api_key="sekrit")
    assert [m.id for m in good.models.list().data] == [NAME]
    assert good.completions.create(model=NAME, prompt="hi", max_tokens=2).usage.completion_tokens <= 2
    # As in vLLM: health checks, scrapers and the tokenizer routes need no key.
    assert s.request("GET", "/health")[0] == 200
    assert s.request("GET", "/metrics")[0] == 200
    assert s.json("POST", "/tokenize", {"prompt": "hi"})[0] == 200


def test_queue_bound_gives_503_then_recovers(spawn):
    s = spawn("--max-num-seqs", "1", "--max-queue", "0", max_model_len=2048)
    body = {"model": NAME, "prompt": "hi", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    conn, r = open_stream(s, "/v1/completions", body)
    assert r.status == 200
    r.readline()  # the first chunk: the request holds its slot
    status, err = s.json("POST", "/v1/completions", {"model": NAME, "prompt": "again", "max_tokens": 2})
    assert status == 503, err
    assert err["error"]["type"] == "ServiceUnavailableError" and "overloaded" in err["error"]["message"]
    with pytest.raises(openai.InternalServerError) as e:
        s.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert e.value.status_code == 503
    # Asking for more sequences than the bound could ever hold is the client's error.
    status, err = s.json("POST", "/v1/completions", {"model": NAME, "prompt": ["a", "b"], "max_tokens": 2})
    assert status == 400, err
    conn.close()
    deadline = time.time() + 30
    while True:
        status, _ = s.json("POST", "/v1/completions", {"model": NAME, "prompt": "again", "max_tokens": 2})
        if status == 200 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert status == 200


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = server.wait_metrics(lambda m: m["vllm:num_requests_running"] == 0)
    abort = f'vllm:request_success_total{{model_name="{NAME}",engine="0",finished_reason="abort"}}'
    max_tokens = 1000
    body = {"model": NAME, "prompt": "a long story", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    conn, r = open_stream(server, "/v1/completions", body)
    for _ in range(3):
        assert r.readline().startswith(b"data: ")
        r.readline()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    after = server.wait_metrics(
        lambda m: m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0 and m[abort] > before[abort]
    )
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0
    assert after[abort] == before[abort] + 1
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < max_tokens, "the request ran to the end after its client left"
    # Non-streaming requests keep working.
    c = server.client().completions.create(model=NAME, prompt="hi", max_tokens=3)
    assert c.usage.completion_tokens <= 3


def test_disconnect_while_waiting_for_a_non_streamed_answer_aborts(server):
    before = server.wait_metrics(lambda m: m["vllm:num_requests_running"] == 0)
    abort = f'vllm:request_success_total{{model_name="{NAME}",engine="0",finished_reason="abort"}}'
    max_tokens = 1000
    conn = server.connect()
    body = {"model": NAME, "prompt": "patience", "max_tokens": max_tokens, "ignore_eos": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    server.wait_metrics(lambda m: m["vllm:num_requests_running"] >= 1, timeout=5)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    after = server.wait_metrics(lambda m: m["vllm:num_requests_running"] == 0 and m[abort] > before[abort])
    assert after[abort] == before[abort] + 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < max_tokens
    assert after["vllm:kv_cache_usage_perc"] == 0.0


def test_64_concurrent_streams_match_sequential_greedy(server, client):
    prompts = [f"Request number {i} says" for i in range(64)]
    kw = dict(max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    sequential = [client.completions.create(model=NAME, prompt=p, **kw).choices[0].text for p in prompts]
    chat_sequential = [
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": p}], **kw).choices[0].message.content
        for p in prompts[:16]
    ]

    def stream_completion(p):
        chunks = list(client.completions.create(model=NAME, prompt=p, stream=True,
                                                stream_options={"include_usage": True}, **kw))
        assert chunks[-1].usage.completion_tokens == 24
        assert chunks[-2].choices[0].finish_reason == "length"
        return "".join(ch.choices[0].text for ch in chunks[:-1])

    def stream_chat(p):
        chunks = list(client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": p}],
                                                     stream=True, **kw))
        assert chunks[-1].choices[0].finish_reason == "length"
        return "".join(ch.choices[0].delta.content or "" for ch in chunks)

    with ThreadPoolExecutor(max_workers=80) as pool:
        completions = pool.map(stream_completion, prompts)
        chats = pool.map(stream_chat, prompts[:16])
        completions, chats = list(completions), list(chats)
    assert completions == sequential
    assert chats == chat_sequential
    m = server.wait_metrics(lambda m: m["vllm:num_requests_running"] == 0)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0.0


def test_sigterm_drains_in_flight_then_exits_zero(spawn):
    s = spawn(max_model_len=2048)
    body = {"model": NAME, "prompt": "drain me", "max_tokens": 2000, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    conn, r = open_stream(s, "/v1/completions", body)
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    # New connections are refused once the signal is handled, while the stream goes on.
    deadline = time.time() + 10
    refused = False
    while time.time() < deadline and not refused:
        try:
            socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            time.sleep(0.02)
        except OSError:
            refused = True
    events = sse_events(r)
    conn.close()
    assert refused, "the server kept accepting connections after SIGTERM"
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])
    assert usage["usage"]["completion_tokens"] == 2000
    assert json.loads(events[-3])["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(60) == 0, s.logs()


def test_sigint_exits_zero_and_grace_is_bounded(spawn):
    idle = spawn()
    assert idle.stop(signal.SIGINT) == 0
    s = spawn("--shutdown-timeout", "0.2", max_model_len=2048)
    body = {"model": NAME, "prompt": "cut me", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    # Several long streams, so the work outlasts the grace period.
    streams = [open_stream(s, "/v1/completions", body) for _ in range(4)]
    for _, r in streams:
        r.readline()
    started = time.time()
    s.proc.send_signal(signal.SIGTERM)
    # Each stream cut at the timeout ends with an error event and [DONE], not a dropped connection.
    for conn, r in streams:
        events = sse_events(r)
        conn.close()
        assert events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert "shutdown-timeout" in error["message"], error
    assert s.proc.wait(30) == 0, s.logs()
    assert time.time() - started < 10


def test_cors_and_request_id_headers(spawn, tmp_path):
    s = spawn("--allowed-origins", '["http://app.example"]', "--enable-request-id-headers", "--api-key", "k")
    key = {"Authorization": "Bearer k"}
    # A browser's preflight needs no key; only the listed origin is allowed.
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
    status, headers, _ = s.request("OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    status, headers, _ = s.request("OPTIONS", "/v1/chat/completions", headers={**preflight, "Origin": "http://x.example"})
    assert "access-control-allow-origin" not in headers
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
    status, headers, data = s.request("POST", "/v1/chat/completions", body,
                                      headers={**key, "Origin": "http://app.example", "X-Request-Id": "trace-7"})
    assert status == 200 and b"data: [DONE]" in data
    assert headers["x-request-id"] == "trace-7" and headers["access-control-allow-origin"] == "http://app.example"
    fresh = [s.request("GET", "/health")[1]["x-request-id"] for _ in range(2)]
    assert len(fresh[0]) == 32 and fresh[0] != fresh[1]


def test_bad_cors_flags_fail_at_start_naming_the_flag(tmp_path):
    for flag, value in [("--allowed-origins", "*"), ("--allowed-methods", '["GE T"]')]:
        r = subprocess.run([os.environ["FERRITE_BIN"], "serve", "--model", str(MODEL), flag, value],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and flag in r.stderr, r.stderr


def test_a_vllm_command_line_serves_unchanged(spawn):
    # `vllm serve MODEL` with flags whose meaning ferrite has, and the key from VLLM_API_KEY.
    flags = ["--enable-prefix-caching", "--enable-chunked-prefill", "--trust-remote-code",
             "--disable-log-requests", "--disable-log-stats", "-tp", "1", "--load-format", "safetensors"]
    s = spawn(*flags, "--seed", "7", model_args=[str(MODEL)], env={"VLLM_API_KEY": "vk", "FERRITE_API_KEY": "fk"})
    assert s.json("GET", "/v1/models")[0] == 401
    assert s.json("GET", "/v1/models", headers={"Authorization": "Bearer fk"})[0] == 401
    good = s.client(api_key="vk")
    assert [m.id for m in good.models.list().data] == [NAME]
    assert good.completions.create(model=NAME, prompt="hi", max_tokens=2).usage.completion_tokens <= 2


def test_ferrite_api_key_when_vllm_api_key_is_unset(spawn):
    # An empty VLLM_API_KEY is no key, as an unset one.
    s = spawn(env={"VLLM_API_KEY": "", "FERRITE_API_KEY": "fk"})
    assert s.json("GET", "/v1/models")[0] == 401
    assert s.json("GET", "/v1/models", headers={"Authorization": "Bearer fk"})[0] == 200


@pytest.mark.parametrize("flags,feature", [
    (["-tp", "2"], "tensor parallelism"),
    (["--pipeline-parallel-size", "2"], "pipeline parallelism"),
    (["--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}'], "`medusa` is not built"),
    (["--speculative-config", '{"method": "ngram"}'], "num_speculative_tokens"),
    (["--enable-lora"], "LoRA"),
    (["--quantization", "awq"], "--quantization awq"),
    (["--kv-cache-dtype", "fp8_e5m2"], "fp8_e5m2 KV cache"),
    (["--no-enable-chunked-prefill"], "prefill without chunking"),
    (["--revision", "main"], "not a model id"),
    (["--load-format", "gguf"], "does not match"),
    (["--middleware", "app.Middleware"], "ASGI middleware"),
])
def test_vllm_flags_for_features_not_built_fail_at_start_naming_them(flags, feature):
    r = subprocess.run([os.environ["FERRITE_BIN"], "serve", str(MODEL), *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and feature in r.stderr, r.stderr


def test_quantization_fp8_quantizes_an_unquantized_checkpoint_at_load(spawn):
    # vLLM's online FP8: the weights are rounded to e4m3 as they load, so greedy text may move
    # but the server serves as before.
    s = spawn("--quantization", "fp8")
    client = s.client()
    out = client.completions.create(model=NAME, prompt="The capital of France", max_tokens=8, temperature=0)
    assert out.usage.completion_tokens == 8 and out.choices[0].text


def test_fp8_kv_cache_rounds_keys_and_values_to_e4m3(spawn, server):
    # vLLM's --kv-cache-dtype fp8: keys and values are kept as e4m3 (scales 1.0 for a checkpoint
    # without k_scale / v_scale), so the same greedy request scores its tokens a little
    # differently from a bf16/f32 cache, and the engine says which cache it allocated.
    fp8 = spawn("--kv-cache-dtype", "fp8")
    prompt = "The capital of France is a city of many bridges and"
    outs = [s.client().completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
            for s in (fp8, server)]
    assert all(o.usage.completion_tokens == 6 for o in outs)
    scores = [o.choices[0].logprobs.token_logprobs for o in outs]
    assert scores[0][0] != scores[1][0] and abs(scores[0][0] - scores[1][0]) < 0.5, scores
    assert "dtype=fp8" in fp8.logs() and "dtype=fp8" not in server.logs()


def test_ngram_speculation_serves_the_same_text_and_counts_drafts(spawn):
    spec = spawn("--speculative-config",
                 '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}')
    plain = spawn()
    prompt = "one two three four one two three four one two three four one two"
    outs = [s.client().completions.create(model=NAME, prompt=prompt, max_tokens=32, temperature=0, seed=1)
            for s in (spec, plain)]
    assert outs[0].choices[0].text == outs[1].choices[0].text
    m = spec.metrics()
    assert m["vllm:spec_decode_num_drafts_total"] > 0, m
    assert m["vllm:spec_decode_num_draft_tokens_total"] >= m["vllm:spec_decode_num_accepted_tokens_total"]
    per_pos = [k for k in m if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert len(per_pos) == 4, per_pos
    assert not any("spec_decode" in k for k in plain.metrics())


def test_draft_model_speculation_serves_the_same_text_and_counts_drafts(spawn):
    # The target drafting for itself: every draft, greedy or sampled with a seed, is the token
    # the target draws, so every one is accepted and the text is the plain server's.
    spec = spawn("--speculative-config", json.dumps({"model": str(MODEL), "num_speculative_tokens": 3}))
    plain = spawn()
    for temperature in (0, 0.8):
        outs = [s.client().completions.create(model=NAME, prompt="The quick brown fox", max_tokens=24,
                                              temperature=temperature, seed=5) for s in (spec, plain)]
        assert outs[0].choices[0].text == outs[1].choices[0].text
    chunks = spec.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=16, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = plain.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=16, temperature=0)
    assert streamed == whole.choices[0].message.content
    m = spec.metrics()
    assert m["vllm:spec_decode_num_draft_tokens_total"] > 0, m
    assert m["vllm:spec_decode_num_accepted_tokens_total"] == m["vllm:spec_decode_num_draft_tokens_total"], m


def test_mtp_speculation_serves_the_same_text(spawn):
    # Qwen3.5 (a hybrid: its state rolled back after rejected drafts) with the MTP head its
    # checkpoint carries; the head is random, so this checks the plumbing, not the acceptance.
    mtp_model = ["--model", str(MODEL.parent / "qwen3_5-mtp")]
    spec = spawn("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}', model_args=mtp_model)
    plain = spawn(model_args=mtp_model)
    for temperature in (0, 0.8):
        outs = [s.client().completions.create(model=NAME, prompt="The quick brown fox", max_tokens=24,
                                              temperature=temperature, seed=3) for s in (spec, plain)]
        assert outs[0].choices[0].text == outs[1].choices[0].text
    assert spec.metrics()["vllm:spec_decode_num_draft_tokens_total"] > 0


def test_eagle3_speculation_serves_the_same_text(spawn):
    # A 7-layer Llama with a random EAGLE-3 head in the speculators format beside it: the config
    # names neither method nor draft count (the head's checkpoint says both, as vLLM reads it).
    target = MODEL.parent / "llama-eagle3"
    spec = spawn("--speculative-config", json.dumps({"model": str(target / "eagle3-speculators")}),
                 model_args=["--model", str(target)])
    plain = spawn(model_args=["--model", str(target)])
    for temperature in (0, 0.8):
        outs = [s.client().completions.create(model=NAME, prompt="The quick brown fox", max_tokens=24,
                                              temperature=temperature, seed=3) for s in (spec, plain)]
        assert outs[0].choices[0].text == outs[1].choices[0].text
    m = spec.metrics()
    assert m["vllm:spec_decode_num_draft_tokens_total"] > 0, m
    per_pos = [k for k in m if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert len(per_pos) == 3, per_pos


def test_unfit_draft_models_fail_at_start_naming_them(tmp_path):
    for config, needle in [({"model": str(tmp_path / "absent"), "num_speculative_tokens": 2}, "absent"),
                           ({"method": "draft_model", "num_speculative_tokens": 2}, "needs `model`"),
                           ({"model": str(MODEL.parent / "llava"), "num_speculative_tokens": 2}, "vocabulary"),
                           ({"method": "mtp", "num_speculative_tokens": 1}, "multi-token-prediction head"),
                           ({"method": "eagle3", "model": str(MODEL.parent / "llama-eagle3" / "eagle3"),
                             "num_speculative_tokens": 2}, "eagle_aux_hidden_state_layer_ids")]:
        r = subprocess.run([os.environ["FERRITE_BIN"], "serve", str(MODEL), "--speculative-config", json.dumps(config)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and needle in r.stderr and "--speculative-config" in r.stderr, r.stderr


def test_model_ids_resolve_through_the_hugging_face_cache(spawn, tmp_path):
    # `ferrite serve org/name` serves the snapshot `refs/main` names in HF_HUB_CACHE, under the id.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny--llama"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots").mkdir()
    os.symlink(MODEL.resolve(), repo / "snapshots" / commit)
    s = spawn(model_args=["tiny/llama"], env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert s.json("GET", "/v1/models")[1]["data"][0]["root"] == "tiny/llama"
    r = subprocess.run([os.environ["FERRITE_BIN"], "serve", "tiny/absent", "--download-dir", str(tmp_path / "hub")],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert r.returncode != 0 and "tiny/absent" in r.stderr and "HF_HUB_OFFLINE" in r.stderr, r.stderr


def test_chat_template_max_logprobs_and_tokenizer_flags(spawn):
    template = '{{ "<<" }}{% for m in messages %}{{ m["content"] }}|{% endfor %}'
    s = spawn("--chat-template", template, "--max-logprobs", "3", "--tokenizer", str(MODEL))
    chat = s.json("POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]})
    plain = s.json("POST", "/tokenize", {"prompt": "<<hi|yo|", "add_special_tokens": False})
    assert chat[0] == plain[0] == 200 and chat[1]["tokens"] == plain[1]["tokens"]
    ok = {"model": NAME, "prompt": "hi", "max_tokens": 2, "logprobs": 3}
    assert s.json("POST", "/v1/completions", ok)[0] == 200
    status, body = s.json("POST", "/v1/completions", dict(ok, logprobs=4))
    assert status == 400 and body["error"]["param"] == "logprobs" and "at most 3" in body["error"]["message"]
    unlimited = spawn("--max-logprobs", "-1")
    assert unlimited.json("POST", "/v1/completions", dict(ok, logprobs=25))[0] == 200
    r = subprocess.run([os.environ["FERRITE_BIN"], "serve", str(MODEL), "--tokenizer", "no/such-tokenizer"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no/such-tokenizer" in r.stderr, r.stderr


def test_https_with_vllms_ssl_flags(tmp_path):
    tls = MODEL.parents[1] / "tls"
    port = free_port()
    context = ssl.create_default_context(cafile=str(tls / "cert.pem"))

    def health(secure=True):
        conn = (http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context) if secure
                else http.client.HTTPConnection("127.0.0.1", port, timeout=5))
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status
        finally:
            conn.close()

    log = open(tmp_path / "https.log", "wb")
    proc = subprocess.Popen([os.environ["FERRITE_BIN"], "serve", str(MODEL), "--port", str(port), "--served-model-name", NAME,
                             "--kv-cache-memory", "64MiB", "--ssl-certfile", str(tls / "cert.pem"),
                             "--ssl-keyfile", str(tls / "key.pem")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if health() == 200:
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        http_client = openai.DefaultHttpxClient(verify=context)
        client = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="unused", http_client=http_client,
                               max_retries=0)
        assert client.completions.create(model=NAME, prompt="hi", max_tokens=3).usage.completion_tokens <= 3
        # Plain HTTP on the TLS port gets no answer, and the server keeps serving.
        with pytest.raises((OSError, http.client.HTTPException)):
            health(secure=False)
        assert health() == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
    bad = subprocess.run([os.environ["FERRITE_BIN"], "serve", str(MODEL), "--ssl-certfile", str(tls / "key.pem"),
                          "--ssl-keyfile", str(tls / "key.pem")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "key.pem" in bad.stderr and "certificate" in bad.stderr, bad.stderr


@pytest.mark.parametrize("level,logged", [("info", True), ("warning", False)])
def test_log_level_decides_the_request_lines(tmp_path, level, logged):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FERRITE_LOG"}
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([os.environ["FERRITE_BIN"], "serve", str(MODEL), "--port", str(port), "--kv-cache-memory",
                                 "64MiB", "--uvicorn-log-level", level, "--root-path", "/api"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.time() + 60
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 2}),
                                 headers={"Content-Type": "application/json"})
                    assert conn.getresponse().status == 200
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
    assert ("request submitted" in log_path.read_text()) == logged
