"""Routing generators: exact loads, distinct experts per row, the requested max violation."""

import pytest
import torch

from ubep import workloads


def test_expert_loads_worked_example():
    assert workloads.expert_loads(8, 4, 2, 1.0, [2]).tolist() == [3, 3, 8, 2]


@pytest.mark.parametrize(("tokens", "experts", "top_k", "maxvio"),
                         [(256, 64, 8, 0.0), (256, 64, 8, 1.0), (256, 64, 8, 3.0), (100, 16, 4, 2.0),
                          (7, 8, 8, 0.0)])
def test_skewed_topk_hits_loads(tokens, experts, top_k, maxvio):
    gen = torch.Generator().manual_seed(1)
    idx = workloads.skewed_topk(tokens, experts, top_k, maxvio=maxvio, generator=gen)
    assert idx.shape == (tokens, top_k)
    assert (idx.sort(1).values.diff(dim=1) > 0).all(), "an expert repeats within a row"
    want = workloads.expert_loads(tokens, experts, top_k, maxvio, [0] if maxvio else [])
    got = torch.bincount(idx.flatten(), minlength=experts)
    assert got[0] == want[0]
    assert sorted(got[1:].tolist()) == sorted(want[1:].tolist())
    assert workloads.measured_maxvio(idx, experts) == pytest.approx(maxvio, abs=0.05)


def test_impossible_skew_is_refused():
    with pytest.raises(ValueError, match="maxvio"):
        workloads.expert_loads(4, 4, 2, 1.0, [0, 1, 2])


def test_origin_data_distinguishes_rows():
    a = workloads.origin_tokens(0, 50, 16, torch.bfloat16)
    b = workloads.origin_tokens(1, 50, 16, torch.bfloat16)
    rows = torch.cat([a, b]).float()
    assert torch.unique(rows, dim=0).shape[0] == 100


def test_drop_slots():
    idx = workloads.random_topk(1000, 16, 4, torch.Generator().manual_seed(0))
    dropped = workloads.drop_slots(idx, 0.25, torch.Generator().manual_seed(0))
    assert 0.2 < (dropped == -1).float().mean() < 0.3


def test_leftover_pairs_spread_over_ranks():
    """16 tokens x top-8 over 256 experts: 128 experts get one pair; they must not all be the
    128 low ids (which one rank of two holds)."""
    idx = workloads.skewed_topk(16, 256, 8, generator=torch.Generator().manual_seed(0))
    on_low_half = int((idx < 128).sum())
    assert 32 < on_low_half < 96
