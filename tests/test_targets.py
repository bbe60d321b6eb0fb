"""``benchmarks/targets.py`` reads the fast path's targets off a ``bench_ep.py`` results.csv."""

import csv
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

COLUMNS = ["W", "hidden", "experts", "top_k", "tokens", "maxvio", "what", "median_us", "pct_link",
           "pct_a2a"]


@pytest.fixture(scope="module")
def targets():
    return load_benchmark("targets")


def _csv(path: Path, world: int, rows: list[tuple]) -> Path:
    """``rows``: (tokens, what, median µs, pct_link, pct_a2a[, maxvio[, hidden]])."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for tokens, what, us, link, a2a, *rest in rows:
            maxvio = rest[0] if rest else 0.0
            hidden = rest[1] if len(rest) > 1 else 7168
            out.writerow([world, hidden, 256, 8, tokens, maxvio, what, us, link, a2a])
    return path


def _by_target(lines: list[dict]) -> dict:
    return {line["target"]: line for line in lines}


def test_ep2_targets_take_each_ops_best_mode(targets, tmp_path):
    path = _csv(tmp_path / "ep2.csv", 2, [
        (128, "cuda/padded/sw graph dispatch", 12.0, 20.0, ""),
        (128, "cuda/padded/tff graph dispatch", 9.5, 25.0, ""),
        (128, "cuda/padded/sw queued graph dispatch", 8.0, 30.0, ""),
        (128, "cuda/padded/sw graph combine source", 13.0, 30.0, ""),
        (128, "cuda/padded/sw graph combine expert_rank", 11.0, 10.0, ""),
        (128, "cuda/padded/sw dispatch", 150.0, 1.0, ""),
        (128, "reference/padded dispatch", 3000.0, 0.1, ""),
        (128, "cuda/padded/dc graph dispatch", 1.0, 99.0, "", 3.0),  # skewed: not a target row
        (128, "cuda/padded/dc graph dispatch", 1.0, 99.0, "", 0.0, 2048),  # another shape
        (4096, "cuda/compact/sw/sms24 dispatch", 180.0, 60.0, ""),
        (4096, "cuda/compact/tff/sms24 combine expert_rank", 150.0, 40.0, ""),
        (4096, "cuda/compact/tff dispatch", 160.0, 70.0, ""),
        (4096, "reference/compact dispatch", 150.0, 75.0, ""),
    ])
    lines = _by_target(targets.verdicts(targets.load(path)))
    dispatch = lines["EP2 128 tok dispatch (graph) <= 10 µs"]
    assert (dispatch["row"], dispatch["measured"], dispatch["met"]) == (
        "cuda/padded/tff graph dispatch", "9.5 µs", True)
    assert lines["EP2 128 tok combine (graph) <= 12 µs"]["met"] is True  # expert_rank: 11 µs
    assert lines["EP2 128 tok dispatch (queued graph) <= 10 µs"]["measured"] == "8.0 µs"
    assert lines["EP2 128 tok combine (queued graph) <= 12 µs"]["met"] is None
    assert lines["EP2 4096 tok dispatch, 24 SMs <= 175 µs"]["met"] is False  # 180: over
    assert lines["EP2 4096 tok combine, 24 SMs <= 190 µs"]["met"] is True
    assert lines["EP2 128 tok dispatch: cuda faster than the reference"]["met"] is True
    slower = lines["EP2 4096 tok dispatch: cuda faster than the reference"]
    assert (slower["measured"], slower["met"]) == ("160.0 against 150.0 µs", False)
    floor = lines["EP2 4096 tok dispatch: within 2x of the link floor"]
    assert (floor["row"], floor["met"]) == ("cuda/compact/tff dispatch", True)
    assert lines["EP2 128 tok combine expert_rank: within 2x of the link floor"]["met"] is False
    assert not any(key.startswith("EP8") for key in lines)
    table = targets.markdown(list(lines.values()))
    assert "| EP2 128 tok combine (queued graph) <= 12 µs | - | - | not measured |" in table


def test_ep8_prefill_is_read_against_the_all_to_all_ceiling(targets, tmp_path):
    path = _csv(tmp_path / "ep8.csv", 8, [
        (128, "cuda/padded/sw graph dispatch", 14.0, 10.0, 5.0),
        (4096, "cuda/compact/sw dispatch", 300.0, 60.0, 82.0),
        (4096, "cuda/compact/tff dispatch", 280.0, 65.0, 85.5),
        (4096, "cuda/compact/sw combine source", 400.0, 45.0, 79.0),
    ])
    lines = _by_target(targets.verdicts(targets.load(path)))
    assert lines["EP8 128 tok dispatch (graph) <= 15 µs"]["met"] is True
    share = lines["EP8 4096 tok dispatch >= 80 % of all-to-all"]
    assert (share["row"], share["measured"], share["met"]) == (
        "cuda/compact/tff dispatch", "85.5 %", True)
    assert lines["EP8 4096 tok combine >= 80 % of all-to-all"]["met"] is False
    assert not any(key.startswith("EP2") for key in lines)


def test_a_csv_without_target_rows_is_refused(targets, tmp_path, monkeypatch, capsys):
    path = _csv(tmp_path / "other.csv", 2, [(128, "cuda/padded/sw graph dispatch", 9.0, 50.0, "",
                                             0.0, 2048)])
    monkeypatch.setattr("sys.argv", ["targets.py", str(path)])
    assert targets.main() == 2
    assert "no rows of hidden 7168" in capsys.readouterr().err


def test_a_one_gpu_run_says_it_has_no_targets(targets, tmp_path, monkeypatch, capsys):
    path = _csv(tmp_path / "ep1.csv", 1, [(128, "cuda/padded/sw queued graph dispatch", 17.0, 0.0,
                                           "")])
    monkeypatch.setattr("sys.argv", ["targets.py", str(path)])
    assert targets.main() == 0
    assert capsys.readouterr().out.strip() == "No targets at EP1: they are set at EP2 and EP8."
