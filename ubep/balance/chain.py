"""In what order a split expert's weight gradient is summed: the chain of ranks computing it.

The rows of expert ``e`` have one global order (source rank, then the source's row-major
``(token, k)`` order) and a plan cuts them into contiguous runs over the ranks computing ``e`` in
ascending rank order (:mod:`ubep.balance.segments`). A weight gradient defined as a sum over rows
in that order, ``acc = 0; for each row: acc = acc + contribution(row)``, therefore comes out with
the bits of the unbalanced layer when the accumulator itself travels: the first rank of the chain
adds its rows to zeros, hands the accumulator to the next rank, which goes on from it, and the last
rank hands it to the home. Adding per-rank partial sums at home instead would change the rounding.

Round ``p`` runs every chain's ``p``-th piece at once (chains of different experts overlap), so
there are as many rounds as ranks in the longest chain.

Running example of :mod:`ubep.balance.plan` (``W = 3``, ``L = 2``)::

    alloc_WE = [[4, 4, 0, 0, 0, 0],      chains  = [[0, 1], [0, 2], [1], [1], [2], [2]]
                [5, 0, 1, 2, 0, 0],
                [0, 2, 0, 0, 3, 3]]

Expert 0: rank 0 adds its 4 rows, sends the accumulator to rank 1, which adds its 5 and sends the
sum home to rank 0: two messages. Expert 1 likewise through rank 2. The rest stay home.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ChainStep(NamedTuple):
    """One piece of a chain: ``rank`` adds its rows of ``expert`` in round ``round`` and hands the
    accumulator to ``to`` (``to == rank``: it is the home and keeps the result)."""

    round: int
    rank: int
    expert: int
    to: int


def grad_chains(alloc_WE: torch.Tensor) -> list[list[int]]:
    """Per expert, the ranks computing any of its rows, ascending (empty for an expert with no row).

    Reads ``alloc_WE [W, E]`` on the host.
    """
    alloc = alloc_WE.cpu().tolist()
    return [[d for d in range(len(alloc)) if alloc[d][e] > 0] for e in range(len(alloc[0]))]


def chain_steps(alloc_WE: torch.Tensor) -> list[ChainStep]:
    """Every piece of every chain, sorted by (round, rank, expert): the order each rank runs and
    sends them. The last piece of a chain goes to the home ``e // L`` (to itself when the home is
    last). Running example: ``(0, 0, 0, 1), (0, 0, 1, 2), (0, 1, 2, 1), (0, 1, 3, 1),
    (0, 2, 4, 2), (0, 2, 5, 2), (1, 1, 0, 0), (1, 2, 1, 0)``.
    """
    world_size, num_experts = alloc_WE.shape
    local = num_experts // world_size
    steps = []
    for e, chain in enumerate(grad_chains(alloc_WE)):
        for p, rank in enumerate(chain):
            to = chain[p + 1] if p + 1 < len(chain) else e // local
            steps.append(ChainStep(p, rank, e, to))
    return sorted(steps)


def chain_messages(alloc_WE: torch.Tensor) -> int:
    """Accumulators that cross between ranks (each one weight gradient's size). Running example: 4."""
    return sum(step.to != step.rank for step in chain_steps(alloc_WE))
