"""Test vectors of ``ubep.layout`` for the C++ twin (``scheduler/include/ubep/layout.h``).

    python -m ubep.layout_vectors --write tests/vectors/layout.json

Each case: a world of sources with their routing, the count matrix, and for every source its expert
counts, local order, and pair rows in both layouts. Routing comes from a fixed-seed torch generator,
so the file is reproducible; a test checks the stored file equals a fresh build.
"""

from __future__ import annotations

import torch

from ubep import layout, vector_files
from ubep.workloads import drop_slots, random_topk

CASES = [  # (name, tokens per source, experts, top_k, world, drop fraction, padded capacity)
    ("docstring_example", None, 4, 2, 2, 0.0, 6),
    ("two_ranks_uneven", (5, 0), 8, 2, 2, 0.25, 8),
    ("three_ranks_top4", (7, 3, 9), 12, 4, 3, 0.1, 27),
    ("one_rank", (6,), 5, 3, 1, 0.0, 6),
    ("four_ranks_top1", (4, 4, 1, 0), 8, 1, 4, 0.0, 16),
]


def _routing(name, tokens, experts, top_k, world, drop):
    if name == "docstring_example":
        return [torch.tensor([[1, 2], [0, 1], [3, -1]]), torch.tensor([[0, 2], [0, 3]])]
    gen = torch.Generator().manual_seed(len(name))
    return [drop_slots(random_topk(t, experts, top_k, gen), drop, gen) for t in tokens]


def build() -> dict:
    cases = []
    for name, tokens, experts, top_k, world, drop, capacity in CASES:
        idxs = _routing(name, tokens, experts, top_k, world, drop)
        local = experts // world
        count_matrix = torch.stack([layout.expert_counts(i, experts) for i in idxs])
        compact = layout.row_base(count_matrix, local)
        padded = layout.row_base(count_matrix, local, capacity)
        cases.append({
            "name": name, "num_experts": experts, "top_k": top_k, "world_size": world,
            "expert_capacity": capacity, "count_matrix": count_matrix.tolist(),
            "row_base_compact": compact.tolist(), "row_base_padded": padded.tolist(),
            "sources": [{
                "topk_idx": i.tolist(),
                "local_order": layout.local_order(i, experts).tolist(),
                "pair_rows_compact": layout.pair_rows(i, compact[s], experts).tolist(),
                "pair_rows_padded": layout.pair_rows(i, padded[s], experts).tolist(),
            } for s, i in enumerate(idxs)],
        })
    return {"format": "ubep.layout vectors v1", "cases": cases}


def render() -> str:
    return vector_files.as_json(build())


def main(argv: list[str] | None = None) -> None:
    vector_files.main(render, __doc__, argv)


if __name__ == "__main__":
    main()
