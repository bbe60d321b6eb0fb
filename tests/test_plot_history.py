"""docs/bench/history.csv, the measurement history, parses and is well formed; benchmarks/plot_history.py
draws a selection of it."""

import csv
import re
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

HISTORY = Path(__file__).resolve().parent.parent / "docs" / "bench" / "history.csv"
COLUMNS = ["date", "commit", "hardware", "command", "configuration", "figure", "value", "unit"]
SESSION = re.compile(r"sessions? ?[0-9]", re.IGNORECASE)


@pytest.fixture(scope="module")
def rows():
    with open(HISTORY, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        body = list(reader)
    assert header == COLUMNS
    return body


@pytest.fixture(scope="module")
def plot_history():
    return load_benchmark("plot_history")


def test_every_row_has_the_eight_columns(rows):
    assert rows
    assert all(len(row) == len(COLUMNS) for row in rows)
    assert all(all(cell.strip() for cell in row) for row in rows)  # no empty cell


def test_values_are_numbers_and_dates_iso(rows):
    for row in rows:
        float(row[COLUMNS.index("value")])
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[0]), row


def test_commits_are_hashes_or_unknown(rows):
    for row in rows:
        assert re.fullmatch(r"[0-9a-f]{7,40}|unknown", row[1]), row


def test_configurations_are_key_value_lists(rows):
    for row in rows:
        for part in row[COLUMNS.index("configuration")].split(";"):
            assert re.fullmatch(r"[^=;]+=[^;]*", part), row


def test_no_cell_numbers_a_work_session(rows):
    assert not [row for row in rows if any(SESSION.search(cell) for cell in row)]


def test_select_filters_on_figure_and_configuration(plot_history):
    history = plot_history.read_rows(HISTORY)
    picked = plot_history.select(history, "dispatch median", ("tokens=128;", "mode=graph-queued"))
    assert picked
    assert all("dispatch median" in r["figure"] and "tokens=128;" in r["configuration"] for r in picked)
    assert plot_history.select(history, "no such figure") == []


def test_labels_name_only_what_differs(plot_history):
    keys = [("H200", "W=1;tokens=16;sync=sw", "dispatch median"),
            ("H200", "W=1;tokens=128;sync=sw", "dispatch median")]
    assert plot_history.labels(keys) == ["tokens=16", "tokens=128"]


def test_repeats_of_a_measurement_share_a_line(plot_history):
    rows = [{"date": "2026-12-01", "hardware": "H200", "configuration": "W=1;tokens=16;round=1",
             "figure": "dispatch median", "value": "10.5"},
            {"date": "2026-12-02", "hardware": "H200", "configuration": "W=1;tokens=16;round=2",
             "figure": "dispatch median", "value": "9.5"}]
    lines = plot_history.series(rows)
    assert list(lines) == [("H200", "W=1;tokens=16", "dispatch median")]
    assert [v for _, v in lines[("H200", "W=1;tokens=16", "dispatch median")]] == [10.5, 9.5]


def test_writes_a_png_for_a_matching_filter(plot_history, tmp_path):
    pytest.importorskip("matplotlib")
    code = plot_history.main(["--csv", str(HISTORY), "--figure", "dispatch median", "--config", "tokens=128;",
                              "--config", "mode=graph-queued", "--out", str(tmp_path)])
    assert code == 0
    pngs = list(tmp_path.glob("*.png"))
    assert len(pngs) == 1
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_match_writes_nothing(plot_history, tmp_path):
    args = ["--csv", str(HISTORY), "--figure", "no such figure", "--out", str(tmp_path)]
    assert plot_history.main(args) == 1
    assert not list(tmp_path.iterdir())
