"""Rank function for tests/test_engine_profile.py: Buffers made with ``UBEP_PROFILE`` set, as a
serving engine's worker process would make them."""

from __future__ import annotations

import os

import torch

import ubep


def profiled_worker(rank: int, world_size: int, out: str) -> list[str]:
    """Two Buffers (padded and compact) made under ``UBEP_PROFILE=out``, three dispatch + combine
    calls each, and one Buffer made with ``profile=False``; returns this rank's phase names."""
    os.environ[ubep.engine_profile.ENV] = out
    shape = {"hidden": 16, "num_experts": 4, "top_k": 2, "max_tokens_per_rank": 8, "dtype": torch.float32}
    buffers = [ubep.Buffer(layout="padded", **shape), ubep.Buffer(layout="compact", **shape),
               ubep.Buffer(layout="compact", profile=False, **shape)]
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(5, 16, generator=gen)
    idx = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(5)])
    w = torch.rand(5, 2, generator=gen)
    for buf in buffers:
        for _ in range(3):
            res = buf.dispatch(x, idx, w)
            buf.combine(res.recv_x, res.handle)
    assert not buffers[2].phase_times()
    return sorted(p for buf in buffers[:2] for p in buf.phase_times())
