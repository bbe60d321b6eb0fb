"""Shared fixtures: a one-rank gloo group in the test process for single-process API tests."""

import os
from datetime import timedelta

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
