"""Small Triton helpers shared by the CUDA backend's dispatch and combine kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lane(vec, ks, k: tl.constexpr):
    """The ``k``-th entry of a ``[K_BLOCK]`` vector (``ks = tl.arange(0, K_BLOCK)``), as a scalar."""
    return tl.sum(tl.where(ks == k, vec, 0), 0)


@triton.jit
def any_true(mask):
    """Whether any entry of a 1-D bool vector is set, as a scalar."""
    return tl.sum(mask.to(tl.int32), 0) > 0
