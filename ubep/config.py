"""Frozen, validated configuration of one expert-parallel layer.

Every field is checked in ``__post_init__`` so that a bad value fails with a message that names the
argument and the expected value, long before any rank communicates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ubep.checks import check_int

LAYOUTS = ("compact", "padded")
SYNC_MODES = ("sw", "tff", "dc", "sp")  # ubep.protocol.MODES; the reference backend ignores it
REDUCTIONS = ("source", "expert_rank")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def least_cuda_sms(world_size: int, sync: str) -> int:
    """The smallest SM budget (``num_sms``) of the cuda backend: one count, one token and one receive
    program, and in ``dc`` one verifier per rank."""
    return 3 + (world_size if sync == "dc" else 0)


# Row indices travel as int32 on the wire, so every destination row index must fit in one.
MAX_ROWS = 2**31 - 1


@dataclass(frozen=True, kw_only=True)
class EPConfig:
    """Shape and policy of an expert-parallel layer, identical on every rank.

    ``num_experts`` experts are spread evenly: rank ``r`` holds experts
    ``[r * num_local_experts, (r + 1) * num_local_experts)``.

    Example: ``EPConfig(world_size=4, rank=1, hidden=1024, num_experts=64, top_k=8,
    max_tokens_per_rank=256, dtype=torch.bfloat16)`` gives ``num_local_experts == 16`` (rank 1
    holds experts 16..31) and, in the padded layout, ``expert_capacity == 4 * 256 == 1024`` rows
    per local expert.
    """

    world_size: int
    rank: int
    hidden: int
    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    dtype: torch.dtype
    layout: str = "compact"
    sync: str = "tff"
    timeout_s: float = 60.0
    check_inputs: bool = True
    num_sms: int | None = None  # cuda backend: most thread blocks per launch; None: its own caps

    def __post_init__(self) -> None:
        for name in ("world_size", "hidden", "num_experts", "top_k", "max_tokens_per_rank"):
            check_int(name, getattr(self, name), 1)
        check_int("rank", self.rank)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.num_experts % self.world_size:
            raise ValueError(
                f"num_experts must be a multiple of the group size {self.world_size}, "
                f"got {self.num_experts}"
            )
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be <= num_experts ({self.num_experts}), got {self.top_k}")
        if self.dtype not in DTYPES:
            raise TypeError(f"dtype must be one of {DTYPES}, got {self.dtype}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.sync not in SYNC_MODES:
            raise ValueError(f"sync must be one of {SYNC_MODES}, got {self.sync!r}")
        if self.num_sms is not None:
            check_int("num_sms", self.num_sms, 1)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        worst_rows = self.num_local_experts * self.expert_capacity
        if worst_rows > MAX_ROWS:
            raise ValueError(
                f"max_tokens_per_rank={self.max_tokens_per_rank} makes {worst_rows} receive rows "
                f"per rank, more than the {MAX_ROWS} an int32 row index can address"
            )

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def expert_capacity(self) -> int:
        """Rows per local expert in the padded layout: every source may send all its tokens."""
        return self.world_size * self.max_tokens_per_rank

    @property
    def local_experts(self) -> range:
        """Global ids of the experts this rank holds."""
        return range(self.rank * self.num_local_experts, (self.rank + 1) * self.num_local_experts)
