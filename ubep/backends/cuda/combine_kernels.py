"""The CUDA backend's combine: one kernel of two program groups (three in ``dc``) that run at once.

- send group (``n_send`` programs, received (source, token) items strided over them):
  ``reduce="source"`` sends each pair's output row home, to slot ``t * K + k`` of the source's back
  buffer; ``reduce="expert_rank"`` first sums the token's pairs held here, in fp32 in ascending
  ``k``, rounds the sum to the row dtype and sends that one row, to slot ``rank * T_max + t``;
  the group's last program then writes the ``sw``, ``dc`` or ``sp`` records (``sync``, ``records``);
- verify group (``dc`` only, ``SPLIT`` programs per rank, ids between the other two): they poll
  until the rows rank ``p`` sent back match its checksum, each over a share of them (``verify``);
- reduce group (``n_recv`` programs, this rank's tokens strided): takes a step's chunk of all of the
  token's rows as one tile once each row has arrived (its arrival rule, ``wire``; ``dc``: every
  verifier) and sums them in fp32, in ascending ``k`` (or ascending rank), into ``y`` (``sp``:
  then writes the sentinel back); ``GATHER`` (the gate-weight gradient) instead returns each pair's
  row as it is.

The contract rounds every product and every sum (``ubep.reduce``); compilers contract ``acc + w * o``
into a fused multiply-add, so the sums use PTX ``mul.rn.f32`` / ``add.rn.f32``, which cannot be
contracted.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda import records, sync, verify
from ubep.backends.cuda.kernels import INTERPRETED, any_true, lane, part_step, symmetric_base
from ubep.backends.cuda.wire import DC, SP, SW, per_block_row, put_tile, take_tiles, tile, tile_rows

# Row tiles of at most this many 128-byte blocks (8 KiB) sum a token's pairs from masked loads
# without branches.
BRANCHLESS_BLOCKS = tl.constexpr(64)


@triton.jit
def _mul(a, b):
    b = tl.broadcast_to(b, a.shape)
    if INTERPRETED:  # NumPy rounds each operation on its own
        return a * b
    else:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _add(a, b):
    if INTERPRETED:
        return a + b
    else:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _send_item(i, out_ptr, out_bits_ptr, rows_ptr, pair_w_ptr, back_ptrs, rank, slot, epoch,
               tokens_max, rows_max, acc_a, acc_b, acc_n, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
               HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
               CB: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr, SENTINEL: tl.constexpr,
               PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr):
    """Item ``i = s * T_max + t``: the outputs of source ``s``'s token ``t`` go home, as rows
    ``rank * T_max + t`` (``PARTIAL``) or ``t * K + k`` of its back buffer; returns the
    per-destination record sums ``acc_*`` (``[W_BLOCK]``) with this item's share added (dc, sp)."""
    ws = tl.arange(0, acc_a.shape[0])
    s = i // tokens_max
    t = i % tokens_max
    ks = tl.arange(0, K_BLOCK)
    rows = tl.load(rows_ptr + i * TOP_K + ks, mask=ks < TOP_K, other=-1)
    if any_true(rows >= 0):
        back = symmetric_base(back_ptrs, s, out_bits_ptr.dtype.element_ty)
        back += (slot * rows_max) * (NB * BE)
        if PARTIAL:
            weights = tl.load(pair_w_ptr + i * TOP_K + ks, mask=ks < TOP_K, other=0.0)
            home = rank * tokens_max + t
            wire = back + home.to(tl.int64) * (NB * BE)
            lane_a = tl.zeros([], dtype=tl.uint32)
            lane_b = tl.zeros([], dtype=tl.uint32)
            for c in range(0, tl.cdiv(NB, CB)):
                _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB, 1)
                acc = tl.zeros(p_off.shape, dtype=tl.float32)
                for k in tl.static_range(TOP_K):
                    row = lane(rows, ks, k)
                    if CB <= BRANCHLESS_BLOCKS:
                        # Masked loads, no branch per pair: the token's rows load in one run of
                        # code, so the compiler issues them before the sums need them; this pays
                        # at 8 KiB tiles, not at 16 KiB (docs/BENCHMARKS.md).
                        o = tl.load(out_ptr + tl.maximum(row, 0) * HIDDEN + p_off,
                                    mask=is_payload & (row >= 0), other=0.0).to(tl.float32)
                        if WEIGHTED:
                            o = _mul(o, lane(weights, ks, k))
                        acc = tl.where(row >= 0, _add(acc, o), acc)  # a missing pair: acc as is
                    elif row >= 0:
                        o = tl.load(out_ptr + row * HIDDEN + p_off, mask=is_payload, other=0.0)
                        o = o.to(tl.float32)
                        if WEIGHTED:
                            o = _mul(o, lane(weights, ks, k))
                        acc = _add(acc, o)
                bits = acc.to(out_ptr.dtype.element_ty).to(out_bits_ptr.dtype.element_ty, bitcast=True)
                a, b = put_tile(wire, bits, c, epoch, home, True, HIDDEN, BE, FE, NB, CB, 1, MODE,
                                SENTINEL)
                lane_a += a
                lane_b += b
            if MODE >= DC:  # dc and sp keep batch records
                acc_a, acc_b, acc_n = records.add_share(acc_a, acc_b, acc_n, s, ws, lane_a, lane_b, NB)
        else:
            # ROWS of the token's pairs per step, one tile: their rows' loads are in flight at once
            for g in tl.static_range(0, K_BLOCK, ROWS):
                kg = g + tl.arange(0, ROWS)
                rows_g = tl.load(rows_ptr + i * TOP_K + kg, mask=kg < TOP_K, other=-1)
                n_live = tl.sum((rows_g >= 0).to(tl.int32), 0)
                if n_live > 0:
                    row_r = per_block_row(rows_g, CB, ROWS)  # [ROWS * CB, 1], -1: no pair
                    wire_r = t.to(tl.int64) * TOP_K + g + tile_rows(CB, ROWS)
                    for c in range(0, tl.cdiv(NB, CB)):
                        _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB, ROWS)
                        values = tl.load(out_bits_ptr + tl.maximum(row_r, 0) * HIDDEN + p_off,
                                         mask=is_payload & (row_r >= 0), other=0)
                        a, b = put_tile(back + wire_r * (NB * BE), values, c, epoch, wire_r,
                                        row_r >= 0, HIDDEN, BE, FE, NB, CB, ROWS, MODE, SENTINEL)
                        if MODE >= DC:
                            blocks = tl.minimum(NB - c * CB, CB) * n_live
                            acc_a, acc_b, acc_n = records.add_share(acc_a, acc_b, acc_n, s, ws, a,
                                                                    b, blocks)
    return acc_a, acc_b, acc_n


@triton.jit
def _row_group(t, h: tl.constexpr, idx_ptr, w_ptr, sent_ptr, tokens_max, WORLD: tl.constexpr,
               E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, R_BLOCK: tl.constexpr,
               RCB: tl.constexpr, PARTIAL: tl.constexpr):
    """Rows ``h .. h + R_BLOCK - 1`` of token ``t``: its ranks' partial sums (``PARTIAL``) or its
    pairs' rows. ``(valid, slots, peers, weights)``, ``[R_BLOCK]`` each (``weights`` zeros with
    ``PARTIAL``), and ``slot_at``, each block-row's slot ``[R_BLOCK * RCB, 1]`` (from a range:
    Triton then sees that rows start on 128-byte blocks)."""
    ks = h + tl.arange(0, R_BLOCK)
    if PARTIAL:
        valid = tl.load(sent_ptr + ks * tokens_max + t, mask=ks < WORLD, other=0) != 0
        slots = ks * tokens_max + t
        peers = tl.where(valid, ks, 0)
        weights = tl.zeros([R_BLOCK], dtype=tl.float32)
        slot_at = (h + tile_rows(RCB, R_BLOCK)) * tokens_max + t
    else:
        ids = tl.load(idx_ptr + t * TOP_K + ks, mask=ks < TOP_K, other=-1)
        valid = ids >= 0
        slots = t * TOP_K + ks
        peers = tl.where(valid, ids // E_LOCAL, 0)
        weights = tl.load(w_ptr + t * TOP_K + ks, mask=valid, other=0.0)
        slot_at = t * TOP_K + h + tile_rows(RCB, R_BLOCK)
    return valid, slots, peers, weights, slot_at


@triton.jit
def _reduce_token(t, part, back_local, rec_local, idx_ptr, w_ptr, sent_ptr, y_ptr, slot, epoch,
                  tokens_max, deadline, err_addr, WORLD: tl.constexpr, E_LOCAL: tl.constexpr,
                  TOP_K: tl.constexpr, R_BLOCK: tl.constexpr, HIDDEN: tl.constexpr,
                  BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                  RCB: tl.constexpr, PARTS: tl.constexpr, MODE: tl.constexpr,
                  SENTINEL: tl.constexpr, PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr,
                  GATHER: tl.constexpr):
    """Token ``t``'s rows (its ``W`` or ``K``), waited for and summed (or gathered) into ``y``,
    ``RCB`` blocks of every row per step: the step's chunks of ``R_BLOCK`` rows at a time are
    taken as one tile (their loads in flight together, each row checked), then each row's chunk
    is picked out of the tile in registers and summed in ascending order. Waiting for each row
    before loading the next would cost one load latency per row, loading them again after the wait
    would read every row twice; ``tff`` takes at most ``REDUCE_ROWS`` rows at once (a tile of 16
    spills).
    ``deadline`` (ns) ends every row wait of the reducer's tokens. Part ``part`` of ``PARTS``
    takes steps ``part, part + PARTS, ..`` (several reducers share a token)."""
    kr = tl.arange(0, R_BLOCK)
    row_elems: tl.constexpr = NB * BE
    dt: tl.constexpr = y_ptr.dtype.element_ty
    num: tl.constexpr = WORLD if PARTIAL else TOP_K
    us = tl.arange(0, R_BLOCK)[:, None, None]
    # one group (most calls): its rows loaded once per token, not per step (6-19 % off 4096-token
    # source combines; H200, docs/BENCHMARKS.md); several: each group's per step, as holding the
    # first group's across the steps spills
    one: tl.constexpr = num <= R_BLOCK
    if one:
        valid0, slots0, peers0, weights0, slot_at0 = _row_group(t, 0, idx_ptr, w_ptr, sent_ptr,
                                                                tokens_max, WORLD, E_LOCAL, TOP_K,
                                                                R_BLOCK, RCB, PARTIAL)
        live_at0 = per_block_row(valid0.to(tl.int32), RCB, R_BLOCK) != 0
    tl.static_assert((NB + RCB - 1) // RCB % PARTS == 0, "the parts must divide a row's steps")
    for step in range(0, tl.cdiv(NB, RCB) // PARTS):
        c = part_step(step, part, PARTS)
        _, p_row, is_row_payload, _ = tile(c, HIDDEN, BE, FE, NB, RCB, 1)
        acc = tl.zeros(p_row.shape, dtype=tl.float32)
        for h in tl.static_range(0, num, R_BLOCK):
            if one:
                valid, peers, weights, slot_at, live_at = valid0, peers0, weights0, slot_at0, live_at0
            else:
                valid, _, peers, weights, slot_at = _row_group(t, h, idx_ptr, w_ptr, sent_ptr,
                                                               tokens_max, WORLD, E_LOCAL, TOP_K,
                                                               R_BLOCK, RCB, PARTIAL)
                live_at = per_block_row(valid.to(tl.int32), RCB, R_BLOCK) != 0
            bits, p_off, is_payload = take_tiles(back_local + slot_at.to(tl.int64) * row_elems, c,
                                                 epoch, deadline, err_addr, sync.WAIT_ROWS, peers,
                                                 slot_at, rec_local + (slot * WORLD + peers) * 2,
                                                 live_at, HIDDEN, BE, FE, NB, RCB, R_BLOCK, MODE,
                                                 SENTINEL)
            if GATHER:
                y_at = y_ptr + (t * TOP_K + h + tile_rows(RCB, R_BLOCK)).to(tl.int64) * HIDDEN
                tl.store(y_at + p_off, bits.to(dt, bitcast=True), mask=is_payload & live_at)
            else:
                by_row = tl.reshape(bits, (R_BLOCK, RCB, BE))
                for u in tl.static_range(R_BLOCK):
                    if h + u < num:
                        # row u's chunk, exactly: a sum of its integer image and zeros (the row
                        # index is a register's, so the compiler keeps just row u's registers)
                        o = tl.sum(tl.where(us == u, by_row, 0), 0).to(bits.dtype)
                        o = o.to(dt, bitcast=True).to(tl.float32)
                        if WEIGHTED:
                            o = _mul(o, lane(weights, kr, u))
                        acc = tl.where(lane(valid.to(tl.int32), kr, u) != 0, _add(acc, o), acc)
        if not GATHER:
            tl.store(y_ptr + t.to(tl.int64) * HIDDEN + p_row, acc.to(dt), mask=is_row_payload)
    if MODE == SP:
        tl.static_assert(one, "sp's reducers take all of a token's rows at once")
        tl.debug_barrier()  # every thread has read the rows before their markers change
        for u in tl.static_range(num):
            if lane(valid0.to(tl.int32), kr, u) != 0:
                wire = back_local + lane(slots0, kr, u).to(tl.int64) * row_elems
                ck.reset_markers(wire, part, SENTINEL, NB, NB_BLOCK, RCB, PARTS)


@triton.jit
def _verify_role(p, v, out_bits_ptr, idx_ptr, sent_ptr, num_tokens, back_ptrs, rec_ptrs, state_ptr,
                 stamps_ptr, pid, rank, slot, epoch, tokens_max, rows_max, timeout_ns, err_addr,
                 WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                 K_BLOCK: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                 SPLIT: tl.constexpr, STEP: tl.constexpr, PARTIAL: tl.constexpr,
                 PROFILE: tl.constexpr):
    """``dc``: verifier ``v`` (of ``SPLIT``) of the rows rank ``p`` sent back (``verify``),
    ``STEP`` tokens a step."""
    back_local = symmetric_base(back_ptrs, rank, out_bits_ptr.dtype.element_ty)
    back_local += (slot * rows_max) * (NB * BE)
    rec_local = symmetric_base(rec_ptrs, rank, tl.int64)
    verify.verify_returned(p, v, back_local, rec_local, state_ptr, stamps_ptr, pid, idx_ptr, sent_ptr,
                           num_tokens, slot, epoch, tokens_max, timeout_ns, err_addr, WORLD, E_LOCAL,
                           TOP_K, K_BLOCK, NB, NB_BLOCK, SPLIT, STEP, PARTIAL, PROFILE)
    sync.stamp(stamps_ptr, pid, 2, PROFILE)


@triton.jit
def _reduce_role(j, out_bits_ptr, idx_ptr, w_ptr, sent_ptr, num_tokens, back_ptrs, sig_ptrs,
                 rec_ptrs, intent_ptrs, state_ptr, stamps_ptr, y_ptr, pid, rank, slot, epoch,
                 tokens_max, rows_max, timeout_ns, err_addr, n_recv, WORLD: tl.constexpr,
                 W_BLOCK: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, R_BLOCK: tl.constexpr,
                 HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
                 NB_BLOCK: tl.constexpr, RCB: tl.constexpr, RECV_PARTS: tl.constexpr,
                 MODE: tl.constexpr, SENTINEL: tl.constexpr, PARTIAL: tl.constexpr,
                 SUM_WEIGHTED: tl.constexpr, GATHER: tl.constexpr, VERIFY: tl.constexpr,
                 PROFILE: tl.constexpr):
    """Reducer ``j`` of ``n_recv``: part ``j % RECV_PARTS`` of tokens ``j // RECV_PARTS``, then
    every ``n_recv // RECV_PARTS``-th, ``R_BLOCK`` rows at a time, in steps of ``RCB`` blocks."""
    if MODE == SW:
        sig_local = symmetric_base(sig_ptrs, rank, tl.int64)
        sync.wait_record(sig_local, slot, epoch, timeout_ns, err_addr, sync.WAIT_ROWS, WORLD,
                         W_BLOCK)
    if MODE == SP:  # sp rows carry no epoch: the sources' intents say which call sent them
        sync.wait_record(symmetric_base(intent_ptrs, rank, tl.int64), slot, epoch, timeout_ns,
                         err_addr, sync.WAIT_ROWS, WORLD, W_BLOCK)
    if VERIFY:
        records.wait_verified(state_ptr, epoch, timeout_ns, err_addr, sync.WAIT_ROWS, WORLD, W_BLOCK)
    sync.stamp(stamps_ptr, pid, 1, PROFILE)
    back_local = symmetric_base(back_ptrs, rank, out_bits_ptr.dtype.element_ty)
    back_local += (slot * rows_max) * (NB * BE)
    rec_local = symmetric_base(rec_ptrs, rank, tl.int64)
    # one deadline for all of this reducer's row waits: after a peer fails it gives up within one
    # timeout, not one per token
    deadline = sync.now_ns() + timeout_ns
    part = j % RECV_PARTS
    t = j // RECV_PARTS
    while t < num_tokens:
        _reduce_token(t, part, back_local, rec_local, idx_ptr, w_ptr, sent_ptr, y_ptr, slot, epoch,
                      tokens_max, deadline, err_addr, WORLD, E_LOCAL, TOP_K, R_BLOCK, HIDDEN, BE, FE,
                      NB, NB_BLOCK, RCB, RECV_PARTS, MODE, SENTINEL, PARTIAL, SUM_WEIGHTED, GATHER)
        t += n_recv // RECV_PARTS
    sync.stamp(stamps_ptr, pid, 2, PROFILE)


@triton.jit(do_not_specialize=["num_tokens", "rank", "tokens_max", "rows_max", "n_send", "n_recv",
                              "code"])
def combine(out_ptr, out_bits_ptr, rows_ptr, pair_w_ptr, idx_ptr, w_ptr, sent_ptr, num_tokens,
            back_ptrs, sig_ptrs, ack_ptrs, rec_ptrs, intent_ptrs, state_ptr, stamps_ptr, y_ptr, rank,
            tokens_max, rows_max, timeout_ns, err_addr, n_send, n_recv, code, WORLD: tl.constexpr,
            W_BLOCK: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
            HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
            NB_BLOCK: tl.constexpr, CB: tl.constexpr, ROWS: tl.constexpr, R_BLOCK: tl.constexpr,
            RCB: tl.constexpr, RECV_PARTS: tl.constexpr, MODE: tl.constexpr,
            SENTINEL: tl.constexpr, PARTIAL: tl.constexpr,
            WEIGHTED: tl.constexpr, SUM_WEIGHTED: tl.constexpr,
            GATHER: tl.constexpr, VERIFY: tl.constexpr, SPLIT: tl.constexpr,
            VERIFY_STEP: tl.constexpr, FINAL: tl.constexpr, PROFILE: tl.constexpr):
    """One combine (see the module doc): programs ``[0, n_send)`` send, then (``VERIFY``, ``dc``
    only) ``SPLIT`` verify per rank (``VERIFY_STEP`` tokens a step of a share), then ``n_recv``
    reduce; ``FINAL``: this launch ends the call (a combine may run as a send launch, then a reduce
    launch). ``ROWS``: pairs' rows a ``reduce="source"`` sender moves per step (a power of two, at
    most ``K_BLOCK``). ``R_BLOCK``: a token's rows a reducer takes at once (a power of two; a token
    with more, ``W`` with ``PARTIAL``, else ``K``, is taken in groups of ``R_BLOCK``), ``RCB``
    blocks of each per step. ``RECV_PARTS``: reducers per token (1, or 2 where there are at least
    twice as many reducers as tokens: each then takes every other step of one token).

    Expert side: ``out [rows, H]`` (and the same memory as integers, ``out_bits``), the dispatch's
    ``rows`` / ``pair_w [W, T_max, K]``. Source side: ``idx`` / ``w [T * K]``, ``sent [W, T_max]``,
    ``y [T, H]`` (``GATHER``: ``[T, K, H]``). ``WEIGHTED``: the senders weight their partial sums;
    ``SUM_WEIGHTED``: the source weights each pair's row. ``K_BLOCK >= max(K, W)``. Symmetric
    ``back [2, rows_max, NB * BE]`` (out's integer type), ``sig [2, W]``, ``ack [W]``, ``rec [2, W, 2]``
    (the records of ``sw``, and of ``dc`` / ``sp``: ``records``), ``intent [2, W]`` (``sp``: each
    source's call tag for the rows it puts in the slot, ``sync.publish_intent``); ``code``: the
    call's ``ubep.backends.base.call_code`` (``sync.call_tag``); ``state [records.state_words(W, SPLIT)]``:
    this buffer set's epoch words, counters and record sums; ``stamps [programs, 4]`` int64
    (``PROFILE``). ``SENTINEL``: ``sp``'s marker word.
    """
    pid = tl.program_id(0)
    call = sync.call_epoch(state_ptr, pid)
    slot = call & 1
    epoch = sync.call_tag(call, code)  # what this call's flags and records carry
    sync.stamp(stamps_ptr, pid, 0, PROFILE)
    if pid == tl.num_programs(0) - 1:  # the last program, off the senders' path (as in dispatch)
        sync.publish_ack(ack_ptrs, rank, call, WORLD, W_BLOCK)
    if pid < n_send:
        ack_local = symmetric_base(ack_ptrs, rank, tl.int64)
        sync.wait_acks(ack_local, call, timeout_ns, err_addr, sync.WAIT_COMBINE_SLOT,
                       WORLD, W_BLOCK)
        if MODE == SP and pid == 0:  # the slot is free: say which call fills it
            sync.publish_intent(intent_ptrs, slot, rank, epoch, WORLD, W_BLOCK)
        sync.stamp(stamps_ptr, pid, 1, PROFILE)
        acc_a = tl.zeros([W_BLOCK], dtype=tl.uint32)
        acc_b = tl.zeros([W_BLOCK], dtype=tl.uint32)
        acc_n = tl.zeros([W_BLOCK], dtype=tl.int32)
        i = pid
        while i < WORLD * tokens_max:  # while, not range: runtime bounds (also for the interpreter)
            acc_a, acc_b, acc_n = _send_item(i, out_ptr, out_bits_ptr, rows_ptr, pair_w_ptr, back_ptrs,
                                             rank, slot, epoch, tokens_max, rows_max, acc_a, acc_b,
                                             acc_n, TOP_K, K_BLOCK, HIDDEN, BE, FE, NB, CB, ROWS,
                                             MODE, SENTINEL, PARTIAL, WEIGHTED)
            i += n_send
        sync.stamp(stamps_ptr, pid, 2, PROFILE)
        if MODE == SW:
            sync.publish_record(state_ptr, n_send, sig_ptrs, slot, rank, epoch, WORLD, W_BLOCK)
        if MODE >= DC:
            records.publish(state_ptr, n_send, rec_ptrs, acc_a, acc_b, acc_n, slot, rank, epoch, WORLD,
                            W_BLOCK, NB, MODE == SP)
    else:
        j = pid - n_send
        if VERIFY:  # dc: verifiers get ids below every reducer, which wait for them (verify)
            if j < WORLD * SPLIT:
                _verify_role(j // SPLIT, j % SPLIT, out_bits_ptr, idx_ptr, sent_ptr, num_tokens,
                             back_ptrs, rec_ptrs, state_ptr, stamps_ptr, pid, rank, slot, epoch,
                             tokens_max, rows_max, timeout_ns, err_addr, WORLD, E_LOCAL, TOP_K, K_BLOCK,
                             BE, NB, NB_BLOCK, SPLIT, VERIFY_STEP, PARTIAL, PROFILE)
            else:
                _reduce_role(j - WORLD * SPLIT, out_bits_ptr, idx_ptr, w_ptr, sent_ptr, num_tokens,
                             back_ptrs, sig_ptrs, rec_ptrs, intent_ptrs, state_ptr, stamps_ptr, y_ptr, pid,
                             rank, slot, epoch, tokens_max, rows_max, timeout_ns, err_addr, n_recv, WORLD,
                             W_BLOCK, E_LOCAL, TOP_K, R_BLOCK, HIDDEN, BE, FE, NB, NB_BLOCK, RCB,
                             RECV_PARTS, MODE, SENTINEL, PARTIAL, SUM_WEIGHTED, GATHER, VERIFY,
                             PROFILE)
        else:
            _reduce_role(j, out_bits_ptr, idx_ptr, w_ptr, sent_ptr, num_tokens, back_ptrs, sig_ptrs,
                         rec_ptrs, intent_ptrs, state_ptr, stamps_ptr, y_ptr, pid, rank, slot, epoch,
                         tokens_max, rows_max, timeout_ns, err_addr, n_recv, WORLD, W_BLOCK, E_LOCAL,
                         TOP_K, R_BLOCK, HIDDEN, BE, FE, NB, NB_BLOCK, RCB, RECV_PARTS, MODE, SENTINEL,
                         PARTIAL, SUM_WEIGHTED, GATHER, VERIFY, PROFILE)
    if FINAL:
        grid = n_send + n_recv
        if VERIFY:
            grid += WORLD * SPLIT
        sync.end_call(state_ptr, pid, grid, call)
    sync.stamp(stamps_ptr, pid, 3, PROFILE)
