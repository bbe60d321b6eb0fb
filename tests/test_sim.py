"""Superpod simulator: the paper's trends in small scenarios, the CLI, argument checks."""

import pytest
import torch

pytest.importorskip("simpy", reason="the simulator needs the 'sim' extras")
pytest.importorskip("matplotlib", reason="the simulator's plots need the 'sim' extras")

from ubep.cli import main  # noqa: E402
from ubep.scheduler import DEFAULT_VARIANT  # noqa: E402
from ubep.sim import Routing, SimConfig, SimParams, simulate  # noqa: E402
from ubep.sim.params import wire_bytes_per_row  # noqa: E402
from ubep.sim.scenarios import CANN_EP, UBEP, UBEP_NO_MAPPING, Workload, run, superpod  # noqa: E402


def test_tff_rows_take_flag_overhead():
    params = SimParams()
    assert wire_bytes_per_row(params, "tff") == 30 * 512
    assert wire_bytes_per_row(params, "sp") == 14336


def test_decomposition_beats_bsp():
    params = SimParams()
    for tokens in (16, 64):
        work = Workload(32, 32, 8, tokens)
        assert run(work, UBEP, params).total_us < run(work, CANN_EP, params).total_us


def test_mapping_lowers_the_worst_worker():
    """Figure 10's setting: naive > load-balanced > UBEP's mapper (the default) worst worker."""
    assert UBEP[1] == DEFAULT_VARIANT
    params = SimParams()
    work = Workload(64, 256, 8, 64, hot=8)
    worst = {name: max(run(work, v, params).worker_us)
             for name, v in (("naive", CANN_EP), ("lb", UBEP_NO_MAPPING), ("hop", UBEP))}
    assert worst["naive"] > worst["lb"] > worst["hop"], worst


def test_data_as_flag_beats_stop_and_wait_most_at_small_granularity():
    params = SimParams().with_(init_ns=1e-3, count_ns_per_pair=1e-3, count_msg_ns=1e-3,
                               cumsum_ns_per_entry=1e-3)
    routing = Routing(torch.ones(32, 32, dtype=torch.long), 1)
    gains = []
    for kib in (1, 64):
        p = params.with_(hidden=kib * 512, sync_unit_bytes=kib * 1024)
        t = {m: max(r.done_ns for r in simulate(routing, superpod(32), p,
                                                SimConfig("decomposed", UBEP[1], m)))
             for m in ("sw", "tff", "sp")}
        assert t["tff"] < t["sw"] and t["sp"] < t["sw"]
        gains.append(1 - min(t["tff"], t["sp"]) / t["sw"])
    assert gains[0] > gains[1]


def test_every_rank_finishes_and_phases_are_ordered():
    work = Workload(8, 16, 4, 8)
    for execution, mapping, sync in [("bsp", "load_balanced", "sw"),
                                     ("decomposed", "hop_balanced", "dc")]:
        ranks = simulate(work.routing(), superpod(8), SimParams(),
                         SimConfig(execution, mapping, sync, 2))
        assert len(ranks) == 8
        for r in ranks:
            assert all(0 <= a <= b for a, b in r.spans.values())
            assert r.spans["token-reordering"][1] == r.done_ns


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"execution": "async"}, "execution must be one of"),
    ({"mapping": "random"}, "mapping must be one of"),
    ({"sync": "ack"}, "sync must be one of"),
])
def test_config_checks(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SimConfig(**{"execution": "bsp", "mapping": "hop_aware", "sync": "sw", **kwargs})


def test_params_and_sizes_are_checked():
    with pytest.raises(ValueError, match="worker_gbps must be > 0"):
        SimParams(worker_gbps=0)
    with pytest.raises(ValueError, match="n_count must be in"):
        simulate(Workload(4, 4, 2, 4).routing(), superpod(4), SimParams(),
                 SimConfig("decomposed", "hop_aware", "sp", 48))
    with pytest.raises(ValueError, match="topology has 8 ranks"):
        simulate(Workload(4, 4, 2, 4).routing(), superpod(8), SimParams(),
                 SimConfig("bsp", "hop_aware", "sp"))


def test_cli_writes_table_and_figure(tmp_path, capsys):
    assert main(["simulate", "--scenario", "paper-fig10", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "paper-fig10.csv").read_text().startswith("variant,max_worker_us")
    assert (tmp_path / "fig10_workers.png").stat().st_size > 10_000
    assert "UBEP w/o mapping" in capsys.readouterr().out
    assert main(["simulate", "--scenario", "nope", "--out", str(tmp_path)]) == 2
