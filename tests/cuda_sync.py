"""Checks of the CUDA backend's synchronization helpers (``ubep.backends.cuda.sync``, and the ``dc``
verifiers' shares in ``records``), and of its receivers' zeroing of padding weights, through
Triton's interpreter on the CPU, each a rank function of ``ubep.launch.run_ranks`` run in a process
whose environment had ``TRITON_INTERPRET=1`` before Triton was imported
(tests/test_cuda_emulated.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ubep.backends.cuda import dispatch_kernels, records, sync, verify


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
def _wait_never_met(word_ptr, timeout_ns, err_addr, ONCE: tl.constexpr):
    sync.wait_words(word_ptr, 1, 1, 1, timeout_ns, err_addr, sync.WAIT_ROWS, 8, 1, 1, 1, False, ONCE)


def queued_wait_gives_up(_rank: int, _world: int) -> None:
    """A wait for a word, of a rank that has already timed out (a call queued behind the failure:
    its halted word is set), gives up after ``GIVE_UP_POLLS`` polls, not at its own deadline (here
    never: the interpreter's clock reads 0), and leaves the first report as it is; whether every
    thread loads the word or one thread reads it for all."""
    for once in (False, True):
        errors = torch.tensor([sync.WAIT_COUNTS.value, 1, 7])
        never = torch.zeros(1, dtype=torch.int64)
        _wait_never_met[(1,)](never, 2**62, _error_block(errors, 1).data_ptr(), once)
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
            first = records.ACC.value + 5 * world + source * split * 3
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


@triton.jit
def _settle(state_ptr, rec_ptr, lanes_ptr, out_ptr, s, v, epoch, round, fresh, arrived,
            WORLD: tl.constexpr, SPLIT: tl.constexpr):
    pending, again, round = verify._settle(state_ptr, rec_ptr, 0, s, v, epoch, round, fresh != 0,
                                           arrived != 0, tl.load(lanes_ptr).to(tl.uint32),
                                           tl.load(lanes_ptr + 1).to(tl.uint32),
                                           tl.load(lanes_ptr + 2).to(tl.int32), WORLD, SPLIT)
    tl.store(out_ptr, pending.to(tl.int64))
    tl.store(out_ptr + 1, again.to(tl.int64))
    tl.store(out_ptr + 2, round.to(tl.int64))


def verify_rounds(_rank: int, _world: int) -> None:
    """``dc`` verify rounds: the last verifier, every share of its round in and the sum wrong, asks
    for the next round and reads its own share again; another verifier re-reads its share only on
    such an ask (of its call), publishes it under that round, and otherwise only polls; a share of
    an older round leaves the sum not ready."""
    world, split, source, epoch = 2, 4, 1, 2**40 + 5
    state = torch.zeros(records.state_words(world, split), dtype=torch.int64)
    rec = torch.zeros(2, world, 2, dtype=torch.int64)
    rec[0, source] = torch.tensor([epoch, 12345])  # this call's record; no sum here matches it
    lanes = torch.tensor([7, 9, 100])
    out = torch.zeros(3, dtype=torch.int64)
    req = records.ACC.value + 4 * world + source
    share = records.ACC.value + 5 * world + source * split * 3

    def tag(call, round_):
        return call << records.ROUND_BITS.value | round_

    def settle(v, round_, fresh, arrived=1):
        _settle[(1,)](state, rec, lanes, out, source, v, epoch, round_, fresh, arrived, world, split)
        return out.tolist()

    for v in range(split - 1):  # round 0's shares are in
        assert settle(v, 0, 1) == [1, 0, 0]
        assert state[share + 3 * v].item() == tag(epoch, 0)
    assert settle(split - 1, 0, 1) == [1, 1, 1] and state[req].item() == tag(epoch, 1)
    assert settle(0, 0, 0) == [1, 1, 1]  # the ask: pass again, in round 1
    assert settle(0, 1, 1) == [1, 0, 1] and state[share].item() == tag(epoch, 1)
    assert settle(split - 1, 1, 0) == [1, 0, 1] and state[req].item() == tag(epoch, 1)
    assert settle(1, 0, 0, arrived=0) == [1, 1, 0]  # no record yet: poll it, publish nothing
    assert state[share + 3].item() == tag(epoch, 0)
    state[req] = tag(epoch - 1, 5)  # an older call's ask is none
    assert settle(1, 0, 0) == [1, 0, 0]
    state[records.ACC.value + 3 * world + source] = epoch  # verified: the others leave
    assert settle(1, 0, 0) == [0, 0, 0]


@triton.jit
def _zero_padding(out_w_ptr, recv_w_ptr, count_ptr, slot, capacity, WORLD: tl.constexpr,
                  E_LOCAL: tl.constexpr):
    dispatch_kernels._zero_padding(out_w_ptr, recv_w_ptr, count_ptr, slot, tl.program_id(0),
                                   tl.num_programs(0), capacity, WORLD, E_LOCAL)


def padding_zeroed_in_spans(_rank: int, _world: int) -> None:
    """The padded layout's padding weights, zeroed by two receivers in spans of ``PAD_STEP``
    entries: 4 local experts of 700 rows (2800 entries, several spans per receiver) holding 5, 0,
    700 and 13 rows, the sums of two sources' counts in slot 1 (slot 0 holds other counts).
    Exactly the padding rows' weights become 0 in both outputs; the rest keep theirs."""
    capacity, world, slot = 700, 2, 1
    counts = torch.tensor([[[9, 9, 9, 9, 0], [9, 9, 9, 9, 0]],  # slot 0, ignored
                           [[2, 0, 300, 13, 0], [3, 0, 400, 0, 0]]])  # [slot, source, E + 1]
    totals = counts[slot].sum(0)[:-1]
    experts = totals.numel()
    assert experts * capacity > 4 * dispatch_kernels.PAD_STEP.value  # receivers with two spans
    out_w, recv_w = torch.full((2, experts * capacity), 7.0).unbind(0)
    _zero_padding[(2,)](out_w, recv_w, counts, slot, capacity, WORLD=world, E_LOCAL=experts)
    padding = torch.arange(capacity).repeat(experts) >= totals.repeat_interleave(capacity)
    want = torch.where(padding, 0.0, 7.0)
    assert torch.equal(out_w, want) and torch.equal(recv_w, want), (out_w, recv_w)
