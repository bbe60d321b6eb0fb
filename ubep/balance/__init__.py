"""Balanced expert parallelism (MoonEP's idea): per batch, under-loaded ranks borrow copies of hot
experts so that every rank computes the same number of rows, ``S * K`` when every rank sends
``S * K``, whatever the routing skew.

:mod:`~ubep.balance.plan` decides how many rows of each expert each rank computes;
:mod:`~ubep.balance.segments` lays those rows out per rank and gives every ``(token, k)`` pair its
destination rank, segment and row; :mod:`~ubep.balance.chain` orders the weight-gradient sum of an
expert split over several ranks. Pure functions over int64 counts; docs/BALANCE.md explains them.
"""

from ubep.balance.plan import (
    BalancePlan,
    group_moves,
    plan_balance,
    rank_targets,
    split_moves,
)
from ubep.balance.segments import (
    PairDestinations,
    Segments,
    max_rows_per_rank,
    pair_destinations,
    segment_layout,
    segment_offsets,
)

__all__ = [
    "BalancePlan",
    "PairDestinations",
    "Segments",
    "group_moves",
    "max_rows_per_rank",
    "pair_destinations",
    "plan_balance",
    "rank_targets",
    "segment_layout",
    "segment_offsets",
    "split_moves",
]
