"""Shared fixtures: a one-rank gloo group in the test process for single-process API tests, and
the scripts of benchmarks/ loaded as modules."""

import importlib.util
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist


@pytest.fixture(scope="session")
def single_rank_group():
    if not dist.is_initialized():
        # one rank needs no rendezvous: an in-process store, no port to collide on
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
    yield dist.group.WORLD


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
