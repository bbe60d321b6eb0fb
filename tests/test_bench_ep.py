"""``benchmarks/bench_ep.py`` without a GPU: the sweep of model shapes (``--shapes``), its table
and the two ceilings its rates are given against, the GPU parts faked."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_ep():
    return load_benchmark("bench_ep")


def test_a_shape_is_hidden_experts_top_k(bench_ep):
    assert bench_ep.parse_shape("7168:256:8") == (7168, 256, 8)
    for bad in ("7168:256", "7168:256:8:1", "7168:x:8", "7168:0:8", "-8:256:8"):
        with pytest.raises(argparse.ArgumentTypeError, match="--shapes"):
            bench_ep.parse_shape(bad)


def test_each_shape_gets_its_own_arguments(bench_ep):
    base = argparse.Namespace(hidden=7168, experts=256, top_k=8, shapes=None, tokens=[128])
    assert [(a.hidden, a.experts, a.top_k) for a in bench_ep.shape_runs(base)] == [(7168, 256, 8)]
    sweep = argparse.Namespace(**{**vars(base), "shapes": [(2048, 64, 4), (4096, 1024, 16)]})
    runs = bench_ep.shape_runs(sweep)
    assert [(a.hidden, a.experts, a.top_k) for a in runs] == [(2048, 64, 4), (4096, 1024, 16)]
    assert all(a.tokens == [128] for a in runs) and sweep.hidden == 7168


def test_a_bad_shape_is_refused_before_anything_runs():
    done = subprocess.run([sys.executable, "benchmarks/bench_ep.py", "--shapes", "7168:256"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--shapes: '7168:256' is not HIDDEN:EXPERTS:TOP_K" in done.stderr


def test_a_sweep_writes_one_table_with_each_rows_shape(bench_ep, monkeypatch, tmp_path):
    """``main`` over two shapes, the GPU parts replaced by fakes: one CSV / Markdown table whose rows
    name their shape and rate against both ceilings, the header naming both shapes and ceilings."""
    def fake_ranks(fn, ranks, shape, **kwargs):
        if fn is bench_ep.a2a_ceiling_rank:
            return [300.0 + rank for rank in range(ranks)]
        rows = [{"tokens": 128, "maxvio": 0.0, "what": f"cuda/padded/sw {op} {shape.hidden}",
                 "bytes": shape.hidden * 2, "programs": 3, "us": [2.0, 1.0, 3.0]}
                for op in ("dispatch", "combine")]
        return [rows for _ in range(ranks)]

    monkeypatch.setattr(bench_ep, "run_ranks", fake_ranks)
    monkeypatch.setattr(bench_ep, "link_ceiling_gbps", lambda peer: 100.0)
    monkeypatch.setattr(bench_ep.torch.cuda, "get_device_name", lambda i: "a fake GPU")
    monkeypatch.setattr(sys, "argv", ["bench_ep.py", "--ranks", "2", "--shapes", "2048:64:4",
                                      "7168:256:8", "--out", str(tmp_path)])
    assert bench_ep.main() == 0
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert lines[0].startswith("W,hidden,experts,top_k,tokens,maxvio,what,median_us")
    assert lines[0].endswith(",GBps,pct_link,pct_a2a,programs")
    assert lines[1].startswith("2,2048,64,4,128,0.0,cuda/padded/sw dispatch 2048,2.0")
    # 4096 bytes in 2 µs: 2.048 GB/s, against the slowest rank's 300 GB/s all-to-all
    assert lines[1].endswith(",3.0,2.0,4096,2.0,2.0,0.7,3")
    assert lines[3].startswith("2,7168,256,8,128,0.0,cuda/padded/sw dispatch 7168,2.0")
    header = (tmp_path / "results.md").read_text().splitlines()[0]
    assert "hidden 2048 / 64 experts / top-4, hidden 7168 / 256 experts / top-8" in header
    assert "all-to-all ceiling (NCCL, 1 GiB per rank) 300 GB/s per rank" in header
