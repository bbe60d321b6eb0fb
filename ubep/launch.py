"""Run one function on W local ranks, each its own process in a fresh process group.

Used by the tests and by ``ubep demo``. ``fn`` must be importable by name (defined at module level),
since ranks are started with the ``spawn`` method. Each rank returns a small picklable value; a rank
that raises is reported with its traceback, and a rank still running at the deadline is killed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class RankFailure:
    """What a rank raised: the exception's class name, its message, and the formatted traceback."""

    rank: int
    kind: str
    message: str
    trace: str


class RanksFailed(RuntimeError):
    def __init__(self, failures: list[RankFailure]):
        self.failures = failures
        super().__init__("\n".join(f"rank {f.rank} raised {f.kind}:\n{f.trace}" for f in failures))


def _rendezvous_store(rank, world_size, ports, timeout):
    """The process group's TCP store. Rank 0 listens on a port the OS picks at bind time and passes
    it to the other ranks through ``ports``: a port probed free in the parent and bound later by
    rank 0 can be taken meanwhile by another run (parallel test workers)."""
    import torch.distributed as dist

    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout,
                               wait_for_workers=False)  # they learn the port below
        for _ in range(world_size - 1):
            ports.put(store.port)
        return store
    try:
        port = ports.get(timeout=timeout.total_seconds())
    except queue.Empty:
        raise TimeoutError(f"rank {rank}: rank 0 did not open the process group's store within "
                           f"{timeout.total_seconds():g} s") from None
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)


def _rank_main(fn, rank, world_size, args, ports, pg_backend, pg_timeout_s, threads, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    if pg_backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    try:
        device_id = torch.device("cuda", torch.cuda.current_device()) if pg_backend == "nccl" else None
        timeout = timedelta(seconds=pg_timeout_s)
        store = _rendezvous_store(rank, world_size, ports, timeout)
        dist.init_process_group(pg_backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout, device_id=device_id)
        value = fn(rank, world_size, *args)
        results.put((rank, value))
    except BaseException as err:  # report everything, the parent decides
        results.put((rank, RankFailure(rank, type(err).__name__, str(err),
                                              traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    fn: Callable,
    world_size: int,
    *args,
    pg_backend: str = "gloo",
    timeout_s: float = 300.0,
    pg_timeout_s: float = 120.0,
    threads: int = 1,
    return_failures: bool = False,
) -> list:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; results in rank order.

    A rank that raises gives a :class:`RankFailure` in its slot when ``return_failures`` is true;
    otherwise :class:`RanksFailed` is raised with every failed rank's traceback. All ranks must
    finish within ``timeout_s`` seconds or the stragglers are killed and reported.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ports = ctx.Queue()
    env_backup = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    procs = [
        ctx.Process(target=_rank_main, daemon=True,
                    args=(fn, r, world_size, args, ports, pg_backend, pg_timeout_s, threads,
                          results))
        for r in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
    finally:
        if env_backup is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = env_backup
    outcome: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    while len(outcome) < world_size:
        try:
            rank, value = results.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            outcome[rank] = value
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in outcome]
            for r in dead:  # died without reporting (killed, segfault)
                outcome[r] = RankFailure(r, "ProcessDied", f"exit code {procs[r].exitcode}", "")
            if time.monotonic() > deadline:
                for r in range(world_size):
                    if r not in outcome:
                        outcome[r] = RankFailure(r, "Timeout", f"still running after "
                                                 f"{timeout_s:g} s", "")
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    ordered = [outcome[r] for r in range(world_size)]
    failures = [v for v in ordered if isinstance(v, RankFailure)]
    if failures and not return_failures:
        raise RanksFailed(failures)
    return ordered
