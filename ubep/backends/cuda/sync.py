"""Device-side synchronization of the CUDA backend: epochs, flags, acks and bounded spin-waits.

Every call of a buffer set (dispatch-like calls share one, combine-like calls another) has an epoch
``e = 1, 2, ...`` and uses the receive slot ``e & 1`` on every peer. The epoch lives on the device so
that CUDA-graph replays advance it: ``state[q]`` (``q < MAX_PROGRAMS``, int64) all hold the last
finished call; program ``pid`` reads only ``state[pid]`` and, when its call ends, sets every word
``q = pid (mod grid)``, so programs never wait for one another and launches of any grid size agree.

Besides the rows (whose arrival rules live in ``ubep.backends.cuda.wire``), two kinds of words cross
the link, each written after a CTA barrier with a system-scope release, to all peers at once
(:func:`peer_words`), so that everything stored before is visible to a reader that has seen the
word through an acquire load:

- the *record* ``sig[slot, source] = e``: every writer program of ``source`` (the count group, plus
  the senders in ``sw``) has stored its counts, routes (and rows). Writers count themselves on a
  local counter; the last one publishes the record on every peer (``publish_record``). One word per
  source keeps the receivers' polls cheap; per-writer flags would be slower (each release waits for
  the program's own remote stores, and the pollers would have hundreds of words to read);
- *acks* ``ack[peer]`` (in the sender's memory): the last call whose slot the peer has finished
  reading. A rank's launches run in stream order, so when call ``e`` starts every program of call
  ``e - 1`` has ended: the last program of each launch of call ``e`` stores ``e - 1`` on every
  peer with a release as it starts (``publish_ack``). The consuming programs themselves publish
  nothing: a counter and a release at the end of each would hold every one of them until its own
  stores had drained. Once ``ack[peer] >= e - 2`` the peer is done with call ``e - 2``, the last
  call that used the slot, and a sender may write call ``e`` into it, whatever the order of calls.
  That is usually long true (the peer has started call ``e - 1``), so the check is ``W`` local
  loads.

Every wait reads ``%globaltimer`` and gives up after ``timeout_ns``: it writes ``(phase code, peer,
epoch)`` into an error word in pinned host memory, which the host checks without synchronizing
(:data:`PHASES` names the codes), and lets the kernel finish, so no rank ever hangs. The waits for
words (records, acks, counts) and ``dc``'s verifiers also give up early once an earlier wait of the
rank has timed out (:func:`still_due`); a program's row waits (``wire.take_tiles``) share one
deadline instead (docs/CUDA.md, "Timeouts"). Kernels reach both through ``err_addr``, the rank's
error block in device memory: ``[halted, address of the host error word]``; the early give-up reads
``halted``, so no spinning program reads host memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends import base
from ubep.backends.cuda.kernels import INTERPRETED

MAX_PROGRAMS = 1024  # epoch words per buffer set: the largest grid of one launch
CALL_BITS = tl.constexpr(base.CALL_BITS)  # a call's epoch below its code in its words (call_tag)
STATE_WORDS = MAX_PROGRAMS + 1  # the epoch words, then the writers' counter

PHASES = {
    1: "dispatch: wait for counts and routes",
    2: "dispatch: wait for tokens",
    3: "dispatch: wait for the peer to free its slot",
    4: "combine: wait for rows",
    5: "combine: wait for the peer to free its slot",
}
WAIT_COUNTS, WAIT_TOKENS, WAIT_DISPATCH_SLOT, WAIT_ROWS, WAIT_COMBINE_SLOT = (
    tl.constexpr(code) for code in PHASES)
_MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)
PROGRAM_THREADS = tl.constexpr(256)  # threads of a program: geometry.NUM_WARPS warps of 32
GIVE_UP_POLLS = tl.constexpr(1024)  # polls between a wait's looks at the halted word (a power of 2)


@triton.jit
def now_ns():
    """The GPU's global nanosecond timer (0 in the interpreter, where a wait checks once)."""
    if INTERPRETED:
        return tl.zeros([], dtype=tl.int64)
    else:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)


@triton.jit
def stamp(stamps_ptr, pid, which: tl.constexpr, PROFILE: tl.constexpr):
    """With ``PROFILE``, ``stamps[pid, which] = %globaltimer``: ``which`` 0 start, 1 first wait over,
    2 work done, 3 finished (``ubep.backends.cuda.stamps`` turns them into phases); else nothing."""
    if PROFILE:
        tl.store(stamps_ptr + pid * 4 + which, now_ns())


@triton.jit
def load_sys(ptrs, ACQUIRE: tl.constexpr):
    """int64 words at ``ptrs`` loaded at system scope, with ``ACQUIRE`` semantics (later loads and
    stores are ordered after what the writer released before storing them) or relaxed. In the
    SASS an acquire load is followed by an invalidation of the SM's whole L1 (``CCTL.IVALL``),
    under every program sharing the SM: polls spin on relaxed loads and acquire once what they
    waited for is there."""
    if INTERPRETED:
        return tl.load(ptrs, volatile=True)
    elif ACQUIRE:
        return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptrs],
                                         dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.inline_asm_elementwise("ld.relaxed.sys.global.b64 $0, [$1];", "=l,l", [ptrs],
                                         dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def store_release_sys(ptr, value):
    """The int64 ``value`` into the word at ``ptr`` with a system-scope release (a store, not an
    exchange: the word may be in host memory, where a PCIe host need not support the GPU's
    atomics). Every thread of the program stores the same value."""
    if INTERPRETED:
        tl.store(ptr, value)
    else:
        tl.inline_asm_elementwise("st.release.sys.global.b64 [$1], $2; mov.u32 $0, 0;", "=r,l,l",
                                  [ptr, value.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def read_once(ptrs, SEM: tl.constexpr):
    """The int64 words at ``ptrs`` (a pointer or a tensor of them), each read at system scope with
    ordering ``SEM`` (``"relaxed"`` or ``"acquire"``) by one thread and shared with the program's
    other threads: Triton lowers an atomic add of 0 so (one predicated atomic per word, then shared
    memory behind a barrier; in the SASS of Triton 3.6's ptxas the atomic stays one,
    ``ATOMG.E.ADD.64.STRONG.SYS``, a read-modify-write at the word's L2 slice). A poll whose loop
    holds a barrier (a reduction over warps) must branch on such a read: words each thread loads
    itself can differ between warps, and warps that leave the loop at different passes pair their
    barriers wrongly."""
    return tl.atomic_add(ptrs, 0, sem=SEM, scope="sys")


@triton.jit
def report(err_addr, code, peer, epoch):
    """Record a timed-out wait: mark the rank halted and write ``[code, peer, epoch]`` into the host
    error word (``err_addr``: the module doc), unless a wait of this rank has timed out before: the
    first timeout is the cause, and the waits of the calls queued behind it time out in turn
    (reports at the same moment may race; each names a real failure)."""
    block = err_addr.to(tl.pointer_type(tl.int64))
    if tl.load(block, volatile=True) == 0:
        tl.store(block, 1)
        err = tl.load(block + 1).to(tl.pointer_type(tl.int64))
        zero = tl.zeros([], dtype=tl.int64)  # peer and code may be compile-time ints
        tl.store(err + 1, zero + peer)
        tl.store(err + 2, epoch)
        tl.store(err, zero + code)


@triton.jit
def still_due(deadline, err_addr):
    """A wait's ``deadline`` (ns) after one more poll: 1 ns earlier, so that it counts the polls
    (no counter to keep in registers), or 0 once an earlier wait of this rank has timed out. Every
    ``GIVE_UP_POLLS``-th poll looks at the rank's halted word (``err_addr``, device memory): the
    calls queued behind a failure then fail in at most that many polls each instead of a whole
    timeout."""
    deadline -= 1
    if (deadline & (GIVE_UP_POLLS - 1)) == 0:  # noqa: SIM102 (nested: only these polls load the word)
        if tl.load(err_addr.to(tl.pointer_type(tl.int64)), volatile=True) != 0:
            deadline = tl.zeros_like(deadline)
    return deadline


@triton.jit
def call_epoch(state_ptr, pid):
    """The epoch of the call this launch belongs to."""
    return tl.load(state_ptr + pid) + 1


@triton.jit
def call_tag(epoch, code):
    """What a call's route entries, flags and records carry: its ``epoch`` with its ``code``
    (``ubep.backends.base.call_code``: the operation, reduction, weighting and handle) above bit
    ``CALL_BITS``. Ranks that called different operations then wait for words that never come and
    time out, instead of taking each other's rows; slots and acks go by the epoch alone."""
    return epoch | (code.to(tl.int64) << CALL_BITS)


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
def _count(pending):
    """How many of a ``[W_BLOCK, N_BLOCK]`` wait's words are still pending."""
    return tl.sum(tl.sum(pending.to(tl.int32), 1), 0)


@triton.jit
def wait_words(base_ptr, row_stride, num_words, target, timeout_ns, err_addr, code, epoch,
               WORLD: tl.constexpr, W_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr,
               AT_LEAST: tl.constexpr, ONCE: tl.constexpr):
    """Spin until the words ``base[s * row_stride + j]`` (``s < WORLD``, ``j < num_words``) all
    equal ``target`` (or are ``>= target`` with ``AT_LEAST``), then read them once more with an
    acquire (words a wait ends on do not change until this rank moves on); a timeout is reported
    naming the first peer ``s`` still missing. The first read acquires: a wait whose words are
    already there (the acks, mostly) ends after one round trip instead of two. The spin reads
    relaxed (:func:`load_sys` says why).

    ``ONCE`` (words that hundreds of programs poll at once: the records) polls each word in one
    thread and hands it to the others; only its first read is every thread's own load, counted
    over the whole program (:func:`_first_look`). A load from each of a program's 8 warps in every
    poll would queue eight times the requests at that word's L2 slice and hold back the release
    that ends the wait (W = 1, 128 tokens: 256 receivers saw the record 2.6 µs later than 128; H200,
    docs/BENCHMARKS.md).
    Every branch of the wait then follows a read all warps share: the reads go through a barrier,
    and warps that branch on their own reads around it pair their barriers wrongly
    (docs/CUDA.md, "Waits"). Without ``ONCE`` every thread loads its words itself: where the tile
    spans warps, each branch follows a sum over all of them; where it does not, the loop holds no
    barrier. The two loops differ in what they carry: a tile of ``read_once``'s layout stops
    Triton's layout pass, and the count in the other loop makes ptxas spill in the EP2 decode
    dispatch kernel."""
    s = tl.arange(0, W_BLOCK)[:, None]
    j = tl.arange(0, N_BLOCK)[None, :]
    valid = (s < WORLD) & (j < num_words)
    ptrs = base_ptr + tl.where(valid, s * row_stride + j, 0)
    if ONCE:
        missing = _first_look(ptrs, target, valid, AT_LEAST)
        if missing > 0:
            deadline = now_ns() + timeout_ns
            while (missing > 0) & (now_ns() < deadline):
                missing = _count(_pending(read_once(ptrs, "relaxed"), target, valid, AT_LEAST))
                deadline = still_due(deadline, err_addr)
            _report_missing(ptrs, target, valid, s, err_addr, code, epoch, W_BLOCK, AT_LEAST, True)
    else:
        pending = _pending(load_sys(ptrs, True), target, valid, AT_LEAST)
        if _count(pending) > 0:
            deadline = now_ns() + timeout_ns
            while (_count(pending) > 0) & (now_ns() < deadline):
                pending = _pending(load_sys(ptrs, False), target, valid, AT_LEAST)
                deadline = still_due(deadline, err_addr)
            _report_missing(ptrs, target, valid, s, err_addr, code, epoch, W_BLOCK, AT_LEAST, False)


@triton.jit
def _first_look(ptrs, target, valid, AT_LEAST: tl.constexpr):
    """How many of a ``ONCE`` wait's words are pending at its first read (times
    ``PROGRAM_THREADS``), the same count in every warp: each thread loads the words itself with an
    acquire load, and the count is summed over a tile of one entry per thread of the program, so
    that it crosses the warps through one barrier before any of them branches on it. Words already
    there then cost one load, not ``read_once``'s atomic and barrier (W = 1: 0.1-0.3 µs off 16- and
    128-token `sw` dispatches; H200, docs/BENCHMARKS.md)."""
    t = tl.arange(0, PROGRAM_THREADS)[None, None, :]
    wide = ptrs[:, :, None] + t * 0
    pending = _pending(load_sys(wide, True), target, valid[:, :, None], AT_LEAST)
    return tl.sum(tl.sum(tl.sum(pending.to(tl.int32), 2), 1), 0)


@triton.jit
def _report_missing(ptrs, target, valid, s, err_addr, code, epoch, W_BLOCK: tl.constexpr,
                    AT_LEAST: tl.constexpr, ONCE: tl.constexpr):
    """After a wait's spin: read the words once more with an acquire and report the first peer
    still missing, if any (the spin ran out of time)."""
    if ONCE:
        pending = _pending(read_once(ptrs, "acquire"), target, valid, AT_LEAST)
    else:
        pending = _pending(load_sys(ptrs, True), target, valid, AT_LEAST)
    if _count(pending) > 0:
        peer = tl.min(tl.min(tl.where(pending, s, W_BLOCK), 1), 0)
        report(err_addr, code, peer, epoch)


@triton.jit
def wait_acks(ack_local, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr,
              W_BLOCK: tl.constexpr):
    """Wait until every peer has finished reading call ``epoch - 2`` (this rank's ``ack [W]``)."""
    wait_words(ack_local, 1, 1, epoch - 2, timeout_ns, err_addr, code, epoch, WORLD, W_BLOCK, 1,
               True, False)


@triton.jit
def wait_record(sig_local, slot, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr,
                W_BLOCK: tl.constexpr):
    """Wait until every source's record for call ``epoch`` is in this rank's ``sig [2, W]``."""
    wait_words(sig_local + slot * WORLD, 1, 1, epoch, timeout_ns, err_addr, code, epoch, WORLD,
               W_BLOCK, 1, False, True)


@triton.jit
def peer_words(ptrs, word, offsets, live, W_BLOCK: tl.constexpr):
    """``[W_BLOCK]`` pointers: word ``offsets[p]`` of peer ``p``'s symmetric buffer (base addresses
    ``ptrs [W]``, words of type ``word``), where ``live``. Written as one vector of system-scope
    release exchanges, one lane per peer, the releases leave together; in a loop over the peers
    one thread's release orders the exchange before it, so the exchanges could not overlap (a link
    round trip each at worst; not yet timed on two GPUs). After a CTA barrier, each lane's release
    covers every thread's stores before the barrier."""
    bases = tl.load(ptrs + tl.arange(0, W_BLOCK), mask=live, other=0)
    return bases.to(tl.pointer_type(word)) + offsets


@triton.jit
def _release_to_peers(ptrs, offset, value, WORLD: tl.constexpr, W_BLOCK: tl.constexpr):
    """The int64 ``value`` into word ``offset`` of every peer's buffer (:func:`peer_words`), one
    system-scope release exchange per lane."""
    live = tl.arange(0, W_BLOCK) < WORLD
    words = peer_words(ptrs, tl.int64, offset, live, W_BLOCK)
    tl.atomic_xchg(words, tl.zeros([W_BLOCK], dtype=tl.int64) + value, mask=live, sem="release",
                   scope="sys")


@triton.jit
def publish_record(state_ptr, num_writers, sig_ptrs, slot, rank, epoch, WORLD: tl.constexpr,
                   W_BLOCK: tl.constexpr):
    """A writer program has stored everything; the last of ``num_writers`` (counted in
    ``state[MAX_PROGRAMS]``) resets the count and publishes this rank's record in every peer's
    ``sig[slot, rank]``."""
    counter_ptr = state_ptr + _MAX_PROGRAMS
    tl.debug_barrier()  # the program's stores precede the release below
    # GPU scope: the counter is local, and system-scope atomics from 256 writers queue for microseconds
    # on this one word; the last writer's system-scope release below is cumulative over everything
    # the counter made it acquire.
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == num_writers - 1:
        tl.store(counter_ptr, 0)
        tl.debug_barrier()  # what the counter acquired precedes every lane's release
        _release_to_peers(sig_ptrs, slot * WORLD + rank, epoch, WORLD, W_BLOCK)


@triton.jit
def publish_intent(intent_ptrs, slot, rank, tag, WORLD: tl.constexpr, W_BLOCK: tl.constexpr):
    """``sp``, where receivers wait for no record: this rank's call ``tag`` (:func:`call_tag`) into
    every peer's ``intent[slot, rank]``, once the slot is free (after :func:`wait_acks`; earlier, a
    peer still reading the slot's previous call would see it change). sp rows carry no epoch: a
    receiver waits for every source's intent (:func:`wait_record` on ``intent``) before it takes
    rows, so rows of a peer that called another operation are never taken."""
    _release_to_peers(intent_ptrs, slot * WORLD + rank, tag, WORLD, W_BLOCK)


@triton.jit
def publish_ack(ack_ptrs, rank, epoch, WORLD: tl.constexpr, W_BLOCK: tl.constexpr):
    """Called by one program of each launch of call ``epoch`` (again by a later launch of the call:
    the same value): every launch of call ``epoch - 1`` has ended before this one started (stream
    order), so this rank is done reading that call's slot; store ``epoch - 1`` in every peer's
    ``ack[rank]`` with a release."""
    _release_to_peers(ack_ptrs, rank, epoch - 1, WORLD, W_BLOCK)
