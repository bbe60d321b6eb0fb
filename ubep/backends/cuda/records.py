"""Batch records of the ``dc`` and ``sp`` modes: one per (slot, source) on every receiver.

``rec [2, W, 2]`` int64 (symmetric, one per buffer set) holds the protocol's 16-byte record
``(epoch, value)`` of the batch source ``s`` sent this rank in slot ``e & 1``; rows are numbered by
their index in the receiver's region for that source (``checksum``), so a batch is every row one
source sends one destination in one launch of its send group.

Senders: each send program sums its share of every destination's batch (``dc``: the checksum lanes
and the blocks sent; ``sp``: the blocks that would carry the sentinel, and the blocks sent) and adds it
with relaxed atomics into this rank's accumulator ``state[ACC + 3 * d ..]``, then counts itself on
the senders' counter with a GPU-scope acq_rel atomic (which orders its adds before the count). The
last one reads and clears the accumulator and, per destination:

- ``dc``: writes ``(epoch, checksum)`` with plain stores: no fence, since the receiver checks the
  checksum against what it holds (a torn or stale record fails that check);
- ``sp``: only if some block would carry the sentinel, writes ``N`` then ``epoch`` with a
  system-scope release (all destinations at once, ``sync.peer_words``), cumulative over every
  sender's rows (the counter made it acquire them), so the record orders after the whole batch (the
  ``sw`` fallback). Otherwise nothing is written.

Receivers: ``dc``: verifier ``s`` (``verify``) polls until the checksum of the markers it holds for
source ``s`` matches the record (:func:`differs`), then sets ``state[OK + s] = epoch``; every
receiver waits for all ``W`` of those before it copies (a ``dc`` batch arrives all at once). ``sp``:
a row has arrived when none of its blocks holds the sentinel in the values loaded, or the record
reads ``epoch`` (``wire.take_tiles``); the receiver writes the sentinel back after consuming it,
within its call (the rank's next call acks the slot: ``sync``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda import sync

SENDERS = tl.constexpr(sync.STATE_WORDS)  # the senders' counter
ACC = tl.constexpr(sync.STATE_WORDS + 1)  # [W, 3] int64: lane A (or sentinel blocks), lane B, blocks


def state_words(world: int, split: int) -> int:
    """int64 words of a buffer set's state: ``sync``'s, the senders' counter, ``ACC [W, 3]``, ``OK
    [W]``, ``REQ [W]`` and ``SHARE [W, split, 3]`` (``dc``: the round the last verifier of a source
    asks for, and each verifier's share of its source's lanes)."""
    return sync.STATE_WORDS + 1 + 5 * world + 3 * world * split


@triton.jit
def add_share(acc_a, acc_b, acc_n, dest, ws, a, b, blocks):
    """A row's share (``put_tile`` sums ``a, b``; ``blocks`` sent) added at ``dest`` of the
    ``[W_BLOCK]`` per-destination sums of a send program (``ws = tl.arange(0, W_BLOCK)``)."""
    here = ws == dest
    return (tl.where(here, acc_a + a, acc_a), tl.where(here, acc_b + b, acc_b),
            tl.where(here, acc_n + blocks, acc_n))


@triton.jit
def publish(state_ptr, n_senders, rec_ptrs, acc_a, acc_b, acc_n, slot, rank, epoch,
            WORLD: tl.constexpr, W_BLOCK: tl.constexpr, NB: tl.constexpr, SP_MODE: tl.constexpr):
    """A send program is done: add its sums; the last of ``n_senders`` writes the records (module
    doc) into every peer's ``rec[slot, rank]``."""
    ws = tl.arange(0, W_BLOCK)
    acc = state_ptr + ACC + ws * 3
    live = ws < WORLD
    tl.atomic_add(acc, acc_a.to(tl.int64), mask=live, sem="relaxed", scope="gpu")
    tl.atomic_add(acc + 1, acc_b.to(tl.int64), mask=live, sem="relaxed", scope="gpu")
    tl.atomic_add(acc + 2, acc_n.to(tl.int64), mask=live, sem="relaxed", scope="gpu")
    tl.debug_barrier()  # every thread's adds (and rows) precede the count below
    if tl.atomic_add(state_ptr + SENDERS, 1, sem="acq_rel", scope="gpu") == n_senders - 1:
        tl.store(state_ptr + SENDERS, 0)
        zero = tl.zeros_like(ws).to(tl.int64)
        sum_a = tl.atomic_xchg(acc, zero, mask=live, sem="relaxed", scope="gpu")
        sum_b = tl.atomic_xchg(acc + 1, zero, mask=live, sem="relaxed", scope="gpu")
        sum_n = tl.atomic_xchg(acc + 2, zero, mask=live, sem="relaxed", scope="gpu")
        # every destination at once, one lane each (sync.peer_words)
        if SP_MODE:
            collide = live & (sum_a > 0)
            recs = sync.peer_words(rec_ptrs, tl.int64, (slot * WORLD + rank) * 2, collide, W_BLOCK)
            tl.store(recs + 1, sum_n // NB, mask=collide)
            tl.debug_barrier()  # N precedes the epoch, whichever thread stored it
            tl.atomic_xchg(recs, zero + epoch, mask=collide, sem="release", scope="sys")
        else:
            recs = sync.peer_words(rec_ptrs, tl.int64, (slot * WORLD + rank) * 2, live, W_BLOCK)
            a = (sum_a & 0xFFFFFFFF).to(tl.uint32)
            b = (sum_b & 0xFFFFFFFF).to(tl.uint32)
            tl.store(recs + 1, ck.checksum(a, b, sum_n, ck.digest(epoch)), mask=live)
            tl.store(recs, zero + epoch, mask=live)


@triton.jit
def arrived(rec_local, slot, source, epoch, WORLD: tl.constexpr):
    """``dc``: whether this rank's record of ``source`` reads call ``epoch``."""
    return sync.read_once(rec_local + (slot * WORLD + source) * 2, "relaxed") == epoch


@triton.jit
def differs(rec_local, slot, source, epoch, has_arrived, lane_a, lane_b, blocks,
            WORLD: tl.constexpr):
    """``dc``: whether this rank's record of ``source`` does not (yet) read ``(epoch, checksum)`` for
    the lanes and block count a receiver computed over the markers it holds; ``has_arrived``: what
    :func:`arrived` read at the start of that pass (the epoch word does not change within a call)."""
    value = sync.read_once(rec_local + (slot * WORLD + source) * 2 + 1, "relaxed")
    want = ck.checksum(lane_a.to(tl.uint32), lane_b.to(tl.uint32), blocks, ck.digest(epoch))
    return (has_arrived == 0) | (value != want)


# Where the dc words of ``state_words`` lie past ``ACC [W, 3]``.
@triton.jit
def _verified_words(state_ptr, WORLD: tl.constexpr):
    """``OK [W]``: per source, the last call whose batch this rank's verifier matched."""
    return state_ptr + ACC + 3 * WORLD


@triton.jit
def _asked_words(state_ptr, WORLD: tl.constexpr):
    """``REQ [W]``: per source, the share tag its last verifier asked for."""
    return state_ptr + ACC + 4 * WORLD


@triton.jit
def _share_words(state_ptr, source, WORLD: tl.constexpr, SPLIT: tl.constexpr):
    """``SHARE [W, SPLIT, 3]`` at ``source``: each verifier's (tag, lanes, blocks)."""
    return state_ptr + ACC + 5 * WORLD + source * SPLIT * 3


# Rounds of one call's verify of one source fit in the low bits of a share's tag.
ROUND_BITS = tl.constexpr(16)
ROUND_MASK = tl.constexpr((1 << ROUND_BITS.value) - 1)


@triton.jit
def share_tag(epoch, round):
    """``dc``: the tag of the shares of round ``round`` of call ``epoch``'s verify of a source: a pass
    over a share is published under the round the last verifier had asked for when it began."""
    return (epoch.to(tl.int64) << ROUND_BITS) | (round & ROUND_MASK).to(tl.int64)


@triton.jit
def ask_round(state_ptr, source, tag, WORLD: tl.constexpr):
    """``dc``: the last verifier of ``source`` asks the others for passes under ``tag`` (a release:
    what it read and wrote before is ordered before the ask)."""
    tl.debug_barrier()
    tl.atomic_xchg(_asked_words(state_ptr, WORLD) + source, tag, sem="release", scope="gpu")


@triton.jit
def asked_round(state_ptr, source, epoch, WORLD: tl.constexpr):
    """``dc``: the round of call ``epoch`` the last verifier of ``source`` has asked for (0 before it
    asks: an older call's ask counts as none)."""
    tag = sync.read_once(_asked_words(state_ptr, WORLD) + source, "relaxed")
    mine = (tag >> ROUND_BITS) == epoch
    return tl.where(mine, tag & ROUND_MASK, 0).to(tl.int32)


@triton.jit
def publish_share(state_ptr, source, v, tag, lane_a, lane_b, blocks, WORLD: tl.constexpr,
                  SPLIT: tl.constexpr):
    """``dc``: verifier ``v`` of ``source`` (one of ``SPLIT``) publishes the lanes and block count of
    its share under ``tag`` (``share_tag``): both words, then the tag word (a release)."""
    share = _share_words(state_ptr, source, WORLD, SPLIT) + v * 3
    tl.store(share + 1, (lane_a.to(tl.int64) << 32) | lane_b.to(tl.int64))
    tl.store(share + 2, blocks.to(tl.int64))
    tl.debug_barrier()
    tl.atomic_xchg(share, tag, sem="release", scope="gpu")


# Words of the other verifiers' shares the last one reads at once: one per thread of a program, so
# that no two threads hold the same word (``add_shares``).
SHARE_WORDS = sync.PROGRAM_THREADS


@triton.jit
def add_shares(state_ptr, source, tag, lane_a, lane_b, blocks, WORLD: tl.constexpr,
               SPLIT: tl.constexpr):
    """``dc``: the last verifier's own lanes and block count plus the ``SPLIT - 1`` shares the others
    published under ``tag`` (lanes mod 2**32), and whether all of them are there. Every word is
    read by one thread, all in one round (a relaxed system-scope atomic add of 0 each); the sums over
    the program go to every thread alike, so its warps agree on the poll. A word read by two threads
    could differ between them (a peer rewrites it meanwhile), hence ``SHARE_WORDS`` words, one per
    thread. A share read as it is rewritten may pair one pass's words with another's: each lane
    still matches only over complete rows, so the sum can only fail to match, never match early."""
    tl.static_assert(3 * (SPLIT - 1) <= SHARE_WORDS)
    words = tl.arange(0, SHARE_WORDS)
    live = words < 3 * (SPLIT - 1)
    share = _share_words(state_ptr, source, WORLD, SPLIT)
    got = tl.atomic_add(share + words, tl.zeros([SHARE_WORDS], dtype=tl.int64), mask=live,
                        sem="relaxed", scope="sys")
    got = tl.where(live, got, 0)
    kind = words % 3  # (tag, lane A << 32 | lane B, blocks) per share (publish_share)
    stale = tl.sum(((kind == 0) & live & (got != tag)).to(tl.int32), 0)
    lanes = tl.where(kind == 1, got, 0)
    a = lane_a.to(tl.int64) + tl.sum((lanes >> 32) & 0xFFFFFFFF, 0)
    b = lane_b.to(tl.int64) + tl.sum(lanes & 0xFFFFFFFF, 0)
    n = blocks.to(tl.int64) + tl.sum(tl.where(kind == 2, got, 0), 0)
    return stale == 0, (a & 0xFFFFFFFF).to(tl.uint32), (b & 0xFFFFFFFF).to(tl.uint32), n.to(tl.int32)


@triton.jit
def is_verified(state_ptr, source, epoch, WORLD: tl.constexpr):
    """``dc``: whether ``source``'s batch of call ``epoch`` has been marked verified."""
    return sync.read_once(_verified_words(state_ptr, WORLD) + source, "relaxed") == epoch


@triton.jit
def mark_verified(state_ptr, source, epoch, WORLD: tl.constexpr):
    """``dc``: this rank's verifier has matched ``source``'s batch of call ``epoch``."""
    tl.debug_barrier()
    tl.atomic_xchg(_verified_words(state_ptr, WORLD) + source, epoch, sem="release", scope="gpu")


@triton.jit
def wait_verified(state_ptr, epoch, timeout_ns, err_addr, code, WORLD: tl.constexpr,
                  W_BLOCK: tl.constexpr):
    """``dc``: wait until every source's batch of call ``epoch`` has been matched on this rank."""
    sync.wait_words(_verified_words(state_ptr, WORLD), 1, 1, epoch, timeout_ns, err_addr, code, epoch,
                    WORLD, W_BLOCK, 1, False, True)
