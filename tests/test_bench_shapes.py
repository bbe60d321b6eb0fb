"""``benchmarks/bench_ep.py --shapes``: the sweep of model shapes, checked without a GPU."""

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_ep():
    spec = importlib.util.spec_from_file_location("bench_ep", ROOT / "benchmarks" / "bench_ep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
