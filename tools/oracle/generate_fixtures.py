#!/usr/bin/env python3
"""Build the tiny random-init model fixtures and record the transformers oracle for each.

For every entry of SPECS below:
  1. build the model from its config class with torch.manual_seed(seed), eager attention;
     every parameter that init leaves constant (RMSNorm weights = 1, biases = 0, ...) is perturbed
     so that an engine which ignores it cannot pass;
  2. save_pretrained (safetensors, in the spec's save dtype) to fixtures/models/<name>/ together with
     copies of fixtures/tokenizer/tokenizer.json and tokenizer_config.json;
  3. reload it FROM DISK in float32 and run the battery (greedy, 16 new tokens, EOS disabled, batch 1),
     recording per step the top-5 log-probabilities of the raw f32 logits;
  4. if the smallest top1-top2 log-prob gap over the battery is below --min-gap, or some output is one
     token repeated, try the next seed (the seed used is recorded);
  5. check that the fixture's distinctive feature matters (an ablated copy gives different outputs),
     reload once more, and check that generate() and a hand-written KV-cache loop reproduce the outputs.

Writes fixtures/models/<name>/{config.json, generation_config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, oracle.json}.

Usage:
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py              # all fixtures
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py --only llama mistral
    .venv-oracle/bin/python tools/oracle/generate_fixtures.py --list

Adding a model family = one Spec entry in SPECS (config class name, kwargs over BASE, optional ablation).
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_common import ROOT, greedy_generate, manual_greedy, versions, write_json  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TOKENIZER_DIR = ROOT / "fixtures" / "tokenizer"
MODELS_DIR = ROOT / "fixtures" / "models"
CORPUS = ROOT / "tools" / "oracle" / "corpus.txt"
GENERATOR = "tools/oracle/generate_fixtures.py"

MAX_NEW_TOKENS = 16
DEFAULT_MIN_GAP = 5e-3  # smallest acceptable top1-top2 log-prob gap over the battery
MAX_SEED_TRIES = 60
CONST_PERTURB_STD = 0.2  # std of the noise added to parameters that init leaves constant


# --------------------------------------------------------------------------------------------
# Fixture specs
# --------------------------------------------------------------------------------------------

# Shared by every fixture; a spec's kwargs override these. Token ids match fixtures/tokenizer:
# <|endoftext|> = 0 (bos/pad), <|im_end|> = 2 (eos). pad_token_id stays out of the model config on purpose:
# nn.Embedding(padding_idx=...) would zero that embedding row.
BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    initializer_range=0.3,  # HF default 0.02 gives near-flat logits (tiny top-2 gaps, repetitive output)
    bos_token_id=0,
    eos_token_id=2,
    tie_word_embeddings=False,
)

Ablation = Callable[[torch.nn.Module], None]


@dataclass
class Spec:
    name: str
    config_class: str  # a transformers config class, e.g. "LlamaConfig"
    kwargs: dict[str, Any]
    architecture: str  # the *ForCausalLM class the config maps to (checked)
    feature: str  # what this fixture exercises, for humans and the Rust tests
    save_dtype: str = "float32"  # dtype of model.safetensors; the oracle always runs in float32
    seed: int = 0  # first seed tried
    # Ablation proving the feature matters: config overrides (rebuilt with the same weights) and/or a
    # function mutating the loaded model. The battery's greedy outputs must change.
    ablate_config: dict[str, Any] | None = None
    ablate_fn: Ablation | None = None
    ablation_desc: str = ""
    notes: list[str] = field(default_factory=list)


def _tie_lm_head(model: torch.nn.Module) -> None:
    model.lm_head.weight = model.model.embed_tokens.weight


def _zero_qkv_bias(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
            p.data.zero_()


def _drop_qk_norm(model: torch.nn.Module) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

SPECS: list[Spec] = [
    Spec(
        name="llama",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(rope_parameters=dict(DEFAULT_ROPE)),
        feature="Llama baseline: GQA (4 query heads / 2 KV heads), untied lm_head, default RoPE theta 10000",
        ablate_fn=_tie_lm_head,
        ablation_desc="lm_head replaced by the input embedding (as if tied)",
    ),
    Spec(
        name="llama-tied-llama3rope",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=256,
            ),
        ),
        feature="tied embeddings (no lm_head.weight in the file), MQA (1 KV head), llama3 RoPE scaling "
        "(factor 8, low 1, high 4, original_max 256)",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 llama3 RoPE is static (one inv_freq for all lengths). With head_dim 16, theta 1e4, original_max 256: "
            "wavelength 2*pi/inv_freq < 256/4 = 64 unchanged (pairs 0-2), > 256/1 = 256 divided by factor 8 (pairs 4-7), "
            "in between smoothed: inv_freq * ((1-s)/8 + s), s = (256/wavelen - 1)/(4-1) (pair 3: ratio 0.20912). "
            "Ratios to plain RoPE: [1, 1, 1, 0.20912479, 0.125, 0.125, 0.125, 0.125].",
            "Tied embeddings: model.safetensors has no lm_head.weight; logits = hidden @ embed_tokens.weight^T.",
        ],
    ),
    Spec(
        name="llama-linear-rope",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
        feature="linear RoPE scaling (position interpolation): inv_freq / 2",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=["HF 5.24 linear RoPE: every inv_freq divided by factor (= positions divided by 2); static."],
    ),
    Spec(
        name="llama-dynamic-rope",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            max_position_embeddings=512,
            rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
        ),
        feature="dynamic NTK RoPE (factor 2, max_position_embeddings 512): inv_freq recomputed once the "
        "sequence passes 512 tokens",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 dynamic NTK (modeling_rope_utils.dynamic_rope_update + _compute_dynamic_ntk_parameters): before each "
            "forward, seq_len = max(position_ids)+1; if seq_len > max_seq_len_cached (starts at max_position_embeddings=512) "
            "inv_freq is recomputed with base' = base * (factor*seq_len/512 - (factor-1)) ** (dim/(dim-2)), dim = head_dim, "
            "and max_seq_len_cached = seq_len. Up to 512 tokens it is plain RoPE.",
            "So in generate(): a prefill of L > 512 tokens rotates all L positions with base'(L); each decode step at "
            "position p >= 512 rotates its q and its new k with base'(p+1). Keys already in the KV cache keep the rotation "
            "they were computed with (they are NOT re-rotated). A prompt shorter than 512 whose decode crosses 512 switches "
            "to base'(p+1) at the first step with p >= 512.",
            "The rotary module is stateful (cached length only grows unless a later call has seq_len < 512, which resets "
            "it). The oracle runs every case on a fresh copy of the model, i.e. a fresh engine state per request.",
        ],
    ),
    Spec(
        name="llama-yarn-rope",
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        kwargs=dict(
            max_position_embeddings=1024,  # = factor * original_max, so HF's implicit-factor check is quiet
            rope_parameters=dict(
                rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256
            ),
        ),
        feature="YaRN RoPE (factor 4, original_max 256, beta_fast 32, beta_slow 1, truncate): blended inv_freq and "
        "attention_factor = 0.1*ln(4)+1 multiplying cos and sin",
        ablate_config=dict(rope_parameters=dict(DEFAULT_ROPE)),
        ablation_desc="rope_parameters -> default",
        notes=[
            "HF 5.24 YaRN is static (same inv_freq for every length). cos and sin are both multiplied by "
            "attention_factor (here 0.1*ln(4)+1 = 1.138629436111989), so q.k scores scale by its square.",
            "Correction range from beta_fast=32 / beta_slow=1 over original_max 256, floored/ceiled (truncate=True); "
            "inv_freq ratios to plain RoPE for the 8 pairs: [1, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25, 0.25].",
        ],
    ),
    Spec(
        name="mistral",
        config_class="MistralConfig",
        architecture="MistralForCausalLM",
        kwargs=dict(sliding_window=64, rope_parameters=dict(DEFAULT_ROPE)),
        feature="sliding-window attention, window 64 (each query sees itself and the 63 previous tokens)",
        ablate_config=dict(sliding_window=None),
        ablation_desc="sliding_window -> None (full causal attention)",
        notes=[
            "HF 5.24 Mistral (eager): mask = causal AND kv_idx > q_idx - sliding_window, i.e. a query at position q "
            "attends to positions q-63..q. generate() uses DynamicSlidingWindowLayer caches that keep the last 63 "
            "tokens, with the same result.",
        ],
    ),
    Spec(
        name="qwen2",
        config_class="Qwen2Config",
        architecture="Qwen2ForCausalLM",
        kwargs=dict(tie_word_embeddings=True, rope_parameters=dict(DEFAULT_ROPE)),
        feature="q/k/v projection biases (o_proj has none), tied embeddings",
        ablate_fn=_zero_qkv_bias,
        ablation_desc="q/k/v biases zeroed",
    ),
    Spec(
        name="qwen3",
        config_class="Qwen3Config",
        architecture="Qwen3ForCausalLM",
        kwargs=dict(head_dim=32, rope_parameters=dict(DEFAULT_ROPE)),
        feature="QK-norm (per-head RMSNorm on q and k before RoPE), head_dim 32 != hidden/heads (16)",
        ablate_fn=_drop_qk_norm,
        ablation_desc="q_norm/k_norm replaced by identity",
    ),
]

SPEC_BY_NAME = {s.name: s for s in SPECS}


# --------------------------------------------------------------------------------------------
# Prompt battery (shared by every fixture)
# --------------------------------------------------------------------------------------------


def _corpus_section(start_marker: str) -> str:
    text = CORPUS.read_text(encoding="utf-8")
    i = text.index(start_marker)
    return text[i:]


def _take_tokens(tok, text: str, n: int) -> str:
    """Longest whitespace-delimited prefix of `text` with at most n tokens."""
    words = text.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok(" ".join(words[:mid]))["input_ids"]) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def build_battery(tok) -> list[dict[str, Any]]:
    """Cases: name, prompt text, chat flag (+ messages). prompt_ids are what the HF tokenizer gives."""
    history = _corpus_section("A. HISTORY OF THE SOFTWARE")
    textwrap_src = _corpus_section('"""Text wrapping and filling.')
    raw = [
        ("single_token", "def"),
        ("hello", "Hello, world!"),
        ("pangram", "The quick brown fox jumps over the lazy dog."),
        ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return"),
        ("unicode", "Déjà vu: naïve café, 敏捷的棕色狐狸 🙂 — π ≈ 3.14159"),
        ("paragraph_100", _take_tokens(tok, history, 100)),
        ("code_300", _take_tokens(tok, textwrap_src, 300)),
        # decode crosses position 512 (dynamic-RoPE threshold) part-way through the 16 new tokens
        ("near_512", _take_tokens(tok, history[700:], 505)),
        ("long_650", _take_tokens(tok, history, 650)),
    ]
    cases = [{"name": n, "prompt": p, "chat": False} for n, p in raw]
    chats = [
        (
            "chat_capital",
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"},
            ],
        ),
        (
            "chat_multi_turn",
            [
                {"role": "user", "content": "Hi! Can you add two numbers for me?"},
                {"role": "assistant", "content": "Sure, which numbers?"},
                {"role": "user", "content": "2 and 40, please."},
            ],
        ),
    ]
    for n, msgs in chats:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        cases.append({"name": n, "prompt": text, "chat": True, "messages": msgs})
    for c in cases:
        ids = tok(c["prompt"])["input_ids"]
        if c["chat"]:
            via_template = tok.apply_chat_template(
                c["messages"], tokenize=True, add_generation_prompt=True, return_dict=True
            )["input_ids"]
            assert list(via_template) == ids, (c["name"], via_template, ids)
        assert tok.decode(ids) == c["prompt"], c["name"]
        c["prompt_ids"] = ids
    assert len(cases[0]["prompt_ids"]) == 1
    return cases


# --------------------------------------------------------------------------------------------
# Model building / oracle
# --------------------------------------------------------------------------------------------


def make_config(spec: Spec, vocab_size: int, overrides: dict[str, Any] | None = None):
    cls = getattr(transformers, spec.config_class)
    kw = dict(BASE)
    kw.update(copy.deepcopy(spec.kwargs))
    if overrides:
        kw.update(copy.deepcopy(overrides))
    kw["vocab_size"] = vocab_size
    return cls(**kw)


def build_model(spec: Spec, vocab_size: int, seed: int) -> torch.nn.Module:
    cfg = make_config(spec, vocab_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    assert type(model).__name__ == spec.architecture, (type(model).__name__, spec.architecture)
    # Perturb every parameter that init left constant (norm weights = 1, biases = 0, ...).
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    with torch.no_grad():
        for _, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            if flat.numel() > 0 and bool(torch.all(flat == flat[0])):
                p.add_(torch.randn(p.shape, generator=gen) * CONST_PERTURB_STD)
    model.generation_config.bos_token_id = 0
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.eval()
    return model


def save_fixture(model: torch.nn.Module, spec: Spec, out_dir: Path) -> None:
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    to_save = model.to(getattr(torch, spec.save_dtype))
    to_save.save_pretrained(str(out_dir), safe_serialization=True)
    model.to(torch.float32)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / f, out_dir / f)
    present = sorted(p.name for p in out_dir.iterdir())
    assert "model.safetensors" in present, present


def load_fixture(path: Path) -> torch.nn.Module:
    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return m


def run_battery(model: torch.nn.Module, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for c in cases:
        fresh = copy.deepcopy(model)  # fresh rotary state (dynamic RoPE is stateful) per request
        r = greedy_generate(fresh, c["prompt_ids"], MAX_NEW_TOKENS, stop_at_eos=False)
        results.append(r)
    return results


def assess(results: list[dict[str, Any]]) -> tuple[float, bool, int]:
    min_gap = min(min(r["gaps"]) for r in results)
    degenerate = any(len(set(r["output_ids"])) <= 2 for r in results)
    distinct = len({t for r in results for t in r["output_ids"]})
    return min_gap, degenerate, distinct


def ablation_changes(spec: Spec, fixture_dir: Path, cases, results) -> int | None:
    if spec.ablate_config is None and spec.ablate_fn is None:
        return None
    base = load_fixture(fixture_dir)
    if spec.ablate_config is not None:
        cfg = copy.deepcopy(base.config)
        for k, v in spec.ablate_config.items():
            setattr(cfg, k, copy.deepcopy(v))
        if "rope_parameters" in spec.ablate_config:
            cfg.standardize_rope_params()
        abl = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        missing, unexpected = abl.load_state_dict(base.state_dict(), strict=False)
        assert not unexpected and all("rotary" in m or "lm_head" in m for m in missing), (missing, unexpected)
        if getattr(cfg, "tie_word_embeddings", False):
            abl.tie_weights()
        abl.eval()
    else:
        abl = base
    if spec.ablate_fn is not None:
        spec.ablate_fn(abl)
    abl_results = run_battery(abl, cases)
    return sum(a["output_ids"] != r["output_ids"] for a, r in zip(abl_results, results))


def verify_reload(fixture_dir: Path, cases, results) -> None:
    m = load_fixture(fixture_dir)
    again = run_battery(m, cases)
    for c, a, r in zip(cases, again, results):
        assert a["output_ids"] == r["output_ids"], (fixture_dir.name, c["name"], a["output_ids"], r["output_ids"])
        for sa, sr in zip(a["top_logprobs"], r["top_logprobs"]):
            assert [t for t, _ in sa] == [t for t, _ in sr], (c["name"], sa, sr)
            assert max(abs(x - y) for (_, x), (_, y) in zip(sa, sr)) == 0.0, (c["name"], sa, sr)
        toks, logits = manual_greedy(copy.deepcopy(m), c["prompt_ids"], MAX_NEW_TOKENS)
        assert toks == r["output_ids"], (fixture_dir.name, c["name"], "manual loop", toks, r["output_ids"])
        for lg, sr in zip(logits, r["top_logprobs"]):
            lp = torch.log_softmax(lg, -1)
            assert max(abs(float(lp[t]) - v) for t, v in sr) < 1e-4


def verify_recorded(name: str, tok) -> tuple[int, int, float]:
    """Re-run a fixture from disk against its committed oracle.json; exact token and logprob equality."""
    import json

    d = MODELS_DIR / name
    oracle = json.loads((d / "oracle.json").read_text(encoding="utf-8"))
    m = load_fixture(d)
    steps, max_diff = 0, 0.0
    for c in oracle["cases"]:
        assert tok(c["prompt"])["input_ids"] == c["prompt_ids"], (name, c["name"], "tokenizer drift")
        r = greedy_generate(copy.deepcopy(m), c["prompt_ids"], len(c["output_ids"]), stop_at_eos=False)
        assert r["output_ids"] == c["output_ids"], (name, c["name"], r["output_ids"], c["output_ids"])
        for sa, sr in zip(r["top_logprobs"], c["top_logprobs"]):
            assert [t for t, _ in sa] == [t for t, _ in sr], (name, c["name"], "top-5 ids differ", sa, sr)
            max_diff = max(max_diff, max(abs(x - y) for (_, x), (_, y) in zip(sa, sr)))
        steps += len(r["output_ids"])
    # Bit-identical on the machine that generated them; other CPUs / thread counts may differ in the last bits.
    assert max_diff < 1e-4, (name, max_diff)
    return len(oracle["cases"]), steps, max_diff


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def generate_one(spec: Spec, tok, cases, min_gap_req: float) -> dict[str, Any]:
    t0 = time.time()
    vocab = len(tok)
    out_dir = MODELS_DIR / spec.name
    best = None
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td) / spec.name
        for seed in range(spec.seed, spec.seed + MAX_SEED_TRIES):
            model = build_model(spec, vocab, seed)
            save_fixture(model, spec, tmp)
            loaded = load_fixture(tmp)  # the oracle always runs on what is on disk
            results = run_battery(loaded, cases)
            min_gap, degenerate, distinct = assess(results)
            ok = min_gap >= min_gap_req and not degenerate
            print(f"  {spec.name}: seed {seed}: min_gap {min_gap:.2e} distinct {distinct} degenerate {degenerate}")
            if best is None or (ok, min_gap) > (best[0], best[1]):
                best = (ok, min_gap, seed, results)
            if ok:
                break
        ok, min_gap, seed, results = best
        if not ok:
            print(f"  WARNING {spec.name}: no seed reached min_gap {min_gap_req}; using seed {seed} ({min_gap:.2e})")
        # Rebuild the chosen seed into the real fixture dir (deterministic).
        model = build_model(spec, vocab, seed)
        save_fixture(model, spec, out_dir)
    final = run_battery(load_fixture(out_dir), cases)
    assert [r["output_ids"] for r in final] == [r["output_ids"] for r in results]
    results = final
    min_gap, degenerate, distinct = assess(results)
    changed = ablation_changes(spec, out_dir, cases, results)
    if changed is not None:
        assert changed > 0, f"{spec.name}: ablation ({spec.ablation_desc}) changed no output: feature not exercised"
    verify_reload(out_dir, cases, results)

    cfg = load_fixture(out_dir).config
    oracle = {
        "generator": GENERATOR,
        **versions(),
        "architecture": spec.architecture,
        "model_type": cfg.model_type,
        "feature": spec.feature,
        "dtype": "float32",
        "save_dtype": spec.save_dtype,
        "attn_implementation": "eager",
        "decoding": "greedy (do_sample=False), batch 1, KV cache (HF generate)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "eos_disabled": True,
        "eos_note": "generation_config.eos_token_id=None for the run, no min_new_tokens: exactly 16 tokens, each the "
        "argmax of the raw f32 logits (EOS may be emitted and generation continues)",
        "top_logprobs_note": "per step, top-5 [token_id, logprob] of log_softmax(f32 logits), best first",
        "seed": seed,
        "initializer_range": cfg.initializer_range,
        "const_param_perturb_std": CONST_PERTURB_STD,
        "min_top2_gap": min_gap,
        "distinct_output_tokens": distinct,
        "ablation": None if changed is None else {"change": spec.ablation_desc, "cases_changed": changed,
                                                  "cases": len(cases)},
        "notes": spec.notes,
        "cases": [
            {
                "name": c["name"],
                "prompt": c["prompt"],
                "chat": c["chat"],
                **({"messages": c["messages"]} if c["chat"] else {}),
                "prompt_len": len(c["prompt_ids"]),
                "prompt_ids": c["prompt_ids"],
                "output_ids": r["output_ids"],
                "output_text": tok.decode(r["output_ids"]),
                "min_top2_gap": min(r["gaps"]),
                "top_logprobs": r["top_logprobs"],
            }
            for c, r in zip(cases, results)
        ],
    }
    write_json(out_dir / "oracle.json", oracle)
    return {
        "name": spec.name,
        "size": dir_size(out_dir),
        "weights": (out_dir / "model.safetensors").stat().st_size,
        "min_gap": min_gap,
        "distinct": distinct,
        "seed": seed,
        "ablation": "-" if changed is None else f"{changed}/{len(cases)}",
        "secs": time.time() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="regenerate only these fixtures")
    ap.add_argument("--list", action="store_true", help="list fixture names and exit")
    ap.add_argument("--min-gap", type=float, default=DEFAULT_MIN_GAP)
    ap.add_argument("--verify-only", action="store_true",
                    help="do not regenerate: reload the fixtures from disk and check them against oracle.json")
    args = ap.parse_args()
    if args.list:
        for s in SPECS:
            print(f"{s.name:24s} {s.architecture:22s} {s.feature}")
        return 0
    names = args.only or [s.name for s in SPECS]
    unknown = [n for n in names if n not in SPEC_BY_NAME]
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {list(SPEC_BY_NAME)}")
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        ap.error("fixtures/tokenizer/tokenizer.json missing: run tools/oracle/train_tokenizer.py first")

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    if args.verify_only:
        for n in names:
            ncases, steps, diff = verify_recorded(n, tok)
            print(f"{n:24s} ok: {ncases} cases, {steps} steps: tokens + top-5 ids exact, "
                  f"max logprob diff {diff:.1e}")
        return 0
    cases = build_battery(tok)
    print("battery:", ", ".join(f"{c['name']}({len(c['prompt_ids'])})" for c in cases))
    rows = [generate_one(SPEC_BY_NAME[n], tok, cases, args.min_gap) for n in names]

    print()
    print(f"{'fixture':24s} {'size':>9s} {'weights':>9s} {'min_top2_gap':>12s} {'distinct':>8s} {'seed':>4s} "
          f"{'ablation':>8s} {'secs':>5s}")
    for r in rows:
        print(f"{r['name']:24s} {r['size']:9d} {r['weights']:9d} {r['min_gap']:12.3e} {r['distinct']:8d} "
              f"{r['seed']:4d} {r['ablation']:>8s} {r['secs']:5.1f}")
    total = dir_size(ROOT / "fixtures")
    print(f"fixtures/ total: {total} bytes ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
