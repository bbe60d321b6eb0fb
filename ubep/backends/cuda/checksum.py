"""Marker words of the ``dc`` and ``sp`` modes on the GPU: masks, checksum lanes, sentinel tests.

Both modes read the first ``MARK_BYTES = 8`` bytes of every 128-byte block, its two u32 marker
words (``F = 8`` in ``ubep.protocol``). Blocks are pure payload (``FE = 0``).

- ``dc``: marker word ``k = (r * NB + b) * 2 + j`` (word ``j`` of block ``b`` of row ``r``; ``r`` is the
  row's index in the receiver's region for this source, so rows not sent leave gaps in ``k``) travels
  as ``payload ^ fmix32(k ^ d)``, ``d = fmix32(e_lo ^ fmix32(e_hi))``. The batch checksum sums
  ``fmix32(w_k ^ fmix32(2k))`` (lane A) and ``fmix32(w_k ^ fmix32(2k + 1))`` (lane B) mod 2**32 over
  the wire words ``w_k`` of the blocks sent, so any program may add partial sums, in any order.
- ``sp``: a block has arrived when its two marker words are not both the sentinel word ``S`` (one
  sentinel element repeated: bf16 ``0xFFA5`` gives ``S = 0xFFA5FFA5``); a row *collides* when one of
  its blocks would carry ``S, S``.

Everything here is ``tl`` integer arithmetic on u32 (no inline PTX), so Triton's interpreter runs it
on the CPU (``tests/test_cuda_markers.py`` compares it with ``ubep.protocol``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ubep.protocol import sentinel_candidates

MARK_BYTES = tl.constexpr(8)  # F: marker bytes at the start of every block
_BLOCK_WORDS = tl.constexpr(128 // 4)  # u32 words per 128-byte block (wire.BLOCK_BYTES)
_BLOCK_PAIRS = tl.constexpr(128 // 8)  # 8-byte marker pairs per 128-byte block


def sentinel_word(dtype: torch.dtype) -> int:
    """The u32 marker word of ``sp``: candidate 0 of ``dtype`` repeated (bf16 -> ``0xFFA5FFA5``,
    fp32 -> ``0xFFA5A5A5``). Choosing the candidate at init (``ubep.protocol.choose_sentinel``) is
    left for later."""
    pattern = sentinel_candidates(dtype)[0]
    return pattern * 0x10001 if dtype.itemsize == 2 else pattern


@triton.jit
def fmix32(x):
    """MurmurHash3's finalizer on u32 values (``ubep.protocol.fmix32``); products wrap mod 2**32."""
    x = x ^ (x >> 16)
    x = x * tl.full([], 0x85EBCA6B, tl.uint32)
    x = x ^ (x >> 13)
    x = x * tl.full([], 0xC2B2AE35, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def digest(epoch):
    """The epoch digest ``d`` (u32) of an int64 epoch: ``fmix32(e_lo ^ fmix32(e_hi))``."""
    lo = (epoch & 0xFFFFFFFF).to(tl.uint32)
    hi = ((epoch >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return fmix32(lo ^ fmix32(hi))


@triton.jit
def _layout(values, BITS: tl.constexpr):
    """``(o, j, shift, is_mark)`` of the element columns of a ``[CB, BE]`` tile: element ``o`` of a
    block is bits ``shift ..`` of marker word ``j`` when ``is_mark``."""
    per_word: tl.constexpr = 32 // BITS
    o = tl.arange(0, values.shape[1])[None, :]
    return o, o // per_word, ((o % per_word) * BITS).to(tl.uint32), o < MARK_BYTES * 8 // BITS


@triton.jit
def mask_tile(values, first_word, d, BITS: tl.constexpr):
    """``values [CB, BE]`` (integers of ``BITS`` bits) with their marker elements xored with
    ``fmix32(k ^ d)``; ``first_word [CB, 1]`` u32 is ``k`` of each block's word 0. Encodes and
    decodes."""
    _, j, shift, is_mark = _layout(values, BITS)
    word = tl.where(j == 0, fmix32(first_word ^ d), fmix32((first_word + 1) ^ d))
    piece = ((word >> shift) & ((1 << BITS) - 1)).to(values.dtype)
    return tl.where(is_mark, values ^ piece, values)


@triton.jit
def marker_words(values, BITS: tl.constexpr):
    """The two u32 marker words ``(w0, w1)``, each ``[CB]``, of the blocks of a ``[CB, BE]`` tile."""
    _, j, shift, is_mark = _layout(values, BITS)
    bits = (values.to(tl.uint32) & ((1 << BITS) - 1)) << shift  # bit fields never overlap: sum = or
    w0 = tl.sum(tl.where(is_mark & (j == 0), bits, 0), 1)
    w1 = tl.sum(tl.where(is_mark & (j == 1), bits, 0), 1)
    return w0, w1


@triton.jit
def block_lanes(w0, w1, first_word):
    """Each block's checksum lanes ``(A, B)`` (u32, same shapes as the arguments): the block's wire
    marker words are ``w0, w1`` and its word 0 is number ``first_word``. A batch's lanes are their
    sums over its blocks (mod 2**32)."""
    k2 = first_word * 2
    a = fmix32(w0 ^ fmix32(k2)) + fmix32(w1 ^ fmix32(k2 + 2))
    b = fmix32(w0 ^ fmix32(k2 + 1)) + fmix32(w1 ^ fmix32(k2 + 3))
    return a, b


@triton.jit
def checksum(lane_a, lane_b, num_blocks, d):
    """The u64 batch checksum, as int64 bits: ``fmix32(B ^ fmix32(n)) << 32 | fmix32(A ^ d)``."""
    high = fmix32(lane_b ^ fmix32(num_blocks.to(tl.uint32)))
    return (high.to(tl.int64) << 32) | fmix32(lane_a ^ d).to(tl.int64)


@triton.jit
def _held_markers(wire_ptr, block, valid):
    """The two u32 marker words ``(w0, w1)`` of the 128-byte blocks numbered ``block`` (any shape)
    at ``wire_ptr``, ``valid`` ones only, as one volatile 8-byte load each (word 0 is the low half:
    little-endian): half the load instructions of two 4-byte loads."""
    pairs = wire_ptr.to(tl.pointer_type(tl.int64))
    both = tl.load(pairs + tl.where(valid, block * _BLOCK_PAIRS, 0), mask=valid, other=0,
                   volatile=True)
    return (both & 0xFFFFFFFF).to(tl.uint32), ((both >> 32) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def wire_lanes(wire_ptr, rows, NB: tl.constexpr, NB_BLOCK: tl.constexpr):
    """Lanes ``(A, B)`` and block count over the markers held at ``wire_ptr`` (a ``dc`` region of
    rows of ``NB`` 128-byte blocks) for the row indices ``rows [R]`` (-1: no row), with volatile loads:
    what a receiver computes while it polls."""
    b = tl.arange(0, NB_BLOCK)[None, :]
    r = rows[:, None].to(tl.int64)
    valid = (r >= 0) & (b < NB)
    block = r * NB + b
    w0, w1 = _held_markers(wire_ptr, block, valid)
    a, b = block_lanes(w0, w1, (block * 2).to(tl.uint32))
    zero = tl.zeros_like(a)
    return (tl.sum(tl.where(valid, a, zero)), tl.sum(tl.where(valid, b, zero)),
            tl.sum(tl.sum(valid.to(tl.int32), 1), 0))


@triton.jit
def collides(values, SENTINEL: tl.constexpr, BITS: tl.constexpr):
    """``[CB]``: whether each block of the payload tile ``values [CB, BE]`` would carry the sentinel
    word ``SENTINEL`` (u32) in both marker words."""
    w0, w1 = marker_words(values, BITS)
    s = tl.full([], SENTINEL, tl.uint32)
    return (w0 == s) & (w1 == s)


@triton.jit
def sentinel_pending(wire_ptr, SENTINEL: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr):
    """``sp``: how many of the ``NB`` blocks of the row at ``wire_ptr`` still hold the sentinel in
    both marker words (volatile loads)."""
    b = tl.arange(0, NB_BLOCK)
    s = tl.full([], SENTINEL, tl.uint32)
    w0, w1 = _held_markers(wire_ptr, b, b < NB)
    return tl.sum(((w0 == s) & (w1 == s) & (b < NB)).to(tl.int32), 0)


@triton.jit
def reset_markers(wire_ptr, part, SENTINEL: tl.constexpr, NB: tl.constexpr, NB_BLOCK: tl.constexpr,
                  CB: tl.constexpr, PARTS: tl.constexpr):
    """``sp``: write the sentinel word into both marker words of the blocks at ``wire_ptr`` that
    part ``part`` of ``PARTS`` read: chunks ``part, part + PARTS, ..`` of ``CB`` blocks, of ``NB``
    (``PARTS = 1``: every block)."""
    words = wire_ptr.to(tl.pointer_type(tl.int32))
    b = tl.arange(0, NB_BLOCK)[:, None]
    j = tl.arange(0, 2)[None, :]
    s = tl.full([NB_BLOCK, 2], SENTINEL, tl.uint32).to(tl.int32, bitcast=True)
    tl.store(words + b * _BLOCK_WORDS + j, s, mask=(b < NB) & ((b // CB) % PARTS == part))
