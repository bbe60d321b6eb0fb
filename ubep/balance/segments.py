"""Where a balanced plan puts each row: per-rank segments and the destination of every pair.

Rank ``d`` lays out its rows in ``2L`` segments (``L = E / W``): segments ``0..L-1`` are its own
experts ``d*L .. d*L+L-1`` (present even when empty, since their weights are always there), and
segments ``L..2L-1`` are *borrowed slots*, filled in ascending global expert id by the remote
experts it computes rows of, then idle. A plan borrows from at most one group, so ``L`` slots
suffice and at most ``2L`` segments are non-empty.

The rows of expert ``e`` are ordered as in :mod:`ubep.oracle` (source rank, then the source's
row-major ``(token, k)`` order) and cut into contiguous runs over the ranks computing ``e`` in
ascending rank order. Rank order rather than home first: the cut then follows the source order,
so when an expert is spread over many ranks, rank ``d`` tends to get source ``d``'s rows, which
need not cross the wire.

Running example of :mod:`ubep.balance.plan` (``W = 3``, ``L = 2``)::

    borrowed_WL            = [[-1, -1], [0, -1], [1, -1]]
    tokens_per_segment_WG  = [[4, 4, 0, 0], [1, 2, 5, 0], [3, 3, 2, 0]]

Expert 0's 9 rows (4 from source 0, 3 from source 1, 2 from source 2) are split 4 to rank 0 (all
of source 0's, which stay local) and 5 to rank 1 (source 1's, then source 2's).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ubep.checks import check_int
from ubep.layout import local_order


class Segments(NamedTuple):
    """Per-rank segment layout, int64 tensors.

    - ``borrowed_WL [W, L]``: global id of the expert in each borrowed slot, ``-1`` when idle;
    - ``tokens_per_segment_WG [W, 2L]``: rows per segment, own experts first, then the slots;
    - ``segment_WE [W, E]``: segment of expert ``e`` on rank ``d``; ``-1`` where ``d`` computes no
      row of a remote ``e`` (own experts always have their segment).
    """

    borrowed_WL: torch.Tensor
    tokens_per_segment_WG: torch.Tensor
    segment_WE: torch.Tensor


class PairDestinations(NamedTuple):
    """Per pair ``(t, k)`` of one source, ``[T, K]`` int64 each, ``-1`` for empty slots.

    ``rank``: the rank computing the pair; ``segment``: its segment there; ``row``: its position
    inside that segment. The row in the rank's buffer is
    ``segment_offsets(tokens_per_segment_WG, align)[rank, segment] + row``.
    """

    rank: torch.Tensor
    segment: torch.Tensor
    row: torch.Tensor


def segment_layout(alloc_WE: torch.Tensor, *, check: bool = True) -> Segments:
    """Segments of every rank from an allocation ``alloc_WE [W, E]`` (rows of ``e`` on rank ``d``).

    ``check=True`` verifies on the host that no rank borrows from two groups (which would not fit
    the ``L`` slots); plans from :func:`ubep.balance.plan_balance` always pass.
    """
    if alloc_WE.dim() != 2 or alloc_WE.shape[0] == 0 or alloc_WE.shape[1] % alloc_WE.shape[0]:
        raise ValueError(f"alloc_WE must be [W, E] with E a multiple of W, got {tuple(alloc_WE.shape)}")
    world_size, num_experts = alloc_WE.shape
    local = num_experts // world_size
    device = alloc_WE.device
    alloc = alloc_WE.long()
    experts = torch.arange(num_experts, device=device)
    own = (experts // local)[None, :] == torch.arange(world_size, device=device)[:, None]
    remote = (alloc > 0) & ~own
    if check:
        groups = remote.view(world_size, world_size, local).any(2).sum(1)
        if bool((groups > 1).any()):
            rank = int((groups > 1).nonzero()[0, 0])
            raise ValueError(f"alloc_WE: rank {rank} computes experts of {int(groups[rank])} remote groups, "
                             f"at most 1 fits its {local} borrowed slots")
    slot = remote.long().cumsum(1) - 1  # ascending global id among the rank's remote experts
    # Column L is a sink for the experts that are not borrowed; it is dropped afterwards.
    borrowed = torch.full((world_size, local + 1), -1, dtype=torch.int64, device=device)
    borrowed.scatter_(1, torch.where(remote, slot.clamp(max=local), local),
                      torch.where(remote, experts, -1).expand(world_size, -1))
    borrowed = borrowed[:, :local]
    own_rows = torch.diagonal(alloc.view(world_size, world_size, local), dim1=0, dim2=1).t()
    borrowed_rows = torch.where(borrowed >= 0, alloc.gather(1, borrowed.clamp(min=0)), 0)
    segment = torch.where(own, experts % local, torch.where(remote, local + slot, -1))
    return Segments(borrowed, torch.cat([own_rows, borrowed_rows], 1), segment)


def segment_offsets(tokens_per_segment_WG: torch.Tensor, align: int = 1) -> torch.Tensor:
    """First row of each segment, ``[W, G + 1]`` int64, each segment padded to a multiple of ``align``.

    Column ``G`` is the rank's padded total. Empty segments take no rows. Example, rank 1 of the
    running example with ``align = 4``: ``[1, 2, 5, 0]`` pads to ``[4, 4, 8, 0]``, offsets
    ``[0, 4, 8, 16, 16]``.
    """
    check_int("align", align, 1)
    padded = (tokens_per_segment_WG.long() + align - 1) // align * align
    return torch.cat([padded.new_zeros(padded.shape[0], 1), padded.cumsum(1)], 1)


def max_rows_per_rank(rows_per_rank: int, num_local_experts: int, align: int = 1) -> int:
    """Static receive size: the padded rows of any rank computing at most ``rows_per_rank`` rows.

    At most ``2L`` segments are non-empty and padding adds at most ``align - 1`` rows to each, so the
    padded total is at most ``rows_per_rank + 2L(align - 1)``, rounded down to a multiple of
    ``align`` because every padded segment is one. Example: ``S * K = 8``, ``L = 2``, ``align = 4``:
    ``4 * floor(20 / 4) = 20``.
    """
    check_int("rows_per_rank", rows_per_rank, 0)
    check_int("num_local_experts", num_local_experts, 1)
    check_int("align", align, 1)
    slack = rows_per_rank + 2 * num_local_experts * (align - 1)
    return slack // align * align


def pair_destinations(topk_idx_TK: torch.Tensor, source: int, counts_WE: torch.Tensor,
                      alloc_WE: torch.Tensor, segment_WE: torch.Tensor) -> PairDestinations:
    """Rank, segment and row of every pair of one source rank under an allocation.

    ``counts_WE [W, E]`` is the all-gathered count matrix (this source's row must count
    ``topk_idx_TK``); ``alloc_WE`` and ``segment_WE`` come from the plan. A pair of expert ``e`` is
    row ``g`` of ``e`` (pairs of earlier sources, then its stable order in this source); ``g``
    falls in rank ``d``'s run when ``cum[d - 1] <= g < cum[d]``, with ``cum`` the inclusive sum of
    ``alloc_WE[:, e]`` over ranks, and its row in the segment is ``g - cum[d - 1]``. No host
    synchronization. Example, source 2 of the running example with
    ``topk_idx_TK = [[0, 1], [5, 0], [1, 3], [4, 5]]``::

        rank    = [[1, 2], [2, 1], [2, 1], [2, 2]]
        segment = [[2, 2], [1, 2], [2, 1], [0, 1]]
        row     = [[3, 0], [1, 4], [1, 1], [2, 2]]
    """
    world_size, num_experts = counts_WE.shape
    idx = topk_idx_TK.long()
    valid = idx >= 0
    expert = idx.clamp(min=0)
    counts = counts_WE.long()
    before = (counts.cumsum(0) - counts)[source]  # [E] rows of each expert from earlier sources
    g = before[expert] + local_order(topk_idx_TK, num_experts)
    alloc_EW = alloc_WE.long().t()
    end = alloc_EW.cumsum(1)[expert]  # [T, K, W] inclusive end of each rank's run
    rank = (end <= g.unsqueeze(-1)).sum(-1).clamp(max=world_size - 1)
    start = (end - alloc_EW[expert]).gather(-1, rank.unsqueeze(-1)).squeeze(-1)
    segment = segment_WE.long()[rank, expert]
    return PairDestinations(torch.where(valid, rank, -1), torch.where(valid, segment, -1),
                            torch.where(valid, g - start, -1))
