"""Rank functions of tests/test_agreement.py: ranks that disagree, on a Buffer or on a call, and a
rank that exits.

Each makes every rank raise (``run_ranks(..., return_failures=True)`` collects what each raised);
none may hang, crash its process, or return a result.
"""

from __future__ import annotations

import os

import torch

import ubep
from tests.workers import Case, case_inputs

CASE = Case(tokens=(6, 5), hidden=64, num_experts=8, top_k=2, dtype="fp32", seed=3)


def _buffer(rank: int, backend: str, override: dict | None = None) -> ubep.Buffer:
    """The case's Buffer, with ``override`` on rank 1 only."""
    kwargs = {"hidden": CASE.hidden, "num_experts": CASE.num_experts, "top_k": CASE.top_k,
              "max_tokens_per_rank": max(CASE.tokens), "dtype": torch.float32, "backend": backend,
              "sync": "tff", "timeout_s": 3.0}
    if rank == 1:
        kwargs.update(override or {})
    return ubep.Buffer(**kwargs)


def buffers_differ(rank: int, world_size: int, backend: str, override: dict) -> None:
    """Rank 1 creates its Buffer with ``override``; every rank must raise at creation."""
    _buffer(rank, backend, override)


def _dispatched(rank: int, backend: str) -> tuple[ubep.Buffer, ubep.DispatchResult]:
    buf = _buffer(rank, backend)
    x, idx, w = case_inputs(CASE, rank)
    return buf, buf.dispatch(x, idx, w)


def reductions_differ(rank: int, world_size: int, backend: str) -> None:
    """One dispatch, then a combine with ``reduce="source"`` on rank 0 and ``"expert_rank"`` on rank
    1: every rank must raise instead of returning ``y``."""
    buf, res = _dispatched(rank, backend)
    buf.combine(res.recv_x, res.handle, reduce="expert_rank" if rank else "source")


def weighting_differs(rank: int, world_size: int, backend: str) -> None:
    buf, res = _dispatched(rank, backend)
    buf.combine(res.recv_x, res.handle, weighted=rank == 0)


def operations_differ(rank: int, world_size: int, backend: str) -> None:
    """One dispatch, then rank 0 combines while rank 1 dispatches again."""
    buf, res = _dispatched(rank, backend)
    if rank == 0:
        buf.combine(res.recv_x, res.handle)
    else:
        buf.dispatch(*case_inputs(CASE, rank))


def handles_differ(rank: int, world_size: int, backend: str) -> None:
    """Two dispatches, then rank 0 combines the first one's rows and rank 1 the second's."""
    buf, first = _dispatched(rank, backend)
    second = buf.dispatch(*case_inputs(CASE, rank))
    res = first if rank == 0 else second
    buf.combine(res.recv_x, res.handle)


def peer_exits(rank: int, world_size: int) -> str:
    """Rank 1 exits right after creating its Buffer; rank 0's dispatch must say that the exchange
    failed, and how soon, not that it timed out."""
    buf = _buffer(rank, "reference")
    if rank == 1:
        os._exit(0)
    try:
        buf.dispatch(*case_inputs(CASE, rank))
    except ubep.EPCommError as err:
        return str(err)
    return "no error"
