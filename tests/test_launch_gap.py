"""``benchmarks/launch_gap.py``: the gaps between a compact dispatch's two kernels, read off a
profiler trace (the GPU run itself needs a GPU)."""

import pytest

from tests.conftest import load_benchmark

launch_pairs = load_benchmark("launch_gap").launch_pairs


def _kernel(name, ts, dur):
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_pairs_the_kernels_of_each_call_in_start_order():
    events = [
        _kernel("dispatch", 300.0, 20.0),  # the second call, out of order in the trace
        {"cat": "cpu_op", "name": "dispatch", "ts": 1.0, "dur": 500.0},  # not a kernel
        _kernel("dispatch", 100.0, 18.0),
        _kernel("void at::native::fill_kernel", 130.0, 2.0),  # another kernel between: ignored
        _kernel("dispatch", 180.0, 40.0),
        _kernel("dispatch", 385.0, 41.0),
    ]
    assert launch_pairs(events) == [(62.0, 18.0, 40.0), (65.0, 20.0, 41.0)]


def test_an_odd_kernel_count_is_an_error():
    with pytest.raises(ValueError, match="3 dispatch kernels"):
        launch_pairs([_kernel("dispatch", t, 1.0) for t in (0.0, 10.0, 20.0)])


def test_host_steps_split_a_compact_dispatch_at_its_wait():
    """On a CPU backend whose kernels are stubbed (``host_path.py``): three parts, in order."""
    pytest.importorskip("triton")
    import argparse

    import torch

    host_path = load_benchmark("host_path")
    args = argparse.Namespace(sync="tff", tokens=16, hidden=64, experts=16, top_k=4, layout="compact")
    backend = host_path.stubbed_backend(args)
    x = torch.zeros(16, 64, dtype=torch.bfloat16)
    idx = torch.arange(16 * 4).view(16, 4) % 16
    parts = load_benchmark("launch_gap").host_steps(backend, x, idx, torch.ones(16, 4))
    assert len(parts) == 3 and all(p >= 0 for p in parts), parts
    assert backend.dispatch(x, idx, torch.ones(16, 4))[0].shape == (64, 64)
