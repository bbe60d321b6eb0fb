"""``benchmarks/host_path.py`` runs on a CPU machine (no GPU) and reports what it promises."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


def test_host_path_times_a_padded_dispatch_and_combine():
    out = subprocess.run(
        [sys.executable, "benchmarks/host_path.py", "--sync", "tff", "--tokens", "16", "--hidden",
         "64", "--experts", "16", "--top-k", "4", "--iters", "20"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300, check=True).stdout
    assert "padded tff, 16 tokens, hidden 64, 16 experts, top-4" in out
    assert "dispatch: min" in out and "combine:  min" in out
    calls = int(out.rsplit("Python calls per dispatch + combine:", 1)[1])
    assert 0 < calls < 1000


def test_host_path_times_a_compact_dispatch():
    """The stubbed sizing launch writes the rows the host polls for: the dispatch completes."""
    out = subprocess.run(
        [sys.executable, "benchmarks/host_path.py", "--layout", "compact", "--sync", "sw",
         "--tokens", "16", "--hidden", "64", "--experts", "16", "--top-k", "4", "--iters", "20"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300, check=True).stdout
    assert "compact sw, 16 tokens, hidden 64, 16 experts, top-4" in out
    assert "dispatch: min" in out and "combine:  min" in out
