"""The dispatch's count group: every pair's stable order within its expert, in one pass over the pairs.

The contract orders an expert's received rows by (source rank, token, k) (``ubep.layout.local_order``):
pair ``p`` of expert ``e`` gets order = the number of pairs of ``e`` before ``p`` on this rank. The
count programs split the pairs into contiguous ranges (program ``j`` the ``j``-th) and:

1. count their range's pairs per expert (``hist [E]``), store that row and flag it done;
2. wait for the flags of the programs with lower ids only (lower ids are scheduled first), and add
   their rows: ``base[e]``, the pairs of ``e`` before the range. A range that starts within the
   first ``PREFIX`` pairs counts the pairs before it itself instead, in one load (decode: one round
   trip instead of a row store, a flag, a wait and a load); where no program of the call waits,
   step 1 is skipped;
3. walk the range in chunks of ``CHUNK`` pairs: order = ``base[e]`` + pairs of ``e`` earlier in the
   chunk (a ``[CHUNK, CHUNK]`` comparison) and write the route entry ``(epoch, local expert << 32 |
   order, weight bits)`` straight into the expert's rank, then add the chunk to ``base``;
4. the last program, which has every row, writes each rank's counts.

Work per program is ``T * K / n_count`` pairs plus the rows it adds (``j * E``); a scan per expert
would cost ``T * K`` per expert.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import sync


@triton.jit
def _range_hist(idx_ptr, first, last, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """``[E_BLOCK]`` int32: pairs ``[first, last)`` per expert."""
    offs = tl.arange(0, CHUNK)
    hist = tl.zeros([E_BLOCK], dtype=tl.int32)
    start = first
    while start < last:  # while, not range: runtime bounds (also for Triton's interpreter)
        pair = start + offs
        ids = tl.load(idx_ptr + pair, mask=pair < last, other=-1)
        hist += tl.histogram(tl.maximum(ids, 0).to(tl.int32), E_BLOCK, mask=ids >= 0)
        start += CHUNK
    return hist


@triton.jit
def _rows_before(hist_ptr, j, E_BLOCK: tl.constexpr, J_BLOCK: tl.constexpr):
    """``[E_BLOCK]`` int32: the sum of rows ``[0, j)`` of ``hist [n_count, E_BLOCK]``."""
    es = tl.arange(0, E_BLOCK)[None, :]
    total = tl.zeros([E_BLOCK], dtype=tl.int32)
    q0 = 0
    while q0 < j:
        q = q0 + tl.arange(0, J_BLOCK)[:, None]
        total += tl.sum(tl.load(hist_ptr + q * E_BLOCK + es, mask=q < j, other=0), 0).to(tl.int32)
        q0 += J_BLOCK
    return total


@triton.jit
def count_role(j, idx_ptr, w_ptr, num_tokens, route_ptrs, count_ptrs, hist_ptr, flags_ptr, rank,
               slot, epoch, n_count, tokens_max, timeout_ns, err_addr, WORLD: tl.constexpr,
               E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, E_BLOCK: tl.constexpr,
               CHUNK: tl.constexpr, J_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr,
               PREFIX: tl.constexpr):
    """Count program ``j`` of ``n_count`` (see the module doc). ``idx`` / ``w``: ``[T * K]`` int64 /
    fp32; ``hist [n_count, E_BLOCK]`` int32 and ``flags [N_BLOCK]`` int64: this GPU's scratch."""
    num_pairs = num_tokens * TOP_K
    per = tl.cdiv(tl.cdiv(num_pairs, CHUNK), n_count) * CHUNK
    first = tl.minimum(j * per, num_pairs)
    last = tl.minimum(first + per, num_pairs)
    es = tl.arange(0, E_BLOCK)
    if (n_count - 1) * per > PREFIX:  # some program of this call waits for the rows before it
        # loads PREFIX pairs wide: a long range (few count programs, under an SM budget) in a few
        # round trips, not one per CHUNK
        mine = _range_hist(idx_ptr, first, last, E_BLOCK, PREFIX)
        tl.store(hist_ptr + j * E_BLOCK + es, mine)
        tl.debug_barrier()  # the row is stored before the flag is released
        tl.atomic_xchg(flags_ptr + j, epoch, sem="release", scope="gpu")
    if first <= PREFIX:
        base = _range_hist(idx_ptr, 0, first, E_BLOCK, PREFIX)
    else:
        sync.wait_words(flags_ptr, 0, j, epoch, timeout_ns, err_addr, sync.WAIT_COUNTS, epoch, 1, 1,
                        N_BLOCK, False, False)
        base = _rows_before(hist_ptr, j, E_BLOCK, J_BLOCK)
    offs = tl.arange(0, CHUNK)
    earlier = offs[None, :] < offs[:, None]  # [p, q]: q comes before p
    stage = (slot * WORLD + rank).to(tl.int64) * tokens_max * TOP_K * 4
    # each expert's route buffer, gathered per pair, and weights loaded beside the ids: a step waits
    # for one round trip (its ids), not two (then the weights and the route buffer)
    routes = tl.load(route_ptrs + es // E_LOCAL, mask=es < WORLD * E_LOCAL, other=0)
    start = first
    while start < last:
        pair = start + offs
        bits = tl.load(w_ptr + pair, mask=pair < last, other=0.0).to(tl.int32, bitcast=True)
        ids = tl.load(idx_ptr + pair, mask=pair < last, other=-1)
        valid = ids >= 0
        e = tl.maximum(ids, 0).to(tl.int32)
        same = (ids[:, None] == ids[None, :]) & earlier
        order = tl.gather(base, e, 0) + tl.sum(same.to(tl.int32), 1)
        entry = tl.gather(routes, e, 0).to(tl.pointer_type(tl.int64)) + stage + pair.to(tl.int64) * 4
        tl.store(entry, tl.zeros_like(ids) + epoch, mask=valid)
        tl.store(entry + 1, ((e % E_LOCAL).to(tl.int64) << 32) | order.to(tl.int64), mask=valid)
        tl.store(entry + 2, bits.to(tl.int64) & 0xFFFFFFFF, mask=valid)
        base += tl.histogram(e, E_BLOCK, mask=valid)
        start += CHUNK
    if j == n_count - 1:  # base now holds every pair of this rank: the counts
        count = tl.load(count_ptrs + es // E_LOCAL, mask=es < WORLD * E_LOCAL, other=0)
        count = count.to(tl.pointer_type(tl.int64)) + (slot * WORLD + rank) * (E_LOCAL + 1)
        tl.store(count + es % E_LOCAL, base.to(tl.int64), mask=es < WORLD * E_LOCAL)
        # each rank's token count after its experts' counts, stored by its first expert's lane
        first_local = (es < WORLD * E_LOCAL) & (es % E_LOCAL == 0)
        tl.store(count + E_LOCAL, tl.zeros_like(es).to(tl.int64) + num_tokens, mask=first_local)
