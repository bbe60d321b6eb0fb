"""The rounding contract: fp32 product then fp32 sum, ascending k, skipping invalid slots."""

import numpy as np
import torch

from ubep.reduce import ordered_sum


def _scalar_loop(o, w, valid):
    acc = np.float32(0.0)
    for k in range(len(o)):
        if valid[k]:
            acc = np.float32(acc + np.float32(np.float32(w[k]) * np.float32(o[k])))
    return acc


def test_worked_example():
    out = ordered_sum(torch.tensor([[[1.0], [2.0]]]), torch.tensor([[True, True]]),
                      torch.tensor([[0.5, 0.25]]))
    assert out.tolist() == [[1.0]]


def test_matches_a_scalar_fp32_loop_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    contrib = torch.randn(64, 8, 3, generator=gen).to(torch.bfloat16)
    weights = torch.rand(64, 8, generator=gen)
    valid = torch.rand(64, 8, generator=gen) > 0.3
    got = ordered_sum(contrib, valid, weights)
    o, w, v = contrib.float().numpy(), weights.numpy(), valid.numpy()
    want = np.array([[_scalar_loop(o[m, :, h], w[m], v[m]) for h in range(3)] for m in range(64)])
    assert np.array_equal(got.numpy(), want)


def test_order_matters_so_the_contract_is_observable():
    """Summing the same terms in another order changes bits: the test above can fail."""
    contrib = torch.tensor([[[1.0], [1e8], [-1e8]]])
    valid = torch.ones(1, 3, dtype=torch.bool)
    forward = ordered_sum(contrib, valid)
    backward = ordered_sum(contrib.flip(1), valid)
    assert forward.item() != backward.item()


def test_unweighted_and_all_invalid():
    contrib = torch.ones(2, 3, 4)
    valid = torch.tensor([[False] * 3, [True, False, True]])
    assert ordered_sum(contrib, valid).tolist() == [[0.0] * 4, [2.0] * 4]
