"""Test vectors of :func:`ubep.tuning.best_split` on ``cm384(W)`` with ``cm384_ascend()`` for the C++ host
tiling (``ascend_ops/op_host/split.h``).

    python -m ubep.tuning.vectors --write tests/vectors/split.json

The cases are the two splits the paper reports plus a fixed-seed sample of the grid below (worlds,
tokens, experts, top-k, row bytes, AIVs), keeping only shapes where the world divides the experts.
Each case holds the split and its predicted times; the file also holds the cost parameters and the
fabric's latencies and bandwidths, so the C++ constants are checked too. A test checks the stored
file equals a fresh build.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict

from ubep import vector_files
from ubep.topology import cm384
from ubep.tuning.model import DispatchShape
from ubep.tuning.params import cm384_ascend
from ubep.tuning.split import best_split

WORLDS = (2, 4, 8, 16, 64, 128, 256, 384)
TOKENS = (0, 1, 16, 64, 128, 512, 4096)
EXPERTS = (64, 128, 256, 384)
TOPK = (1, 4, 8)
BYTES = (7168 * 2, 4096 * 2)
WORKERS = (2, 8, 24, 48)
PAPER = [(256, 64, 256, 8, 7168 * 2, 48), (128, 128, 128, 8, 7168 * 2, 48)]  # 12 and 1 count AIVs
SAMPLED = 100


def grid_cases() -> list[tuple[int, int, int, int, int, int]]:
    """``(world, tokens, experts, topk, bytes_per_token, n_workers)``: the paper's two, then the sample."""
    grid = [c for c in itertools.product(WORLDS, TOKENS, EXPERTS, TOPK, BYTES, WORKERS) if c[2] % c[0] == 0]
    return PAPER + sorted(random.Random(0).sample(grid, SAMPLED))


def build() -> dict:
    params = cm384_ascend()
    fabric = cm384(2)
    cases = []
    for world, tokens, experts, topk, nbytes, workers in grid_cases():
        shape = DispatchShape(tokens=tokens, experts=experts, topk=topk, bytes_per_token=nbytes)
        split = best_split(shape, workers, cm384(world), params)
        cases.append({
            "world": world, "tokens": tokens, "experts": experts, "topk": topk, "bytes_per_token": nbytes,
            "n_workers": workers, "n_count": split.n_count, "n_token": split.n_token,
            "count_ns": split.count_ns, "token_ns": split.token_ns, "tail_ns": split.tail_ns,
            "total_ns": split.total_ns,
        })
    return {"format": "ubep.tuning split vectors v1", "params": asdict(params),
            "fabric": {"latency_ns": list(fabric.latency_ns), "bandwidth_gbps": list(fabric.bandwidth_gbps)},
            "cases": cases}


def render() -> str:
    return vector_files.as_json(build())


def main(argv: list[str] | None = None) -> None:
    vector_files.main(render, __doc__, argv)


if __name__ == "__main__":
    main()
