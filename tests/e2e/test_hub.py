"""`ferrite serve org/name` downloading through the Hub's file API, against a loopback imitation
of it (no network here): the files land in the Hugging Face cache layout, a private repository
needs HF_TOKEN, a repository without config.json is refused, and a download cut off part-way
resumes where it stopped."""

import hashlib
import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import MODEL, NAME

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
FILES = {p.name: p.read_bytes() for p in MODEL.iterdir() if p.suffix in (".json", ".safetensors")}


class Hub(BaseHTTPRequestHandler):
    """`/api/models/{repo}/revision/{rev}` and `/{repo}/resolve/{rev}/{file}`, with Range."""

    repos = {"tiny/llama": FILES, "private/llama": FILES, "tiny/no-config": {"README.json": b"{}"}}
    cut_once = set()  # (repo, file): the first full download of these stops half-way
    ranges = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        if parts[0] == "api":
            repo = "/".join(parts[2:4])
            files = self.authorized(repo)
            if files is not None:
                self.send_json({"sha": COMMIT, "siblings": [{"rfilename": f} for f in files]})
            return
        repo, name = "/".join(parts[0:2]), "/".join(parts[4:])
        files = self.authorized(repo)
        if files is None:
            return
        if name not in files:
            self.send_error(404, "Entry not found")
            return
        data = files[name]
        start = int(self.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0] or 0)
        end = len(data) - 1 if self.headers.get("Range", "").endswith("-") else min(int(self.headers.get("Range", "bytes=0-0").split("-")[1]), len(data) - 1)
        Hub.ranges.append((repo, name, self.headers.get("Range")))
        body = data[start:end + 1]
        self.send_response(206)
        self.send_header("x-repo-commit", COMMIT)
        self.send_header("etag", '"%s"' % hashlib.sha256(data).hexdigest())
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if (repo, name) in Hub.cut_once and start == 0 and len(body) > 1:
            Hub.cut_once.discard((repo, name))
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def authorized(self, repo):
        if repo.startswith("private/") and self.headers.get("Authorization") != "Bearer good":
            self.send_error(401, "Unauthorized")
            return None
        if repo not in self.repos:
            self.send_error(404, "Repository not found")
            return None
        return self.repos[repo]

    def send_json(self, value):
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def start(model, env):
    return subprocess.run([os.environ["FERRITE_BIN"], "generate", "--model", model, "--prompt", "hi", "--max-tokens", "2",
                           "--temperature", "0"], capture_output=True, text=True, timeout=120, env=env)


def test_model_ids_download_into_the_hugging_face_cache(hub, tmp_path, spawn):
    env = {"HF_ENDPOINT": hub, "HF_HUB_CACHE": str(tmp_path / "hub")}
    Hub.cut_once.add(("tiny/llama", "model.safetensors"))
    s = spawn(model_args=["tiny/llama"], env=env)
    assert s.json("GET", "/v1/models")[1]["data"][0]["root"] == "tiny/llama"
    snapshot = tmp_path / "hub" / "models--tiny--llama" / "snapshots" / COMMIT
    assert (snapshot / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert (tmp_path / "hub" / "models--tiny--llama" / "refs" / "main").read_text().strip() == COMMIT
    # The cut-off download went on from where it stopped.
    assert any(n == "model.safetensors" and r not in (None, "bytes=0-0", "bytes=0-") for _, n, r in Hub.ranges), Hub.ranges


def test_private_and_broken_repositories_fail_naming_the_cause(hub, tmp_path):
    env = dict(os.environ, HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path / "hub"))
    env.pop("HF_TOKEN", None)
    r = start("private/llama", env)
    assert r.returncode != 0 and "401" in r.stderr and "HF_TOKEN" in r.stderr, r.stderr
    assert start("private/llama", dict(env, HF_TOKEN="good")).returncode == 0
    r = start("tiny/no-config", env)
    assert r.returncode != 0 and "config.json" in r.stderr, r.stderr
    r = start("tiny/absent", env)
    assert r.returncode != 0 and "404" in r.stderr, r.stderr
    r = start("tiny/llama", dict(env, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "empty")))
    assert r.returncode != 0 and "HF_HUB_OFFLINE" in r.stderr, r.stderr


def test_a_gguf_file_of_a_repository(hub, tmp_path):
    gguf = os.environ.get("FERRITE_SMOLLM2_GGUF")
    if not gguf:
        pytest.skip("SKIP: FERRITE_SMOLLM2_GGUF (the default model's GGUF, which scripts/test.sh fetches) is not set")
    Hub.repos["tiny/gguf"] = {"smol.Q4_1.gguf": open(gguf, "rb").read(), "README.json": b"{}"}
    env = dict(os.environ, HF_ENDPOINT=hub, HF_HUB_CACHE=str(tmp_path / "hub"))
    r = start("tiny/gguf:smol.Q4_1.gguf", env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hub" / "models--tiny--gguf" / "snapshots" / COMMIT / "smol.Q4_1.gguf").exists()
    # Only the named file is fetched.
    assert not (tmp_path / "hub" / "models--tiny--gguf" / "snapshots" / COMMIT / "README.json").exists()
    r = start("tiny/gguf:other.gguf", env)
    assert r.returncode != 0 and "404" in r.stderr, r.stderr
    # vLLM's form names the quantization; from the cache when offline.
    assert start("tiny/gguf:Q4_1", env).returncode == 0
    assert start("tiny/gguf:q4_1", dict(env, HF_HUB_OFFLINE="1")).returncode == 0
    r = start("tiny/gguf:Q8_0", env)
    assert r.returncode != 0 and "Q8_0" in r.stderr, r.stderr
