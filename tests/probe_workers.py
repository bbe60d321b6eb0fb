"""Rank functions of tests/test_ascend_probe.py."""

from __future__ import annotations

from tests.workers import Case, run_cases
from ubep.backends.ascend_probe import ProbeResult, probe_blocks


def probe_then_layer_case(rank: int, world: int, cases: list[Case]) -> ProbeResult:
    """A layer's calls, the probe on the same group, the layer's calls again (the windows prepared
    again for it: the probe's rows must not reach them); every call checked against the oracle."""
    run_cases(rank, world, cases)
    result = probe_blocks(rounds=150, blocks=3, timeout_s=60)
    run_cases(rank, world, cases)
    return result


def refused_probe_case(rank: int, world: int) -> list[str]:
    """The probe's argument errors, raised before any communication."""
    messages = []
    for kwargs in ({"blocks": 0}, {"blocks": 33}, {"rounds": 0}, {"device": "cuda"}):
        try:
            probe_blocks(**kwargs)
        except ValueError as err:
            messages.append(str(err))
    return messages


def probe_case(rank: int, world: int, rounds: int, blocks: int, timeout_s: float) -> ProbeResult:
    return probe_blocks(rounds=rounds, blocks=blocks, timeout_s=timeout_s)
