#!/usr/bin/env python3
"""Quantize a saved f32 fixture in place with llmcompressor (compressed-tensors FP8 and integer
weight-only checkpoints).

Run by generate_fixtures.py in a subprocess (quantizing a MoE and then loading it with transformers in
the same process leaves the experts randomly initialised), as

    python tools/oracle/fp8_quantize.py DIR SCHEME IGNORE_JSON [CALIB_JSON]

DIR holds a float32 fixture (config.json + model.safetensors); it is overwritten by the compressed
checkpoint that llmcompressor's oneshot writes (save_compressed=True: float-quantized format for FP8
e4m3 weights + scales, pack-quantized for int4/int8 weights packed in int32 + scales (+ zero points),
nvfp4-pack-quantized for FP4 codes two to a byte + e4m3 group scales + a global scale;
config.json's quantization_config exactly as the tools write it). SCHEME is a llmcompressor preset
(FP8_DYNAMIC, FP8, FP8_BLOCK, NVFP4A16) or a JSON object: the `config_groups` of a custom scheme (group sizes
the presets do not have, to fit the fixtures' small hidden sizes). IGNORE_JSON is a JSON list of module names / `re:`
patterns left unquantized. CALIB_JSON (static schemes only) is a JSON list of token-id lists: the
calibration set, run one sequence a batch.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch


def main() -> int:
    src = Path(sys.argv[1])
    scheme = sys.argv[2]
    ignore = json.loads(sys.argv[3])
    calib = json.loads(Path(sys.argv[4]).read_text(encoding="utf-8")) if len(sys.argv) > 4 else None

    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, attn_implementation="eager")
    if scheme.startswith("{"):
        recipe = QuantizationModifier(config_groups=json.loads(scheme), ignore=ignore)
    else:
        recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    kw = {}
    if calib is not None:
        from datasets import Dataset

        ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(x) for x in calib]})
        tokenizer = Path(__file__).resolve().parents[2] / "fixtures" / "tokenizer"  # oneshot wants a processor
        kw = dict(dataset=ds, tokenizer=str(tokenizer), num_calibration_samples=len(calib), max_seq_length=max(len(x) for x in calib),
                  shuffle_calibration_samples=False, batch_size=1)
    with tempfile.TemporaryDirectory() as td:
        oneshot(model=model, recipe=recipe, output_dir=None, log_dir=None, **kw)
        out = Path(td) / "q"
        model.save_pretrained(str(out), save_compressed=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copyfile(out / f, src / f)
        extra = sorted(p.name for p in out.iterdir() if p.name not in ("config.json", "model.safetensors",
                                                                         "generation_config.json", "recipe.yaml"))
        assert not extra, f"unexpected files from save_pretrained: {extra}"
    return 0


if __name__ == "__main__":
    sys.exit(main())
