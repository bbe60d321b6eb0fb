"""Spawned ranks meet through a store whose port rank 0 picks at bind time: runs at once do not
collide, and a rank left without rank 0 says so instead of hanging. A rank that fails as it starts
reports its own exception; one that dies without a word is reported with how it ended."""

import multiprocessing as mp
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ubep.launch import RankFailure, RanksFailed, _rendezvous_store, run_ranks


def world_sum(rank: int, world_size: int) -> int:
    import torch

    value = torch.tensor([rank + 1])
    dist.all_reduce(value)
    return int(value)


def test_runs_at_once_each_get_their_own_group():
    results: list = [None] * 4

    def one(i):
        try:
            results[i] = run_ranks(world_sum, 2, timeout_s=120)
        except Exception as err:  # a thread's exception is otherwise lost: show it in the assert
            results[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[3, 3]] * 4


def test_a_rank_without_rank_0_times_out_with_a_clear_error():
    ports = mp.get_context("spawn").Queue()
    with pytest.raises(TimeoutError, match="rank 1: rank 0 did not open"):
        _rendezvous_store(1, 2, ports, timedelta(seconds=0.2))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_rank_failing_at_start_up_reports_its_exception():
    """An NCCL group on a machine without a GPU: every rank says why, in its own exception."""
    failures = run_ranks(world_sum, 2, pg_backend="nccl", timeout_s=120, return_failures=True)
    for rank, failure in enumerate(failures):
        assert isinstance(failure, RankFailure) and failure.rank == rank
        assert failure.kind == "RuntimeError", failure
        assert "needs a CUDA GPU" in failure.message
        assert "Traceback" in failure.trace


def test_a_rank_that_died_without_a_trace_is_reported_with_its_exit():
    error = RanksFailed([RankFailure(1, "ProcessDied", "killed by signal 9 before it reported", "")])
    assert "rank 1 raised ProcessDied: killed by signal 9 before it reported" in str(error)
