"""Checks of the CUDA backend's synchronization helpers (``ubep.backends.cuda.sync``) through
Triton's interpreter on the CPU, each a rank function of ``ubep.launch.run_ranks`` run in a process
whose environment had ``TRITON_INTERPRET=1`` before Triton was imported
(tests/test_cuda_emulated.py)."""

from __future__ import annotations

import torch
import triton

from ubep.backends.cuda import sync


@triton.jit
def _timed_out(err_addr, code, peer, epoch):
    sync.report(err_addr, code, peer, epoch)


def _error_block(errors: torch.Tensor, halted: int) -> torch.Tensor:
    """The kernels' ``err_addr`` block for the host error word ``errors`` (``sync``'s module doc)."""
    return torch.tensor([halted, errors.data_ptr()], dtype=torch.int64)


def first_report_survives(_rank: int, _world: int) -> None:
    """Two timed-out waits in a row (the second one of a call queued behind the first) report into
    the host error word: the first report is kept whole, and the rank is marked halted."""
    errors = torch.zeros(3, dtype=torch.int64)
    block = _error_block(errors, 0)
    _timed_out[(1,)](block.data_ptr(), sync.WAIT_COUNTS.value, 1, 7)
    _timed_out[(1,)](block.data_ptr(), sync.WAIT_ROWS.value, 0, 8)
    assert errors.tolist() == [sync.WAIT_COUNTS.value, 1, 7], errors
    assert block[0].item() == 1, block


@triton.jit
def _wait_never_met(word_ptr, timeout_ns, err_addr):
    sync.wait_words(word_ptr, 1, 1, 1, timeout_ns, err_addr, sync.WAIT_ROWS, 8, 1, 1, 1, False)


def queued_wait_gives_up(_rank: int, _world: int) -> None:
    """A wait for a word, of a rank that has already timed out (a call queued behind the failure:
    its halted word is set), gives up after ``GIVE_UP_POLLS`` polls, not at its own deadline (here
    never: the interpreter's clock reads 0), and leaves the first report as it is."""
    errors = torch.tensor([sync.WAIT_COUNTS.value, 1, 7])
    never = torch.zeros(1, dtype=torch.int64)
    _wait_never_met[(1,)](never, 2**62, _error_block(errors, 1).data_ptr())
    assert errors.tolist() == [sync.WAIT_COUNTS.value, 1, 7], errors
