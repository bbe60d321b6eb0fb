"""Run one function on W local ranks, each its own process in a fresh process group.

Used by the tests and by ``ubep demo``. ``fn`` must be importable by name (defined at module level),
since ranks are started with the ``spawn`` method. Each rank returns a small picklable value; a rank
that raises, in ``fn`` or while it starts (device, process group), is reported with its exception and
traceback, and a rank still running at the deadline is killed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
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
        super().__init__("\n".join(f"rank {f.rank} raised {f.kind}: {f.message}\n{f.trace}"
                                   for f in failures))


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


def _rank_gpu(rank: int):
    """The GPU of ``rank`` in an NCCL group: ranks share the GPUs in turn."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        raise RuntimeError(f"rank {rank}: an NCCL process group needs a CUDA GPU, and torch sees none "
                           f"on this machine")
    return torch.device("cuda", rank % count)


def _set_rank_npu(rank: int) -> None:
    """The NPU of ``rank`` in an HCCL group (torch_npu), shared in turn as GPUs are."""
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    count = torch.npu.device_count()
    if count == 0:
        raise RuntimeError(f"rank {rank}: an HCCL process group needs an NPU, and torch_npu sees none")
    torch.npu.set_device(rank % count)


def _rank_main(fn, rank, world_size, args, ports, pg_backend, pg_timeout_s, threads, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:  # from here on, whatever a rank raises reaches the parent with its type and message
        device_id = _rank_gpu(rank) if pg_backend == "nccl" else None
        if device_id is not None:
            torch.cuda.set_device(device_id)
        if pg_backend == "hccl":
            _set_rank_npu(rank)
        timeout = timedelta(seconds=pg_timeout_s)
        store = _rendezvous_store(rank, world_size, ports, timeout)
        dist.init_process_group(pg_backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout, device_id=device_id)
        value = fn(rank, world_size, *args)
        # By value: the queue's own pickler shares tensors through file descriptors that vanish
        # when this process exits, which it may do before the parent reads them.
        results.put((rank, pickle.dumps(value)))
    except BaseException as err:  # report everything, the parent decides
        results.put((rank, pickle.dumps(RankFailure(rank, type(err).__name__, str(err),
                                                          traceback.format_exc()))))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _drain(results, outcome: dict[int, object]) -> None:
    """Move every report already sent on ``results`` into ``outcome``."""
    while True:
        try:
            rank, value = results.get(timeout=0.5)
        except queue.Empty:
            return
        outcome[rank] = pickle.loads(value)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {-exitcode} before it reported"
    return f"exited with code {exitcode} before it reported (its stderr says why)"


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
            outcome[rank] = pickle.loads(value)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in outcome]
            if dead:  # what they put before exiting is in the pipe now, though the get above missed it
                _drain(results, outcome)
            for r in dead:
                if r not in outcome:  # died without reporting (killed, segfault, failed to start)
                    outcome[r] = RankFailure(r, "ProcessDied", _exit_reason(procs[r].exitcode), "")
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
