"""Mixture-of-experts helpers for generate_fixtures.py: initialising buffers that init leaves at
zero, and probing the routers of a fixture to show that routing is exercised.

- `init_correction_bias`: DeepSeek-V3's `e_score_correction_bias` is a buffer (not a parameter, so the
  generic constant-parameter perturbation misses it) initialised to zeros; give it N(0, std) noise so
  that an engine ignoring it picks other experts.
- `routing_probe`: runs the battery prompts (prefill only) with forward hooks on every router and
  records, per MoE layer, how often each expert is chosen and how many distinct expert sets the tokens
  use. For grouped routers it also counts the tokens whose choice the group limit changes (versus plain
  top-k over all experts) and, for V3, the tokens whose choice the correction bias changes. It asserts
  that every layer routes different tokens to different experts, and that the group limit (and the bias,
  where there is one) changes the selection of some token.
"""

from __future__ import annotations

from typing import Any

import torch


def init_correction_bias(std: float):
    def init(model: torch.nn.Module, gen: torch.Generator) -> None:
        with torch.no_grad():
            for name, buf in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buf.copy_(torch.randn(buf.shape, generator=gen) * std)

    return init


def _is_router(module: torch.nn.Module) -> bool:
    return type(module).__name__.lower().endswith("topkrouter") or type(module).__name__ == "HunYuanMoEV1Gate"


def _noaux_tc(router) -> bool:
    """DeepSeek-V3's sigmoid router with a correction bias (also GLM-4-MoE's and GLM-4-MoE-Lite's)."""
    return hasattr(router, "e_score_correction_bias")


def _sets(indices: torch.Tensor) -> list[frozenset]:
    return [frozenset(row.tolist()) for row in indices]


def _plain_choice(router, logits: torch.Tensor, with_bias: bool) -> torch.Tensor:
    """The experts plain top-k (no group limit) would choose."""
    k = router.top_k
    if _noaux_tc(router):
        scores = logits.sigmoid()
        if with_bias:
            scores = scores + router.e_score_correction_bias
        return torch.topk(scores, k, dim=-1)[1]
    return torch.topk(logits.softmax(dim=-1, dtype=torch.float32), k, dim=-1)[1]


def _grouped_without_bias(router, logits: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's grouped choice (as DeepseekV3TopkRouter.forward) with the correction bias left out."""
    scores = logits.sigmoid()
    n_group, topk_group, e = router.num_group, router.topk_group, router.num_experts
    group_scores = scores.view(-1, n_group, e // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand(-1, n_group, e // n_group).reshape(-1, e)
    masked = scores.masked_fill(~mask.bool(), float("-inf"))
    return torch.topk(masked, k=router.top_k, dim=-1, sorted=False)[1]


@torch.no_grad()
def routing_probe(model: torch.nn.Module, cases: list[dict[str, Any]]) -> dict[str, Any]:
    routers = [(n, m) for n, m in model.named_modules() if _is_router(m)]
    assert routers, "no router modules found"
    records: dict[str, list] = {n: [] for n, _ in routers}
    hooks = [m.register_forward_hook(lambda mod, inp, out, n=n: records[n].append(out)) for n, m in routers]
    try:
        for c in cases:
            model(input_ids=torch.tensor([c["prompt_ids"]]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for name, router in routers:
        logits = torch.cat([out[0].reshape(-1, out[0].shape[-1]) for out in records[name]]).float()
        chosen = torch.cat([out[2].reshape(-1, out[2].shape[-1]) for out in records[name]])
        counts = torch.bincount(chosen.reshape(-1), minlength=router.num_experts).tolist()
        sets = _sets(chosen)
        entry: dict[str, Any] = {
            "router": name,
            "tokens": len(sets),
            "expert_counts": counts,
            "distinct_expert_sets": len(set(sets)),
        }
        assert len(set(sets)) > 1 and sum(c > 0 for c in counts) > router.top_k, (name, counts, len(set(sets)))
        grouped = (getattr(router, "num_group", None) or 1) > 1 and (
            _noaux_tc(router) or getattr(router, "topk_method", "") == "group_limited_greedy"
        )
        if grouped:
            plain = _sets(_plain_choice(router, logits, with_bias=True))
            changed = sum(a != b for a, b in zip(sets, plain))
            entry["group_limit_changed_tokens"] = changed
            assert changed > 0, f"{name}: the group limit changes no token's experts"
        if _noaux_tc(router):
            unbiased = _sets(_grouped_without_bias(router, logits))
            changed = sum(a != b for a, b in zip(sets, unbiased))
            entry["correction_bias_changed_tokens"] = changed
            assert changed > 0, f"{name}: e_score_correction_bias changes no token's experts"
        layers.append(entry)
    return {
        "note": "battery prompts, prefill only; per MoE layer: how often each expert was chosen, distinct expert "
        "sets over tokens, and (grouped routers) tokens whose choice differs from plain top-k over all experts / "
        "from the same grouped routing without e_score_correction_bias",
        "layers": layers,
    }


def zero_shared_expert_gate(model: torch.nn.Module) -> None:
    """Qwen2-MoE ablation: sigmoid(0) = 0.5 scales every shared-expert output instead of the learned gate."""
    for name, p in model.named_parameters():
        if name.endswith("shared_expert_gate.weight"):
            p.data.zero_()
