"""Small Triton helpers shared by the CUDA backend's dispatch and combine kernels."""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton's CPU interpreter (tests without a GPU) cannot run inline PTX; the few helpers that use it
# have a plain equivalent there: same values, no timer, no memory-order qualifiers.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def symmetric_base(table_ptr, i, dtype: tl.constexpr):
    """Entry ``i`` of a ``[W]`` table of symmetric-buffer base addresses, as a pointer to ``dtype``.
    Triton knows nothing of an address loaded from memory; saying that the allocation is 16-byte
    aligned lets row copies use 16-byte accesses, which ``tff`` needs (``wire``) and NVLink rewards."""
    return tl.multiple_of(tl.load(table_ptr + i).to(tl.pointer_type(dtype)), 16)


@triton.jit
def lane(vec, ks, k: tl.constexpr):
    """The ``k``-th entry of a ``[K_BLOCK]`` vector (``ks = tl.arange(0, K_BLOCK)``), as a scalar."""
    return tl.sum(tl.where(ks == k, vec, 0), 0)


@triton.jit
def any_true(mask):
    """Whether any entry of a 1-D bool vector is set, as a scalar."""
    return tl.sum(mask.to(tl.int32), 0) > 0


@triton.jit
def part_step(step, part, PARTS: tl.constexpr):
    """The row step that part ``part`` of ``PARTS`` programs sharing a row takes at its ``step``-th
    (``step * PARTS + part``: the parts interleave)."""
    if PARTS == 1:
        return step
    else:
        return step * PARTS + part
