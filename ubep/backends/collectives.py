"""torch.distributed collectives with a deadline, and the errors they end in.

A peer that fails before communicating must never leave this rank waiting: every collective here
waits at most ``timeout_s`` and then raises :class:`~ubep.backends.base.EPCommError`, saying which
rank, which phase and what happened (the group reported a failure after some seconds, for instance a
peer that closed its connection, or nothing completed in time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ubep.backends.base import EPCommError

_DEVICE_OF_PG_BACKEND = {"gloo": "cpu", "nccl": "cuda", "hccl": "npu"}


def group_device(group: dist.ProcessGroup | None) -> torch.device | None:
    """Where tensors of a collective over ``group`` live (gloo: CPU; NCCL: the current CUDA device;
    HCCL: the current NPU), or None for a process-group backend not known here. A group with several
    backends (``"cpu:gloo,cuda:nccl"``) takes the CPU where gloo is one of them."""
    name = str(dist.get_backend(group)).lower()
    kinds = [kind for pg, kind in _DEVICE_OF_PG_BACKEND.items() if pg in name]
    if not kinds:
        return None
    kind = "cpu" if "cpu" in kinds else kinds[0]
    if kind == "cpu":
        return torch.device("cpu")
    return torch.device(kind, getattr(torch, kind).current_device())


def run_with_deadline(start: Callable[[], dist.Work], *, phase: str, rank: int, timeout_s: float,
                      device: torch.device) -> None:
    """Start a collective with ``start()`` and wait for it, at most ``timeout_s``.

    On CPU the process group's own timed wait is used. On a device it is not: NCCL's timed wait
    sleeps in millisecond steps, which would dominate every call, so this polls the work's
    completion instead and then orders the current stream after it.
    """
    began = time.monotonic()
    deadline = began + timeout_s
    try:
        work = start()
        if device.type == "cpu":
            work.wait(timeout=timedelta(seconds=timeout_s))
            return
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError("nothing completed")
            time.sleep(0)
        work.wait()
    except Exception as err:  # process groups raise RuntimeError subclasses, varying by backend
        raise comm_error(rank, phase, time.monotonic() - began, timeout_s, err) from err


def comm_error(rank: int, phase: str, elapsed_s: float, timeout_s: float,
               err: BaseException) -> EPCommError:
    """What a failed collective tells the user: a timeout as a timeout, and anything that failed
    sooner (a peer that exited or crashed closes its connection) as a failure after that long, with
    the process group's own words."""
    detail = " ".join(str(err).split()) or type(err).__name__
    if elapsed_s >= timeout_s * 0.99:
        what = f"timed out after {timeout_s:g} s"
        hint = "a peer is late, hung, or called another operation"
    else:
        what = f"failed after {elapsed_s:.2f} s"
        hint = "a peer may have exited, crashed or closed its connection"
    return EPCommError(f"ubep rank {rank}: phase '{phase}' {what} ({detail}); {hint}")


def all_gather(t: torch.Tensor, group: dist.ProcessGroup | None, *, phase: str, rank: int,
               timeout_s: float) -> torch.Tensor:
    """``[W, *t.shape]``: ``t`` of every rank of ``group``, in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    run_with_deadline(lambda: dist.all_gather(parts, t, group=group, async_op=True), phase=phase,
                      rank=rank, timeout_s=timeout_s, device=t.device)
    return torch.stack(parts)
