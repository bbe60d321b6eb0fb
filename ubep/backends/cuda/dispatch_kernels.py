"""The CUDA backend's dispatch in four Triton kernels (plus the barriers between them).

1. ``count_and_order`` (one program per expert): the expert's pair count and the stable order of
   each of its pairs (``ubep.layout.local_order``), and the count written into every rank's count
   matrix row of this source (so the count exchange is part of the kernel);
2. ``row_base`` (one program per expert): this source's first receive row for the expert, from the
   full count matrix (``ubep.layout.row_base``);
3. ``send`` (one program per (token, rank)): the token's routing row to that rank (rows of its
   pairs held there, or -1, and its gate weights), and the token itself once if any pair is there;
4. ``replicate`` (one program per staged (source, token)): every pair's row copied into its receive
   row, with its weight; the routing rows are kept for combine.

Every kernel reproduces ``ubep.layout`` exactly; tests compare them on the CPU with Triton's
interpreter and on GPUs against the oracle.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def count_and_order(idx_ptr, num_pairs, num_tokens, order_ptr, meta_ptrs_ptr, rank,
                    WORLD: tl.constexpr, MAX_PAIRS: tl.constexpr, num_experts: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Program ``e``: ``order[p]`` for each pair ``p`` of expert ``e`` (pairs earlier in ``(t, k)``
    order with the same expert), and ``meta[r][rank, e] = count`` on every rank ``r``; program 0
    also writes the token count, ``meta[r][rank, E] = T``."""
    e = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    seen = tl.zeros([], dtype=tl.int64)
    for start in range(0, MAX_PAIRS, BLOCK):  # a fixed bound: one compilation per buffer
        mask = start + offs < num_pairs
        ids = tl.load(idx_ptr + start + offs, mask=mask, other=-1)
        mine = (ids == e).to(tl.int64)
        order = seen + tl.cumsum(mine, 0) - mine
        tl.store(order_ptr + start + offs, order, mask=mask & (ids == e))
        seen += tl.sum(mine, 0)
    row = rank * (num_experts + 1)
    for r in tl.static_range(WORLD):
        meta = tl.load(meta_ptrs_ptr + r).to(tl.pointer_type(tl.int64))
        tl.store(meta + row + e, seen)
        if e == 0:
            tl.store(meta + row + num_experts, num_tokens.to(tl.int64))


@triton.jit
def row_base(meta_ptr, base_ptr, rank, capacity, WORLD: tl.constexpr, NUM_LOCAL: tl.constexpr,
             LOCAL_BLOCK: tl.constexpr, num_experts: tl.constexpr):
    """Program ``e``: ``base[e]`` = the first receive row, on ``e``'s rank, of this source's pairs
    for ``e``: earlier local experts' rows (compact, ``capacity <= 0``) or ``local * capacity``
    (padded), plus earlier sources' counts for ``e``. ``meta`` is ``[W, E + 1]`` int64."""
    e = tl.program_id(0)
    stride = num_experts + 1
    local = e % NUM_LOCAL
    first = e - local  # the rank's first expert
    start = tl.zeros([], dtype=tl.int64)
    earlier = tl.arange(0, LOCAL_BLOCK)  # the rank's experts before e, from every source
    for s in tl.static_range(WORLD):
        start += tl.sum(tl.load(meta_ptr + s * stride + first + earlier, mask=earlier < local,
                                other=0), 0)
    start = tl.where(capacity > 0, local.to(tl.int64) * capacity, start)
    for s in tl.static_range(WORLD):  # earlier sources, this expert
        start += tl.load(meta_ptr + s * stride + e, mask=s < rank, other=0)
    tl.store(base_ptr + e, start)


@triton.jit
def send(x_ptr, idx_ptr, weights_ptr, order_ptr, base_ptr, stage_x_ptrs_ptr, stage_route_ptrs_ptr,
         sent_ptr, rank, num_tokens, tokens_max, num_local_experts, top_k: tl.constexpr,
         K_BLOCK: tl.constexpr, hidden: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(t, r)``: token ``t``'s routing row into rank ``r``'s staging area at row
    ``rank * T_max + t`` (``[rows of its pairs on r or -1] * K, [weight bits] * K``, int32), and the
    token's row there too if one of its pairs is on ``r``; ``sent[r, t]`` (int8) records which."""
    t = tl.program_id(0)
    r = tl.program_id(1)
    ks = tl.arange(0, K_BLOCK)
    kmask = ks < top_k
    ids = tl.load(idx_ptr + t * top_k + ks, mask=kmask, other=-1)
    order = tl.load(order_ptr + t * top_k + ks, mask=kmask, other=0)
    here = (ids >= 0) & (ids // num_local_experts == r)
    base = tl.load(base_ptr + tl.where(here, ids, 0), mask=here, other=0)
    rows = tl.where(here, base + order, -1).to(tl.int32)
    w_bits = tl.load(weights_ptr + t * top_k + ks, mask=kmask, other=0.0).to(tl.int32, bitcast=True)
    slot = (rank * tokens_max + t).to(tl.int64)
    route = tl.load(stage_route_ptrs_ptr + r).to(tl.pointer_type(tl.int32))
    tl.store(route + slot * 2 * top_k + ks, rows, mask=kmask)
    tl.store(route + slot * 2 * top_k + top_k + ks, w_bits, mask=kmask)
    any_here = tl.sum(here.to(tl.int32), 0) > 0
    tl.store(sent_ptr + r * num_tokens + t, any_here.to(tl.int8))
    if any_here:
        dst = tl.load(stage_x_ptrs_ptr + r).to(tl.pointer_type(x_ptr.dtype.element_ty))
        offs = tl.arange(0, BLOCK)
        for start in range(0, hidden, BLOCK):
            m = start + offs < hidden
            v = tl.load(x_ptr + t.to(tl.int64) * hidden + start + offs, mask=m)
            tl.store(dst + slot * hidden + start + offs, v, mask=m)


@triton.jit
def replicate(stage_x_ptr, stage_route_ptr, meta_ptr, out_ptr, out_w_ptr, rows_ptr, weights_ptr,
              tokens_max, num_experts, top_k: tl.constexpr, K_BLOCK: tl.constexpr,
              hidden: tl.constexpr, BLOCK: tl.constexpr):
    """Program ``(s, t)``: for staged token ``t`` of source ``s`` (ignored past that source's token
    count), copy it into the receive row of each of its pairs here and set the row's weight; keep
    the pair rows (-1 where none) and weights for combine in ``rows`` / ``weights`` ``[W, T_max, K]``."""
    s = tl.program_id(0)
    t = tl.program_id(1)
    ks = tl.arange(0, K_BLOCK)
    kmask = ks < top_k
    slot = (s * tokens_max + t).to(tl.int64)
    arrived = t < tl.load(meta_ptr + s * (num_experts + 1) + num_experts)
    rows = tl.load(stage_route_ptr + slot * 2 * top_k + ks, mask=kmask & arrived, other=-1)
    w = tl.load(stage_route_ptr + slot * 2 * top_k + top_k + ks, mask=kmask & arrived, other=0)
    w = w.to(tl.float32, bitcast=True)
    tl.store(rows_ptr + slot * top_k + ks, rows.to(tl.int64), mask=kmask)
    tl.store(weights_ptr + slot * top_k + ks, w, mask=kmask)
    valid = kmask & (rows >= 0)
    tl.store(out_w_ptr + tl.where(valid, rows, 0), w, mask=valid)
    offs = tl.arange(0, BLOCK)
    for k in tl.static_range(top_k):
        row = tl.sum(tl.where(ks == k, rows, 0), 0).to(tl.int64)
        if row >= 0:
            for start in range(0, hidden, BLOCK):
                m = start + offs < hidden
                v = tl.load(stage_x_ptr + slot * hidden + start + offs, mask=m)
                tl.store(out_ptr + row * hidden + start + offs, v, mask=m)
