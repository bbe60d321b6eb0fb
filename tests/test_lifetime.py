"""A Buffer's end: ``destroy()`` gives its memory back and every later use raises a clear error; the
backends a CUDA graph captured keep their memory until ``ubep.release_graph_memory()``. On the
reference backend in this process (the cuda backend's GPU side: tests/test_cuda_lifetime.py)."""

from types import SimpleNamespace

import pytest
import torch

import ubep
from ubep.backends import lifetime

H, E, K, T = 16, 4, 2, 3


@pytest.fixture
def buf(single_rank_group):
    return ubep.Buffer(single_rank_group, hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T,
                       dtype=torch.float32)


def _inputs():
    idx = torch.tensor([[0, 1], [2, 3], [1, -1]])
    return torch.randn(T, H), idx, torch.rand(T, K)


def test_a_destroyed_buffer_refuses_every_call(buf):
    res = buf.dispatch(*_inputs())
    buf.destroy()
    buf.destroy()  # idempotent
    for call in (lambda: buf.dispatch(*_inputs()), lambda: buf.combine(res.recv_x, res.handle),
                 buf.synchronize):
        with pytest.raises(RuntimeError, match="this ubep.Buffer was destroyed"):
            call()


def test_backward_after_destroy_raises(buf):
    x, idx, w = _inputs()
    x.requires_grad_(True)
    res = buf.dispatch(x, idx, w)
    y = buf.combine(res.recv_x, res.handle)
    buf.destroy()
    with pytest.raises(RuntimeError, match="whose Buffer was destroyed"):
        y.sum().backward()


def _backend(nbytes: int):
    released = []
    backend = SimpleNamespace(destroyed=False, symmetric_bytes=nbytes,
                              release=lambda: released.append(True))
    return backend, released


def test_graph_memory_is_kept_until_released(monkeypatch):
    monkeypatch.setattr(lifetime, "_CAPTURED", [])
    kept, kept_released = _backend(100)
    live, live_released = _backend(7)
    for backend in (kept, live, kept):
        lifetime.keep_for_graphs(backend)
    assert lifetime.held_for_graphs(kept) and [kept, live] == lifetime._CAPTURED
    assert ubep.release_graph_memory() == 0  # neither destroyed yet
    kept.destroyed = True
    assert lifetime.destroyed_for_graphs() == [kept]
    assert ubep.release_graph_memory() == 100
    assert kept_released == [True] and live_released == [] and [live] == lifetime._CAPTURED
