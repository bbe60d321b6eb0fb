"""Routing and token generators for tests, benchmarks and the demo.

Every value depends on where it came from, so a row that lands in the wrong place is visible:
``origin_tokens`` makes token ``t`` of rank ``s`` differ from every other token, and the toy expert
``scale_expert`` makes the output depend on which expert computed it.

Skew is given as ``maxvio = max expert load / mean expert load - 1`` (0 = perfectly balanced).
"""

from __future__ import annotations

import torch


def origin_tokens(rank: int, num_tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """``[T, H]`` tokens whose values are a function of (rank, token, column).

    ``sin`` of distinct phases keeps every row distinct and every value in [-1, 1], in any dtype.
    """
    t = torch.arange(num_tokens, dtype=torch.float64).unsqueeze(1)
    h = torch.arange(hidden, dtype=torch.float64).unsqueeze(0)
    return torch.sin(rank * 1.618 + t * 0.7071 + h * 0.0137 + 0.1).to(dtype)


def origin_weights(rank: int, num_tokens: int, top_k: int) -> torch.Tensor:
    """``[T, K]`` fp32 gate weights in (0, 1], a function of (rank, token, k)."""
    t = torch.arange(num_tokens, dtype=torch.float64).unsqueeze(1)
    k = torch.arange(top_k, dtype=torch.float64).unsqueeze(0)
    return (0.55 + 0.45 * torch.cos(rank * 2.3 + t * 0.37 + k * 1.1)).float()


def scale_expert(rows_NH: torch.Tensor, expert: int) -> torch.Tensor:
    """A toy expert whose output depends on the expert id: ``x * (1 + e / 64) + e / 128``."""
    return (rows_NH.float() * (1.0 + expert / 64.0) + expert / 128.0).to(rows_NH.dtype)


def expert_loads(num_tokens: int, num_experts: int, top_k: int, maxvio: float,
                 hot_experts: list[int]) -> torch.Tensor:
    """``[E]`` int64 loads summing to ``T * K`` with the hot experts at ``(1 + maxvio) * mean``.

    The rest share what is left evenly (differences of at most one). A hot load is capped at ``T``
    (a token names an expert at most once), so a large ``maxvio`` on a small batch saturates.
    Example: ``T=8, E=4, K=2, maxvio=1, hot=[2]`` gives ``[3, 3, 8, 2]`` (mean 4, max 8).
    """
    total = num_tokens * top_k
    mean = total / num_experts
    hot = min(num_tokens, round((1.0 + maxvio) * mean)) if hot_experts else 0
    loads = torch.zeros(num_experts, dtype=torch.long)
    cold = [e for e in range(num_experts) if e not in set(hot_experts)]
    rest = total - hot * len(hot_experts)
    if rest < 0 or (cold and -(-rest // len(cold)) > num_tokens):
        raise ValueError(f"maxvio={maxvio} with {len(hot_experts)} hot experts cannot be met by "
                         f"{num_tokens} tokens x top-{top_k} over {num_experts} experts")
    loads[hot_experts] = hot
    if cold:
        share = torch.full((len(cold),), rest // len(cold), dtype=torch.long)
        share[: rest % len(cold)] += 1
        loads[cold] = share
    return loads


def skewed_topk(
    num_tokens: int, num_experts: int, top_k: int, *, maxvio: float = 0.0,
    hot_experts: list[int] | None = None, generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``[T, K]`` int64 routing with the loads of :func:`expert_loads`, distinct per row.

    The hot experts get exactly their loads; the cold loads (which differ by at most one) are
    dealt to the cold experts in a random order, so that when ``T * K < E`` the leftover pairs do
    not all land on the low expert ids, and so on rank 0. Each token takes the ``K`` experts with
    the most remaining demand (which always succeeds when no load exceeds ``T``), then token order
    and each row are shuffled with ``generator``.
    """
    hot = [0] if hot_experts is None and maxvio > 0 else (hot_experts or [])
    demand = expert_loads(num_tokens, num_experts, top_k, maxvio, hot).double()
    cold = torch.tensor([e for e in range(num_experts) if e not in set(hot)], dtype=torch.long)
    demand[cold] = demand[cold[torch.randperm(len(cold), generator=generator)]]
    # Break ties among equal demands at random but reproducibly.
    jitter = torch.rand(num_experts, generator=generator, dtype=torch.float64) * 0.5
    rows = torch.empty(num_tokens, top_k, dtype=torch.long)
    for t in range(num_tokens):
        chosen = torch.topk(demand + jitter, top_k).indices
        rows[t] = chosen
        demand[chosen] -= 1
    perm = torch.randperm(num_tokens, generator=generator)
    shuffle = torch.rand(num_tokens, top_k, generator=generator).argsort(dim=1)
    return rows[perm].gather(1, shuffle)


def random_topk(num_tokens: int, num_experts: int, top_k: int,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """``[T, K]`` int64 uniform routing: ``K`` distinct experts per token."""
    scores = torch.rand(num_tokens, num_experts, generator=generator)
    return scores.topk(top_k, dim=1).indices


def drop_slots(topk_idx_TK: torch.Tensor, fraction: float,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """A copy with about ``fraction`` of the entries set to ``-1`` (no expert)."""
    drop = torch.rand(topk_idx_TK.shape, generator=generator) < fraction
    return torch.where(drop, torch.full_like(topk_idx_TK, -1), topk_idx_TK)


def measured_maxvio(topk_idx_TK: torch.Tensor, num_experts: int) -> float:
    """``max load / mean load - 1`` of a routing (``-1`` entries ignored)."""
    valid = topk_idx_TK[topk_idx_TK >= 0].long()
    loads = torch.bincount(valid, minlength=num_experts).double()
    return float(loads.max() / loads.mean() - 1.0) if valid.numel() else 0.0
