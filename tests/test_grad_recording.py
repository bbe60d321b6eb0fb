"""Calls that autograd records go through the autograd Functions, others straight to the backend:
the same bits either way, and gradients only where asked for."""

import torch

import ubep
from tests.workers import Case, case_inputs


def test_calls_with_and_without_grad_give_the_same_bits(single_rank_group):
    case = Case(tokens=(9,), hidden=40, num_experts=8, top_k=3, dtype="bf16", drop=0.2, seed=5)
    x, idx, w = case_inputs(case, 0)
    buf = ubep.Buffer(single_rank_group, hidden=case.hidden, num_experts=case.num_experts,
                      top_k=case.top_k, max_tokens_per_rank=9, dtype=torch.bfloat16)
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    recorded = buf.dispatch(xg, idx, wg)
    y_recorded = buf.combine(recorded.recv_x, recorded.handle)
    assert recorded.recv_x.grad_fn is not None and y_recorded.grad_fn is not None
    y_recorded.float().sum().backward()
    assert xg.grad is not None and wg.grad is not None
    for plain in (False, True):
        with torch.no_grad() if plain else torch.enable_grad():
            res = buf.dispatch(xg if plain else x, idx, wg if plain else w)
            y = buf.combine(res.recv_x, res.handle)
        assert not res.recv_x.requires_grad and not y.requires_grad
        assert torch.equal(res.recv_x, recorded.recv_x.detach())
        assert torch.equal(res.recv_weights, recorded.recv_weights.detach())
        assert torch.equal(y, y_recorded.detach())
