"""Hierarchical token-level scheduler: which worker sends which tokens of one source rank.

:mod:`~ubep.scheduler.search` locates token indices in cumulative counts (quaternary search, and
binary for comparison); :mod:`~ubep.scheduler.mapping` builds the per-worker assignments (the
hop-balanced partition that is UBEP's mapper, :data:`DEFAULT_VARIANT`; the paper's transposition
read literally; two baselines) and estimates their latency (the paper's objective (1)).
``python -m ubep.scheduler.vectors`` writes the test vectors the C++ twin checks.
"""

from ubep.scheduler.mapping import (
    DEFAULT_VARIANT,
    VARIANTS,
    Assignment,
    expert_contiguous,
    hop_aware,
    hop_balanced,
    load_balanced,
    per_hop_bound,
    schedule,
    slice_bounds,
    transpose_order,
    worker_latency_ns,
)
from ubep.scheduler.search import Located, binary_search, quaternary_search

__all__ = [
    "DEFAULT_VARIANT",
    "VARIANTS",
    "Assignment",
    "Located",
    "binary_search",
    "expert_contiguous",
    "hop_aware",
    "hop_balanced",
    "load_balanced",
    "per_hop_bound",
    "quaternary_search",
    "schedule",
    "slice_bounds",
    "transpose_order",
    "worker_latency_ns",
]
