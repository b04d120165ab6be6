"""End-to-end tests of `ferrite serve`: the real binary on a loopback port, driven with the
official `openai` client and with raw HTTP.

Run through `cargo test -p ferrite --test server_e2e` (which builds the binary and sets
FERRITE_BIN), or directly:
    FERRITE_BIN=target/release/ferrite .venv-ci/bin/python -m pytest tests/e2e -q
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("FERRITE_E2E_MODEL", REPO / "fixtures" / "models" / "llama"))
NAME = "tiny-llama"
MAX_MODEL_LEN = 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `ferrite serve` process; its stderr goes to a log file shown when a test fails."""

    def __init__(self, tmp_path, *extra, max_model_len=MAX_MODEL_LEN, model_args=None, env=None):
        binary = os.environ.get("FERRITE_BIN")
        if not binary:
            pytest.fail("FERRITE_BIN must point at the ferrite binary")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"server-{self.port}.log"
        self.log = open(self.log_path, "wb")
        model_args = ["--model", str(MODEL)] if model_args is None else model_args
        args = [
            binary, "serve", *model_args, "--port", str(self.port),
            "--served-model-name", NAME, "--max-model-len", str(max_model_len),
            "--kv-cache-memory", "64MiB", *extra,
        ]
        env = dict(os.environ, FERRITE_LOG=os.environ.get("FERRITE_LOG", "info"), **(env or {}))
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
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

    def client(self, api_key="unused", **kw):
        return openai.OpenAI(base_url=f"{self.base}/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def connect(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None):
        """Raw HTTP: returns (status, headers, body bytes). `body` may be bytes or JSON-able."""
        conn = self.connect()
        try:
            if body is not None and not isinstance(body, (bytes, bytearray)):
                body = json.dumps(body).encode()
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def json(self, method, path, body=None, headers=None):
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data) if data else None

    def metrics(self):
        """Samples of /metrics as {name{labels}: value}, plus {name: value} for single-label ones."""
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        out = {}
        for line in data.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
            name, _, labels = key.partition("{")
            if labels == f'model_name="{NAME}",engine="0"}}':
                out[name] = float(value)
        return out

    def wait_metrics(self, predicate, timeout=10):
        """Polls /metrics until `predicate(samples)` holds; returns the samples."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if predicate(m) or time.time() > deadline:
                return m
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("server"))
    yield s
    code = s.stop()
    assert code == 0, f"server exited with {code}:\n{s.logs()}"


@pytest.fixture(scope="session")
def client(server):
    return server.client()


@pytest.fixture
def spawn(tmp_path):
    """Starts extra servers with their own flags; each is stopped after the test."""
    started = []

    def start(*extra, **kw):
        s = Server(tmp_path, *extra, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def health_during(server, path, body, clients=2):
    """Sends `body` to `path` from `clients` threads at once and polls /health until they are
    answered. Returns their (status, seconds) and the slowest /health answer in seconds."""
    done = []

    def send():
        start = time.time()
        done.append((server.request("POST", path, body)[0], time.time() - start))

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for t in threads:
        t.start()
    worst = 0.0
    while any(t.is_alive() for t in threads):
        start = time.time()
        assert server.request("GET", "/health")[0] == 200
        worst = max(worst, time.time() - start)
        time.sleep(0.02)
    for t in threads:
        t.join()
    return done, worst


def sse_events(response):
    """The `data:` payloads of an SSE response (http.client), in order, up to and with [DONE]."""
    events = []
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        events.append(payload)
        if payload == "[DONE]":
            break
    return events


def open_stream(server, path, body, headers=None):
    """Starts a streaming request and returns (connection, response) with the status read."""
    conn = server.connect()
    conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()
