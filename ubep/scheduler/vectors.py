"""Shared test vectors: inputs and exact outputs of the scheduler, for the C++ twin to reproduce.

``python -m ubep.scheduler.vectors --write tests/vectors/scheduler.json`` (re)writes the file;
without ``--write`` the JSON goes to stdout. Each case holds ``counts``, ``hops``,
``num_workers`` and the expected ``transpose_order``, ``slice_bounds``, ``per_hop_bound``, the
search of every token index ``0..M`` over the cumulative counts in transposition order
(quaternary position, offset, steps, and binary steps), the slice starts that the quaternary
search finds, and, per variant, the pieces (``worker_ptr``, ``dest``, ``start``, ``length``),
``totals`` and ``class_counts``. Random cases come from a 64-bit LCG (below), not from torch, so
the file does not depend on the torch version.
"""

from __future__ import annotations

import json

import torch

from ubep import vector_files
from ubep.scheduler.mapping import VARIANTS, per_hop_bound, schedule, slice_bounds, transpose_order
from ubep.scheduler.search import binary_search, quaternary_search

FORMAT = "ubep.scheduler vectors v1"

# (name, counts, hops, num_workers): the docstring examples, the counterexamples, the edges.
HAND_CASES = [
    ("running_example", [3, 1, 2, 0, 1, 0], [0, 0, 1, 1, 2, 2], 2),
    ("hot_destination_breaks_hop_bound", [1, 1, 1, 5], [0, 0, 1, 1], 2),
    ("one_token_each_contiguous_classes", [1] * 6, [0, 0, 0, 1, 1, 1], 3),
    ("ten_dests_four_workers", [1] * 10, [0, 0, 0, 1, 1, 1, 1, 2, 2, 2], 4),
    ("no_destinations", [], [], 3),
    ("all_empty", [0, 0, 0, 0], [0, 1, 1, 2], 2),
    ("one_worker", [4, 0, 2, 7], [0, 1, 1, 2], 1),
    ("more_workers_than_tokens", [1, 0, 2], [0, 1, 1], 5),
    ("more_workers_than_dests", [6, 3], [1, 0], 4),
    ("single_hot_destination", [0, 0, 50, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 2, 2], 3),
    ("unsorted_classes", [2, 5, 1, 3, 4, 2], [2, 0, 1, 0, 2, 1], 4),
    ("spares_wrap_farthest_dealt_second", [2, 3, 1], [0, 1, 2], 4),
]


class Lcg:
    """Knuth's MMIX LCG; ``below(k)`` takes the top 31 bits mod ``k``. Seed 1: 4, 3, 1 for
    ``below(5)`` three times (easy to port: unsigned 64-bit wraparound)."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def below(self, k: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % k


def random_cases(count: int, seed: int = 1) -> list[tuple[str, list[int], list[int], int]]:
    """Small cases, a third of them with one or two hot destinations; classes are contiguous
    runs (as a topology gives them) in two cases out of three, shuffled labels otherwise."""
    rng = Lcg(seed)
    cases = []
    for i in range(count):
        num_dests, num_workers, num_classes = 1 + rng.below(16), 2 + rng.below(6), 2 + rng.below(2)
        counts = [rng.below(4) for _ in range(num_dests)]
        if i % 3 == 0:
            for _ in range(1 + rng.below(2)):
                counts[rng.below(num_dests)] += 8 + rng.below(20)
        hops = sorted(rng.below(num_classes) for _ in range(num_dests))
        if i % 3 == 2:
            hops = [rng.below(num_classes) for _ in range(num_dests)]
        cases.append((f"random_{i:02d}", counts, hops, num_workers))
    return cases


def expected(name: str, counts: list[int], hops: list[int], num_workers: int) -> dict:
    counts_D, hop_D = torch.tensor(counts, dtype=torch.int64), torch.tensor(hops, dtype=torch.int64)
    num_classes = max(hops, default=0) + 1
    total = sum(counts)
    order = transpose_order(len(counts), num_workers)
    cumsum = torch.cumsum(counts_D[order], 0)
    every = torch.arange(total + 1)
    quaternary, binary = quaternary_search(cumsum, every), binary_search(cumsum, every)
    bounds = slice_bounds(total, num_workers)
    starts = quaternary_search(cumsum, bounds[:-1])
    case = {
        "name": name, "counts": counts, "hops": hops, "num_workers": num_workers,
        "transpose_order": order.tolist(), "slice_bounds": bounds.tolist(),
        "per_hop_bound": per_hop_bound(counts_D, hop_D, num_classes, num_workers).tolist(),
        "search": {"cumsum": cumsum.tolist(), "position": quaternary.position.tolist(),
                   "offset": quaternary.offset.tolist(), "quaternary_steps": quaternary.steps.tolist(),
                   "binary_steps": binary.steps.tolist()},
        "slice_starts": {"position": starts.position.tolist(), "offset": starts.offset.tolist()},
        "variants": {},
    }
    for variant in VARIANTS:
        a = schedule(variant, counts_D, hop_D, num_workers)
        case["variants"][variant] = {
            "worker_ptr": a.worker_ptr.tolist(), "dest": a.dest.tolist(), "start": a.start.tolist(),
            "length": a.length.tolist(), "totals": a.worker_totals().tolist(),
            "class_counts": a.worker_class_counts(hop_D, num_classes).tolist(),
        }
    return case


def render() -> str:
    """The whole file, one case per line so that diffs stay readable."""
    cases = [expected(*c) for c in HAND_CASES + random_cases(24)]
    lines = ",\n".join("    " + json.dumps(c, separators=(",", ":")) for c in cases)
    search_note = "search: every token index 0..M over cumsum of counts in transpose_order"
    return (f'{{\n  "format": {json.dumps(FORMAT)},\n  "note": {json.dumps(search_note)},\n'
            f'  "cases": [\n{lines}\n  ]\n}}\n')


def main(argv: list[str] | None = None) -> None:
    vector_files.main(render, __doc__, argv)


if __name__ == "__main__":
    main()
