"""cuda Buffers over the life of a serving process (skipped without CUDA): many Buffers made, used
and destroyed one after another, two alive at once, CUDA graphs that outlive their Buffer. Every
result exact against torch's own permute and ordered sum (tests/lifetime_workers.py)."""

import pytest
import torch

from tests import lifetime_workers as lw
from tests.shared_gpu import run_on_gpus

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_serving_sequence_of_buffers_is_exact():
    """The five model shapes, 128 and 4096 tokens, both layouts, sw and tff: 40 Buffers in one
    process, each with 40 unchecked call pairs queued back to back."""
    found = run_on_gpus(lw.serving_sequence_case, 1, lw.SHAPES, (128, 4096), ("sw", "tff"), 40,
                        timeout_s=1200)[0]
    assert found == dict.fromkeys(found, 0), found


@pytest.mark.parametrize("sync", ["dc", "sp"])
def test_serving_sequence_in_the_record_modes(sync):
    found = run_on_gpus(lw.serving_sequence_case, 1, lw.SHAPES[1:3], (128, 1024), (sync,), 20,
                        timeout_s=900)[0]
    assert found == dict.fromkeys(found, 0), found


def test_a_prefill_and_a_decode_buffer_alive_at_once():
    run_on_gpus(lw.two_buffers_case, 1, 12, timeout_s=600)


def test_a_graph_outlives_its_destroyed_buffer():
    message = run_on_gpus(lw.destroyed_graph_case, 2, timeout_s=300)[0]
    assert "a CUDA graph replayed a call of a destroyed Buffer" in message, message
    assert "timed out after 1 s" in message and "waiting on rank 1" in message, message
