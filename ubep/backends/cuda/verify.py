"""``dc`` verifiers: which rows each source sent this rank, and the poll until their checksum matches.

A ``dc`` batch arrives all at once: verifier ``s`` recomputes the checksum lanes over the markers
this rank holds from source ``s`` (``checksum.wire_lanes``, a few rows per step) until they
match ``s``'s record, then marks ``s`` verified (``records``); every receiver waits for all ``W``
verifiers before it copies. Until the record reads this call's epoch a poll reads just that word
and no rows: a verifier waiting for a peer that has not started then spins on one load instead of
the whole batch (with two processes sharing a GPU, such a kernel kept the GPU from the other
process for a whole timeout, measured; see docs/CUDA.md). A program may wait only for peers and
for programs of lower id in its launch (a GPU need not hold every program of a grid at once, and
schedules lower ids first), so the ``W`` verifiers are programs of their own, with ids below every
receiver's, and wait only for peers.
The verifier knows the rows without asking the sender:

- dispatch (:func:`verify_staged`): staged row ``t`` of source ``s`` arrived when one of its pairs is
  here (a route entry of this call; for ``dispatch_like`` the handle's rows);
- combine (:func:`verify_returned`): rank ``p`` sent back row ``p * T_max + t`` for each token ``t``
  that went to it (``PARTIAL``), else row ``t * K + k`` for each pair on one of its experts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda import records, sync

T_CHUNK = tl.constexpr(16)  # tokens one step of a staged-rows check reads
# Rows one step of a returned-rows check reads. In the combine kernel (W = 2, top-8, 7168 bf16,
# ptxas for sm_90): 32 keep it at 196 registers and no stack, 64 take it to 245, 128 to 255 and
# 1.7 KiB of stack per thread (BENCHMARKS.md, "Kernel resources").
RETURNED_ROWS = tl.constexpr(32)


@triton.jit
def _staged_differs(s, stage_local, route_local, count_local, rows_ptr, rec_local, slot, epoch,
                    tokens_max, WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                    K_BLOCK: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr,
                    NB_BLOCK: tl.constexpr, LIKE: tl.constexpr):
    """``dc``: whether the markers staged from source ``s`` do not match its record (yet). Staged
    row ``t`` was sent here when one of its pairs is (route entries of this call, or the handle's
    rows)."""
    wire = stage_local + ((slot * WORLD + s) * tokens_max).to(tl.int64) * (NB * BE)
    ks = tl.arange(0, K_BLOCK)[None, :]
    if LIKE:
        num = tokens_max
    else:
        num = tl.load(count_local + (slot * WORLD + s) * (E_LOCAL + 1) + E_LOCAL).to(tl.int32)
    has_arrived = records.arrived(rec_local, slot, s, epoch, WORLD)
    num = tl.where(has_arrived, num, 0)  # see the module doc
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    blocks = tl.zeros([], dtype=tl.int32)
    start = 0
    while start < num:  # while, not range: runtime bounds (also for Triton's interpreter)
        t = start + tl.arange(0, T_CHUNK)
        valid = (t[:, None] < num) & (ks < TOP_K)
        if LIKE:
            pairs = tl.load(rows_ptr + (s * tokens_max + t[:, None]) * TOP_K + ks, mask=valid, other=-1)
            here = tl.max((pairs >= 0).to(tl.int32), 1) > 0
        else:
            entry = route_local + (((slot * WORLD + s) * tokens_max + t[:, None]).to(tl.int64) * TOP_K
                                   + ks) * 4
            here = tl.max((tl.load(entry, mask=valid, other=0) == epoch).to(tl.int32), 1) > 0
        a, b, n = ck.wire_lanes(wire, tl.where(here, t, -1), NB, NB_BLOCK)
        lane_a += a
        lane_b += b
        blocks += n
        start += T_CHUNK
    return records.differs(rec_local, slot, s, epoch, has_arrived, lane_a, lane_b, blocks, WORLD)


@triton.jit
def verify_staged(s, stage_local, route_local, count_local, rows_ptr, rec_local, state_ptr, slot,
                  epoch, tokens_max, timeout_ns, err_addr, WORLD: tl.constexpr,
                  E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                  BE: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr, LIKE: tl.constexpr):
    """``dc``: poll until source ``s``'s staged batch matches its record (bounded), then mark it
    verified (also after a timeout, reported, so the receivers do not wait twice)."""
    deadline = sync.now_ns() + timeout_ns
    pending = _staged_differs(s, stage_local, route_local, count_local, rows_ptr, rec_local, slot,
                              epoch, tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, BE, NB, NB_BLOCK,
                              LIKE)
    while pending & (sync.now_ns() < deadline):
        pending = _staged_differs(s, stage_local, route_local, count_local, rows_ptr, rec_local,
                                  slot, epoch, tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, BE, NB,
                                  NB_BLOCK, LIKE)
        deadline = sync.still_due(deadline, err_addr)
    if pending:
        sync.report(err_addr, sync.WAIT_TOKENS, s, epoch)
    records.mark_verified(state_ptr, s, epoch, WORLD)


@triton.jit
def _returned_differs(p, back_local, rec_local, idx_ptr, sent_ptr, num_tokens, slot, epoch,
                      tokens_max, WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                      K_BLOCK: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                      PARTIAL: tl.constexpr):
    """``dc``: whether the markers held from rank ``p`` do not match its record (yet). ``p`` sent
    row ``p * T_max + t`` for each token ``t`` that went to it (``PARTIAL``), else row ``t * K + k``
    for each pair ``k`` of token ``t`` on one of its experts. ``RETURNED_ROWS`` rows per step."""
    STEP: tl.constexpr = RETURNED_ROWS if PARTIAL else RETURNED_ROWS // K_BLOCK  # K_BLOCK <= 16
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    blocks = tl.zeros([], dtype=tl.int32)
    has_arrived = records.arrived(rec_local, slot, p, epoch, WORLD)
    num = tl.where(has_arrived, num_tokens, 0)
    start = 0
    while start < num:
        t = start + tl.arange(0, STEP)
        if PARTIAL:
            sent = tl.load(sent_ptr + p * tokens_max + t, mask=t < num, other=0) != 0
            rows = tl.where(sent, p * tokens_max + t, -1)
        else:
            ks = tl.arange(0, K_BLOCK)[None, :]
            valid = (t[:, None] < num) & (ks < TOP_K)
            ids = tl.load(idx_ptr + t[:, None] * TOP_K + ks, mask=valid, other=-1)
            mine = (ids >= 0) & (ids // E_LOCAL == p)
            rows = tl.reshape(tl.where(mine, t[:, None] * TOP_K + ks, -1), [STEP * K_BLOCK])
        a, b, n = ck.wire_lanes(back_local, rows, NB, NB_BLOCK)
        lane_a += a
        lane_b += b
        blocks += n
        start += STEP
    return records.differs(rec_local, slot, p, epoch, has_arrived, lane_a, lane_b, blocks,
                           WORLD)


@triton.jit
def verify_returned(p, back_local, rec_local, state_ptr, idx_ptr, sent_ptr, num_tokens, slot, epoch,
                    tokens_max, timeout_ns, err_addr, WORLD: tl.constexpr, E_LOCAL: tl.constexpr,
                    TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, NB: tl.constexpr,
                    NB_BLOCK: tl.constexpr, PARTIAL: tl.constexpr):
    """``dc``: poll until rank ``p``'s rows match its record (bounded), then mark them verified (also
    after a timeout, reported, so the reducers do not wait twice)."""
    deadline = sync.now_ns() + timeout_ns
    pending = _returned_differs(p, back_local, rec_local, idx_ptr, sent_ptr, num_tokens, slot, epoch,
                                tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, NB, NB_BLOCK, PARTIAL)
    while pending & (sync.now_ns() < deadline):
        pending = _returned_differs(p, back_local, rec_local, idx_ptr, sent_ptr, num_tokens, slot,
                                    epoch, tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, NB, NB_BLOCK,
                                    PARTIAL)
        deadline = sync.still_due(deadline, err_addr)
    if pending:
        sync.report(err_addr, sync.WAIT_ROWS, p, epoch)
    records.mark_verified(state_ptr, p, epoch, WORLD)
