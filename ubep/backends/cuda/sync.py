"""Device-side synchronization of the CUDA backend: epochs, flags, acks and bounded spin-waits.

Every call of a buffer set (dispatch-like calls share one, combine-like calls another) has an epoch
``e = 1, 2, ...`` and uses the receive slot ``e & 1`` on every peer. The epoch lives on the device so
that CUDA-graph replays advance it: ``state[q]`` (``MAX_PROGRAMS`` int64 words) all hold the last
finished call; program ``pid`` reads only ``state[pid]`` and, when its call ends, sets every word
``q = pid (mod grid)``, so programs never wait for one another and launches of any grid size agree.

Besides the rows (whose arrival rules live in ``ubep.backends.cuda.wire``), two kinds of words cross
the link, each written with one release atomic per peer after a CTA barrier, so that everything the
program stored before is visible to a reader that sees the word through an acquire load:

- *flags* ``sig[slot, source, j] = e``: writer program ``j`` of ``source`` (the count group, plus the
  senders in ``sw``) has stored its counts, routes (and rows); receivers wait for all of them;
- *acks* ``ack[peer, q] = e`` (in the sender's memory): the peer's consuming program ``q (mod n)``
  has finished reading call ``e``. A sender writes call ``e`` into a peer's slot only once every ack
  word of that peer reads at least ``e - 2``, the last call that used the slot, whatever the order of
  calls; that is usually long true, so the check is a few local loads.

Every wait reads ``%globaltimer`` and gives up after ``timeout_ns``: it writes ``(phase code, peer,
epoch)`` into an error word in pinned host memory, which the host checks without synchronizing
(:data:`PHASES` names the codes), and lets the kernel finish, so no rank ever hangs.
"""

from __future__ import annotations

import triton
import triton.language as tl

MAX_PROGRAMS = 1024  # epoch words per buffer set: the largest grid of one launch
FLAG_WORDS = 512  # flag words per (slot, source): the most writer programs of one launch
ACK_WORDS = 256  # ack words per peer: the most consuming programs of one launch

PHASES = {
    1: "dispatch: wait for counts and routes",
    2: "dispatch: wait for tokens",
    3: "dispatch: wait for the peer to free its slot",
    4: "combine: wait for rows",
    5: "combine: wait for the peer to free its slot",
}
WAIT_COUNTS, WAIT_TOKENS, WAIT_DISPATCH_SLOT, WAIT_ROWS, WAIT_COMBINE_SLOT = (
    tl.constexpr(code) for code in PHASES)
_MAX_PROGRAMS, _FLAG_WORDS, _ACK_WORDS = (tl.constexpr(n) for n in (MAX_PROGRAMS, FLAG_WORDS,
                                                                   ACK_WORDS))


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
def load_acquire(ptrs):
    """int64 words at ``ptrs`` with acquire semantics at system scope (later loads see what the
    writer released before storing them)."""
    return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptrs],
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
def call_epoch(state_ptr, pid):
    """The epoch of the call this launch belongs to."""
    return tl.load(state_ptr + pid) + 1


@triton.jit
def end_call(state_ptr, pid, grid, epoch):
    """Program ``pid`` of a call's last launch of ``grid`` programs is done with call ``epoch``."""
    q = tl.arange(0, _MAX_PROGRAMS)
    tl.store(state_ptr + q, tl.zeros_like(q).to(tl.int64) + epoch, mask=q % grid == pid)


@triton.jit
def _pending(words, target, valid, AT_LEAST: tl.constexpr):
    if AT_LEAST:
        return valid & (words < target)
    else:
        return valid & (words != target)


@triton.jit
def wait_words(base_ptr, row_stride, num_words, target, timeout_ns, err_addr, code, epoch,
               WORLD: tl.constexpr, W_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr,
               AT_LEAST: tl.constexpr):
    """Spin until the words ``base[s * row_stride + j]`` (``s < WORLD``, ``j < num_words``) all equal
    ``target`` (or are ``>= target`` with ``AT_LEAST``); acquire semantics; a timeout is reported
    naming the first peer ``s`` still missing."""
    s = tl.arange(0, W_BLOCK)[:, None]
    j = tl.arange(0, N_BLOCK)[None, :]
    valid = (s < WORLD) & (j < num_words)
    ptrs = base_ptr + tl.where(valid, s * row_stride + j, 0)
    deadline = now_ns() + timeout_ns
    pending = _pending(load_acquire(ptrs), target, valid, AT_LEAST)
    while (tl.sum(tl.sum(pending.to(tl.int32), 1), 0) > 0) & (now_ns() < deadline):
        pending = _pending(load_acquire(ptrs), target, valid, AT_LEAST)
    if tl.sum(tl.sum(pending.to(tl.int32), 1), 0) > 0:
        peer = tl.min(tl.min(tl.where(pending, s, W_BLOCK), 1), 0)
        report(err_addr, code, peer, epoch)


@triton.jit
def wait_acks(ack_local, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr,
              W_BLOCK: tl.constexpr):
    """Wait until every peer has finished reading call ``epoch - 2`` (this rank's ``ack [W,
    ACK_WORDS]``)."""
    wait_words(ack_local, _ACK_WORDS, _ACK_WORDS, epoch - 2, timeout_ns, err_addr, code, epoch,
               WORLD, W_BLOCK, _ACK_WORDS, True)


@triton.jit
def wait_flags(sig_local, slot, epoch, num_writers, timeout_ns, err_addr, code,
               WORLD: tl.constexpr, W_BLOCK: tl.constexpr):
    """Wait until the ``num_writers`` flags of every source for call ``epoch`` are in this rank's
    ``sig [2, W, FLAG_WORDS]``."""
    wait_words(sig_local + slot * WORLD * _FLAG_WORDS, _FLAG_WORDS, num_writers, epoch, timeout_ns,
               err_addr, code, epoch, WORLD, W_BLOCK, _FLAG_WORDS, False)


@triton.jit
def publish_flag(sig_ptrs, slot, rank, epoch, j, WORLD: tl.constexpr):
    """Writer program ``j`` has stored everything: its flag to ``sig[slot, rank, j]`` on every peer."""
    tl.debug_barrier()  # the program's stores precede the releases below
    for peer in tl.static_range(WORLD):
        sig = tl.load(sig_ptrs + peer).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(sig + (slot * WORLD + rank) * _FLAG_WORDS + j, epoch, sem="release",
                       scope="sys")


@triton.jit
def publish_acks(ack_ptrs, rank, epoch, j, num_consumers, WORLD: tl.constexpr):
    """Consuming program ``j`` of ``num_consumers`` has finished reading call ``epoch``: ack words
    ``q = j (mod num_consumers)`` of ``ack[rank, :]`` on every peer."""
    tl.debug_barrier()  # the program's loads of the slot precede the releases below
    q = tl.arange(0, _ACK_WORDS)
    mine = q % num_consumers == j
    for peer in tl.static_range(WORLD):
        ack = tl.load(ack_ptrs + peer).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(ack + rank * _ACK_WORDS + q, tl.zeros_like(q).to(tl.int64) + epoch,
                       mask=mine, sem="release", scope="sys")
