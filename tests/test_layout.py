"""Hand-worked expectations for ubep.layout (the running example of its module docstring)."""

import pytest
import torch

from ubep import layout

# W = 2 ranks, E = 4 experts, E_local = 2, K = 2; source 0's routing.
IDX = torch.tensor([[1, 2], [0, 1], [3, -1]])
C = torch.tensor([[1, 2, 1, 1], [2, 0, 1, 1]])


def test_expert_counts():
    assert layout.expert_counts(IDX, 4).tolist() == [1, 2, 1, 1]
    assert layout.expert_counts(torch.full((3, 2), -1), 4).tolist() == [0, 0, 0, 0]
    assert layout.expert_counts(torch.zeros(0, 2, dtype=torch.int32), 4).tolist() == [0] * 4


def test_dest_rank_keeps_empty_slots():
    assert layout.dest_rank(IDX, 2).tolist() == [[0, 1], [0, 0], [1, -1]]


def test_token_rank_mask_dedups_per_rank():
    mask = layout.token_rank_mask(IDX, 2, 2)
    assert mask.tolist() == [[True, True], [True, False], [False, True]]


def test_send_order_rank_major_then_token():
    tokens, ranks, counts = layout.send_order(layout.token_rank_mask(IDX, 2, 2))
    assert tokens.tolist() == [0, 1, 0, 2]
    assert ranks.tolist() == [0, 0, 1, 1]
    assert counts.tolist() == [2, 2]


def test_pairs_between_ranks():
    assert layout.pairs_between_ranks(C).tolist() == [[3, 2], [2, 2]]


def test_send_order_empty_and_all_dropped():
    tokens, _, counts = layout.send_order(layout.token_rank_mask(torch.full((2, 3), -1), 1, 3))
    assert tokens.tolist() == [] and counts.tolist() == [0, 0, 0]
    tokens, _, counts = layout.send_order(torch.zeros(0, 3, dtype=torch.bool))
    assert tokens.numel() == 0 and counts.tolist() == [0, 0, 0]


def test_local_order_is_stable_per_expert():
    assert layout.local_order(IDX, 4).tolist() == [[0, 0], [0, 1], [0, -1]]
    idx = torch.tensor([[5, 1], [1, 5], [5, -1], [1, 0]])
    assert layout.local_order(idx, 8).tolist() == [[0, 0], [1, 1], [2, -1], [2, 0]]


def test_row_base_compact_and_padded():
    assert layout.row_base(C, 2).tolist() == [[0, 3, 0, 2], [1, 5, 1, 3]]
    assert layout.row_base(C, 2, expert_capacity=6).tolist() == [[0, 6, 0, 6], [1, 8, 1, 7]]


def test_pair_rows_and_received_rows():
    rows = layout.pair_rows(IDX, layout.row_base(C, 2)[0], 4)
    assert rows.tolist() == [[3, 0], [0, 4], [2, -1]]
    ranks = layout.dest_rank(IDX, 2)
    assert layout.received_rows(rows, ranks, 1).tolist() == [[-1, 0], [-1, -1], [2, -1]]
    assert layout.received_rows(rows, ranks, 0).tolist() == [[3, -1], [0, 4], [-1, -1]]


def test_return_slots_group_by_rank():
    assert layout.return_slots(IDX, 2, 2).tolist() == [0, 2, 3, 1, 4]


@pytest.mark.parametrize("seed", range(5))
def test_rows_fill_each_rank_exactly_once(seed):
    """All sources' pair rows on a rank form a permutation of 0..N-1, ordered as promised."""
    gen = torch.Generator().manual_seed(seed)
    world, experts, top_k = 3, 9, 3
    idxs = [torch.rand(n, experts, generator=gen).topk(top_k, 1).indices for n in (7, 0, 11)]
    count_matrix = torch.stack([layout.expert_counts(i, experts) for i in idxs])
    base = layout.row_base(count_matrix, experts // world)
    for rank in range(world):
        keys, rows = [], []
        for s, idx in enumerate(idxs):
            r = layout.received_rows(layout.pair_rows(idx, base[s], experts),
                                     layout.dest_rank(idx, 3), rank)
            t, k = (r >= 0).nonzero(as_tuple=True)
            rows += r[t, k].tolist()
            keys += [(int(idx[a, b]), s, int(a)) for a, b in zip(t, k, strict=True)]
        assert sorted(rows) == list(range(len(rows)))
        assert [key for _, key in sorted(zip(rows, keys, strict=True))] == sorted(keys)


def test_stored_vectors_match_a_fresh_build():
    from pathlib import Path

    from ubep import layout_vectors

    stored = (Path(__file__).parent / "vectors" / "layout.json").read_text()
    assert stored == layout_vectors.render()
