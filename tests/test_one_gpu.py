"""``benchmarks/one_gpu.py`` without a GPU: its plain Triton kernels move and reduce exactly the rows
ubep's dispatch and combine do, so its ratios compare like with like (Triton's interpreter on CPU
tensors, in a fresh interpreter: it must be chosen before Triton is imported)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import torch
from tests.conftest import load_benchmark
from ubep.reduce import ordered_sum

one_gpu = load_benchmark("one_gpu")
gather, reduce = one_gpu.plain_kernels()
gen = torch.Generator().manual_seed(3)
T, H, E, K = 9, 1500, 6, 3  # H over one BLOCK: two pieces per row, the second partial
x = torch.randn(T, H, generator=gen)
idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
idx[2, 1] = idx[5, 0] = -1
w = torch.rand(T, K, generator=gen)
rows, pos = one_gpu.sorted_pairs(idx, E)
flat = idx.flatten()
want = x[torch.argsort(torch.where(flat >= 0, flat, E), stable=True)[: int((flat >= 0).sum())] // K]
assert torch.equal(gather(x, rows), want)
assert torch.equal(reduce(want, pos, w), ordered_sum(x.unsqueeze(1).expand(-1, K, -1), idx >= 0, w))
print("ok")
"""


def test_the_plain_kernels_move_the_rows_of_a_dispatch_and_reduce_those_of_a_combine():
    done = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
