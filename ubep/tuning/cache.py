"""Splits memoized per token bucket, so the tuner runs only when the workload crosses a bucket.

UniEP discretizes the token count into 4096-token buckets and queries its model only when the
workload crosses a bucket boundary, reusing the cached configuration otherwise. Here bucket
``b = ceil(T / bucket_tokens)`` covers ``T`` in ``((b - 1) * bucket_tokens, b * bucket_tokens]``
and is tuned at its upper edge ``b * bucket_tokens``: the answer then does not depend on which
``T`` of the bucket came first (UniEP tunes at the ``T`` that crossed), so repeated runs agree.
Decode batches (8..128 tokens) all fall in the first 4096 bucket; pass a small ``bucket_tokens``
there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from ubep.checks import check_int
from ubep.topology import Topology
from ubep.tuning.model import DispatchShape
from ubep.tuning.params import CostParams
from ubep.tuning.split import Split, best_count, best_split

UNIEP_BUCKET_TOKENS = 4096


class SplitCache:
    """``split(shape, n_workers)`` (and ``count(shape, n_max)``, the count workers where no budget
    is split) for one topology and one parameter set, memoized per
    ``(bucket, experts, topk, bytes_per_token, n_workers)``.

    Example: with ``bucket_tokens=4096``, ``T = 100, 4096, 3000`` are one miss (tuned at 4096) and
    two hits; ``T = 4097`` is a miss (bucket 2, tuned at 8192).
    """

    def __init__(self, topology: Topology, params: CostParams, *,
                 bucket_tokens: int = UNIEP_BUCKET_TOKENS) -> None:
        if not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
        if not isinstance(params, CostParams):
            raise TypeError(f"params must be a CostParams, got {type(params).__name__}")
        check_int("bucket_tokens", bucket_tokens, 1)
        self.topology, self.params, self.bucket_tokens = topology, params, bucket_tokens
        self.hits = self.misses = 0
        self._splits: dict[tuple[int, int, int, int, int], Split] = {}
        self._counts: dict[tuple[int, int, int, int, int], int] = {}

    def bucket(self, tokens: int) -> int:
        check_int("tokens", tokens, 0)
        return math.ceil(tokens / self.bucket_tokens)

    def split(self, shape: DispatchShape, n_workers: int) -> Split:
        return self._tuned(self._splits, best_split, shape, "n_workers", n_workers, 2)

    def count(self, shape: DispatchShape, n_max: int) -> int:
        return self._tuned(self._counts, best_count, shape, "n_max", n_max, 1)

    def _tuned(self, table: dict, tune: Callable, shape: DispatchShape, name: str, n: int,
               least: int):
        """``tune`` at the upper edge of ``shape``'s bucket with ``n`` workers, once per key."""
        if not isinstance(shape, DispatchShape):
            raise TypeError(f"shape must be a DispatchShape, got {type(shape).__name__}")
        check_int(name, n, least)
        b = self.bucket(shape.tokens)
        key = (b, shape.experts, shape.topk, shape.bytes_per_token, n)
        if key in table:
            self.hits += 1
        else:
            self.misses += 1
            table[key] = tune(replace(shape, tokens=b * self.bucket_tokens), n, self.topology,
                              self.params)
        return table[key]
