"""``ubep.BalancedBuffer`` on CPU ranks: a balanced MoE layer equals the unbalanced layer and the
one-process layer bit for bit (outputs, gradients of x, of the gate weights and of the expert
weights) under skewed routings; every rank computes its plan's target; bad input and ranks that
disagree raise errors naming the argument."""

import dataclasses
import re

import pytest
import torch

import ubep
import ubep.ops
from tests.balanced_workers import BalancedCase, compare_cases, disagreeing_rank
from ubep import balanced_layer
from ubep.backends.ascend_library import library_path
from ubep.balance.chain import chain_messages, chain_steps, grad_chains
from ubep.balanced import BalancedBuffer
from ubep.exact_expert import exact_weights
from ubep.launch import RankFailure, run_ranks


def cases_for(world: int) -> list[BalancedCase]:
    uneven = tuple((5 * s + 7) % 13 if s != 1 else 0 for s in range(world))
    return [
        BalancedCase(tokens=(8,) * world),  # full batches: exactly S * K rows on every rank
        BalancedCase(tokens=uneven, top_k=3, hot=(0, 1), drop=0.1, dtype=torch.bfloat16,
                     hidden=20, intermediate=8, seed=3),
        BalancedCase(tokens=(6,) * world, top_k=4, experts_per_rank=3, maxvio=2.0,
                     hot=(3 * world - 1,), dtype=torch.float16, seed=5),
    ]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_balanced_layer_is_bitwise(world):
    check_balanced_cases(world, cases_for(world))


@pytest.mark.skipif(library_path() is None,
                    reason="the ascend operator library is not built (./build.sh test)")
@pytest.mark.parametrize("world", [2, 3])
def test_balanced_layer_is_bitwise_with_rows_on_the_ascend_twin(world):
    """The rows through the ascend backend (a plain Buffer of W * 2L virtual experts, one per
    segment): the same bits as the unbalanced reference layer and the one-process layer."""
    check_balanced_cases(world, [dataclasses.replace(c, backend="ascend") for c in cases_for(world)[:2]])


def check_balanced_cases(world: int, cases: list[BalancedCase]) -> None:
    results = run_ranks(compare_cases, world, cases, timeout_s=400)
    for i, case in enumerate(cases):
        per_rank = [results[r][i] for r in range(world)]
        for r, res in enumerate(per_rank):
            for name, (vs_unbalanced, unbalanced_vs_one_process) in res["checks"].items():
                assert vs_unbalanced, (case, r, name, "balanced != unbalanced")
                assert unbalanced_vs_one_process, (case, r, name, "unbalanced != one process")
        assert {res["rows_backend"] for res in per_rank} == {case.backend}
        rows = [res["rows"] for res in per_rank]
        assert rows == per_rank[0]["targets"], (case, rows)
        assert max(rows) - min(rows) <= 1
        assert sum(rows) == sum(res["rows_unbalanced"] for res in per_rank)
        if case.drop == 0 and len(set(case.tokens)) == 1:
            assert rows == [case.tokens[0] * case.top_k] * world
        unbalanced = [res["rows_unbalanced"] for res in per_rank]
        assert max(unbalanced) > max(rows), (case, unbalanced)  # the skew was there to remove
        assert any(e >= 0 for res in per_rank for e in res["borrowed"])


def test_chain_of_the_running_example():
    alloc = torch.tensor([[4, 4, 0, 0, 0, 0], [5, 0, 1, 2, 0, 0], [0, 2, 0, 0, 3, 3]])
    assert grad_chains(alloc) == [[0, 1], [0, 2], [1], [1], [2], [2]]
    assert [tuple(s) for s in chain_steps(alloc)] == [
        (0, 0, 0, 1), (0, 0, 1, 2), (0, 1, 2, 1), (0, 1, 3, 1), (0, 2, 4, 2), (0, 2, 5, 2),
        (1, 1, 0, 0), (1, 2, 1, 0)]
    assert chain_messages(alloc) == 4
    # a home that computes none of its expert's rows still ends its chain; a chain with the home
    # last needs no final message; an expert with no row has no chain
    alloc = torch.tensor([[0, 0, 3, 0], [2, 0, 1, 0]])
    assert chain_steps(alloc) == [(0, 0, 2, 1), (0, 1, 0, 0), (1, 1, 2, 1)]
    assert chain_messages(alloc) == 2


def _buffer(**over):
    args = {"hidden": 8, "num_experts": 2, "top_k": 2, "max_tokens_per_rank": 4,
            "dtype": torch.float32, "weight_shapes": [(8, 4), (4, 8)]}
    return BalancedBuffer(**{**args, **over})


def test_one_rank_step_and_bad_input(single_rank_group):
    buf = _buffer()
    x = torch.randn(4, 8)
    idx = torch.tensor([[0, 1], [1, -1], [0, 1], [1, 0]])
    gate, loss_w = torch.rand(4, 2), torch.randn(4, 8)
    own = exact_weights(8, 4, 0, range(2))
    got = balanced_layer.balanced_step(buf, x, idx, gate, loss_w, own)
    want = balanced_layer.unbalanced_step(_plain(), x, idx, gate, loss_w, own)
    assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3], strict=True))
    assert got[4].tokens_per_segment.tolist() == [3, 4, 0, 0]
    handle = got[4]
    with pytest.raises(ValueError, match=r"weights must hold this rank's 2 experts, got 1"):
        buf.prefetch_weights(handle, own[:1])
    with pytest.raises(ValueError, match=r"weights\[1\]\[0\] must have shape \[8, 4\], got \[4, 8\]"):
        buf.prefetch_weights(handle, [own[0], [own[1][1], own[1][0]]])
    with pytest.raises(TypeError, match=r"weights\[0\]\[1\] must have dtype torch.float32"):
        buf.prefetch_weights(handle, [[own[0][0], own[0][1].double()], own[1]])
    with pytest.raises(ValueError, match="handle must come from a dispatch of this BalancedBuffer"):
        _buffer().prefetch_weights(handle, own)
    with pytest.raises(ValueError, match="handle must come from a dispatch of this BalancedBuffer"):
        buf.reduce_weight_grads(want[4], lambda seg, acc: acc)
    with pytest.raises(TypeError, match="accumulate must be callable"):
        buf.reduce_weight_grads(handle, None)
    with pytest.raises(ValueError, match=r"accumulate\(segment=0, \.\.\.\) must be a list of 2"):
        buf.reduce_weight_grads(handle, lambda seg, acc: acc[:1])
    with pytest.raises(ValueError, match="reduce must be 'source' on a BalancedBuffer"):
        buf.combine(torch.zeros(7, 8), handle, reduce="expert_rank")
    with pytest.raises(ValueError, match=r"topk_idx values must be in \[-1, 2\)"):
        buf.dispatch(x, idx + 1, gate)
    with pytest.raises(RuntimeError, match="is a BalancedBuffer, whose rows are segments"):
        ubep.ops.dispatch(buf, x, idx, gate)
    with pytest.raises(ValueError, match="backend must be one of .* for a BalancedBuffer, got 'auto'"):
        _buffer(backend="auto")
    with pytest.raises(ValueError, match=r"weight_shapes\[1\] must have 1 to 4 dimensions"):
        _buffer(weight_shapes=[(8, 4), ()])
    with pytest.raises(ValueError, match="weight_shapes must be a sequence of 1 to 8 shapes"):
        _buffer(weight_shapes=[])
    with pytest.raises(ValueError, match=r"weight_shapes\[0\] must be >= 1, got 0"):
        _buffer(weight_shapes=[(8, 0)])
    with pytest.raises(TypeError, match="weight_dtype must be one of"):
        _buffer(weight_dtype=torch.int32)


def _plain():
    return ubep.Buffer(hidden=8, num_experts=2, top_k=2, max_tokens_per_rank=4, dtype=torch.float32)


@pytest.mark.parametrize("what, message", [
    ("shapes", r"weight_shapes, weight_dtype and backend are \[\(8, 4\), \(4, 8\)\] float32, rows on "
               r"reference on ranks \[0\], \[\(8, 6\), \(6, 8\)\] float32, rows on reference on ranks \[1\]"),
    ("rows", r"weight_shapes, weight_dtype and backend are \[\(8, 4\), \(4, 8\)\] float32, rows on "
             r"reference on ranks \[0\], \[\(8, 4\), \(4, 8\)\] float32, rows on ascend on ranks \[1\]"),
    ("plain", r"balance is 'redundant' on ranks \[0\], 'none' on ranks \[1\]"),
])
def test_ranks_that_disagree_raise_on_every_rank(what, message):
    results = run_ranks(disagreeing_rank, 2, what, return_failures=True, timeout_s=120)
    for failure in results:
        assert isinstance(failure, RankFailure) and failure.kind == "ValueError", failure
        assert re.search(message, failure.message), failure.message
