"""Device-side synchronization of the CUDA backend: epochs, bounded spin-waits, batch records, acks.

Every call of a buffer set (dispatch-like calls share one, combine-like calls another) has an epoch
``e = 1, 2, ...`` kept on the device (``state[EPOCH]``, so CUDA-graph replays advance it) and uses the
receive slot ``e & 1`` on every peer. Three kinds of words cross the link besides the rows:

- the *record* ``sig[slot][source] = e``: written by the source's last writer program after a
  release, so everything the source's writers stored before it (counts, routes, ``sw`` rows) is
  visible to a receiver that has read it with an acquire load;
- the *ack* ``ack[peer] = e`` (in the sender's memory, written by the receiver when it has consumed
  call ``e``): a sender writes call ``e`` into a peer's slot only once that peer acked ``e - 2``, the
  last call that used the slot, whatever the order of calls; usually long true, so one local load;
- rows themselves, whose arrival rules live in ``ubep.backends.cuda.wire``.

Every wait reads ``%globaltimer`` and gives up after ``timeout_ns``: it writes ``(phase code, peer,
epoch)`` into an error word in pinned host memory, which the host checks without synchronizing
(:data:`PHASES` names the codes), and lets the kernel finish, so no rank ever hangs.

Program counting: ``state[WRITERS_DONE]`` counts writer programs; the last one publishes the records.
``state[PROGRAMS_DONE]`` counts every program of a launch; the last one of a call's final launch writes
the acks and advances the epoch (every program has read it by then).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Words of a buffer set's int64 ``state``, and the phase codes of timed-out waits (kernel constants).
EPOCH, WRITERS_DONE, PROGRAMS_DONE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
STATE_WORDS = 4

PHASES = {
    1: "dispatch: wait for counts and routes",
    2: "dispatch: wait for tokens",
    3: "dispatch: wait for the peer to free its slot",
    4: "combine: wait for rows",
    5: "combine: wait for the peer to free its slot",
}
WAIT_COUNTS, WAIT_TOKENS, WAIT_DISPATCH_SLOT, WAIT_ROWS, WAIT_COMBINE_SLOT = (
    tl.constexpr(code) for code in PHASES)


@triton.jit
def now_ns():
    """The GPU's global nanosecond timer."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def stamp(stamps_ptr, pid, which: tl.constexpr, PROFILE: tl.constexpr):
    """With ``PROFILE``, ``stamps[pid, which] = %globaltimer``: ``which`` 0 start, 1 first wait over,
    2 work done, 3 finished (``ubep.backends.cuda.stamps`` turns them into phases); else nothing."""
    if PROFILE:
        tl.store(stamps_ptr + pid * 4 + which, now_ns())


@triton.jit
def load_acquire(ptr):
    """One int64 at ``ptr`` with acquire semantics at system scope (later loads see what the writer
    released before storing it)."""
    return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr],
                                     dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def report(err_addr, code, peer, epoch):
    """Record a timed-out wait in the host error word ``[code, peer, epoch]`` (any one of several
    concurrent reports survives; each names a real failure)."""
    err = err_addr.to(tl.pointer_type(tl.int64))
    zero = tl.zeros([], dtype=tl.int64)  # peer and code may be compile-time ints
    tl.store(err + 1, zero + peer)
    tl.store(err + 2, epoch)
    tl.store(err, zero + code)


@triton.jit
def _pending(value, target, AT_LEAST: tl.constexpr):
    if AT_LEAST:
        return value < target
    else:
        return value != target


@triton.jit
def wait_word(ptr, target, timeout_ns, err_addr, code, peer, epoch, AT_LEAST: tl.constexpr):
    """Spin until the int64 at ``ptr`` equals ``target`` (or is ``>= target`` with ``AT_LEAST``);
    acquire semantics; a timeout is reported through the host error word."""
    deadline = now_ns() + timeout_ns
    pending = _pending(load_acquire(ptr), target, AT_LEAST)
    while pending & (now_ns() < deadline):
        pending = _pending(load_acquire(ptr), target, AT_LEAST)
    if pending:
        report(err_addr, code, peer, epoch)


@triton.jit
def wait_acks(ack_ptr, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr):
    """Wait until every peer has acked call ``epoch - 2`` in this rank's ``ack`` words."""
    for peer in tl.static_range(WORLD):
        wait_word(ack_ptr + peer, epoch - 2, timeout_ns, err_addr, code, peer, epoch, True)


@triton.jit
def wait_records(sig_ptr, slot, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr):
    """Wait until every source's record for call ``epoch`` is in this rank's ``sig[slot]``."""
    for source in tl.static_range(WORLD):
        wait_word(sig_ptr + slot * WORLD + source, epoch, timeout_ns, err_addr, code, source, epoch,
                  False)


@triton.jit
def writer_done(state_ptr, num_writers, sig_ptrs, slot, rank, epoch, WORLD: tl.constexpr):
    """A writer program has stored everything; the last of ``num_writers`` publishes this rank's
    record in every peer's ``sig[slot][rank]``."""
    tl.debug_barrier()  # the program's stores precede the release below
    old = tl.atomic_add(state_ptr + WRITERS_DONE, 1, sem="acq_rel", scope="sys")
    if old == num_writers - 1:
        tl.store(state_ptr + WRITERS_DONE, 0)
        for peer in tl.static_range(WORLD):
            sig = tl.load(sig_ptrs + peer).to(tl.pointer_type(tl.int64))
            tl.atomic_xchg(sig + slot * WORLD + rank, epoch, sem="release", scope="sys")


@triton.jit
def program_done(state_ptr, num_programs, ack_ptrs, rank, epoch, FINAL: tl.constexpr,
                 WORLD: tl.constexpr):
    """A program of the launch is finished; the last of ``num_programs`` resets the count and, if this
    launch ends the call, acks ``epoch`` to every peer and advances the epoch."""
    tl.debug_barrier()
    old = tl.atomic_add(state_ptr + PROGRAMS_DONE, 1, sem="acq_rel", scope="sys")
    if old == num_programs - 1:
        tl.store(state_ptr + PROGRAMS_DONE, 0)
        if FINAL:
            for peer in tl.static_range(WORLD):
                ack = tl.load(ack_ptrs + peer).to(tl.pointer_type(tl.int64))
                tl.atomic_xchg(ack + rank, epoch, sem="release", scope="sys")
            tl.store(state_ptr + EPOCH, epoch)
