"""Shared fixtures: a one-rank gloo group in the test process for single-process API tests."""

import os
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist


@pytest.fixture(scope="session")
def single_rank_group():
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1, timeout=timedelta(seconds=30))
    yield dist.group.WORLD
