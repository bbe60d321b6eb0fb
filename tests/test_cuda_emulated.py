"""The CUDA backend's own kernels and host code on the CPU (no GPU): W ranks emulated in one process
through Triton's interpreter (tests/cuda_emulation.py), bit for bit against the oracle.

Rows are fp32 or fp16 here: the interpreter's conversion to bf16 truncates where the GPU rounds to
nearest, so bf16 sums are left to the GPU tests (dispatch moves bits and is checked in bf16 too).
Skipped where Triton is not installed (CI has none); GPU machines run tests/test_cuda.py.
"""

import os

import pytest

from tests.cuda_emulation import emulated_case, emulated_sentinel_case
from tests.workers import Case
from ubep.launch import run_ranks

pytest.importorskip("triton")

CASES = [
    Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync="tff"),
    Case(tokens=(4, 0, 6), hidden=40, num_experts=6, top_k=3, dtype="fp32", sync="sw", drop=0.25,
         seed=1),
    Case(tokens=(7, 7), hidden=16, num_experts=8, top_k=4, dtype="fp16", layout="padded",
         maxvio=1.0, seed=2, sync="tff"),
    Case(tokens=(6, 2), hidden=136, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="sw", seed=3),
    Case(tokens=(4, 0, 6), hidden=40, num_experts=6, top_k=3, dtype="fp32", sync="dc", drop=0.25,
         seed=1),
    Case(tokens=(7, 7), hidden=16, num_experts=8, top_k=4, dtype="fp16", layout="padded",
         maxvio=1.0, seed=2, sync="dc"),
    Case(tokens=(6, 2), hidden=136, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="dc", drop=0.25, seed=3),
    Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync="sp", drop=0.25),
    Case(tokens=(4, 0, 6), hidden=136, num_experts=6, top_k=3, dtype="fp16", layout="padded",
         sync="sp", seed=1),
]
# sp rows holding the sentinel: fp32 rows of 2 blocks, fp16 rows of 3 (the last one padded)
SENTINEL_CASES = [
    Case(tokens=(7, 0, 5), hidden=40, num_experts=6, top_k=2, dtype="fp32", sync="sp", drop=0.25,
         seed=4),
    Case(tokens=(8, 6), hidden=136, num_experts=8, top_k=3, dtype="fp16", layout="padded",
         sync="sp", seed=5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"W{len(c.tokens)}-{c.layout}-{c.dtype}-{c.sync}")
def test_emulated_ranks_match_oracle(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the spawned process
    run_ranks(emulated_case, 1, case, timeout_s=600)
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.parametrize("case", SENTINEL_CASES, ids=lambda c: f"W{len(c.tokens)}-{c.layout}-{c.dtype}")
def test_emulated_sp_rows_holding_the_sentinel(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_sentinel_case, 1, case, 3, timeout_s=600)


def test_two_count_programs_split_the_pairs(monkeypatch):
    """36 and 20 pairs, 4 per step, 2 count programs: each range spans several steps, and the
    second program adds the first one's counts."""
    case = Case(tokens=(9, 5), hidden=8, num_experts=8, top_k=4, dtype="fp32", maxvio=1.0,
                drop=0.1, seed=5, sync="sw")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_case, 1, case, 2, timeout_s=600)
