"""The CUDA backend's combine in two Triton kernels (plus the barriers between them).

1. ``send_back`` (one program per received (source, token)): ``reduce="source"`` sends each pair's
   output row to the source, at slot ``t * K + k``; ``reduce="expert_rank"`` first sums the token's
   pairs held here, in fp32 in ascending ``k``, rounds the sum to the row dtype and sends that one
   row, to slot ``rank * T_max + t``;
2. ``reduce_slots`` (one program per token): the source's fp32 sum in ascending ``k`` (or
   ascending rank), cast to the row dtype.

The contract rounds every product and every sum (``ubep.reduce``); compilers would contract
``acc + w * o`` into a fused multiply-add, so with ``EXACT`` the kernels use PTX ``mul.rn.f32`` and
``add.rn.f32``, which cannot be contracted. Triton's CPU interpreter, which cannot run PTX, computes
the same separate operations with NumPy (``EXACT=False``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mul(a, b, EXACT: tl.constexpr):
    if EXACT:
        b = tl.broadcast_to(b, a.shape)
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return a * b


@triton.jit
def _add(a, b, EXACT: tl.constexpr):
    if EXACT:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return a + b


@triton.jit
def _row_of(rows, ks, k: tl.constexpr):
    """The ``k``-th entry of a ``[K_BLOCK]`` vector, as a scalar."""
    return tl.sum(tl.where(ks == k, rows, 0), 0)


@triton.jit
def send_back(out_ptr, rows_ptr, weights_ptr, back_ptrs_ptr, rank, tokens_max,
              top_k: tl.constexpr, K_BLOCK: tl.constexpr, hidden: tl.constexpr,
              BLOCK: tl.constexpr, PARTIAL: tl.constexpr, WEIGHTED: tl.constexpr,
              EXACT: tl.constexpr):
    """Program ``(s, t)``: the outputs of source ``s``'s token ``t`` go home (see module doc).

    ``out`` is the ``[rows, H]`` expert output; ``rows`` / ``weights`` the ``[W, T_max, K]`` pair
    rows (-1 where not here) and gate weights recorded by dispatch."""
    s = tl.program_id(0)
    t = tl.program_id(1)
    ks = tl.arange(0, K_BLOCK)
    kmask = ks < top_k
    slot = (s * tokens_max + t).to(tl.int64)
    rows = tl.load(rows_ptr + slot * top_k + ks, mask=kmask, other=-1)
    w = tl.load(weights_ptr + slot * top_k + ks, mask=kmask, other=0.0)
    back = tl.load(back_ptrs_ptr + s).to(tl.pointer_type(out_ptr.dtype.element_ty))
    offs = tl.arange(0, BLOCK)
    if PARTIAL:
        if tl.sum((rows >= 0).to(tl.int32), 0) > 0:
            dst = back + (rank * tokens_max + t).to(tl.int64) * hidden
            for start in range(0, hidden, BLOCK):
                m = start + offs < hidden
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for k in tl.static_range(top_k):
                    row = _row_of(rows, ks, k)
                    if row >= 0:
                        o = tl.load(out_ptr + row * hidden + start + offs, mask=m).to(tl.float32)
                        if WEIGHTED:
                            o = _mul(o, _row_of(w, ks, k), EXACT)
                        acc = _add(acc, o, EXACT)
                tl.store(dst + start + offs, acc.to(out_ptr.dtype.element_ty), mask=m)
    else:
        for k in tl.static_range(top_k):
            row = _row_of(rows, ks, k)
            if row >= 0:
                dst = back + (t.to(tl.int64) * top_k + k) * hidden
                for start in range(0, hidden, BLOCK):
                    m = start + offs < hidden
                    tl.store(dst + start + offs, tl.load(out_ptr + row * hidden + start + offs,
                                                         mask=m), mask=m)


@triton.jit
def reduce_slots(back_ptr, slot_t, slot_j, valid_ptr, valid_t, valid_j, weights_ptr, y_ptr,
                 NUM: tl.constexpr, hidden: tl.constexpr, BLOCK: tl.constexpr,
                 WEIGHTED: tl.constexpr, EXACT: tl.constexpr):
    """Program ``t``: ``y[t] = sum over j = 0..NUM-1, ascending, where valid[t, j], of
    w[t, j] * back[t * slot_t + j * slot_j]`` in fp32, cast to the row dtype.

    ``reduce="source"``: ``j`` is the pair ``k`` (slot ``t * K + k``, ``valid = topk_idx >= 0``, gate
    weights ``[T, K]``); ``reduce="expert_rank"``: ``j`` is the rank that sent a partial (slot
    ``j * T_max + t``, ``valid`` = the token went to that rank, unweighted)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    for start in range(0, hidden, BLOCK):
        m = start + offs < hidden
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(NUM):
            if tl.load(valid_ptr + t * valid_t + j * valid_j):
                o = tl.load(back_ptr + (t * slot_t + j * slot_j) * hidden + start + offs, mask=m)
                o = o.to(tl.float32)
                if WEIGHTED:
                    o = _mul(o, tl.load(weights_ptr + t * valid_t + j * valid_j), EXACT)
                acc = _add(acc, o, EXACT)
        tl.store(y_ptr + t * hidden + start + offs, acc.to(y_ptr.dtype.element_ty), mask=m)
