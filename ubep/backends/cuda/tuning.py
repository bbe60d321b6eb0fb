"""The cuda backend's caps and thresholds, in one frozen value passed to the backend
(``CudaBackend(tuning=...)``) and to its planner (``plan``).

Defaults are the H200 machines' (``Tuning.h200()``); the measurements behind each are in
docs/BENCHMARKS.md. How the rows themselves are cut (steps, tiles, parts) is in ``geometry``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ubep.tuning import CostParams, h200


@dataclass(frozen=True)
class Tuning:
    # Pairs a count program orders per step: sets the whole dispatch kernel's registers.
    count_step: int = 32
    # Calls of at most this many pairs (a power of 2) count the pairs before a program's range in one
    # load, so their count programs never wait for one another; larger calls chain them.
    prefix_pairs: int = 2048
    # Pairs per count program in calls past prefix_pairs, and at most per step (a power of 2);
    # None: as many programs as the cost model's count term is least with.
    pair_chunk: int | None = None
    # Programs per group; a grid larger than the GPU holds still completes (lower ids go first).
    max_count: int = 256
    max_send: int = 128
    max_recv: int = 256
    # Combine senders: up to K rows an item, so more of them hide latency.
    max_combine_send: int = 512
    # Rows of the count programs' scratch (the kernel's N_BLOCK): the most count programs any call has.
    count_scratch: int = 256
    # Under an SM budget the count / token split is re-tuned once per bucket of this many tokens.
    split_bucket_tokens: int = 128
    # Up to this many tokens, tff senders wait for their own counts to leave first.
    counts_first_tokens: int = 512
    # Polls of the compact layout's size word before each further poll yields the GIL.
    spin_polls: int = 1000
    # Register cap of the combine kernel per sync mode (absent: the compiler's choice).
    combine_registers: tuple[tuple[str, int], ...] = (("sw", 128), ("tff", 128))
    # dc without an SM budget: one verifier per verify_tokens tokens of the call, within
    # [verify_min, verify_max] in all (at most 64 a source: records.SHARE_WORDS).
    verify_min: int = 16
    verify_max: int = 64
    verify_tokens: int = 2
    # Every group that waits for this call's peer data in a launch of its own, queued by finish_*:
    # start_* queues only what peers wait for (ranks emulated one after another need this).
    phased: bool = False
    # The count / token split's cost model (``ubep.tuning``).
    cost: CostParams = field(default_factory=h200)

    @classmethod
    def h200(cls) -> Tuning:
        return cls()

    def registers(self, sync: str) -> int | None:
        """The combine kernel's register cap in ``sync`` mode (None: uncapped)."""
        return dict(self.combine_registers).get(sync)
