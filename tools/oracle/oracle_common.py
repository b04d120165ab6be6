"""Shared helpers for the oracle scripts (generate_fixtures.py, generate_smollm2_goldens.py,
generate_gemma3_goldens.py).

The oracle is Hugging Face transformers, PyTorch, float32, CPU, eager attention, greedy decoding.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.disable_progress_bar()

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tools" / "oracle" / "corpus.txt"
TOP_K = 5

torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))


def versions() -> dict[str, str]:
    return {
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# Greedy oracle
# --------------------------------------------------------------------------------------------


def _step_record(logits_row: torch.Tensor) -> tuple[list[list[Any]], float, int]:
    """top-5 (id, logprob) of one step's raw f32 logits, the top1-top2 gap, and the argmax."""
    lp = torch.log_softmax(logits_row.float(), dim=-1)
    vals, idx = torch.topk(lp, TOP_K)
    top = [[int(i), float(v)] for i, v in zip(idx.tolist(), vals.tolist())]
    gap = float(vals[0] - vals[1])
    return top, gap, int(torch.argmax(logits_row))


@torch.no_grad()
def greedy_generate(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop_at_eos: bool = False,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    **model_inputs: Any,
) -> dict[str, Any]:
    """HF `generate` greedy, batch 1, returning new tokens + per-step top-5 logprobs of the RAW logits.

    stop_at_eos=False disables EOS entirely (model.generation_config.eos_token_id is set to None for the
    call, because generate() fills a None eos in a passed GenerationConfig from model.generation_config).
    No logits processors are active (no min_new_tokens, no repetition penalty ...), which is asserted by
    checking that every output token is the argmax of the raw logits.
    """
    saved = model.generation_config
    gc = copy.deepcopy(saved)
    gc.do_sample = False
    gc.num_beams = 1
    gc.max_new_tokens = max_new_tokens
    gc.max_length = None
    gc.min_new_tokens = None
    gc.min_length = 0
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    gc.repetition_penalty = None
    gc.pad_token_id = pad_token_id
    gc.eos_token_id = eos_token_id if stop_at_eos else None
    gc.output_logits = True
    gc.return_dict_in_generate = True
    model.generation_config = gc
    try:
        inp = torch.tensor([prompt_ids], dtype=torch.long)
        out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=gc, **model_inputs)
    finally:
        model.generation_config = saved
    new_ids = out.sequences[0, len(prompt_ids):].tolist()
    assert len(out.logits) == len(new_ids), (len(out.logits), len(new_ids))
    if not stop_at_eos:
        assert len(new_ids) == max_new_tokens, f"generation stopped early ({len(new_ids)} < {max_new_tokens})"
    tops, gaps = [], []
    for step, logits in enumerate(out.logits):
        top, gap, amax = _step_record(logits[0])
        assert amax == new_ids[step], f"step {step}: output {new_ids[step]} != argmax {amax} (processor active?)"
        tops.append(top)
        gaps.append(gap)
    return {"output_ids": new_ids, "top_logprobs": tops, "gaps": gaps}


def greedy_generate_inputs(model, input_ids: torch.Tensor, max_new_tokens: int, **model_inputs: Any) -> dict[str, Any]:
    """`greedy_generate` for a batch-1 `input_ids` tensor with the model's other inputs (a
    vision-language model's `pixel_values`, `image_grid_thw`, `mm_token_type_ids`)."""
    return greedy_generate(model, input_ids[0].tolist(), max_new_tokens, **model_inputs)


@torch.no_grad()
def manual_greedy(model, prompt_ids: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Independent cross-check of generate(): prefill + one-token decode steps with the KV cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model(input_ids=ids, cache=cache, use_cache=True)
    toks, logits = [], []
    for _ in range(n):
        last = out.logits[0, -1].float()
        logits.append(last)
        t = int(torch.argmax(last))
        toks.append(t)
        # Phi-3's and PhiMoE's generate drop the cache the first time the sequence outgrows
        # original_max_position_embeddings with no more than that cached, and run it all again.
        switch = getattr(model.config, "original_max_position_embeddings", None)
        seq = prompt_ids + toks
        recomputes = type(model).__name__ in ("Phi3ForCausalLM", "PhimoeForCausalLM")
        if recomputes and switch and len(seq) > switch >= cache.get_seq_length():
            cache = DynamicCache(config=model.config)
            out = model(input_ids=torch.tensor([seq]), cache=cache, use_cache=True)
            continue
        out = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
    return toks, logits


# --------------------------------------------------------------------------------------------
# Real-weights goldens from a GGUF (generate_smollm2_goldens.py, generate_gemma3_goldens.py)
# --------------------------------------------------------------------------------------------


def corpus_from(marker: str) -> str:
    """corpus.txt from the first occurrence of `marker` on."""
    text = CORPUS.read_text(encoding="utf-8")
    return text[text.index(marker):]


def take_tokens(tok, text: str, n: int) -> str:
    """The longest prefix of `text`, in whole space-separated words, that `tok` encodes in at most n tokens."""
    words = text.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok(" ".join(words[:mid]))["input_ids"]) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def load_gguf(gguf: Path):
    """(tokenizer, model) from a GGUF file, dequantized by transformers to f32, eager attention, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return tok, model


def greedy_case(model, tok, case: dict[str, Any]) -> dict[str, Any]:
    """greedy_generate for one battery case: its "prompt_ids", "max_new_tokens" and "stop_at_eos"
    (at the tokenizer's EOS)."""
    return greedy_generate(
        model, case["prompt_ids"], case["max_new_tokens"], stop_at_eos=case["stop_at_eos"], eos_token_id=tok.eos_token_id
    )


def run_battery(model, tok, cases: list[dict[str, Any]], name_width: int) -> list[dict[str, Any]]:
    """greedy_case for every case, printing one line each (name padded to `name_width`)."""
    out = []
    for c in cases:
        t0 = time.time()
        r = greedy_case(model, tok, c)
        print(f"  {c['name']:{name_width}s} prompt {len(c['prompt_ids']):5d}  gap {min(r['gaps']):.2e}  "
              f"{time.time() - t0:5.1f}s  {tok.decode(r['output_ids'])!r}")
        out.append(r)
    return out


def raw_cases(tok, raw: list[tuple[str, str]], max_new_tokens: int) -> list[dict[str, Any]]:
    """Battery cases of plain `(name, prompt)` texts, tokenized by `tok`, run past EOS."""
    return [
        {"name": n, "prompt": t, "chat": False, "prompt_ids": tok(t)["input_ids"],
         "max_new_tokens": max_new_tokens, "stop_at_eos": False}
        for n, t in raw
    ]


def gguf_golden(generator: str, package: str, gguf: Path, digest: str, model, tok, cases: list[dict[str, Any]],
                max_new_tokens: int, config_keys: tuple[str, ...], notes: list[str]) -> dict[str, Any]:
    """The golden of a real-weights GGUF gate: `cases` run greedily (f32, eager, EOS disabled) by
    transformers' model of the file, with its provenance, the config's `config_keys` and `notes`."""
    results = run_battery(model, tok, cases, name_width=16)
    cfg = model.config
    return {
        "generator": generator,
        **versions(),
        "architecture": type(model).__name__,
        "model_type": cfg.model_type,
        "gguf_package": package,
        "gguf_file": gguf.name,
        "gguf_sha256": digest,
        "dtype": "float32",
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate)",
        "max_new_tokens": max_new_tokens,
        "eos_disabled": True,
        "top_logprobs_note": "per step, top-5 [token_id, logprob] of log_softmax(f32 logits), best first",
        "config": {k: getattr(cfg, k) for k in config_keys},
        "min_top2_gap": min(min(r["gaps"]) for r in results),
        "notes": notes,
        "cases": [case_record(tok, c, r) for c, r in zip(cases, results)],
    }


def case_record(tok, case: dict[str, Any], result: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One entry of a golden's "cases": the prompt, its ids and the greedy result; `extra` keys go
    after the messages, before prompt_len."""
    return {
        "name": case["name"],
        "prompt": case["prompt"],
        "chat": case["chat"],
        **({"messages": case["messages"]} if case["chat"] else {}),
        **extra,
        "prompt_len": len(case["prompt_ids"]),
        "prompt_ids": case["prompt_ids"],
        "output_ids": result["output_ids"],
        "output_text": tok.decode(result["output_ids"]),
        "min_top2_gap": min(result["gaps"]),
        "top_logprobs": result["top_logprobs"],
    }


# --------------------------------------------------------------------------------------------
# JSON output: readable at the top level, one line per list of scalars / per top-k step
# --------------------------------------------------------------------------------------------


def _is_scalar(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def _fmt_scalar(x: Any) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            raise ValueError(f"non-finite float {x}")
        return repr(x)
    return json.dumps(x, ensure_ascii=False)


def _dumps(obj: Any, indent: int, level: int) -> str:
    pad = " " * (indent * (level + 1))
    end = " " * (indent * level)
    if _is_scalar(obj):
        return _fmt_scalar(obj)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {_dumps(v, indent, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(obj, (list, tuple)):
        if not obj:
            return "[]"
        if all(_is_scalar(x) for x in obj):
            return "[" + ",".join(_fmt_scalar(x) for x in obj) + "]"
        # list of lists of scalars (e.g. one top-k step): one compact line per element
        if all(isinstance(x, (list, tuple)) and all(
            _is_scalar(y) or (isinstance(y, (list, tuple)) and all(_is_scalar(z) for z in y)) for y in x
        ) for x in obj):
            lines = [pad + json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in obj]
            return "[\n" + ",\n".join(lines) + "\n" + end + "]"
        items = [pad + _dumps(x, indent, level + 1) for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    raise TypeError(type(obj))


def write_json(path: Path, obj: Any) -> None:
    text = _dumps(obj, 1, 0) + "\n"
    json.loads(text)  # sanity
    path.write_text(text, encoding="utf-8")
