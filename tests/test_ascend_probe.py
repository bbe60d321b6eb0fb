"""The probe of the tear-free 512-byte write (``ubep probe``, ``ascend_ops/op_kernel/probe_kernel.cpp``)
on the ascend backend's CPU twin, and what the sync modes rest on: with ``UBEP_TWIN_PIECE`` the twin
moves window copies in 128-byte pieces with a gap between them, as a chip without the 512-byte
transaction might; the probe must then find blocks seen flag first, and ``sw`` and ``dc`` must stay
exact (``tff`` and ``sp`` need whole blocks: docs/ASCEND.md, "What each mode assumes")."""

import pytest

from tests import probe_workers
from tests.test_ascend import cases_for
from tests.workers import run_cases
from ubep.backends.ascend_library import library_path
from ubep.cli import main
from ubep.launch import run_ranks

pytestmark = pytest.mark.skipif(library_path() is None,
                                reason="the ascend operator library is not built (./build.sh test builds it)")
TORN = "128:40"  # UBEP_TWIN_PIECE: 128-byte pieces, 40 us apart


@pytest.mark.parametrize("world", [1, 4])
def test_the_twin_delivers_whole_blocks_and_the_layer_survives_the_probe(world):
    cases = cases_for(world, ("tff",))[:2]
    results = run_ranks(probe_workers.probe_then_layer_case, world, cases, timeout_s=300)
    for rank, r in enumerate(results):
        assert (r.rank, r.source, r.readers, r.blocks, r.rounds) == (rank, (rank - 1) % world, 2, 3, 150)
        assert r.reads >= r.readers * r.blocks and r.older == 0 and r.newer == 0, r
        assert not r.torn


def test_no_writer_starts_before_every_die_filled_its_window(monkeypatch):
    """Die 1's AIV 0 fills the probe's rows 20 ms late (``UBEP_TWIN_SLOW_AIV``); die 0's writers,
    each of which met only its share of the dies, must wait for it (the SyncAll after the
    preparation), or that fill lands on their last rounds and die 1's readers wait for them in vain."""
    monkeypatch.setenv("UBEP_TWIN_SLOW_AIV", "1:0:20000")
    for r in run_ranks(probe_workers.probe_case, 2, 40, 2, 10.0, timeout_s=120):
        assert r.older == 0 and r.reads >= r.readers * r.blocks, r


def test_the_probe_finds_blocks_seen_flag_first(monkeypatch, capsys):
    monkeypatch.setenv("UBEP_TWIN_PIECE", TORN)
    assert main(["probe", "--ranks", "2", "--rounds", "300", "--blocks", "4"]) == 1
    out = capsys.readouterr().out
    assert out.count("TORN: tff and sp are unsafe here") == 2 and "TORN on ranks [0, 1]" in out, out


@pytest.mark.parametrize("sync", ["sw", "dc"])
def test_sw_and_dc_stay_exact_when_blocks_arrive_in_pieces(monkeypatch, sync):
    monkeypatch.setenv("UBEP_TWIN_PIECE", "128:5")
    run_ranks(run_cases, 2, cases_for(2, (sync,)), timeout_s=400)


def test_the_probe_on_the_twin_exits_zero(capsys):
    assert main(["probe", "--ranks", "2", "--rounds", "100", "--blocks", "2"]) == 0
    assert "every block was seen whole (cpu, W=2, 2 blocks x 100 rounds per row)" in capsys.readouterr().out


def test_bad_probe_arguments_are_refused_before_any_communication(capsys):
    messages = run_ranks(probe_workers.refused_probe_case, 1)[0]
    assert messages == ["blocks must be in [1, 32], got 0", "blocks must be in [1, 32], got 33",
                        "rounds must be in [1, 2^31), got 0",
                        "device: the probe runs on NPUs or on the CPU twin, not on cuda (group backend "
                        "'gloo'); pass device="]
    with pytest.raises(SystemExit):
        main(["probe", "--blocks", "40"])
    assert "--blocks 40 must be <= 32" in capsys.readouterr().err
