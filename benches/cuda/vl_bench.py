"""Image requests against a server, and the same work in transformers: time to first token for one
image plus ~64 text tokens, and output throughput at a concurrency with one image per request.

    python3 benches/cuda/vl_bench.py client --base-url http://127.0.0.1:8123 > ferrite.json
    python3 benches/cuda/vl_bench.py baseline --model /tmp/ferrite-bench/qwen2.5-vl-7b > baseline.json

Both sides send the same synthetic image (a PNG of smooth gradients and noise, `--image-size`
pixels a side, a different one per request so that no prefix cache serves it) and the same text
(the first `--text-words` words of a fixed list: the default 32 are about 64 tokens of the
benchmark checkpoints' tokenizer). The
client streams `/v1/chat/completions` (greedy, EOS ignored) and times the first chunk with text;
the baseline times the processor plus `generate(max_new_tokens=1)` for TTFT, and
`generate(max_new_tokens=--output-len)` on a batch of `--concurrency` requests for throughput
(bf16, SDPA). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

WORDS = ("the of and to in is was for on that with as by at from his it an were are which this be or has had "
         "not but first one their its new after who they have her she two been other when there all during into "
         "school time may years more most only over city some world would where later up such used many can "
         "state about national out known university united then made").split()


def image(size: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    base = np.stack([127 + 120 * np.sin(x / 37 + y / 53 + seed), 127 + 120 * np.cos(y / 41 - x / 61),
                     (x + y) * 255 / (2 * size)], axis=-1)
    return Image.fromarray(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8), "RGB")


def png_data_uri(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def stream_one(base_url: str, model: str, uri: str | None, prompt: str, max_tokens: int) -> dict:
    import requests

    image = [{"type": "image_url", "image_url": {"url": uri}}] if uri else []
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": image + [{"type": "text", "text": prompt}]}]}
    start = time.perf_counter()
    first = None
    usage = {}
    last = None
    with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.text[:500]}")
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = last = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
    end = time.perf_counter()
    if first is None:
        raise RuntimeError(f"the stream carried no text; its last event: {last}")
    return {"ttft_s": first - start, "e2e_s": end - start, "prompt_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens")}


def client(args) -> dict:
    import requests

    model = requests.get(f"{args.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    prompt = text(args.text_words)
    seed = iter(range(10_000))
    # Warm-up: the first image request pays for lazily built kernels.
    for _ in range(2):
        stream_one(args.base_url, model, png_data_uri(image(args.image_size, next(seed))), prompt, 2)
    uris = [png_data_uri(image(args.image_size, next(seed))) for _ in range(args.ttft_reps)]
    ttft = [stream_one(args.base_url, model, uri, prompt, 1) for uri in uris]
    # A text-only prompt about as long as the image prompt: what the image itself costs is the difference.
    text_only = []
    if args.text_only_words:
        long_text = text(args.text_only_words)
        text_only = [stream_one(args.base_url, model, None, long_text + f" {i}", 1) for i in range(args.ttft_reps + 1)][1:]
    uris = [png_data_uri(image(args.image_size, next(seed))) for _ in range(args.concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        runs = list(pool.map(lambda u: stream_one(args.base_url, model, u, prompt, args.output_len), uris))
    wall = time.perf_counter() - start
    out = sum(r["output_tokens"] or 0 for r in runs)
    return {
        "prompt_tokens": ttft[0]["prompt_tokens"],
        "ttft_ms": {"median": 1e3 * statistics.median(r["ttft_s"] for r in ttft),
                    "min": 1e3 * min(r["ttft_s"] for r in ttft), "runs": len(ttft)},
        "concurrency": args.concurrency, "output_len": args.output_len, "output_tokens": out, "wall_s": wall,
        "output_tok_s": out / wall,
        "median_ttft_ms_under_load": 1e3 * statistics.median(r["ttft_s"] for r in runs),
        **({"text_only": {"prompt_tokens": text_only[0]["prompt_tokens"],
                          "ttft_ms_median": 1e3 * statistics.median(r["ttft_s"] for r in text_only)}}
           if text_only else {}),
    }


def baseline(args) -> dict:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(args.model)
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.bfloat16, attn_implementation="sdpa",
                                                        device_map=args.device).eval()
    prompt = text(args.text_words)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    chat = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    seed = iter(range(10_000))
    pad = processor.tokenizer.pad_token_id

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def run(images, new_tokens):
        sync()
        start = time.perf_counter()
        inputs = processor(text=[chat] * len(images), images=images, return_tensors="pt", padding=True).to(args.device)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad)
        sync()
        return time.perf_counter() - start, inputs["input_ids"].shape[1], out.shape[1] - inputs["input_ids"].shape[1]

    for _ in range(2):
        run([image(args.image_size, next(seed))], 2)
    ttft = [run([image(args.image_size, next(seed))], 1) for _ in range(args.ttft_reps)]
    images = [image(args.image_size, next(seed)) for _ in range(args.concurrency)]
    wall, _, new = run(images, args.output_len)
    return {
        "prompt_tokens": ttft[0][1],
        "ttft_ms": {"median": 1e3 * statistics.median(t for t, _, _ in ttft), "min": 1e3 * min(t for t, _, _ in ttft),
                    "runs": len(ttft)},
        "concurrency": args.concurrency, "output_len": args.output_len, "output_tokens": new * args.concurrency,
        "wall_s": wall, "output_tok_s": new * args.concurrency / wall,
        "how": "transformers generate, bf16, sdpa, processor included; the batch padded",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["client", "baseline"])
    ap.add_argument("--base-url", default="http://127.0.0.1:8123")
    ap.add_argument("--model", help="checkpoint directory (baseline)")
    ap.add_argument("--image-size", type=int, default=1024)
    ap.add_argument("--text-words", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="where the baseline runs")
    ap.add_argument("--text-only-words", type=int, default=0,
                    help="client: also time a text-only prompt of this many words (about 2 tokens each)")
    ap.add_argument("--ttft-reps", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    result = client(args) if args.mode == "client" else baseline(args)
    print(json.dumps({"mode": args.mode, "image_size": args.image_size, "text_words": args.text_words, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
