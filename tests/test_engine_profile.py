"""``UBEP_PROFILE``: per-phase timing of every Buffer a process makes, and its breakdown written when
the process exits (ubep/engine_profile.py), as inside a serving engine's worker processes."""

from __future__ import annotations

import csv

import pytest
import torch

from tests.engine_profile_workers import profiled_worker
from ubep.launch import run_ranks
from ubep.profiling import PhaseTimer


def test_breakdown_written_at_exit_of_each_rank(tmp_path):
    pytest.importorskip("matplotlib")
    phases = run_ranks(profiled_worker, 2, str(tmp_path), timeout_s=120)
    assert phases[0] and phases[0] == phases[1]
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert [d.split("-")[0] for d in dirs] == ["rank0", "rank1"], dirs
    for rank, d in enumerate(dirs):
        files = {p.name for p in (tmp_path / d).iterdir()}
        assert {"breakdown.csv", "breakdown.md", "breakdown.png"} <= files
        with open(tmp_path / d / "breakdown.csv") as f:
            rows = list(csv.DictReader(f))
        labels = {r["phase"].split(": ")[0] for r in rows}
        assert labels == {"reference padded W=2 T_max=8", "reference compact W=2 T_max=8"}, labels
        assert {r["rank"] for r in rows} == {str(rank)}
        assert all(int(r["calls"]) in (3, 6) for r in rows)  # 3 calls; reorder runs twice per dispatch
        assert {r["phase"].split(": ", 1)[1] for r in rows} == set(phases[rank])


def test_phases_are_profiler_ranges():
    """Each phase is a ``ubep::<phase>`` range in torch's profiler (the engine's own traces)."""
    timer = PhaseTimer(enabled=True)
    with torch.profiler.profile() as prof, timer.phase("dispatch: kernel"):
        torch.ones(4).sum()
    assert "ubep::dispatch: kernel" in {e.name for e in prof.events()}
    assert list(timer.samples()) == ["dispatch: kernel"]
