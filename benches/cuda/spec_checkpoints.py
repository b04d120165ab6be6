"""Turns a random checkpoint into a draft/target pair whose drafts the target accepts, for the
acceptance ceiling of draft-model speculation (benches/cuda/run_spec.sh).

Random weights give a small draft nothing to agree with, so the pair is built instead: the draft
is the checkpoint's first LAYERS decoder layers with its embeddings, final norm and LM head; the
target keeps every layer but has the output projections (o_proj, down_proj) of the layers after
those zeroed, so that they add exactly nothing to the residual stream. The target still reads
and multiplies all of its weights, as a real 8B model does, and computes the draft's function:
every draft is accepted up to the numerics of a verify step against a decode step. Real pairs
accept fewer; the run measures what the machinery gives at the ceiling and at each k.

    python3 benches/cuda/spec_checkpoints.py --checkpoint /tmp/spec-target --layers 4 --draft /tmp/spec-draft

Zeroes the target in place (and writes `spec_zeroed_after`, so that a rerun skips it). Prints one
JSON line: the draft's layers, parameters and bytes.
"""

import argparse
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    args = ap.parse_args()
    ckpt, n = args.checkpoint, args.layers
    config = json.loads((ckpt / "config.json").read_text())
    if not 0 < n < config["num_hidden_layers"]:
        raise SystemExit(f"--layers {n} must be below the checkpoint's {config['num_hidden_layers']} layers")

    def layer(name: str) -> int | None:
        parts = name.split(".")
        return int(parts[2]) if name.startswith("model.layers.") else None

    shards = sorted(ckpt.glob("*.safetensors"))
    marker = ckpt / "spec_zeroed_after"
    draft_tensors = {}
    for shard in shards:
        tensors = load_file(shard)
        draft_tensors.update({k: v.clone() for k, v in tensors.items() if layer(k) is None or layer(k) < n})
        if marker.exists():
            continue
        zeroed = False
        for k, v in tensors.items():
            if layer(k) is not None and layer(k) >= n and k.endswith(("o_proj.weight", "down_proj.weight")):
                v.zero_()
                zeroed = True
        if zeroed:
            save_file(tensors, shard, metadata={"format": "pt"})
    marker.write_text(str(n))

    args.draft.mkdir(parents=True, exist_ok=True)
    save_file(draft_tensors, args.draft / "model.safetensors", metadata={"format": "pt"})
    for f in ckpt.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("model.safetensors.index.json", marker.name):
            shutil.copy(f, args.draft / f.name)
    (args.draft / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=n), indent=2))
    params = sum(t.numel() for t in draft_tensors.values())
    nbytes = sum(t.numel() * t.element_size() for t in draft_tensors.values())
    print(json.dumps({"draft_layers": n, "draft_parameters": params, "draft_bytes": nbytes}))


if __name__ == "__main__":
    main()
