"""DeepSeek Sparse Attention helpers for generate_fixtures.py: probing the lightning indexer of a
DeepSeek-V3.2 fixture to show that its top-k choice is exercised, and that the oracle does not hang
on how its last bits round.

`indexer_probe`:
- selection: per battery case, prompt + greedy continuation run in one forward (no cache) with a hook
  on every indexer that recomputes the index scores from the indexer's inputs, as
  DeepseekV32Indexer.forward does (its top-k must be the module's). Per layer it records the query rows
  with more causal keys than `index_topk` (a real choice; asserted > 0) and the smallest margin between
  the last kept and the first dropped score, relative to the row's largest |score| (asserted > 0: an
  exact tie would leave the choice to torch.topk's order).
- stability: an engine's scores differ from torch's in the last bits, and a key near the top-k boundary
  can then swap with its neighbour. Margins of 1e-6 of a row's scale are common over a battery (thousands
  of choices among hundreds of keys) and as large as f32's own error, so the probe asks what a swap would
  cost: the battery in float64 and in ULP_RUNS f32 runs with every parameter moved by up to ULPS ulps
  must give the same tokens, with every top-5 logprob within LOGPROB_STABLE of the oracle's (a tenth of
  the Rust parity gate's 2e-3).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from oracle_common import greedy_generate

ULP_RUNS = 2
ULPS = 2
LOGPROB_STABLE = 2e-4


def _index_scores(indexer, hidden_states, q_resid, position_embeddings) -> torch.Tensor:
    """`[S, T]` index scores of a batch-1 forward without cache, causal mask applied (-inf above)."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    _, s, _ = hidden_states.shape
    cos, sin = position_embeddings
    rope = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(1, s, indexer.n_heads, indexer.head_dim)
    q_rot, q_pass = torch.split(q, [rope, indexer.head_dim - rope], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rope, indexer.head_dim - rope], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    index = torch.matmul((weights * indexer.n_heads**-0.5).unsqueeze(-2), scores).squeeze(-2)[0]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    return index.masked_fill(~causal, float("-inf"))


def _selection(model: torch.nn.Module, sequences: list[list[int]]) -> list[dict[str, Any]]:
    indexers = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("Indexer")]
    assert indexers, "no indexer modules found"
    stats = {n: {"indexer": n, "rows": 0, "rows_choosing": 0, "min_relative_margin": float("inf")} for n, _ in indexers}

    def hook(name):
        def record(mod, args, kwargs, out):
            index = _index_scores(mod, *args[:3])
            k = min(mod.index_topk, index.shape[-1])
            top = index.topk(k, dim=-1).indices.sort(-1).values
            assert torch.equal(top, out[0].long().sort(-1).values), f"{name}: the recomputed choice differs"
            st = stats[name]
            st["rows"] += index.shape[0]
            for i in range(mod.index_topk, index.shape[0]):
                row = index[i, : i + 1]
                vals = row.topk(mod.index_topk + 1).values
                st["rows_choosing"] += 1
                margin = float(vals[-2] - vals[-1]) / float(row.abs().max())
                st["min_relative_margin"] = min(st["min_relative_margin"], margin)

        return record

    hooks = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in indexers]
    try:
        for ids in sequences:
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return list(stats.values())


def _perturb_ulps(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            r = torch.randint(-ULPS, ULPS + 1, p.shape, generator=gen)
            toward = torch.where(r < 0, float("-inf"), float("inf")).to(p.dtype)
            for step in range(ULPS):
                p.copy_(torch.where(r.abs() > step, torch.nextafter(p, toward), p))


def _largest_deviation(runs: list[dict[str, Any]], want: list[dict[str, Any]]) -> float:
    worst = 0.0
    for r, w in zip(runs, want):
        assert r["output_ids"] == w["output_ids"], ("greedy tokens moved", r["output_ids"], w["output_ids"])
        for got, ref in zip(r["top_logprobs"], w["top_logprobs"]):
            got = dict(got)
            worst = max(worst, max(abs(got[t] - v) for t, v in ref if t in got))
    return worst


@torch.no_grad()
def indexer_probe(model: torch.nn.Module, cases: list[dict[str, Any]]) -> dict[str, Any]:
    def battery(m: torch.nn.Module) -> list[dict[str, Any]]:
        return [greedy_generate(copy.deepcopy(m), c["prompt_ids"], 16) for c in cases]

    want = battery(model)
    layers = _selection(model, [c["prompt_ids"] + w["output_ids"] for c, w in zip(cases, want)])
    for st in layers:
        assert st["rows_choosing"] > 0, f"{st['indexer']}: no row had more causal keys than index_topk"
        assert st["min_relative_margin"] > 0, f"{st['indexer']}: a top-k choice falls on a tie"
    m64 = copy.deepcopy(model).double()
    m64.set_experts_implementation("eager")  # torch's grouped_mm has no float64 kernel
    deviations = {"float64": _largest_deviation(battery(m64), want)}
    gen = torch.Generator().manual_seed(20251201)
    for i in range(ULP_RUNS):
        mp = copy.deepcopy(model)
        _perturb_ulps(mp, gen)
        deviations[f"f32 +-{ULPS} ulp #{i}"] = _largest_deviation(battery(mp), want)
    for run, dev in deviations.items():
        assert dev < LOGPROB_STABLE, f"{run}: a top-5 logprob moved by {dev:.2e}"
    return {
        "note": "prompt + greedy continuation of every case in one forward without cache; per indexer: query rows, "
        "rows with more causal keys than index_topk (a real choice), and the smallest (last kept - first dropped) "
        "index score over the row's largest |score|. Stability: the largest top-5 logprob change against the "
        f"oracle of a float64 run and of f32 runs with every parameter moved by up to {ULPS} ulps, tokens "
        f"unchanged (asserted below {LOGPROB_STABLE})",
        "layers": layers,
        "logprob_deviation": deviations,
    }
