"""The reference backend on NCCL (one rank per GPU) equals the CPU oracle bit for bit.

Skipped without at least two CUDA devices. The cases are the CPU matrix's, so this also shows that
the reduction contract (separate fp32 multiply and add, ascending k) gives the same bits on GPU.
"""

import pytest
import torch

from tests.test_dispatch_combine import cases_for
from tests.workers import run_cases
from ubep.launch import run_ranks

pytestmark = pytest.mark.cuda
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 2, reason="needs at least 2 CUDA devices")
@pytest.mark.parametrize("world", [w for w in (2, 4, 8) if w <= max(GPUS, 2)])
def test_nccl_reference_matches_oracle(world):
    run_ranks(run_cases, world, cases_for(world), pg_backend="nccl", timeout_s=600)
