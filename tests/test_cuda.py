"""GPU backends against the CPU oracle, bit for bit (skipped without CUDA).

The cases are the CPU matrix's: the reference backend on NCCL, and the CUDA backend on NVLink
symmetric memory. Both must give the oracle's bits, which also shows that the reduction contract
(separate fp32 multiply and add, ascending k) holds on the GPU. Where the machine has fewer GPUs
than a test has ranks, the cuda backend's ranks share GPU 0 (tests/shared_gpu.py: the protocol
with real device memory, not NVLink); the reference backend on NCCL needs a GPU per rank.
"""

import dataclasses

import pytest
import torch

from tests.shared_gpu import run_on_gpus
from tests.test_dispatch_combine import cases_for
from tests.workers import (
    compact_capture_case,
    dead_peer_combine_case,
    graph_replay_case,
    host_syncs_case,
    run_cases,
    sentinel_case,
    stress_case,
    timeout_case,
)
from ubep.config import SYNC_MODES, least_cuda_sms

pytestmark = pytest.mark.cuda
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_cuda = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")


@pytest.mark.parametrize(("backend", "sync"), [("reference", "tff")] + [("cuda", m) for m in SYNC_MODES])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_matches_oracle(world, backend, sync):
    if GPUS < 1 or (backend == "reference" and world > GPUS):
        pytest.skip(f"needs {1 if backend == 'cuda' else world} CUDA devices")
    least = least_cuda_sms(world, sync)  # the SM-budget case, raised to what dc needs at this W
    cases = [dataclasses.replace(c, backend=backend, sync=sync,
                                 num_sms=c.num_sms and max(c.num_sms, least))
             for c in cases_for(world)]
    run_on_gpus(run_cases, world, cases, timeout_s=600)


@needs_cuda
@pytest.mark.parametrize(("hidden", "max_tokens"), [(264, 40), (7168, 1100)],
                         ids=["narrow", "wide"])
@pytest.mark.parametrize("layout", ["compact", "padded"])
@pytest.mark.parametrize("sync", SYNC_MODES)
def test_stress_has_no_mismatch(sync, layout, hidden, max_tokens):
    """2000 calls with random data, routing and per-rank delays, reusing the buffers. Wide rows
    take two 8 KiB steps per row, or one 16 KiB step in calls of 1024 tokens or more: both occur."""
    mismatches = run_on_gpus(stress_case, 2, sync, layout, 2000, hidden, max_tokens, timeout_s=600)
    assert mismatches == [0, 0]


@needs_cuda
@pytest.mark.parametrize("layout", ["compact", "padded"])
def test_sp_rows_holding_the_sentinel_complete(layout):
    """Rows whose markers equal the sentinel in every other call: the fenced record completes them,
    bit for bit, and the slots keep working afterwards."""
    run_on_gpus(sentinel_case, 2, layout, 40, timeout_s=300)


@needs_cuda
@pytest.mark.parametrize(("sync", "layout"),
                         [(s, "padded") for s in SYNC_MODES] + [("sw", "compact")])
def test_wait_times_out_with_a_clear_error(sync, layout):
    message = run_on_gpus(timeout_case, 2, sync, layout, timeout_s=120)[0]
    assert "ubep rank 0: phase 'dispatch: wait for counts and routes'" in message, message
    assert "waiting on rank 1" in message and "timed out after 1 s" in message, message


@needs_cuda
@pytest.mark.parametrize("sync", SYNC_MODES)
def test_dead_peer_fails_a_combine_within_a_timeout(sync):
    """A peer that dispatches and then never combines: the combine raises within a few timeouts of
    1 s, where one per token a reducer takes would be 16 s."""
    elapsed, message = run_on_gpus(dead_peer_combine_case, 2, sync, timeout_s=120)[0]
    assert "ubep rank 0: phase 'combine: wait for rows'" in message, message
    assert "waiting on rank 1" in message, message
    assert 0 < elapsed < 6, f"{elapsed:.1f} s"


@needs_cuda
@pytest.mark.parametrize("sync", SYNC_MODES)
def test_padded_layout_replays_in_a_cuda_graph(sync):
    run_on_gpus(graph_replay_case, 2, sync, timeout_s=300)


@needs_cuda
def test_host_synchronizes_only_for_checks():
    run_on_gpus(host_syncs_case, 1, timeout_s=300)


@needs_cuda
def test_compact_dispatch_refuses_a_cuda_graph():
    run_on_gpus(compact_capture_case, 1, timeout_s=300)


@pytest.mark.skipif(GPUS < 2, reason="needs at least 2 CUDA devices (the plan and weights go over NCCL)")
def test_balanced_layer_with_rows_on_cuda_is_bitwise():
    """BalancedBuffer(backend="cuda"): its rows through the cuda backend's dispatch and combine of
    W * 2L virtual experts; outputs and gradients equal the unbalanced reference layer's bits."""
    from tests.balanced_workers import BalancedCase, compare_rank_on_gpu
    from ubep.launch import run_ranks

    case = BalancedCase(tokens=(16, 16), top_k=3, hot=(0, 1), dtype=torch.bfloat16, hidden=64,
                        intermediate=16, seed=3)
    for r, res in enumerate(run_ranks(compare_rank_on_gpu, 2, case, pg_backend="nccl", timeout_s=300)):
        assert res["same"] == [True] * 4 and res["rows_backend"] == "cuda", (r, res)
        assert res["rows"] == res["targets"][r], (r, res)


@pytest.mark.skipif(GPUS < 2, reason="needs at least 2 CUDA devices")
def test_profile_measures_inside_the_kernels(tmp_path):
    pytest.importorskip("matplotlib")
    from ubep.cli import main

    args = ["profile", "--pg", "nccl", "--backend", "cuda", "--ranks", "2", "--tokens", "64",
            "--hidden", "512", "--experts", "16", "--layout", "padded", "--iters", "3",
            "--out", str(tmp_path)]
    assert main(args) == 0
    phases = (tmp_path / "breakdown.csv").read_text()
    assert "dispatch receive: wait" in phases and "combine reduce: done at" in phases
    assert (tmp_path / "workers.csv").read_text().count("dispatch,count") >= 2
    assert (tmp_path / "workers.png").stat().st_size > 5_000
