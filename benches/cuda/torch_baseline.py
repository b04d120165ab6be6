"""The transformers baseline for the CUDA serving benchmark, in the shapes `ferrite bench` uses.

For each batch size: `model.generate` on random prompt ids (< 1000), greedy, exactly
--output-len new tokens (min_new_tokens = max_new_tokens, so EOS never ends a row early),
bf16 weights, SDPA attention. Two variants:
- eager: the default dynamic KV cache, no compilation;
- compiled: `cache_implementation="static"`, which makes generate torch.compile the forward
  (mode reduce-overhead, i.e. CUDA graphs). It runs in a child process under a hard time cap,
  so that a compile that fails or takes too long costs only that variant; the failure text
  is recorded. --no-compile skips it.

Per batch it reports output tok/s (batch * output_len / time of one generate, after a warm-up),
TTFT (a generate of one new token, median of a few) and the decode latency per token. It also
measures the device copy bandwidth and the weight bytes a decode step reads, which give the
single-stream roofline (tok/s = bandwidth / bytes per token).

    python3 benches/cuda/torch_baseline.py --model /tmp/llama-3.1-8b --batches 1,8,32,128 \
        --input-len 512 --output-len 256 --json /tmp/baseline.json

--time-budget caps the whole run: once it is spent, the remaining batches are skipped (and
said so in the JSON), and the compiled variant gets only what is left of it.
"""

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, CompileConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT_VOCAB = 1000  # the fixture tokenizer's own ids, as `ferrite bench --vocab-size 1000` draws them
TTFT_RUNS = 3
# Below this, a compile of an 8B model cannot finish (tracing, Inductor, graph capture), so the
# compiled variant is skipped rather than started.
MIN_COMPILE_S = 60.0


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth_gbs(reps: int = 10) -> float:
    """Bytes read + written per second by a large device-to-device copy, median of `reps`."""
    nbytes = 1 << (31 if DEVICE == "cuda" else 28)
    src = torch.ones(nbytes, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        times.append(time.perf_counter() - start)
    del src, dst
    return 2 * nbytes / statistics.median(times) / 1e9


def weight_bytes(model) -> tuple[int, int]:
    """(all weight bytes, bytes one single-stream decode step reads).

    A dense model reads every weight per token (the embedding table is counted whole, though
    only one row of it is gathered: a ~6 % overstatement at 8B). A mixture of experts reads only
    num_experts_per_tok of its num_experts experts.
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not experts:
        return total, total
    expert = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    return total, total - expert + expert * cfg.num_experts_per_tok // experts


def load(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16, attn_implementation="sdpa", device_map=DEVICE
    ).eval()


def release_memory() -> None:
    """Hands freed tensors back to the device; call it after dropping the last model reference."""
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def timed_generate(model, ids: torch.Tensor, new_tokens: int, gen_kwargs: dict) -> float:
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **gen_kwargs)
    sync()
    elapsed = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + new_tokens, "generate stopped early"
    return elapsed


def measure_batch(model, batch: int, args, gen_kwargs: dict, warmup_tokens: list[int]) -> dict:
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, PROMPT_VOCAB, (batch, args.input_len), generator=gen).to(DEVICE)
    for n in warmup_tokens:
        timed_generate(model, ids, n, gen_kwargs)
    ttft = statistics.median(timed_generate(model, ids, 1, gen_kwargs) for _ in range(TTFT_RUNS))
    total = timed_generate(model, ids, args.output_len, gen_kwargs)
    # Only noise can make the full generate faster than the 1-token ones; no latency then.
    decode = (total - ttft) / max(args.output_len - 1, 1) if total > ttft else None
    row = {
        "batch": batch, "generate_s": total, "output_tok_s": batch * args.output_len / total, "ttft_ms": ttft * 1e3,
        "decode_ms_per_token": decode and decode * 1e3, "decode_tok_s_per_seq": decode and 1 / decode,
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def run_batches(model, args, gen_kwargs: dict, warmup_tokens: list[int], deadline: float, on_row=None) -> list[dict]:
    rows = []
    for batch in args.batches:
        if time.monotonic() > deadline:
            rows.append({"batch": batch, "skipped": "time budget spent"})
        else:
            try:
                rows.append(measure_batch(model, batch, args, gen_kwargs, warmup_tokens))
            except Exception as e:  # an OOM or a failed compile at one size should not cost the others
                print(f"batch {batch}: {e!r}", file=sys.stderr, flush=True)
                rows.append({"batch": batch, "error": repr(e)[-2000:]})
                release_memory()
        if on_row:
            on_row(rows)
    return rows


def compiled_kwargs() -> dict:
    # On CUDA a static cache makes generate compile the forward; the config only spells out the mode.
    return {"cache_implementation": "static", "compile_config": CompileConfig(mode="reduce-overhead")}


def compiled_child(args) -> None:
    """The compiled variant, run as a child process: rewrites --json after every batch so that
    the parent keeps the finished batches when it has to kill this process."""
    start = time.monotonic()
    model = load(args.model)

    def save(rows: list[dict]) -> None:
        # Dynamo's graph count tells a compiled run from one where generate declined to compile.
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        elapsed = time.monotonic() - start
        tmp = args.json.with_suffix(".tmp")  # renamed into place: a kill never leaves half a file
        tmp.write_text(json.dumps({"batches": rows, "dynamo_graphs": graphs, "elapsed_s": elapsed}))
        tmp.rename(args.json)

    # The warm-up is a full-length generate, so that the graphs compiled and captured are those
    # the timed run uses (the static cache's length is part of their shapes), then one of a
    # single token for the TTFT shape.
    save(run_batches(model, args, compiled_kwargs(), [args.output_len, 1], start + args.time_budget, save))
    del model
    release_memory()


def run_compiled(args, cap_s: float) -> dict:
    base = {"cache": "static", "compile": "torch.compile through generate, mode reduce-overhead", "time_cap_s": cap_s}
    if cap_s < MIN_COMPILE_S:
        return base | {"skipped": f"time budget: {cap_s:.0f} s left, a compile needs {MIN_COMPILE_S:.0f}"}
    with tempfile.TemporaryDirectory() as tmp:
        out, log = Path(tmp) / "compiled.json", Path(tmp) / "compiled.log"
        cmd = [sys.executable, __file__, "--compiled-child", "--model", str(args.model),
               "--batches", ",".join(map(str, args.batches)), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--json", str(out), "--time-budget", str(cap_s)]
        with log.open("w") as log_file:
            # A session of its own, so that a kill also reaches Inductor's compile workers.
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=cap_s)
                error = None if proc.returncode == 0 else f"exit status {proc.returncode}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                error = f"killed at the time cap ({cap_s:.0f} s)"
        text = log.read_text(errors="replace")
        sys.stderr.write(text)
        result = base | (json.loads(out.read_text()) if out.exists() else {"batches": []})
    if error:
        result["error"] = f"{error}: {text[-3000:]}"
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 8, 32, 128])
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--no-compile", action="store_true", help="skip the static-cache + torch.compile variant")
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds for the whole run (default 240)")
    ap.add_argument("--compiled-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compiled_child:
        compiled_child(args)
        return

    start = time.monotonic()
    deadline = start + args.time_budget
    bandwidth = copy_bandwidth_gbs()
    model = load(args.model)
    load_s = time.monotonic() - start
    total_bytes, step_bytes = weight_bytes(model)
    with torch.inference_mode():
        probe = torch.randint(0, PROMPT_VOCAB, (1, args.input_len)).to(DEVICE)
        logits_finite = bool(torch.isfinite(model(probe).logits[:, -1]).all())
    cfg = model.config
    report = {
        "bench": "transformers-baseline",
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "model": str(args.model),
        "config": {k: getattr(cfg, k, None) for k in ("model_type", "hidden_size", "num_hidden_layers",
                                                     "num_attention_heads", "num_key_value_heads", "vocab_size")},
        "dtype": "bfloat16", "attn_implementation": "sdpa",
        "input_len": args.input_len, "output_len": args.output_len,
        "sampling": "greedy, min_new_tokens = max_new_tokens",
        "timing": f"one timed generate per batch after a warm-up; TTFT = median of {TTFT_RUNS} generates of 1 token",
        "load_s": load_s, "logits_finite": logits_finite,
        "copy_bandwidth_gbs": bandwidth, "weight_bytes": total_bytes, "decode_bytes_per_token": step_bytes,
        "roofline_single_stream_tok_s": bandwidth * 1e9 / step_bytes,
        "time_budget_s": args.time_budget,
    }
    # A dynamic cache has no shapes to settle, so a short generate warms the kernels up.
    report["eager"] = {"cache": "dynamic", "batches": run_batches(model, args, {}, [4], deadline)}
    del model
    release_memory()
    if args.no_compile:
        report["compiled"] = {"skipped": "--no-compile"}
    else:
        report["compiled"] = run_compiled(args, deadline - time.monotonic())
    report["elapsed_s"] = time.monotonic() - start
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json} in {report['elapsed_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
