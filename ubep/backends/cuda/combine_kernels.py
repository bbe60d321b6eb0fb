"""The CUDA backend's combine: one kernel of two program groups that run at once.

- send group (``n_send`` programs, received (source, token) items strided over them):
  ``reduce="source"`` sends each pair's output row home, to slot ``t * K + k`` of the source's back
  buffer; ``reduce="expert_rank"`` first sums the token's pairs held here, in fp32 in ascending
  ``k``, rounds the sum to the row dtype and sends that one row, to slot ``rank * T_max + t``;
- reduce group (``n_recv`` programs, this rank's tokens strided): waits for each of the token's rows
  (its arrival rule, ``wire``) and sums them in fp32, in ascending ``k`` (or ascending rank), into
  ``y``; ``GATHER`` (the gate-weight gradient) instead returns each pair's row as it is.

The contract rounds every product and every sum (``ubep.reduce``); compilers contract ``acc + w * o``
into a fused multiply-add, so the sums use PTX ``mul.rn.f32`` / ``add.rn.f32``, which cannot be
contracted.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import sync
from ubep.backends.cuda.kernels import INTERPRETED, any_true, lane, symmetric_base
from ubep.backends.cuda.wire import TFF, copy_row, put_tile, take_tile, tile


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
               tokens_max, rows_max, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
               HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
               CB: tl.constexpr, PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr):
    """Item ``i = s * T_max + t``: the outputs of source ``s``'s token ``t`` go home."""
    s = i // tokens_max
    t = i % tokens_max
    ks = tl.arange(0, K_BLOCK)
    rows = tl.load(rows_ptr + i * TOP_K + ks, mask=ks < TOP_K, other=-1)
    if any_true(rows >= 0):
        back = symmetric_base(back_ptrs, s, out_bits_ptr.dtype.element_ty)
        back += (slot * rows_max) * (NB * BE)
        if PARTIAL:
            weights = tl.load(pair_w_ptr + i * TOP_K + ks, mask=ks < TOP_K, other=0.0)
            wire = back + (rank * tokens_max + t).to(tl.int64) * (NB * BE)
            for c in range(0, tl.cdiv(NB, CB)):
                _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB)
                acc = tl.zeros(p_off.shape, dtype=tl.float32)
                for k in tl.static_range(TOP_K):
                    row = lane(rows, ks, k)
                    if row >= 0:
                        o = tl.load(out_ptr + row * HIDDEN + p_off, mask=is_payload, other=0.0)
                        o = o.to(tl.float32)
                        if WEIGHTED:
                            o = _mul(o, lane(weights, ks, k))
                        acc = _add(acc, o)
                bits = acc.to(out_ptr.dtype.element_ty).to(out_bits_ptr.dtype.element_ty, bitcast=True)
                put_tile(wire, bits, c, epoch, HIDDEN, BE, FE, NB, CB)
        else:
            for k in tl.static_range(TOP_K):
                row = lane(rows, ks, k)
                if row >= 0:
                    wire = back + (t.to(tl.int64) * TOP_K + k) * (NB * BE)
                    copy_row(out_bits_ptr + row * HIDDEN, wire, epoch, HIDDEN, BE, FE, NB, CB)


@triton.jit
def _reduce_token(t, back_local, idx_ptr, w_ptr, sent_ptr, y_ptr, epoch, tokens_max, timeout_ns,
                  err_addr, WORLD: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                  K_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
                  NB: tl.constexpr, CB: tl.constexpr,
                  PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr, GATHER: tl.constexpr):
    """Token ``t``'s rows, waited for and summed (or gathered) into ``y``."""
    ks = tl.arange(0, K_BLOCK)
    row_elems: tl.constexpr = NB * BE
    dt: tl.constexpr = y_ptr.dtype.element_ty
    if PARTIAL:
        num: tl.constexpr = WORLD
        valid = tl.load(sent_ptr + ks * tokens_max + t, mask=ks < WORLD, other=0) != 0
        slots = ks * tokens_max + t
        peers = ks
    else:
        num: tl.constexpr = TOP_K
        ids = tl.load(idx_ptr + t * TOP_K + ks, mask=ks < TOP_K, other=-1)
        valid = ids >= 0
        slots = t * TOP_K + ks
        peers = ids // E_LOCAL
        weights = tl.load(w_ptr + t * TOP_K + ks, mask=valid, other=0.0)
    deadline = sync.now_ns() + timeout_ns
    for c in range(0, tl.cdiv(NB, CB)):
        _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB)
        acc = tl.zeros(p_off.shape, dtype=tl.float32)
        for j in tl.static_range(num):
            if lane(valid.to(tl.int32), ks, j) != 0:
                wire = back_local + lane(slots, ks, j).to(tl.int64) * row_elems
                bits, _, _ = take_tile(wire, c, epoch, deadline, err_addr, sync.WAIT_ROWS,
                                       lane(peers, ks, j), HIDDEN, BE, FE, NB, CB)
                o = bits.to(dt, bitcast=True)
                if GATHER:
                    tl.store(y_ptr + (t * TOP_K + j).to(tl.int64) * HIDDEN + p_off, o, mask=is_payload)
                else:
                    o = o.to(tl.float32)
                    if WEIGHTED:
                        o = _mul(o, lane(weights, ks, j))
                    acc = _add(acc, o)
        if not GATHER:
            tl.store(y_ptr + t.to(tl.int64) * HIDDEN + p_off, acc.to(dt), mask=is_payload)


@triton.jit(do_not_specialize=["num_tokens", "rank", "tokens_max", "rows_max", "n_send", "n_recv",
                              "n_consumers"])
def combine(out_ptr, out_bits_ptr, rows_ptr, pair_w_ptr, idx_ptr, w_ptr, sent_ptr, num_tokens,
            back_ptrs, sig_ptrs, ack_ptrs, state_ptr, stamps_ptr, y_ptr, rank, tokens_max, rows_max,
            timeout_ns, err_addr, n_send, n_recv, n_consumers, WORLD: tl.constexpr, W_BLOCK: tl.constexpr,
            E_LOCAL: tl.constexpr,
            TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, BE: tl.constexpr,
            FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr,
            MODE: tl.constexpr, PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr,
            SUM_WEIGHTED: tl.constexpr, GATHER: tl.constexpr, FINAL: tl.constexpr,
            PROFILE: tl.constexpr):
    """One combine (see the module doc): programs ``[0, n_send)`` send, the next ``n_recv`` reduce;
    ``FINAL``: this launch ends the call (a combine may run as a send launch, then a reduce launch).

    Expert side: ``out [rows, H]`` (and the same memory as integers, ``out_bits``), the dispatch's
    ``rows`` / ``pair_w [W, T_max, K]``. Source side: ``idx`` / ``w [T * K]``, ``sent [W, T_max]``,
    ``y [T, H]`` (``GATHER``: ``[T, K, H]``). ``WEIGHTED``: the senders weight their partial sums;
    ``SUM_WEIGHTED``: the source weights each pair's row. ``K_BLOCK >= max(K, W)``. Symmetric
    ``back [2, rows_max, NB * BE]`` (out's integer type), ``sig [2, W]``, ``ack [W]``;
    ``state [STATE_WORDS]``: this buffer set's epoch words and writers' counter; ``stamps [programs,
    4]`` int64 (``PROFILE``).
    """
    pid = tl.program_id(0)
    epoch = sync.call_epoch(state_ptr, pid)
    slot = epoch & 1
    sync.stamp(stamps_ptr, pid, 0, PROFILE)
    if pid < n_send:
        ack_local = symmetric_base(ack_ptrs, rank, tl.int64)
        sync.wait_acks(ack_local, epoch, n_consumers, timeout_ns, err_addr, sync.WAIT_COMBINE_SLOT,
                       WORLD, W_BLOCK)
        sync.stamp(stamps_ptr, pid, 1, PROFILE)
        i = pid
        while i < WORLD * tokens_max:  # while, not range: runtime bounds (also for the interpreter)
            _send_item(i, out_ptr, out_bits_ptr, rows_ptr, pair_w_ptr, back_ptrs, rank, slot, epoch,
                       tokens_max, rows_max, TOP_K, K_BLOCK, HIDDEN, BE, FE, NB, CB, PARTIAL,
                       WEIGHTED)
            i += n_send
        sync.stamp(stamps_ptr, pid, 2, PROFILE)
        if MODE != TFF:
            sync.publish_record(state_ptr, n_send, sig_ptrs, slot, rank, epoch, WORLD)
    else:
        if MODE != TFF:
            sig_local = symmetric_base(sig_ptrs, rank, tl.int64)
            sync.wait_record(sig_local, slot, epoch, timeout_ns, err_addr, sync.WAIT_ROWS, WORLD,
                             W_BLOCK)
        sync.stamp(stamps_ptr, pid, 1, PROFILE)
        back_local = symmetric_base(back_ptrs, rank, out_bits_ptr.dtype.element_ty)
        back_local += (slot * rows_max) * (NB * BE)
        t = pid - n_send
        while t < num_tokens:
            _reduce_token(t, back_local, idx_ptr, w_ptr, sent_ptr, y_ptr, epoch, tokens_max,
                          timeout_ns, err_addr, WORLD, E_LOCAL, TOP_K, K_BLOCK, HIDDEN, BE, FE, NB,
                          CB, PARTIAL, SUM_WEIGHTED, GATHER)
            t += n_recv
        sync.stamp(stamps_ptr, pid, 2, PROFILE)
        sync.publish_ack(ack_ptrs, rank, WORLD)
    if FINAL:
        sync.end_call(state_ptr, pid, n_send + n_recv, epoch)
    sync.stamp(stamps_ptr, pid, 3, PROFILE)
