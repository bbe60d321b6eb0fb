"""Balanced expert parallelism: which rank computes how many rows of each expert (MoonEP's planner).

Every rank holds ``L = E / W`` experts (expert ``e`` lives on its *home* rank ``e // L``; the
experts of one home form its *group*). Under skewed routing some groups receive far more rows than
others. The planner evens the load out for one batch by letting under-loaded ranks compute part
of an over-loaded group's rows with borrowed copies of those experts' weights. All functions are
pure and deterministic over counts (int64 tensors); none reads a device value back to the host
unless ``check=True`` asks it to validate the input, so every rank can run the same plan on its
own device from the all-gathered counts.

Vocabulary:
- ``N``: rows in the batch, one per routed ``(token, k)`` pair, ``sum(expert_rows_E)``;
- *target* of rank ``r``: rows it computes, ``N // W`` plus one for the first ``N % W`` ranks.
  When every rank sends ``S * K`` rows this is exactly ``S * K`` everywhere; with masked or fewer
  tokens it stays within one row of the mean, so max / mean is 1 whenever ``W`` divides ``N``;
- *balance* of a group: its rows minus its home's target (``> 0``: a donor, ``< 0``: a receiver);
- ``moves_WW[h, d]``: rows of group ``h`` computed on rank ``d != h``;
- ``alloc_WE[d, e]``: rows of expert ``e`` computed on rank ``d``.

Two greedy passes (:func:`group_moves`, then :func:`split_moves`). The first fills each receiver's
whole deficit from one donor in one move, which is what bounds a rank to one remote group and to
``L`` borrowed experts. The price is the one invariant that gives way: a donor whose surplus is
smaller than the deficit it fills (no donor has enough) sends more than its surplus, keeps fewer
than ``target`` of its own rows, and later borrows the difference from one other group. Routing
can force this; see :func:`group_moves` for an example.

Running example (reused in :mod:`ubep.balance.segments`): ``W = 3``, ``E = 6`` (``L = 2``),
``S = 4`` tokens per rank, ``K = 2``, so ``N = 24`` and every target is 8. The count matrix
(rows each source sends to each expert) and its column sums::

    counts_WE = [[4, 2, 0, 1, 1, 0],
                 [3, 2, 1, 0, 1, 1],
                 [2, 2, 0, 1, 1, 2]]      expert_rows_E = [9, 6, 1, 2, 3, 3]

Group rows ``[15, 3, 6]``, balances ``[7, -5, -2]``; rank 0 lends 5 rows to rank 1 and 2 to rank 2::

    alloc_WE = [[4, 4, 0, 0, 0, 0],      # rank 0 keeps 8 of its 15
                [5, 0, 1, 2, 0, 0],      # rank 1: its own 3, plus 5 of expert 0
                [0, 2, 0, 0, 3, 3]]      # rank 2: its own 6, plus 2 of expert 1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ubep.balance.segments import PairDestinations, pair_destinations, segment_layout
from ubep.checks import check_int


def _lowest_argmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Index of the largest value along ``dim`` (kept as a size-1 dim), the lowest index on ties.

    The tie rule is spelled out in the key rather than left to ``argmax``, so that it cannot depend
    on the device or the kernel. Size-1 index tensors (never 0-d ones, which torch reads back as
    Python ints) keep the caller free of host synchronization.
    """
    n = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = n
    lower_first = (n - 1 - torch.arange(n, device=x.device)).view(shape)
    return (x * n + lower_first).argmax(dim, keepdim=True)


def rank_targets(total: torch.Tensor | int, world_size: int) -> torch.Tensor:
    """Rows each rank computes, ``[W]`` int64: ``total // W``, one more on the first ``total % W``.

    ``total`` may be a 0-d tensor on a device (no synchronization). Example: ``rank_targets(10, 4)``
    is ``[3, 3, 2, 2]``; ``rank_targets(24, 3)`` is ``[8, 8, 8]``.
    """
    total = torch.as_tensor(total, dtype=torch.int64)
    ranks = torch.arange(world_size, device=total.device)
    return total // world_size + (ranks < total % world_size).long()


def group_moves(group_rows_W: torch.Tensor, targets_W: torch.Tensor) -> torch.Tensor:
    """Rows of each group handed to other ranks, ``[W, W]`` int64 (``[h, d]``: group ``h`` to ``d``).

    Needs ``sum(group_rows_W) == sum(targets_W)`` and targets within one of each other (as
    :func:`rank_targets` gives). Each round takes the donor with the largest balance and the
    receiver with the smallest (ties: lowest rank) and moves the receiver's whole deficit in one
    go; the donor may overshoot into a deficit of its own. It stops when no balance is positive.

    - A receiver ends at balance 0 and is never picked again, so every rank takes rows from at most
      one other group, and there are at most ``W - 1`` rounds (the last one zeroes two ranks).
    - A rank whose own rows fit its target is never a donor: it keeps all of them.
    - A donor overshoots at most once (its last move) and never gives rows it does not have: a
      positive balance ``b`` leaves ``target_h + b`` own rows, at least the receiver's target, which
      bounds its deficit.
    - At most ``donors - 1`` donors overshoot (the last round ends both ranks at 0). Any plan with
      one remote group per rank has at least ``donors - B``, ``B`` the most disjoint sets of ranks,
      each with a donor, whose balances sum to 0: ranks linked by borrowing form such sets, each
      with at most one rank that gives without borrowing, and every donor gives. Unless some
      proper subset of ranks balances out exactly, ``B = 1`` and the greedy is optimal.

    Running example: balances ``[7, -5, -2]`` give ``[[0, 5, 2], [0, 0, 0], [0, 0, 0]]``.
    Forced overshoot: group rows ``[13, 13, 14, 0]``, targets 10: rank 3 must take 10 rows from a
    single group, but no surplus exceeds 4. Rank 2 sends 10 (keeping 4 of its own rows) and borrows
    6 from group 0; rank 0 then keeps 7 of its own and borrows 3 from group 1::

        [[0, 0, 6, 0], [3, 0, 0, 0], [0, 0, 0, 10], [0, 0, 0, 0]]
    """
    world_size = group_rows_W.numel()
    balance = group_rows_W.long() - targets_W.long()
    moves = torch.zeros(world_size * world_size, dtype=torch.int64, device=balance.device)
    # A fixed round count (no early exit) keeps the loop free of host reads; idle rounds move 0.
    for _ in range(world_size - 1):
        donor = _lowest_argmax(balance, 0)
        receiver = _lowest_argmax(-balance, 0)
        move = torch.where(balance.gather(0, donor) > 0, -balance.gather(0, receiver), 0)
        moves.scatter_add_(0, donor * world_size + receiver, move)
        balance.scatter_add_(0, donor, -move)
        balance.scatter_add_(0, receiver, move)
    return moves.view(world_size, world_size)


def split_moves(expert_rows_E: torch.Tensor, moves_WW: torch.Tensor) -> torch.Tensor:
    """Expert-level allocation ``alloc_WE [W, E]`` int64 from the group-level moves.

    Inside each donor group (all groups at once), each step gives the receiver with the largest
    remaining quota as many rows as it still needs of the expert with the most rows left (ties:
    lowest rank, lowest expert); whatever no receiver takes stays home. Each step empties a quota
    or an expert, so a group with ``R`` receivers is split in at most ``R + L - 1`` pieces and the
    loop needs at most ``W + L - 2`` steps. Large pieces keep the number of (rank, borrowed expert)
    pairs, hence of weight copies, small.

    Running example: group 0 has experts ``[9, 6]`` and quotas 5 (rank 1), 2 (rank 2): rank 1 takes
    5 rows of expert 0, then rank 2 takes 2 of expert 1, and rank 0 keeps ``[4, 4]``.
    """
    world_size = moves_WW.shape[0]
    local = expert_rows_E.numel() // world_size
    remaining = expert_rows_E.long().view(world_size, local).clone()
    quota = moves_WW.long().clone()
    given = torch.zeros(world_size, world_size * local, dtype=torch.int64, device=quota.device)
    for _ in range(max(world_size + local - 2, 0)):
        receiver = _lowest_argmax(quota, 1)
        expert = _lowest_argmax(remaining, 1)
        take = torch.minimum(quota.gather(1, receiver), remaining.gather(1, expert))
        quota.scatter_add_(1, receiver, -take)
        remaining.scatter_add_(1, expert, -take)
        given.scatter_add_(1, receiver * local + expert, take)
    # given[h, d, j] is rows of group h's j-th expert on rank d; home d == h adds what is left.
    home = torch.eye(world_size, dtype=torch.int64, device=quota.device)
    alloc = given.view(world_size, world_size, local).transpose(0, 1) + home[:, :, None] * remaining
    return alloc.reshape(world_size, world_size * local)


@dataclass(frozen=True, eq=False)
class BalancePlan:
    """One batch's plan; every field is an int64 tensor on the counts' device.

    - ``targets_W [W]``: rows each rank computes (:func:`rank_targets`);
    - ``moves_WW [W, W]``: rows of group ``h`` computed on rank ``d`` (:func:`group_moves`);
    - ``alloc_WE [W, E]``: rows of expert ``e`` computed on rank ``d`` (:func:`split_moves`);
    - ``borrowed_WL [W, L]``, ``tokens_per_segment_WG [W, 2L]``, ``segment_WE [W, E]``: each
      rank's segments (:func:`ubep.balance.segments.segment_layout`).
    """

    targets_W: torch.Tensor
    moves_WW: torch.Tensor
    alloc_WE: torch.Tensor
    borrowed_WL: torch.Tensor
    tokens_per_segment_WG: torch.Tensor
    segment_WE: torch.Tensor

    def destinations(self, topk_idx_TK: torch.Tensor, source: int,
                     counts_WE: torch.Tensor) -> PairDestinations:
        """:func:`ubep.balance.segments.pair_destinations` for one source rank under this plan."""
        return pair_destinations(topk_idx_TK, source, counts_WE, self.alloc_WE, self.segment_WE)


def _check_counts(counts: torch.Tensor, world_size: int | None, check: bool) -> tuple[torch.Tensor, int]:
    if not isinstance(counts, torch.Tensor) or counts.dim() not in (1, 2):
        raise ValueError(f"counts must be a [W, E] or [E] tensor, got {getattr(counts, 'shape', counts)}")
    if counts.dtype.is_floating_point or counts.dtype.is_complex or counts.dtype == torch.bool:
        raise TypeError(f"counts must be an integer tensor, got {counts.dtype}")
    if counts.dim() == 2:
        if world_size is not None and world_size != counts.shape[0]:
            raise ValueError(f"world_size must be counts.shape[0] = {counts.shape[0]}, got {world_size}")
        world_size = counts.shape[0]
        counts = counts.long().sum(0)
    if world_size is None:
        raise ValueError("world_size is needed with [E] counts")
    check_int("world_size", world_size, 1)
    if counts.numel() == 0 or counts.numel() % world_size:
        raise ValueError(f"the number of experts must be a positive multiple of world_size {world_size}, "
                         f"got {counts.numel()}")
    if check and bool((counts < 0).any()):
        raise ValueError(f"counts must be >= 0, got min {int(counts.min())}")
    return counts.long(), world_size


def plan_balance(counts: torch.Tensor, world_size: int | None = None, *, check: bool = True) -> BalancePlan:
    """Plan one batch from the all-gathered counts.

    ``counts``: ``[W, E]`` rows each source rank sends to each expert, or their column sums ``[E]``
    with ``world_size``. The plan depends on the column sums only; the per-pair split
    (:meth:`BalancePlan.destinations`) also needs the ``[W, E]`` matrix. ``check=True`` validates
    the values on the host (a synchronization); shapes and dtypes are always checked.

    Guarantees (``N`` rows, ``L = E / W``): ``alloc_WE.sum(0)`` equals the expert totals; rank ``r``
    computes exactly ``targets_W[r]`` rows (``S * K`` when ``N = W * S * K``, else at most
    ``ceil(N / W)``); each rank borrows experts of at most one other group, hence at most ``L``
    experts and at most ``2L`` non-empty segments; a rank whose own rows fit its target keeps them
    all (the exception for donors is in :func:`group_moves`). Cost: ``W - 1`` rounds over ``[W]``,
    then ``W + L - 2`` steps over ``[W, W]`` and ``[W, L]``, then ``O(W * E)`` for the layout.
    """
    expert_rows_E, world_size = _check_counts(counts, world_size, check)
    local = expert_rows_E.numel() // world_size
    targets = rank_targets(expert_rows_E.sum(), world_size)
    moves = group_moves(expert_rows_E.view(world_size, local).sum(1), targets)
    alloc = split_moves(expert_rows_E, moves)
    segments = segment_layout(alloc, check=False)
    return BalancePlan(targets, moves, alloc, segments.borrowed_WL, segments.tokens_per_segment_WG,
                       segments.segment_WE)
