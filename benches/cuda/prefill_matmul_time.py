"""The matrix work of a prompt's prefill on this GPU: the decoder's linear layers of a checkpoint
(bf16 torch.matmul, cuBLAS) over a prompt of each length, fed in chunks of `--chunk` tokens as the
server's scheduler feeds it, timed with CUDA events (median of `--reps`). Attention and the
elementwise work are left out: this is the floor that the long-prompt TTFT is compared with.

    python3 benches/cuda/prefill_matmul_time.py --model CKPT --lens 2048,8192 --chunk 2048
Prints one JSON object: {"chunk": .., "seconds": {"2048": .., ...}, "per_layer_chunk_ms": ..}.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lens", required=True)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    # qkv, o, gate_up, down: [out, in] as the checkpoint stores them.
    shapes = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden), (hidden, inter)]
    weights = [torch.randn(o, i, dtype=torch.bfloat16, device="cuda") * 0.02 for o, i in shapes]

    def layer_ms(tokens):
        xs = [torch.randn(tokens, i, dtype=torch.bfloat16, device="cuda") for _, i in shapes]
        for x, w in zip(xs, weights):
            x @ w.t()
        times = []
        for _ in range(args.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for x, w in zip(xs, weights):
                x @ w.t()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    full = layer_ms(args.chunk)
    seconds = {}
    for n in (int(v) for v in args.lens.split(",")):
        chunks, rest = divmod(n, args.chunk)
        ms = chunks * full + (layer_ms(rest) if rest else 0.0)
        seconds[str(n)] = ms * layers / 1e3
    print(json.dumps({"chunk": args.chunk, "layers": layers, "per_layer_chunk_ms": full, "seconds": seconds}))


if __name__ == "__main__":
    main()
