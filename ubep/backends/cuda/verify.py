"""``dc`` verifiers: which rows each source sent this rank, and the poll until their checksum matches.

A ``dc`` batch arrives all at once: ``SPLIT`` verifiers per source ``s`` recompute the checksum lanes
over the markers this rank holds from ``s`` (``checksum.wire_lanes``), each over its share of the
rows (every ``SPLIT``-th step of ``STEP`` tokens: at most ``STAGED_TOKENS``, or ``RETURNED_ROWS``
rows; fewer where that gives every verifier a step, ``geometry.verify_step``), and poll until
the lanes of all shares together match ``s``'s record; then ``s`` is marked verified
(``records``), and every receiver waits for all sources before it copies. One program reading
every marker of a large batch would bound the call (a 32-byte sector per 128-byte block).

How the ``SPLIT`` verifiers of a source meet without waiting on a higher id (a GPU need not hold
every program of a grid at once, and schedules lower ids first): verifiers ``v < SPLIT - 1`` pass
over their share once the record is there and publish its lanes under round 0
(``records.publish_share``), then poll two words only, until the source is marked verified or their
deadline passes, and report nothing; the last one, ``SPLIT - 1``, adds the shares of its round to
its own (``records.add_shares``: lower ids only) and compares the sum with the record. Once it
matches, the last verifier marks the source verified; where every share is in and the sum is wrong
(a row had not landed when some share was read), it asks for the next round
(``records.ask_round``), and each verifier passes over its share once more and publishes it under
that round. It reports a timeout, if any. So the others leave within a poll of the mark instead of
a pass over their share, and read no rows in between. The verifiers are programs of their own,
with ids below every receiver's, and otherwise wait only for peers.

Until the record reads this call's epoch a pass reads just that word and no rows: a verifier waiting
for a peer that has not started spins on one load instead of the whole batch (with two processes
sharing a GPU, whole-batch polls keep the GPU from the other process for a whole timeout). The
verifiers know the rows without asking the sender:

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

# Steps of a verifier's share, at most: STAGED_TOKENS tokens of a staged-rows check, RETURNED_ROWS
# rows of a returned-rows one; smaller where that gives every verifier a step (geometry.verify_step):
# a pass over a share of rows is slow (32 returned rows about 10 µs; H200, docs/BENCHMARKS.md) while
# the verifiers without rows wait. 32 returned rows keep the combine kernel at 196 registers and no
# stack, 128 take it to 255 and 1.7 KiB of stack per thread (W = 2, top-8, 7168 bf16, ptxas for
# sm_90; benchmarks/kernel_resources.py).
STAGED_TOKENS = 16
RETURNED_ROWS = 32


@triton.jit
def _staged_share(s, v, stage_local, route_local, count_local, rows_ptr, rec_local, slot, epoch,
                  tokens_max, WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                  K_BLOCK: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr,
                  NB_BLOCK: tl.constexpr, SPLIT: tl.constexpr, STEP: tl.constexpr,
                  LIKE: tl.constexpr):
    """``(arrived, lane A, lane B, blocks)`` over share ``v`` of the markers staged from source
    ``s`` (no rows read before ``s``'s record has ``arrived``), ``STEP`` tokens a step. Staged row
    ``t`` was sent here when one of its pairs is (route entries of this call, or the handle's
    rows)."""
    wire = stage_local + ((slot * WORLD + s) * tokens_max).to(tl.int64) * (NB * BE)
    ks = tl.arange(0, K_BLOCK)[None, :]
    if LIKE:
        num = tokens_max
    else:
        num = tl.load(count_local + (slot * WORLD + s) * (E_LOCAL + 1) + E_LOCAL).to(tl.int32)
    arrived = records.arrived(rec_local, slot, s, epoch, WORLD)
    num = tl.where(arrived, num, 0)
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    blocks = tl.zeros([], dtype=tl.int32)
    start = v * STEP
    while start < num:  # while, not range: runtime bounds (also for Triton's interpreter)
        t = start + tl.arange(0, STEP)
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
        start += SPLIT * STEP
    return arrived, lane_a, lane_b, blocks


@triton.jit
def _returned_share(p, v, back_local, rec_local, idx_ptr, sent_ptr, num_tokens, slot, epoch,
                    tokens_max, WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                    K_BLOCK: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                    SPLIT: tl.constexpr, STEP: tl.constexpr, PARTIAL: tl.constexpr):
    """``(arrived, lane A, lane B, blocks)`` over share ``v`` of the markers held from rank ``p``
    (no rows read before ``p``'s record has ``arrived``). ``p`` sent row ``p * T_max + t`` for each
    token ``t`` that went to it (``PARTIAL``), else row ``t * K + k`` for each pair ``k`` of token
    ``t`` on one of its experts. ``STEP`` tokens per step, every ``SPLIT``-th step."""
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    blocks = tl.zeros([], dtype=tl.int32)
    arrived = records.arrived(rec_local, slot, p, epoch, WORLD)
    num = tl.where(arrived, num_tokens, 0)
    start = v * STEP
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
        start += SPLIT * STEP
    return arrived, lane_a, lane_b, blocks


@triton.jit
def _settle(state_ptr, rec_local, slot, s, v, epoch, round, fresh, arrived, lane_a, lane_b, blocks,
            WORLD: tl.constexpr, SPLIT: tl.constexpr):
    """After a poll of verifier ``v`` of source ``s`` (``fresh``: it passed over its share, whose
    lanes are given, in round ``round``): ``(pending, again, round)``, whether it polls on, whether
    its next poll passes over its share again, and that pass's round. The last verifier adds the
    others' shares of its round to its own; where all are in, the record there and the sum wrong (a
    row had not landed when some share was read), it asks for a new round and reads its own share
    again. The others publish each pass, then read only the verified word and the ask until one of
    them changes."""
    if v == SPLIT - 1:
        ready, a, b, n = records.add_shares(state_ptr, s, records.share_tag(epoch, round), lane_a,
                                            lane_b, blocks, WORLD, SPLIT)
        differs = records.differs(rec_local, slot, s, epoch, arrived, a, b, n, WORLD)
        pending = (ready == 0) | differs
        ask = (ready != 0) & (arrived != 0) & differs
        if ask:
            round += 1
            records.ask_round(state_ptr, s, records.share_tag(epoch, round), WORLD)
        again = (arrived == 0) | ask
    else:
        if fresh & (arrived != 0):
            records.publish_share(state_ptr, s, v, records.share_tag(epoch, round), lane_a, lane_b,
                                  blocks, WORLD, SPLIT)
        pending = records.is_verified(state_ptr, s, epoch, WORLD) == 0
        asked = records.asked_round(state_ptr, s, epoch, WORLD)
        again = pending & ((arrived == 0) | (asked != round))
        round = tl.where(again & (arrived != 0), asked, round)
    return pending, again, round


@triton.jit
def _finish(state_ptr, err_addr, code, s, v, epoch, pending, WORLD: tl.constexpr,
            SPLIT: tl.constexpr):
    """The last verifier of ``s`` reports a timeout, if any, and marks ``s`` verified (after a
    timeout too, so the receivers do not wait twice)."""
    if v == SPLIT - 1:
        if pending:
            sync.report(err_addr, code, s, epoch)
        records.mark_verified(state_ptr, s, epoch, WORLD)


@triton.jit
def _stamp_first_pass(stamps_ptr, pid, arrived, stamped, PROFILE: tl.constexpr):
    """With ``PROFILE``: a verifier's stamp 1 (its "wait") when it has passed over its share of an
    arrived batch for the first time; then later passes (rounds asked for) show as the time between
    it and the verifier's end. Returns whether it has stamped (a verifier that never saw its batch,
    a timeout, stamps when its poll ends: :func:`_stamp_unseen`)."""
    if (arrived != 0) & (stamped == 0):
        sync.stamp(stamps_ptr, pid, 1, PROFILE)
    return stamped | (arrived != 0).to(tl.int32)


@triton.jit
def _stamp_unseen(stamps_ptr, pid, stamped, PROFILE: tl.constexpr):
    """With ``PROFILE``: stamp 1 of a verifier whose batch never arrived, when its poll ends."""
    if stamped == 0:
        sync.stamp(stamps_ptr, pid, 1, PROFILE)


@triton.jit
def verify_staged(s, v, stage_local, route_local, count_local, rows_ptr, rec_local, state_ptr,
                  stamps_ptr, pid, slot, epoch, tokens_max, timeout_ns, err_addr,
                  WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                  K_BLOCK: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr,
                  NB_BLOCK: tl.constexpr, SPLIT: tl.constexpr, STEP: tl.constexpr,
                  LIKE: tl.constexpr, PROFILE: tl.constexpr):
    """``dc``: verifier ``v`` of source ``s``'s staged batch (module doc), bounded by the timeout;
    program ``pid`` of the launch (its stamps)."""
    deadline = sync.now_ns() + timeout_ns
    round = tl.zeros([], dtype=tl.int32)
    arrived, a, b, n = _staged_share(s, v, stage_local, route_local, count_local, rows_ptr, rec_local,
                                     slot, epoch, tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, BE, NB,
                                     NB_BLOCK, SPLIT, STEP, LIKE)
    stamped = _stamp_first_pass(stamps_ptr, pid, arrived, tl.zeros([], dtype=tl.int32), PROFILE)
    pending, again, round = _settle(state_ptr, rec_local, slot, s, v, epoch, round, True, arrived,
                                    a, b, n, WORLD, SPLIT)
    while pending & (sync.now_ns() < deadline):
        if again:
            arrived, a, b, n = _staged_share(s, v, stage_local, route_local, count_local, rows_ptr,
                                             rec_local, slot, epoch, tokens_max, WORLD, E_LOCAL,
                                             TOP_K, K_BLOCK, BE, NB, NB_BLOCK, SPLIT, STEP, LIKE)
            stamped = _stamp_first_pass(stamps_ptr, pid, arrived, stamped, PROFILE)
        pending, again, round = _settle(state_ptr, rec_local, slot, s, v, epoch, round, again,
                                        arrived, a, b, n, WORLD, SPLIT)
        deadline = sync.still_due(deadline, err_addr)
    _stamp_unseen(stamps_ptr, pid, stamped, PROFILE)
    _finish(state_ptr, err_addr, sync.WAIT_TOKENS, s, v, epoch, pending, WORLD, SPLIT)


@triton.jit
def verify_returned(p, v, back_local, rec_local, state_ptr, stamps_ptr, pid, idx_ptr, sent_ptr,
                    num_tokens, slot, epoch, tokens_max, timeout_ns, err_addr, WORLD: tl.constexpr,
                    E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                    NB: tl.constexpr, NB_BLOCK: tl.constexpr, SPLIT: tl.constexpr,
                    STEP: tl.constexpr, PARTIAL: tl.constexpr, PROFILE: tl.constexpr):
    """``dc``: verifier ``v`` of the rows rank ``p`` sent back (module doc), bounded by the
    timeout; program ``pid`` of the launch (its stamps)."""
    deadline = sync.now_ns() + timeout_ns
    round = tl.zeros([], dtype=tl.int32)
    arrived, a, b, n = _returned_share(p, v, back_local, rec_local, idx_ptr, sent_ptr, num_tokens,
                                       slot, epoch, tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK, NB,
                                       NB_BLOCK, SPLIT, STEP, PARTIAL)
    stamped = _stamp_first_pass(stamps_ptr, pid, arrived, tl.zeros([], dtype=tl.int32), PROFILE)
    pending, again, round = _settle(state_ptr, rec_local, slot, p, v, epoch, round, True, arrived,
                                    a, b, n, WORLD, SPLIT)
    while pending & (sync.now_ns() < deadline):
        if again:
            arrived, a, b, n = _returned_share(p, v, back_local, rec_local, idx_ptr, sent_ptr,
                                               num_tokens, slot, epoch, tokens_max, WORLD, E_LOCAL,
                                               TOP_K, K_BLOCK, NB, NB_BLOCK, SPLIT, STEP, PARTIAL)
            stamped = _stamp_first_pass(stamps_ptr, pid, arrived, stamped, PROFILE)
        pending, again, round = _settle(state_ptr, rec_local, slot, p, v, epoch, round, again,
                                        arrived, a, b, n, WORLD, SPLIT)
        deadline = sync.still_due(deadline, err_addr)
    _stamp_unseen(stamps_ptr, pid, stamped, PROFILE)
    _finish(state_ptr, err_addr, sync.WAIT_ROWS, p, v, epoch, pending, WORLD, SPLIT)
