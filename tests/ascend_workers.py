"""Rank functions for the Ascend backend tests that the shared case runner does not cover: a stress
loop with random delays and a rank that skips a call."""

from __future__ import annotations

import os
import random
import time

import torch

import ubep
from tests.workers import Case, _check_equal, case_inputs
from ubep import oracle, workloads


def stress_worker(rank: int, world_size: int, sync: str, iterations: int) -> int:
    """``iterations`` dispatch + combine calls on one buffer, new routing each time, every rank
    sleeping a random 0-3 ms before each call and every AIV a random 0-200 µs before each window
    copy (the twin's UBEP_TWIN_JITTER_US); raises on the first mismatch, else returns 0."""
    os.environ["UBEP_TWIN_JITTER_US"] = "200"
    hidden, experts, top_k, max_tokens = 32, 2 * world_size, 3, 6
    buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k, max_tokens_per_rank=max_tokens,
                      dtype=torch.bfloat16, backend="ascend", sync=sync, timeout_s=60)
    delays = random.Random(1000 + rank)
    for it in range(iterations):
        case = Case(tokens=tuple((it + 3 * s) % (max_tokens + 1) for s in range(world_size)), hidden=hidden,
                    num_experts=experts, top_k=top_k, maxvio=float(it % 3), drop=0.2 * (it % 2), seed=it)
        inputs = [case_inputs(case, s) for s in range(world_size)]
        xs, idxs, ws = (list(v) for v in zip(*inputs, strict=True))
        time.sleep(delays.uniform(0, 0.003))
        res = buf.dispatch(*inputs[rank])
        want_x, want_tpe, _ = oracle.dispatch(xs, idxs, ws, rank, world_size, experts)
        _check_equal(f"iteration {it}: recv_x", res.recv_x, want_x)
        time.sleep(delays.uniform(0, 0.003))
        reduce = ("source", "expert_rank")[it % 2]
        y = buf.combine(res.recv_x, res.handle, reduce=reduce)
        outs = oracle.expert_outputs(idxs, lambda s, t, k, e, xs=xs: xs[s][t])
        want_y = oracle.combine(outs, idxs, ws, rank, world_size, experts, reduce, True, hidden,
                                torch.bfloat16)
        _check_equal(f"iteration {it}: combine({reduce})", y, want_y)
    return 0


def skip_worker(rank: int, world_size: int, sync: str) -> str:
    """Rank 1 builds the buffer and skips the dispatch; rank 0 must raise EPCommError, not hang."""
    buf = ubep.Buffer(hidden=16, num_experts=4, top_k=2, max_tokens_per_rank=4, dtype=torch.float32,
                      backend="ascend", sync=sync, timeout_s=2)
    if rank == 1:
        return "skipped"
    x = workloads.origin_tokens(rank, 4, 16, torch.float32)
    idx = torch.tensor([[0, 3], [1, 2], [2, -1], [3, 0]])
    start = time.monotonic()
    try:
        buf.dispatch(x, idx, torch.ones(4, 2))
    except ubep.EPCommError as err:
        return f"{time.monotonic() - start:.1f}|{err}"
    return "no error"
