"""``benchmarks/calibrate_split.py`` without a GPU: refitting an earlier run's measurements, all
groups or the count group alone (what one GPU can sample)."""

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import load_benchmark
from ubep.tuning import h200

MEASURED = str(Path(__file__).resolve().parent.parent / "benchmarks" / "data"
               / "calibration-h200-ep2-onepass-2026-12-01.csv")


@pytest.fixture(scope="module")
def calibrate_split():
    return load_benchmark("calibrate_split")


def _refit(calibrate_split, monkeypatch, tmp_path, *groups):
    argv = ["calibrate_split.py", "--refit", MEASURED, "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv + (["--groups", *groups] if groups else []))
    assert calibrate_split.main() == 0
    with (tmp_path / "calibration.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    return rows, json.loads((tmp_path / "params.json").read_text())


def test_count_group_alone_keeps_the_token_constants(calibrate_split, monkeypatch, tmp_path):
    rows, params = _refit(calibrate_split, monkeypatch, tmp_path, "count")
    assert rows and {r["group"] for r in rows} == {"count"}
    preset = h200()
    assert params["alpha_ns"] == preset.alpha_ns and params["b_token_ns"] == preset.b_token_ns
    # the file was measured on the code h200() was fitted to: the refit lands near the preset
    assert params["pair_ns"] == pytest.approx(preset.pair_ns, rel=0.05)
    for r in rows:
        assert float(r["predicted_us"]) == pytest.approx(float(r["preset_us"]), rel=0.05)


def test_both_groups_by_default(calibrate_split, monkeypatch, tmp_path):
    rows, _ = _refit(calibrate_split, monkeypatch, tmp_path)
    assert {r["group"] for r in rows} == {"count", "token"}
    assert all(float(r["preset_us"]) > 0 for r in rows)


def test_one_gpu_cannot_sample_the_token_group(calibrate_split, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["calibrate_split.py", "--ranks", "1"])
    assert calibrate_split.main() == 2
    assert "--groups count" in capsys.readouterr().err
