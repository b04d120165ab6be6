"""Soak test: `ferrite serve` on the default model under mixed traffic for a bounded time.

Clients send streaming and plain completions and chat requests with short and long prompts,
cut some streams mid-way (the connection closed), and send malformed requests. Every few
seconds the script samples the server's resident memory, open file descriptors, and its
`/metrics` (running and waiting requests, KV-cache usage). At the end it checks:

- no lost request: every request got an HTTP answer (200, or a clean 400/503), or was one the
  client cut on purpose;
- resident memory after warm-up grows by at most 2 %;
- the server returns to idle (no running or waiting requests, KV cache empty).

    .venv-ci/bin/python benches/soak.py --minutes 30                 # the full run
    .venv-ci/bin/python benches/soak.py --minutes 5 --out benches/results/soak-smoke.json

Prints one JSON report (also written to --out) and exits 1 when a check fails.
"""

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def metrics(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            if line.startswith(name):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class Traffic:
    def __init__(self, port, seed):
        self.port = port
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {}
        self.latencies = []

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def one(self):
        r = self.rng
        kind = r.choice(["completion", "chat", "stream", "chat_stream", "cut", "bad", "bad"])
        words = " ".join(r.choice(["tell", "me", "about", "the", "sea", "and", "sky"]) for _ in range(r.choice([3, 40, 400])))
        if kind in ("completion", "stream", "cut"):
            path = "/v1/completions"
            body = {"model": "soak", "prompt": words, "max_tokens": r.choice([1, 16, 64]), "temperature": 0.7}
        else:
            path = "/v1/chat/completions"
            body = {"model": "soak", "messages": [{"role": "user", "content": words}], "max_tokens": r.choice([1, 16, 64])}
        if kind in ("stream", "chat_stream", "cut"):
            body["stream"] = True
        if kind == "bad":
            body = r.choice([{"model": "soak"}, {"model": "soak", "prompt": "x", "max_tokens": -1}, "not json"])
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        start = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if kind == "cut" and resp.status == 200:
                resp.read(64)  # a first event or two, then hang up
                conn.close()
                self.count("cut")
                return
            resp.read()
            self.count(f"{kind}:{resp.status}")
            if resp.status == 200:
                with self.lock:
                    self.latencies.append(time.time() - start)
        except (OSError, http.client.HTTPException) as e:
            self.count(f"lost:{type(e).__name__}")
        finally:
            conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--ferrite", default=str(REPO / "target/release/ferrite"))
    ap.add_argument("--out")
    args = ap.parse_args()
    model = subprocess.run([args.ferrite, "default-model"], capture_output=True, text=True, check=True).stdout.strip()
    port = free_port()
    log = open(os.devnull, "w")
    server = subprocess.Popen([args.ferrite, "serve", "--model", model, "--port", str(port), "--served-model-name",
                               "soak", "--max-model-len", "2048", "--kv-cache-memory", "256MiB"], stdout=log, stderr=log)
    deadline = time.time() + 120
    while True:
        try:
            metrics(port)
            break
        except OSError:
            if time.time() > deadline or server.poll() is not None:
                sys.exit("the server did not start")
            time.sleep(0.2)
    traffic = Traffic(port, seed=0)
    stop = threading.Event()

    def client():
        while not stop.is_set():
            traffic.one()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    samples = []
    started = time.time()
    end = started + args.minutes * 60
    while time.time() < end:
        time.sleep(5)
        m = metrics(port)
        samples.append({"t": round(time.time() - started, 1), "rss_kib": rss_kib(server.pid),
                        "fds": len(os.listdir(f"/proc/{server.pid}/fd")), **m})
    stop.set()
    for t in threads:
        t.join(timeout=180)
    time.sleep(2)
    idle = metrics(port)
    server.terminate()
    server.wait(timeout=60)
    # Warm-up: the first fifth of the run (allocator pools and caches filling).
    warm = [s["rss_kib"] for s in samples[len(samples) // 5:]]
    growth = (warm[-1] - warm[0]) / warm[0] if len(warm) > 1 else 0.0
    lat = sorted(traffic.latencies)
    pct = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None
    lost = {k: v for k, v in traffic.counts.items() if k.startswith("lost")}
    report = {
        "bench": "soak", "date": time.strftime("%Y-%m-%d"), "machine": os.uname().machine,
        "cores": os.cpu_count(), "minutes": args.minutes, "clients": args.clients, "model": Path(model).name,
        "requests": traffic.counts, "latency_s": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
        "rss_growth_after_warmup": round(growth, 4), "samples": samples, "idle_metrics": idle,
        "checks": {
            "no_lost_request": not lost,
            "rss_growth_at_most_2_percent": growth <= 0.02,
            "back_to_idle": idle.get("vllm:num_requests_running", 0) == 0
            and idle.get("vllm:num_requests_waiting", 0) == 0 and idle.get("vllm:kv_cache_usage_perc", 0) == 0,
            "fds_bounded": max(s["fds"] for s in samples) < 200 if samples else True,
        },
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    sys.exit(0 if all(report["checks"].values()) else 1)


if __name__ == "__main__":
    main()
