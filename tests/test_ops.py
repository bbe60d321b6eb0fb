"""``torch.ops.ubep.dispatch`` / ``combine`` (ubep/ops.py) on gloo ranks: the Buffer's bits and the
oracle's, forward and backward, both layouts and reductions, on the reference backend and on the
ascend backend's CPU twin (where its library is built); ``torch.compile(fullgraph=True)`` with no
graph break and eager's bits; ``torch.library.opcheck``; ids of Buffers that are gone; and, on a
GPU, the cuda backend's padded layout captured in a CUDA graph through the ops."""

import pytest
import torch

from tests.ops_workers import (
    emulated_cuda_routes_case,
    graph_case,
    parity_and_opcheck,
    reference_checks,
    run_parity,
)
from tests.workers import Case
from ubep.backends.ascend_library import library_path
from ubep.launch import run_ranks


def parity_cases(world: int, backend: str) -> list[Case]:
    experts = 4 * world
    tokens = tuple(5 + 3 * s if s != 1 else 0 for s in range(world))  # rank 1 sends nothing
    return [
        Case(tokens=tokens, hidden=24, num_experts=experts, top_k=2, dtype="bf16", backend=backend),
        Case(tokens=tokens, hidden=40, num_experts=experts, top_k=3, dtype="fp16", layout="padded",
             drop=0.25, seed=1, backend=backend),
        Case(tokens=tuple(t + 2 for t in tokens), hidden=16, num_experts=experts, top_k=4,
             dtype="fp32", maxvio=2.0, drop=0.1, seed=2, layout="padded", max_tokens=16,
             backend=backend),
    ]


def opcheck_cases(backend: str) -> list[Case]:
    return [Case(tokens=(4, 4), hidden=16, num_experts=4, top_k=2, dtype="fp32", layout=layout,
                 backend=backend) for layout in ("compact", "padded")]


COMPILERS = ["aot_eager", "inductor"]


@pytest.fixture(scope="module")
def two_ranks() -> list[dict]:
    """Every reference-backend check on 2 gloo ranks, in one spawn (each costs every rank a torch
    import); a failure names its check and case, and fails every test below."""
    padded = Case(tokens=(6, 3), hidden=32, num_experts=4, top_k=2, dtype="bf16", layout="padded",
                  max_tokens=8, seed=3)
    compact = Case(tokens=(5, 7), hidden=16, num_experts=4, top_k=2, dtype="fp32", seed=4)
    return run_ranks(reference_checks, 2, parity_cases(2, "reference"), opcheck_cases("reference"),
                     padded, compact, COMPILERS, timeout_s=300)


def _check_rows(rows: list[list[int]], cases: list[Case]) -> None:
    for i, case in enumerate(cases):
        assert 0 < sum(r[i] for r in rows) <= sum(case.tokens) * case.top_k


def test_ops_match_buffer_and_oracle(two_ranks):
    """Dispatch, every combine and every gradient: the Buffer's bits and the oracle's."""
    _check_rows([r["parity"] for r in two_ranks], parity_cases(2, "reference"))


def test_ops_match_buffer_and_oracle_on_three_ranks():
    cases = parity_cases(3, "reference")
    _check_rows(run_ranks(run_parity, 3, cases, timeout_s=120), cases)


def test_compiled_layers_have_no_graph_break_and_eager_bits(two_ranks):
    """``torch.compile(fullgraph=True)``: a small MoE layer on the padded layout under aot_eager and
    inductor, forward and every gradient bit for bit; the compact layout (an unbacked row count)
    under aot_eager."""
    for rank in two_ranks:
        checked, (rows, eager_rows) = rank["compile"]
        assert checked == COMPILERS and rows == eager_rows > 0


def test_opcheck(two_ranks):
    assert two_ranks[0]["opcheck"] == two_ranks[1]["opcheck"]
    assert len(two_ranks[0]["opcheck"]) == 2 * 7


def test_ids_of_buffers_that_are_gone_raise(two_ranks):
    """Destroyed, deleted and unknown ids, and another Buffer's routes (``lifetime_case``)."""
    assert [r["lifetime"] for r in two_ranks] == [5, 5]


@pytest.mark.skipif(library_path() is None,
                    reason="the ascend operator library is not built (./build.sh test builds it)")
def test_ops_on_the_ascend_twin():
    """Parity and opcheck on the ascend backend's CPU twin."""
    done = run_ranks(parity_and_opcheck, 2, parity_cases(2, "ascend")[:2], opcheck_cases("ascend"),
                     timeout_s=120)
    assert len(done[0]) == 2 * 7


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sync", ["sw", "tff"])
def test_cuda_graph_captures_the_ops(sync):
    from tests.shared_gpu import run_on_gpus

    run_on_gpus(graph_case, 2, sync, timeout_s=300)


def test_cuda_routes_round_trip_on_the_emulation(monkeypatch):
    """The cuda backend's route tensors, on its kernels run by Triton's interpreter (no GPU; CI has
    no Triton and skips this)."""
    pytest.importorskip("triton")
    cases = [Case(tokens=(4, 2), hidden=16, num_experts=4, top_k=2, dtype="fp32", layout=layout,
                  drop=0.2, seed=6, num_sms=3) for layout in ("compact", "padded")]
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the spawned process
    run_ranks(emulated_cuda_routes_case, 1, cases, timeout_s=300)
