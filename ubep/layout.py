"""Pure index math from routing to wire order and receive rows.

Nothing here touches a process group or a device stream: every function maps tensors to tensors, so
the reference backend, the device kernels and the tests share one definition of where each row goes.
Except ``send_order`` and ``return_slots`` (which size their outputs), no function reads a device
value back to the host, so a device backend can run them inside a CUDA graph.

Vocabulary (all shapes per source rank ``s``):
- ``topk_idx_TK``: ``[T, K]`` int, global expert ids, ``-1`` = no expert.
- a *pair* is one ``(t, k)`` with ``topk_idx_TK[t, k] >= 0``.
- the *count matrix* ``C_WE[s, e]``: pairs that source ``s`` routes to expert ``e`` (all-gathered).

Running example used in the docstrings: ``W = 2`` ranks, ``E = 4`` experts (``E_local = 2``: rank 0
holds experts 0, 1; rank 1 holds 2, 3), ``K = 2``, and on source rank 0::

    topk_idx_TK = [[1, 2],    # token 0 -> expert 1 (rank 0), expert 2 (rank 1)
                   [0, 1],    # token 1 -> experts 0, 1 (both on rank 0)
                   [3, -1]]   # token 2 -> expert 3 (rank 1), one empty slot
"""

from __future__ import annotations

import torch


def _histogram(key: torch.Tensor, bins: int) -> torch.Tensor:
    """``[bins]`` int64 counts of ``key`` values in ``[0, bins)``, without a host synchronization
    (``torch.bincount`` reads the maximum back on CUDA)."""
    return torch.zeros(bins, dtype=torch.int64, device=key.device).scatter_add_(
        0, key, torch.ones_like(key))


def expert_counts(topk_idx_TK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Pairs per expert, ``[E]`` int64. Example: ``[1, 2, 1, 1]``."""
    flat = topk_idx_TK.reshape(-1).long()
    return _histogram(torch.where(flat >= 0, flat, num_experts), num_experts + 1)[:num_experts]


def dest_rank(topk_idx_TK: torch.Tensor, num_local_experts: int) -> torch.Tensor:
    """Rank holding each pair's expert, ``[T, K]`` int64, ``-1`` kept.

    Example: ``[[0, 1], [0, 0], [1, -1]]``.
    """
    idx = topk_idx_TK.long()
    return torch.where(idx >= 0, torch.div(idx, num_local_experts, rounding_mode="floor"), -1)


def token_rank_mask(topk_idx_TK: torch.Tensor, num_local_experts: int, world_size: int):
    """Whether token ``t`` has at least one expert on rank ``r``: ``[T, W]`` bool.

    This is the once-per-destination-rank dedup: a token with several experts on one rank crosses
    the wire to it once. Example: ``[[True, True], [True, False], [False, True]]``.
    """
    ranks = dest_rank(topk_idx_TK, num_local_experts)
    mask = torch.zeros(ranks.shape[0], world_size + 1, dtype=torch.bool, device=ranks.device)
    # Column W collects the -1 slots and is dropped.
    mask.scatter_(1, torch.where(ranks >= 0, ranks, world_size), True)
    return mask[:, :world_size]


def send_order(token_rank_mask_TW: torch.Tensor):
    """Wire order of the tokens a source sends: by destination rank, then token index.

    Returns ``(send_token_idx [S], send_rank [S], send_counts [W])``, all int64, where ``S`` is the
    number of (token, destination rank) sends. Example: tokens ``[0, 1, 0, 2]`` to ranks
    ``[0, 0, 1, 1]``, counts ``[2, 2]`` (token 1 goes to rank 0 once although two of its experts
    live there).
    """
    ranks, tokens = token_rank_mask_TW.t().nonzero(as_tuple=True)
    counts = torch.bincount(ranks, minlength=token_rank_mask_TW.shape[1])
    return tokens, ranks, counts


def pairs_between_ranks(count_matrix_WE: torch.Tensor) -> torch.Tensor:
    """``[W, W]`` int64: pairs source ``s`` routes to rank ``d``, summed from the count matrix.

    Example: ``C = [[1, 2, 1, 1], [2, 0, 1, 1]]`` with 2 experts per rank gives
    ``[[3, 2], [2, 2]]``.
    """
    world_size, num_experts = count_matrix_WE.shape
    return count_matrix_WE.long().view(world_size, world_size, num_experts // world_size).sum(-1)


def local_order(topk_idx_TK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Stable position of each pair among this source's pairs to the same expert, ``[T, K]`` int64.

    Pairs are ranked in row-major ``(t, k)`` order; ``-1`` slots get ``-1``. This is the "stable
    local order" term of the deterministic mapping. Example: ``[[0, 0], [0, 1], [0, -1]]``
    (expert 1 receives token 0 first, then token 1).
    """
    flat = topk_idx_TK.reshape(-1).long()
    key = torch.where(flat >= 0, flat, num_experts)
    order = torch.argsort(key, stable=True)
    counts = _histogram(key, num_experts + 1)
    group_start = torch.cumsum(counts, 0) - counts
    rank_in_group = torch.empty_like(flat)
    rank_in_group[order] = torch.arange(flat.numel(), device=flat.device) - group_start[key[order]]
    return torch.where(flat >= 0, rank_in_group, -1).view(topk_idx_TK.shape)


def row_base(
    count_matrix_WE: torch.Tensor, num_local_experts: int, expert_capacity: int | None = None
) -> torch.Tensor:
    """First receive row of each (source, expert) block, ``[W, E]`` int64.

    Entry ``[s, e]`` is the row, on the rank holding ``e``, where the first pair of source ``s``
    for expert ``e`` lands. Rows are ordered by (local expert, source rank, source token):
    - compact layout (``expert_capacity=None``): rows of all local experts are packed, so the
      base is the rows of the earlier local experts plus the exclusive prefix sum over sources;
    - padded layout: local expert ``j`` owns rows ``[j * capacity, (j + 1) * capacity)`` and the
      base is ``j * capacity`` plus the same prefix sum.

    Example: with source 0 as above and source 1 sending ``C[1] = [2, 0, 1, 1]``,
    ``C = [[1, 2, 1, 1], [2, 0, 1, 1]]``. Expert totals ``[3, 2, 2, 2]``. Compact bases::

        [[0, 3, 0, 2],     # source 0: expert 0 at row 0, expert 1 at 3, expert 2 at 0, 3 at 2
         [1, 5, 1, 3]]     # source 1 follows source 0 inside each expert

    and with capacity 6 the padded bases are ``[[0, 6, 0, 6], [1, 8, 1, 7]]``.
    """
    world_size, num_experts = count_matrix_WE.shape
    counts = count_matrix_WE.long()
    src_prefix = torch.cumsum(counts, 0) - counts
    if expert_capacity is None:
        totals = counts.sum(0).view(world_size, num_local_experts)
        expert_start = (torch.cumsum(totals, 1) - totals).view(num_experts)
    else:
        local = torch.arange(num_experts, device=counts.device) % num_local_experts
        expert_start = local * expert_capacity
    return expert_start.unsqueeze(0) + src_prefix


def pair_rows(
    topk_idx_TK: torch.Tensor, row_base_E: torch.Tensor, num_experts: int
) -> torch.Tensor:
    """Receive row of every pair of one source on its destination rank, ``[T, K]`` int64.

    ``row_base_E`` is this source's row of :func:`row_base`. The sender knows every row before
    any token moves, so the receiver only scatters (UniEP's deterministic mapping). Example, source
    0 with the compact bases above: ``[[3, 0], [0, 4], [2, -1]]``.
    """
    idx = topk_idx_TK.long()
    base = row_base_E[idx.clamp(min=0)]
    return torch.where(idx >= 0, base + local_order(topk_idx_TK, num_experts), -1)


def return_slots(topk_idx_TK: torch.Tensor, num_local_experts: int, world_size: int):
    """Where each pair sent back by the destination ranks lands in the source's ``[T * K]`` slots.

    Destinations return pairs grouped by rank, and in ``(t, k)`` order inside a rank. Returns
    ``[P]`` int64 flat ``t * K + k`` slots. Example: ``[0, 2, 3, 1, 4]`` (rank 0 returns (0,0),
    (1,0), (1,1); rank 1 returns (0,1), (2,0)); the per-rank counts are those of
    :func:`pairs_between_ranks`.
    """
    ranks = dest_rank(topk_idx_TK, num_local_experts).reshape(-1)
    key = torch.where(ranks >= 0, ranks, world_size)
    order = torch.argsort(key, stable=True)
    return order[: int((ranks >= 0).sum())]


def received_rows(pair_rows_TK: torch.Tensor, dest_rank_TK: torch.Tensor, rank):
    """Rows that one destination rank fills for a source's pairs, ``-1`` for pairs elsewhere.

    ``[T, K]`` int64; ``rank`` is an int or a ``[T, 1]`` tensor (one destination per row). The source
    sends this row block with each token so the destination needs no search. Example, rank 1 of
    the running example: ``[[-1, 0], [-1, -1], [2, -1]]``.
    """
    return torch.where(dest_rank_TK == rank, pair_rows_TK, -1)
