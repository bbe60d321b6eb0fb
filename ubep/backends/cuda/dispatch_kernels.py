"""The CUDA backend's dispatch: one kernel whose programs split into groups that run at once.

- count group (``n_count`` programs, contiguous ranges of pairs): the stable order of each pair
  within its expert (``ubep.layout.local_order``), written as *route entries* ``(epoch, local
  expert << 32 | order, weight bits)``, and each expert's count, straight into the expert's rank
  (``counting``); the group's last writer then publishes this rank's record on every rank (``sync``);
- token group (``n_send`` programs, tokens strided): each token once to every rank holding one of its
  experts (relay), into the staging slot ``[slot, source, t]``, which needs no offsets, in the wire
  format of the sync mode (``wire``); in ``sw`` the senders count as writers too, so the record
  also says that every row has landed; in ``dc`` / ``sp`` the group's last program writes each
  destination's batch record (``records``);
- verify group (``dc`` only, ``SPLIT`` programs per source, ids between the token and receive
  groups): they poll until source ``s``'s staged batch matches its checksum, each over a share of
  it (``verify``);
- receive group (``n_recv`` programs): waits for every source's record (``dc``: and every
  verifier), turns the count matrix into the first receive row of each (source, local expert)
  (``ubep.layout.row_base``), then copies each staged token into the receive rows of its pairs as
  soon as that token has arrived (``sp``: then writes the sentinel back), and writes each row's gate
  weight (padded layout: 0 on the padding rows).

No grid-wide barrier: the groups meet only through the records and the rows' own arrival rule. The
compact layout runs the kernel twice in one call (counts first; the host then sizes the output), the
padded layout once. ``LIKE`` (combine backward) resends new rows along a handle's recorded routes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda import records, sync, verify
from ubep.backends.cuda.counting import count_role
from ubep.backends.cuda.kernels import any_true, lane, part_step, symmetric_base
from ubep.backends.cuda.wire import DC, SP, per_block_row, store_tile, take_tiles, tile, tile_rows, wire_tile

PAD_STEP = tl.constexpr(256)  # padding weights a receiver zeroes per store (1 per thread)


@triton.jit
def _bit_or(a, b):
    return a | b


@triton.jit
def _send_role(j, x_ptr, idx_ptr, num_tokens, stage_ptrs, sent_ptr, rank, slot, epoch, n_send,
               tokens_max, WORLD: tl.constexpr, W_BLOCK: tl.constexpr, E_LOCAL: tl.constexpr,
               TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, BE: tl.constexpr,
               FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, ROWS: tl.constexpr,
               MODE: tl.constexpr, SENTINEL: tl.constexpr, LIKE: tl.constexpr):
    """Sends tokens ``j, j + n_send, ..``, ``ROWS`` of them per step: each chunk of their rows is
    loaded once, as one tile, then stored to every rank that holds one of the token's experts (a
    program keeps ``ROWS`` rows' loads in flight instead of one). Returns its shares of the batch
    records, ``[W_BLOCK]`` each (lanes and blocks sent per rank; dc and sp only)."""
    ks = tl.arange(0, K_BLOCK)
    ws = tl.arange(0, W_BLOCK)
    us = tl.arange(0, ROWS)
    acc_a = tl.zeros([W_BLOCK], dtype=tl.uint32)
    acc_b = tl.zeros([W_BLOCK], dtype=tl.uint32)
    acc_n = tl.zeros([W_BLOCK], dtype=tl.int32)
    stage_row = (slot * WORLD + rank) * tokens_max
    first = j
    while first < num_tokens:
        ts = first + us * n_send  # [ROWS] this step's tokens
        t_rows = first + tile_rows(CB, ROWS) * n_send  # the same, per block-row of a tile
        live = ts < num_tokens
        # [ROWS, W_BLOCK]: whether each token goes to each rank, once per step
        sent_at = sent_ptr + ws[None, :] * tokens_max + ts[:, None]
        sent_mask = live[:, None] & (ws < WORLD)[None, :]
        if LIKE:
            goes = (tl.load(sent_at, mask=sent_mask, other=0) != 0).to(tl.int32)
        else:
            ids = tl.load(idx_ptr + ts[:, None] * TOP_K + ks[None, :],
                          mask=live[:, None] & (ks < TOP_K)[None, :], other=-1)
            owner = tl.where(ids >= 0, ids // E_LOCAL, -1)[:, :, None]  # [ROWS, K_BLOCK, 1]
            goes = (tl.sum((owner == ws[None, None, :]).to(tl.int32), 1) > 0).to(tl.int32)
            tl.store(sent_at, goes.to(tl.int8), mask=sent_mask)
        # the step's ranks as bits (bit d: rank d), per token and over all of them: a rank's test in
        # the loop below is then a shift, not two reductions over the tile per chunk and rank (W of
        # them in a row before the last rank's stores)
        dest_bits = tl.sum(goes << ws[None, :], 1)  # [ROWS]
        dests = per_block_row(dest_bits, CB, ROWS)  # [ROWS * CB, 1]
        any_dest = tl.reduce(dest_bits, 0, _bit_or)
        # dc and sp keep batch records: each block-row's shares, summed over the chunks, then each
        # rank's with one reduction for all ranks (sums mod 2**32: any order gives the same)
        shares_a = tl.zeros([ROWS * CB, 1], dtype=tl.uint32)
        shares_b = tl.zeros([ROWS * CB, 1], dtype=tl.uint32)
        for c in range(0, tl.cdiv(NB, CB)):
            _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB, ROWS)
            values = tl.load(x_ptr + t_rows.to(tl.int64) * HIDDEN + p_off,
                             mask=is_payload & (t_rows < num_tokens), other=0)
            # the chunk's wire image and record shares are the same for every rank: built once
            wired, block_a, block_b = wire_tile(values, c, epoch, t_rows, HIDDEN, BE, FE, NB, CB,
                                                ROWS, MODE, SENTINEL)
            for dest in tl.static_range(WORLD):
                if ((any_dest >> dest) & 1) != 0:
                    stage = symmetric_base(stage_ptrs, dest, x_ptr.dtype.element_ty)
                    stage += (stage_row + t_rows).to(tl.int64) * (NB * BE)
                    store_tile(stage, wired, c, ((dests >> dest) & 1) != 0, HIDDEN, BE, FE, NB,
                               CB, ROWS)
            shares_a += block_a
            shares_b += block_b
        if MODE >= DC:
            to = ((dests >> ws[None, :]) & 1) != 0  # [ROWS * CB, W_BLOCK]
            acc_a += tl.sum(tl.where(to, shares_a, 0), 0)
            if MODE == DC:
                acc_b += tl.sum(tl.where(to, shares_b, 0), 0)
            acc_n += NB * tl.sum(goes, 0)  # every block of each row sent to each rank
        first += n_send * ROWS
    return acc_a, acc_b, acc_n


@triton.jit
def _row_base(count_local, tpe_ptr, j, slot, capacity, WORLD: tl.constexpr, E_LOCAL: tl.constexpr,
              W_BLOCK: tl.constexpr, L_BLOCK: tl.constexpr, REPLICATE: tl.constexpr):
    """``base [W_BLOCK * L_BLOCK]``: ``base[s * L_BLOCK + l]`` is the first receive row of source
    ``s``'s pairs for local expert ``l`` (``ubep.layout.row_base``), kept in registers: a table in
    memory would cost its receivers a store, a barrier and a load on the way to each row. Receive
    program 0 also writes ``tokens_per_expert``: with ``REPLICATE``, ``tpe [E_LOCAL]`` (the
    handle's counts, nothing after them); without (the compact layout's sizing launch), ``tpe
    [E_LOCAL + 1]`` in pinned host memory, which the host polls for the sum after the counts (the
    output's rows): the sum goes last, with a system-scope release."""
    s = tl.arange(0, W_BLOCK)[:, None]
    loc = tl.arange(0, L_BLOCK)[None, :]
    valid = (s < WORLD) & (loc < E_LOCAL)
    counts = tl.load(count_local + (slot * WORLD + s) * (E_LOCAL + 1) + loc, mask=valid, other=0)
    total = tl.sum(counts, 0)  # [L_BLOCK] rows per local expert
    start = tl.where(capacity > 0, tl.arange(0, L_BLOCK).to(tl.int64) * capacity,
                     tl.cumsum(total, 0) - total)
    base = start[None, :] + tl.cumsum(counts, 0) - counts
    if j == 0:
        lanes = tl.arange(0, L_BLOCK)
        tl.store(tpe_ptr + lanes, total, mask=lanes < E_LOCAL)
        if not REPLICATE:
            tl.debug_barrier()  # the release below covers every thread's stores (a timeout's too)
            sync.store_release_sys(tpe_ptr + E_LOCAL, tl.sum(total, 0))
    return tl.reshape(base, [W_BLOCK * L_BLOCK])


@triton.jit
def _zero_padding(out_w_ptr, recv_w_ptr, count_local, slot, j, n_recv, capacity,
                  WORLD: tl.constexpr, E_LOCAL: tl.constexpr):
    """Padded layout (``capacity > 0``): the weights of local expert ``e``'s padding rows, from its
    row count (the sum of the sources' counts) to ``capacity``, set to 0 in both weight outputs.
    The ``E_LOCAL * capacity`` entries go in spans of ``PAD_STEP``, span ``n_recv - 1 - j`` and
    every ``n_recv``-th after it to receiver ``j``: the last receivers, whose items a small call
    leaves empty, take them first, and no receiver walks expert by expert (a 16-token buffer's 32
    receivers would take 8 experts each). Each entry's count is loaded (the counts have arrived; a
    gather from the receiver's ``[L_BLOCK]`` row totals spills in ``sp``).
    In the kernel, not a memset before it: a CUDA graph of a decode dispatch then holds one
    kernel."""
    offs = tl.arange(0, PAD_STEP)
    zeros = tl.zeros([PAD_STEP], dtype=tl.float32)
    # int64: the entries may come near 2**31 (config.MAX_ROWS), and a span start past them with it
    entries = E_LOCAL * capacity.to(tl.int64)  # 0 in the compact layout, which has no padding
    start = (n_recv - 1 - j).to(tl.int64) * PAD_STEP
    while start < entries:
        at = start + offs
        live = at < entries
        e = tl.where(live, at // tl.maximum(capacity, 1), 0)
        rows = tl.zeros([PAD_STEP], dtype=tl.int64)
        for s in tl.static_range(WORLD):
            rows += tl.load(count_local + (slot * WORLD + s) * (E_LOCAL + 1) + e, mask=live,
                            other=0)
        live &= at - e * capacity >= rows
        tl.store(out_w_ptr + at, zeros, mask=live)
        tl.store(recv_w_ptr + at, zeros, mask=live)
        start += n_recv * PAD_STEP


@triton.jit
def _route_entries(g, route_local, count_local, slot, tokens_max, WORLD: tl.constexpr,
                   E_LOCAL: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                   ROWS: tl.constexpr, LIKE: tl.constexpr):
    """The route entries of items ``g * ROWS + u`` (``_receive_rows``), ``[ROWS, K_BLOCK]`` each:
    ``(pair asked and its token within its source's count, entry epoch, info, weight bits)``. The
    count and all of an entry's words are loaded at once (one round trip, not three): entries past
    the count or of other calls are read, then dropped by their epoch word. ``LIKE``: none (the
    rows come from the handle), nothing loaded."""
    us = tl.arange(0, ROWS)
    ks = tl.arange(0, K_BLOCK)
    items = g * ROWS + us  # [ROWS]
    valid = items < WORLD * tokens_max
    asked = (ks < TOP_K)[None, :] & valid[:, None]
    if LIKE:
        listed = tl.zeros([ROWS, K_BLOCK], dtype=tl.int1)
        entry_epoch = tl.zeros([ROWS, K_BLOCK], dtype=tl.int64)
        info = entry_epoch
        bits = entry_epoch
    else:
        s = tl.where(valid, items // tokens_max, 0)
        t = items % tokens_max
        staged = (slot * WORLD + s) * tokens_max + t
        count_at = count_local + (slot * WORLD + s) * (E_LOCAL + 1) + E_LOCAL
        entry = route_local + (staged.to(tl.int64)[:, None] * TOP_K + ks[None, :]) * 4
        listed = asked & (t < tl.load(count_at, mask=valid, other=0))[:, None]
        entry_epoch = tl.load(entry, mask=asked, other=0)
        info = tl.load(entry + 1, mask=asked, other=0)
        bits = tl.load(entry + 2, mask=asked, other=0)
    return listed, entry_epoch, info, bits


@triton.jit
def _receive_rows(g, part, listed, entry_epoch, info, bits, stage_local, count_local, rec_local,
                  bases, out_ptr, out_w_ptr, recv_w_ptr, rows_ptr, pair_w_ptr, slot, epoch,
                  tokens_max, deadline, err_addr, WORLD: tl.constexpr, E_LOCAL: tl.constexpr,
                  L_BLOCK: tl.constexpr, TOP_K: tl.constexpr, K_BLOCK: tl.constexpr,
                  HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
                  NB_BLOCK: tl.constexpr, CB: tl.constexpr, ROWS: tl.constexpr,
                  PARTS: tl.constexpr, MODE: tl.constexpr, SENTINEL: tl.constexpr,
                  LIKE: tl.constexpr):
    """Items ``i = g * ROWS + u`` (``u < ROWS``; item ``i = s * T_max + t``: staged token ``t`` of
    source ``s``) into their receive rows, given their route entries (``_route_entries``: loaded
    ahead, the first group's with the counts). Adjacent tokens, which senders send at about the
    same time, are loaded as one tile. ``deadline`` (ns) ends every row wait of the receiver's
    items. Part ``part`` of ``PARTS`` moves steps ``part, part + PARTS, ..`` of each row (several
    receivers share a row's stores); part 0 also writes the items' rows and weights."""
    us = tl.arange(0, ROWS)
    ks = tl.arange(0, K_BLOCK)
    kmask = (ks < TOP_K)[None, :]
    items = g * ROWS + us  # [ROWS]
    valid = items < WORLD * tokens_max
    s = tl.where(valid, items // tokens_max, 0)
    t = items % tokens_max
    staged = (slot * WORLD + s) * tokens_max + t
    pairs = items[:, None] * TOP_K + ks[None, :]  # [ROWS, K_BLOCK]
    if LIKE:
        rows = tl.load(rows_ptr + pairs, mask=valid[:, None] & kmask, other=-1)
    else:
        weights = (bits.to(tl.int32)).to(tl.float32, bitcast=True)
        here = listed & (entry_epoch == epoch)
        at = tl.where(here, s[:, None] * L_BLOCK + (info >> 32).to(tl.int32), 0)
        base = tl.reshape(tl.gather(bases, tl.reshape(at, [ROWS * K_BLOCK]), 0), (ROWS, K_BLOCK))
        rows = tl.where(here, base + (info & 0xFFFFFFFF), -1)
        if part == 0:
            tl.store(rows_ptr + pairs, rows, mask=valid[:, None] & kmask)
            tl.store(pair_w_ptr + pairs, tl.where(here, weights, 0.0), mask=valid[:, None] & kmask)
            tl.store(out_w_ptr + rows, weights, mask=here)
            tl.store(recv_w_ptr + rows, weights, mask=here)
    needed = tl.max(rows, 1) >= 0  # [ROWS]: the token has a pair here
    if any_true(needed):
        # per block-row, computed from a range (not spread from `staged`): Triton then sees that
        # rows start on 128-byte blocks, which 16-byte loads need
        items_at = g * ROWS + tile_rows(CB, ROWS)
        s_at = tl.where(items_at < WORLD * tokens_max, items_at // tokens_max, 0)
        wire_at = ((slot * WORLD + s_at) * tokens_max + items_at % tokens_max).to(tl.int64) * (NB * BE)
        live = per_block_row(needed.to(tl.int32), CB, ROWS) != 0
        t_rows = per_block_row(t, CB, ROWS)
        rec = rec_local + (slot * WORLD + s) * 2  # sp: each source's fallback record
        tl.static_assert((NB + CB - 1) // CB % PARTS == 0, "the parts must divide a row's steps")
        for step in range(0, tl.cdiv(NB, CB) // PARTS):
            c = part_step(step, part, PARTS)
            values, p_off, is_payload = take_tiles(stage_local + wire_at, c, epoch, deadline,
                                                   err_addr, sync.WAIT_TOKENS, s, t_rows, rec,
                                                   live, HIDDEN, BE, FE, NB, CB, ROWS, MODE,
                                                   SENTINEL)
            for k in tl.static_range(TOP_K):
                row = per_block_row(tl.sum(tl.where(ks[None, :] == k, rows, 0), 1), CB, ROWS)
                is_placed = is_payload & (row >= 0)
                tl.store(out_ptr + row * HIDDEN + p_off, values, mask=is_placed)
        if MODE == SP:
            tl.debug_barrier()  # every thread has read the rows before their markers change
            for u in tl.static_range(ROWS):
                if lane(needed.to(tl.int32), us, u) != 0:
                    wire = stage_local + lane(staged, us, u).to(tl.int64) * (NB * BE)
                    ck.reset_markers(wire, part, SENTINEL, NB, NB_BLOCK, CB, PARTS)


@triton.jit
def _verify_role(s, v, x_ptr, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs, rec_ptrs, state_ptr, stamps_ptr,
                 rows_ptr, pid, rank, slot, epoch, tokens_max, timeout_ns, err_addr, WORLD: tl.constexpr,
                 W_BLOCK: tl.constexpr, E_LOCAL: tl.constexpr, TOP_K: tl.constexpr,
                 K_BLOCK: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                 SPLIT: tl.constexpr, STEP: tl.constexpr, LIKE: tl.constexpr,
                 RECORDS: tl.constexpr, PROFILE: tl.constexpr):
    """``dc``: verifier ``v`` (of ``SPLIT``) of source ``s``'s staged batch (``verify``), ``STEP``
    tokens a step."""
    count_local = symmetric_base(count_ptrs, rank, tl.int64)
    if RECORDS:  # the route entries and counts say which rows were sent
        sig_local = symmetric_base(sig_ptrs, rank, tl.int64)
        sync.wait_record(sig_local, slot, epoch, timeout_ns, err_addr, sync.WAIT_COUNTS, WORLD, W_BLOCK)
    stage_local = symmetric_base(stage_ptrs, rank, x_ptr.dtype.element_ty)
    route_local = symmetric_base(route_ptrs, rank, tl.int64)
    rec_local = symmetric_base(rec_ptrs, rank, tl.int64)
    verify.verify_staged(s, v, stage_local, route_local, count_local, rows_ptr, rec_local, state_ptr,
                         stamps_ptr, pid, slot, epoch, tokens_max, timeout_ns, err_addr, WORLD,
                         E_LOCAL, TOP_K, K_BLOCK, BE, NB, NB_BLOCK, SPLIT, STEP, LIKE, PROFILE)
    sync.stamp(stamps_ptr, pid, 2, PROFILE)


@triton.jit
def _receive_role(j, x_ptr, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs, rec_ptrs, intent_ptrs,
                  state_ptr, stamps_ptr, out_ptr, out_w_ptr, recv_w_ptr, rows_ptr, pair_w_ptr, tpe_ptr,
                  pid, rank, slot, epoch, tokens_max, capacity, timeout_ns, err_addr, n_recv,
                  WORLD: tl.constexpr, E_LOCAL: tl.constexpr, W_BLOCK: tl.constexpr,
                  L_BLOCK: tl.constexpr,
                  TOP_K: tl.constexpr, K_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, BE: tl.constexpr,
                  FE: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr, CB: tl.constexpr,
                  RECV_ROWS: tl.constexpr, RECV_PARTS: tl.constexpr, MODE: tl.constexpr,
                  SENTINEL: tl.constexpr, LIKE: tl.constexpr, RECORDS: tl.constexpr,
                  REPLICATE: tl.constexpr, VERIFY: tl.constexpr, PROFILE: tl.constexpr):
    """Receiver ``j`` of ``n_recv``: the row bases, then staged items in groups of ``RECV_ROWS``,
    part ``j % RECV_PARTS`` of each of their rows: groups ``j // RECV_PARTS``, then every
    ``n_recv // RECV_PARTS``-th."""
    sig_local = symmetric_base(sig_ptrs, rank, tl.int64)
    count_local = symmetric_base(count_ptrs, rank, tl.int64)
    if RECORDS:
        sync.wait_record(sig_local, slot, epoch, timeout_ns, err_addr,
                         sync.WAIT_TOKENS if LIKE else sync.WAIT_COUNTS, WORLD, W_BLOCK)
    elif MODE == SP:  # sp rows carry no epoch: the sources' intents say which call sent them
        sync.wait_record(symmetric_base(intent_ptrs, rank, tl.int64), slot, epoch, timeout_ns,
                         err_addr, sync.WAIT_TOKENS, WORLD, W_BLOCK)
    if VERIFY:
        records.wait_verified(state_ptr, epoch, timeout_ns, err_addr, sync.WAIT_TOKENS, WORLD, W_BLOCK)
    sync.stamp(stamps_ptr, pid, 1, PROFILE)
    part = j % RECV_PARTS
    g = j // RECV_PARTS
    if REPLICATE:  # the first items' route entries, loaded with the counts: one round trip
        route_local = symmetric_base(route_ptrs, rank, tl.int64)
        listed, entry_epoch, info, bits = _route_entries(g, route_local, count_local, slot,
                                                         tokens_max, WORLD, E_LOCAL, TOP_K, K_BLOCK,
                                                         RECV_ROWS, LIKE)
    if LIKE:  # rows come from the handle
        bases = tl.zeros([W_BLOCK * L_BLOCK], dtype=tl.int64)
    else:
        bases = _row_base(count_local, tpe_ptr, j, slot, capacity, WORLD, E_LOCAL, W_BLOCK, L_BLOCK,
                          REPLICATE)
    if REPLICATE:
        stage_local = symmetric_base(stage_ptrs, rank, x_ptr.dtype.element_ty)
        rec_local = symmetric_base(rec_ptrs, rank, tl.int64)
        # one deadline for all of this receiver's row waits: after a peer fails it gives up within
        # one timeout, not one per item group
        deadline = sync.now_ns() + timeout_ns
        while g * RECV_ROWS < WORLD * tokens_max:
            _receive_rows(g, part, listed, entry_epoch, info, bits, stage_local, count_local,
                          rec_local, bases, out_ptr, out_w_ptr, recv_w_ptr, rows_ptr, pair_w_ptr,
                          slot, epoch, tokens_max, deadline, err_addr, WORLD, E_LOCAL, L_BLOCK,
                          TOP_K, K_BLOCK, HIDDEN, BE, FE, NB, NB_BLOCK, CB, RECV_ROWS, RECV_PARTS,
                          MODE, SENTINEL, LIKE)
            g += n_recv // RECV_PARTS
            listed, entry_epoch, info, bits = _route_entries(g, route_local, count_local, slot,
                                                             tokens_max, WORLD, E_LOCAL, TOP_K,
                                                             K_BLOCK, RECV_ROWS, LIKE)
        if not LIKE:  # after the rows: off their path
            _zero_padding(out_w_ptr, recv_w_ptr, count_local, slot, j, n_recv, capacity, WORLD,
                          E_LOCAL)
    sync.stamp(stamps_ptr, pid, 2, PROFILE)


@triton.jit(do_not_specialize=["num_tokens", "rank", "tokens_max", "capacity", "n_count", "n_send",
                              "n_recv", "n_writers", "code"])
def dispatch(x_ptr, idx_ptr, w_ptr, num_tokens, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs, ack_ptrs,
             rec_ptrs, intent_ptrs, state_ptr, hist_ptr, flags_ptr, stamps_ptr, sent_ptr, out_ptr,
             out_w_ptr, recv_w_ptr, rows_ptr, pair_w_ptr, tpe_ptr, rank, tokens_max, capacity,
             timeout_ns, err_addr, n_count, n_send, n_recv, n_writers, code, WORLD: tl.constexpr,
             E_LOCAL: tl.constexpr, W_BLOCK: tl.constexpr, L_BLOCK: tl.constexpr, TOP_K: tl.constexpr,
             K_BLOCK: tl.constexpr, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
             NB: tl.constexpr, NB_BLOCK: tl.constexpr, CB: tl.constexpr, ROWS: tl.constexpr,
             RECV_ROWS: tl.constexpr, RECV_PARTS: tl.constexpr, E_BLOCK: tl.constexpr,
             CHUNK: tl.constexpr, J_BLOCK: tl.constexpr, N_BLOCK: tl.constexpr,
             PREFIX: tl.constexpr, MODE: tl.constexpr, SENTINEL: tl.constexpr, LIKE: tl.constexpr,
             RECORDS: tl.constexpr,
             REPLICATE: tl.constexpr, VERIFY: tl.constexpr, SPLIT: tl.constexpr,
             VERIFY_STEP: tl.constexpr, FINAL: tl.constexpr, COUNTS_FIRST: tl.constexpr,
             PROFILE: tl.constexpr):
    """One launch of a dispatch (see the module doc); program roles by id: ``[0, n_count)`` count,
    then ``n_send`` token senders, then (``VERIFY``, ``dc`` only) ``SPLIT`` verifiers per source
    (``VERIFY_STEP`` staged tokens a step of a share), then ``n_recv`` receivers. The first
    ``n_writers`` programs (the count group, plus the senders in ``sw``) publish the record;
    receivers wait for it if ``RECORDS``. In ``dc`` / ``sp`` the senders also keep the batch records
    (``records``); ``SENTINEL`` is ``sp``'s marker word.
    ``FINAL``: this launch ends the call (the epoch advances). ``COUNTS_FIRST`` (``tff`` only):
    senders start once this rank's record is out, so the counts lead the tokens. ``NB_BLOCK``:
    ``NB`` rounded up to a power of two (the ``dc`` verifiers and ``sp``'s marker reset). ``ROWS`` /
    ``RECV_ROWS``: rows a sender / receiver moves per step (powers of two). ``PREFIX``: a count
    program whose range starts within this many pairs counts the pairs before it itself
    (``counting``), in one load this wide (the call's pairs, in a power of 2). ``RECV_PARTS``:
    receivers per row (1, or 2 where there are at least twice as many receivers as items: each then
    moves one item's part, ``_receive_rows``). ``code``: the call's ``ubep.backends.base.call_code``;
    its route entries, flags and records carry ``sync.call_tag`` of the epoch and the code, so a
    rank never takes the words of a peer that called another operation (both time out).

    ``x``: ``[T, H]`` viewed as integers; ``idx`` / ``w``: ``[T * K]`` int64 / fp32; symmetric
    buffers by their ``[W]`` base-address tables: ``stage [2, W, T_max, NB * BE]`` (x's integer type),
    ``route [2, W, T_max * K, 4]``, ``count [2, W, E_LOCAL + 1]``, ``sig [2, W]``,
    ``ack [W]``, ``rec [2, W, 2]``, ``intent [2, W]`` (int64; ``sp``: each source's tag for the
    ``dispatch_like`` rows it puts in the slot); ``state [records.state_words(W, SPLIT)]``: this buffer set's
    epoch words, counters and record sums (``sync``, ``records``); ``hist [N_BLOCK, E_BLOCK]`` int32 /
    ``flags [N_BLOCK]`` int64: the count group's scratch (``counting``); ``stamps [programs, 4]`` int64
    (``PROFILE``).
    Outputs: ``sent [W, T_max]`` int8, ``out [rows, H]``, ``out_w [rows]`` and the caller's copy
    ``recv_w [rows]`` (padded: 0 on padding rows), ``rows`` / ``pair_w [W, T_max, K]`` (int64 /
    fp32, -1 / 0 where a pair is not here), ``tpe [E_LOCAL]``.
    """
    pid = tl.program_id(0)
    call = sync.call_epoch(state_ptr, pid)
    slot = call & 1
    epoch = sync.call_tag(call, code)  # what this call's route entries, flags and records carry
    sync.stamp(stamps_ptr, pid, 0, PROFILE)
    if pid == tl.num_programs(0) - 1:
        # the last program, off the count and token groups' path: in the last sender's, ptxas puts
        # the sw decode dispatch kernel 8 bytes on the stack
        sync.publish_ack(ack_ptrs, rank, call, WORLD, W_BLOCK)
    if pid < n_count + n_send:
        ack_local = symmetric_base(ack_ptrs, rank, tl.int64)
        sync.wait_acks(ack_local, call, timeout_ns, err_addr, sync.WAIT_DISPATCH_SLOT,
                       WORLD, W_BLOCK)
        if MODE == SP and LIKE and pid == n_count:  # the slot is free: say which call fills it
            sync.publish_intent(intent_ptrs, slot, rank, epoch, WORLD, W_BLOCK)
        sync.stamp(stamps_ptr, pid, 1, PROFILE)
        if pid < n_count:
            count_role(pid, idx_ptr, w_ptr, num_tokens, route_ptrs, count_ptrs, hist_ptr, flags_ptr,
                       rank, slot, epoch, n_count, tokens_max, timeout_ns, err_addr, WORLD, E_LOCAL,
                       TOP_K, E_BLOCK, CHUNK, J_BLOCK, N_BLOCK, PREFIX)
        else:
            if COUNTS_FIRST:
                sig_local = symmetric_base(sig_ptrs, rank, tl.int64)
                sync.wait_words(sig_local + slot * WORLD + rank, 1, 1, epoch, timeout_ns, err_addr,
                                sync.WAIT_COUNTS, epoch, 1, 1, 1, False, True)
            acc_a, acc_b, acc_n = _send_role(pid - n_count, x_ptr, idx_ptr, num_tokens, stage_ptrs,
                                             sent_ptr, rank, slot, epoch, n_send, tokens_max, WORLD,
                                             W_BLOCK, E_LOCAL, TOP_K, K_BLOCK, HIDDEN, BE, FE, NB, CB,
                                             ROWS, MODE, SENTINEL, LIKE)
            if MODE >= DC:
                records.publish(state_ptr, n_send, rec_ptrs, acc_a, acc_b, acc_n, slot, rank, epoch,
                                WORLD, W_BLOCK, NB, MODE == SP)
        sync.stamp(stamps_ptr, pid, 2, PROFILE)
        if pid < n_writers:
            sync.publish_record(state_ptr, n_writers, sig_ptrs, slot, rank, epoch, WORLD, W_BLOCK)
    else:
        j = pid - n_count - n_send
        if VERIFY:  # dc: verifiers get ids below every receiver, which wait for them (verify)
            if j < WORLD * SPLIT:
                _verify_role(j // SPLIT, j % SPLIT, x_ptr, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs,
                             rec_ptrs, state_ptr, stamps_ptr, rows_ptr, pid, rank, slot, epoch,
                             tokens_max, timeout_ns, err_addr, WORLD, W_BLOCK, E_LOCAL, TOP_K, K_BLOCK,
                             BE, NB, NB_BLOCK, SPLIT, VERIFY_STEP, LIKE, RECORDS, PROFILE)
            else:
                _receive_role(j - WORLD * SPLIT, x_ptr, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs,
                              rec_ptrs, intent_ptrs, state_ptr, stamps_ptr, out_ptr, out_w_ptr,
                              recv_w_ptr, rows_ptr, pair_w_ptr, tpe_ptr, pid, rank, slot, epoch,
                              tokens_max, capacity, timeout_ns, err_addr, n_recv, WORLD, E_LOCAL,
                              W_BLOCK, L_BLOCK, TOP_K, K_BLOCK, HIDDEN, BE, FE, NB, NB_BLOCK, CB,
                              RECV_ROWS, RECV_PARTS, MODE, SENTINEL, LIKE, RECORDS, REPLICATE, VERIFY,
                              PROFILE)
        else:
            _receive_role(j, x_ptr, stage_ptrs, route_ptrs, count_ptrs, sig_ptrs, rec_ptrs,
                          intent_ptrs, state_ptr, stamps_ptr, out_ptr, out_w_ptr, recv_w_ptr, rows_ptr,
                          pair_w_ptr, tpe_ptr, pid, rank, slot, epoch, tokens_max, capacity, timeout_ns,
                          err_addr, n_recv, WORLD, E_LOCAL, W_BLOCK, L_BLOCK, TOP_K, K_BLOCK, HIDDEN,
                          BE, FE, NB, NB_BLOCK, CB, RECV_ROWS, RECV_PARTS, MODE, SENTINEL, LIKE, RECORDS,
                          REPLICATE, VERIFY, PROFILE)
    if FINAL:
        grid = n_count + n_send + n_recv
        if VERIFY:
            grid += WORLD * SPLIT
        sync.end_call(state_ptr, pid, grid, call)
    sync.stamp(stamps_ptr, pid, 3, PROFILE)
