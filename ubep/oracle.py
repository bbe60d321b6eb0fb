"""The semantics of DESIGN.md computed in one process from every rank's inputs, written as plainly as
possible (one expert at a time) so that it checks the distributed code rather than repeating it.

Inputs are lists indexed by source rank: ``xs[s]`` ``[T_s, H]``, ``idxs[s]`` ``[T_s, K]``,
``weights[s]`` ``[T_s, K]`` fp32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ubep.reduce import ordered_sum, rank_partial_sum


def rows_of_expert(idxs: list[torch.Tensor], expert: int) -> list[tuple[int, int, int]]:
    """``(source, token, k)`` of every pair routed to ``expert``, in receive order."""
    found = []
    for s, idx in enumerate(idxs):
        token, k = (idx == expert).nonzero(as_tuple=True)
        found += [(s, int(t), int(kk)) for t, kk in zip(token, k, strict=True)]
    return found


def dispatch(xs, idxs, weights, rank: int, world_size: int, num_experts: int):
    """``(recv_x [N, H], tokens_per_expert [E_local], recv_weights [N])`` on ``rank`` (compact)."""
    local = num_experts // world_size
    rows, counts, ws = [], [], []
    for e in range(rank * local, (rank + 1) * local):
        pairs = rows_of_expert(idxs, e)
        counts.append(len(pairs))
        rows += [xs[s][t] for s, t, _ in pairs]
        ws += [weights[s][t, k] for s, t, k in pairs]
    hidden = xs[0].shape[1]
    recv_x = torch.stack(rows) if rows else xs[0].new_zeros(0, hidden)
    recv_w = torch.stack(ws).float() if ws else torch.zeros(0)
    return recv_x, torch.tensor(counts, dtype=torch.long), recv_w


def to_padded(recv_NH: torch.Tensor, tokens_per_expert: torch.Tensor, capacity: int):
    """Compact rows ``[N, ...]`` -> padded ``[E_local, capacity, ...]``, zero padding."""
    out = recv_NH.new_zeros(len(tokens_per_expert), capacity, *recv_NH.shape[1:])
    start = 0
    for j, n in enumerate(tokens_per_expert.tolist()):
        out[j, :n] = recv_NH[start : start + n]
        start += n
    return out


def expert_outputs(idxs, out_of_row: Callable):
    """Per source ``s``: ``[T_s, K, H]`` output of each pair, with ``out_of_row(s, t, k, e)``."""
    outs = []
    for s, idx in enumerate(idxs):
        num_tokens, top_k = idx.shape
        rows = [[out_of_row(s, t, k, int(idx[t, k])) if idx[t, k] >= 0 else None
                 for k in range(top_k)] for t in range(num_tokens)]
        outs.append(rows)
    return outs


def combine(outs, idxs, weights, source: int, world_size: int, num_experts: int,
            reduce: str, weighted: bool, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """``y [T_s, H]`` on ``source`` from per-pair outputs ``outs[s][t][k]`` (``[H]`` or None)."""
    idx, rows = idxs[source], outs[source]
    num_tokens, top_k = idx.shape
    contrib = torch.zeros(num_tokens, top_k, hidden, dtype=dtype)
    for t in range(num_tokens):
        for k in range(top_k):
            if rows[t][k] is not None:
                contrib[t, k] = rows[t][k]
    w = weights[source].float() if weighted else None
    if reduce == "source":
        return ordered_sum(contrib, idx >= 0, w).to(dtype)
    rank = torch.div(idx, num_experts // world_size, rounding_mode="floor")
    return rank_partial_sum(contrib, idx >= 0, rank, world_size, dtype, w).to(dtype)
