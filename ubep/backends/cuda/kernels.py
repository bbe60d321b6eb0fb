"""Triton kernels of the CUDA backend: they move rows, nothing else.

Arithmetic (the ordered fp32 sums of combine) stays in torch ops, whose separate multiply and add
kernels cannot be contracted into a fused multiply-add; this keeps every result equal, bit for bit,
to the reference backend's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_BYTES = 4096  # bytes of a row one program moves per step (16-byte vector stores)


@triton.jit
def _move_row(src, dst, row_elems: tl.constexpr, BLOCK: tl.constexpr):
    """Copy ``row_elems`` elements from ``src`` to ``dst`` in ``BLOCK``-element steps."""
    offs = tl.arange(0, BLOCK)
    for start in range(0, row_elems, BLOCK):
        mask = start + offs < row_elems
        tl.store(dst + start + offs, tl.load(src + start + offs, mask=mask), mask=mask)


@triton.jit
def _put_rows(src_ptr, src_row_ptr, dst_ptrs_ptr, dst_rank_ptr, dst_row_ptr, num_items,
              row_elems: tl.constexpr, BLOCK: tl.constexpr):
    """Item ``i``: copy row ``src_row[i]`` of ``src`` to row ``dst_row[i]`` of rank ``dst_rank[i]``'s
    buffer (base address ``dst_ptrs[dst_rank[i]]``); items with ``dst_rank < 0`` are skipped."""
    item = tl.program_id(0)
    if item < num_items:
        rank = tl.load(dst_rank_ptr + item)
        if rank >= 0:
            src_row = tl.load(src_row_ptr + item).to(tl.int64)
            dst_row = tl.load(dst_row_ptr + item).to(tl.int64)
            dst = tl.load(dst_ptrs_ptr + rank).to(tl.pointer_type(src_ptr.dtype.element_ty))
            _move_row(src_ptr + src_row * row_elems, dst + dst_row * row_elems, row_elems, BLOCK)


def row_block(src_RF: torch.Tensor) -> int:
    """Elements a program moves per step: the row, up to ``BLOCK_BYTES``."""
    return min(triton.next_power_of_2(src_RF.shape[1]), max(16, BLOCK_BYTES // src_RF.element_size()))


def put_rows(src_RF: torch.Tensor, src_row_I: torch.Tensor, dst_ptrs_W: torch.Tensor,
             dst_rank_I: torch.Tensor, dst_row_I: torch.Tensor) -> None:
    """For every item ``i`` with ``dst_rank_I[i] >= 0``: ``dst[dst_rank_I[i]][dst_row_I[i]] =
    src_RF[src_row_I[i]]``, where ``dst[r]`` is a row-major ``[*, F]`` buffer of ``src_RF``'s
    dtype at address ``dst_ptrs_W[r]`` (a peer's symmetric buffer, or this rank's own).

    ``src_RF`` is ``[R, F]`` contiguous; the index tensors are ``[I]`` integer tensors on its device.
    One program per item; sizes never depend on device values, so the launch needs no host sync.
    """
    num_items = src_row_I.numel()
    if num_items == 0:
        return
    row_elems, block = src_RF.shape[1], row_block(src_RF)
    _put_rows[(num_items,)](src_RF, src_row_I, dst_ptrs_W, dst_rank_I, dst_row_I, num_items,
                            row_elems, BLOCK=block)


@triton.jit
def _copy_rows(src_ptr, src_row_ptr, out_ptr, out_row_ptr, num_items, row_elems: tl.constexpr,
               BLOCK: tl.constexpr):
    """Item ``i``: copy row ``src_row[i]`` of ``src`` to row ``out_row[i]`` of ``out`` (skip if < 0)."""
    item = tl.program_id(0)
    if item < num_items:
        out_row = tl.load(out_row_ptr + item).to(tl.int64)
        if out_row >= 0:
            src_row = tl.load(src_row_ptr + item).to(tl.int64)
            _move_row(src_ptr + src_row * row_elems, out_ptr + out_row * row_elems, row_elems, BLOCK)


def copy_rows(src_RF: torch.Tensor, src_row_I: torch.Tensor, out_RF: torch.Tensor,
              out_row_I: torch.Tensor) -> None:
    """``out_RF[out_row_I[i]] = src_RF[src_row_I[i]]`` for every item with ``out_row_I[i] >= 0``;
    both ``[*, F]`` contiguous on one device. The local twin of :func:`put_rows`."""
    num_items = src_row_I.numel()
    if num_items == 0:
        return
    row_elems, block = src_RF.shape[1], row_block(src_RF)
    _copy_rows[(num_items,)](src_RF, src_row_I, out_RF, out_row_I, num_items, row_elems, BLOCK=block)
