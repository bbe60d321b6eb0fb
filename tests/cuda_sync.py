"""Checks of the CUDA backend's synchronization helpers (``ubep.backends.cuda.sync``, and the ``dc``
verifiers' shares in ``records``) through Triton's interpreter on the CPU, each a rank function of
``ubep.launch.run_ranks`` run in a process whose environment had ``TRITON_INTERPRET=1`` before
Triton was imported (tests/test_cuda_emulated.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ubep.backends.cuda import records, sync


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


@triton.jit
def _add_shares(state_ptr, own_ptr, out_ptr, source, epoch, WORLD: tl.constexpr, SPLIT: tl.constexpr):
    ready, a, b, n = records.add_shares(state_ptr, source, epoch, tl.load(own_ptr).to(tl.uint32),
                                        tl.load(own_ptr + 1).to(tl.uint32),
                                        tl.load(own_ptr + 2).to(tl.int32), WORLD, SPLIT)
    tl.store(out_ptr, ready.to(tl.int64))
    tl.store(out_ptr + 1, a.to(tl.int64))
    tl.store(out_ptr + 2, b.to(tl.int64))
    tl.store(out_ptr + 3, n.to(tl.int64))


def shares_add_up(_rank: int, _world: int) -> None:
    """The last ``dc`` verifier of a source adds the ``SPLIT - 1`` shares published for its call to
    its own (lanes mod 2**32), and only those: the shares of the other sources and the words past
    its source's are never read; a share of another call (or none yet) leaves the sum not ready."""
    gen = torch.Generator().manual_seed(3)
    world, epoch = 3, 2**40 + 5
    for split in (1, 2, 16, 64):
        for source in range(world):
            state = torch.randint(-2**62, 2**62, (records.state_words(world, 64),), generator=gen)
            first = records.ACC.value + 4 * world + source * split * 3
            lanes = torch.randint(0, 2**32, (split, 2), generator=gen)
            blocks = torch.randint(0, 2**20, (split,), generator=gen)
            for u in range(split - 1):
                both = int(lanes[u, 0]) << 32 | int(lanes[u, 1])  # as int64 words hold it
                state[first + 3 * u: first + 3 * u + 3] = torch.tensor(
                    [epoch, both - (both >> 63 << 64), int(blocks[u])])
            own = torch.tensor([lanes[-1, 0], lanes[-1, 1], blocks[-1]])
            out = torch.zeros(4, dtype=torch.int64)
            _add_shares[(1,)](state, own, out, source, epoch, world, split)
            want = [1, int(lanes[:, 0].sum()) % 2**32, int(lanes[:, 1].sum()) % 2**32,
                    int(blocks.sum())]
            assert out.tolist() == want, (split, source, out.tolist(), want)
            if split > 1:
                state[first + 3 * (split - 2)] = epoch - 1
                _add_shares[(1,)](state, own, out, source, epoch, world, split)
                assert out[0].item() == 0, (split, source, "a share of another call")
