"""Multi-process dispatch/combine on gloo, bit for bit against the single-process oracle.

One spawn per world size runs a matrix of cases: K in {1, 2, 8}; hidden sizes that are not powers
of two; bf16/fp16/fp32; uneven token counts including 0; -1 slots; skewed routing; both layouts;
both reductions, weighted and not; gradients of x and of the gate weights.
"""

import pytest

from tests.workers import Case, run_cases
from ubep.launch import run_ranks


def cases_for(world: int) -> list[Case]:
    experts = max(8, 4 * world)
    tokens = tuple((3 * s + 5) % 13 if s != 1 else 0 for s in range(world))
    return [
        Case(tokens=tokens, hidden=40, num_experts=experts, top_k=1, dtype="bf16"),
        Case(tokens=tokens, hidden=72, num_experts=experts, top_k=2, dtype="fp16",
             layout="padded", drop=0.25, seed=1),
        Case(tokens=tuple(t + 4 for t in tokens), hidden=24, num_experts=experts, top_k=8,
             dtype="fp32", maxvio=3.0, drop=0.1, seed=2, num_sms=6),
        Case(tokens=tuple(t + 8 for t in tokens), hidden=200, num_experts=experts, top_k=8,
             dtype="bf16", layout="padded", maxvio=1.0, seed=3, max_tokens=24),
        Case(tokens=(0,) * world, hidden=24, num_experts=experts, top_k=2, seed=4, max_tokens=3),
        # top-16, the largest top-k: more rows per token than a cuda combine reducer takes at once
        Case(tokens=tuple(t + 3 for t in tokens), hidden=136, num_experts=world * -(-16 // world),
             top_k=16, dtype="bf16", seed=5),
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_matches_oracle(world):
    cases = cases_for(world)
    results = run_ranks(run_cases, world, cases, timeout_s=400)
    for case_idx, case in enumerate(cases):
        rows = [results[r][case_idx]["rows"] for r in range(world)]
        pairs = sum(case.tokens) * case.top_k
        if not case.drop:
            assert sum(rows) == pairs, (case, rows)
        else:
            assert sum(rows) <= pairs
    assert "dispatch: count exchange" in results[0][0]["phases"]


def test_relay_sends_each_token_once_per_rank():
    """K = 8 of 8 experts on 2 ranks: every token reaches the other rank once, not 4 times."""
    case = Case(tokens=(6, 6), hidden=16, num_experts=8, top_k=8, grads=False)
    wire = [r[0]["wire"] for r in run_ranks(run_cases, 2, [case])]
    for w in wire:
        assert w.tokens_sent == 6 and w.pairs_sent == 24
        assert w.token_bytes * 4 == w.naive_token_bytes
