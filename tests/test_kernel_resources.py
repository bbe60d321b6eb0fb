"""``benchmarks/kernel_resources.py`` builds the dispatch kernel on a CPU machine and tables what
ptxas gave it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


def test_kernel_resources_tables_one_row_per_build():
    out = subprocess.run(
        [sys.executable, "benchmarks/kernel_resources.py", "--modes", "sw", "--worlds", "2",
         "--tokens", "16"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| sw |")]
    assert len(rows) == 1, out
    registers, stack, reductions, barriers = map(int, re.findall(r"\d+", rows[0])[2:])
    assert 0 < registers <= 255 and stack % 8 == 0 and reductions > 0 and barriers > 0


def test_kernel_resources_tables_the_combine_in_both_reductions():
    out = subprocess.run(
        [sys.executable, "benchmarks/kernel_resources.py", "--kernel", "combine", "--modes", "tff",
         "--worlds", "2", "--tokens", "128"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| tff |")]
    assert [row.split("|")[4].strip() for row in rows] == ["source", "expert_rank"], out
    for row in rows:
        registers, stack = map(int, row.split("|")[5:7])
        assert 0 < registers <= 128 and stack % 8 == 0  # tff's budget (COMBINE_REGISTERS)
