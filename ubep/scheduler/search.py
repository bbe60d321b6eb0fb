"""Locate token indices in a sequence of per-destination blocks: quaternary and binary search.

Destinations ``0..D-1`` (in whatever order the caller laid them out) hold ``counts`` tokens each,
back to back; ``cumsum_D`` is the inclusive prefix sum of those counts. A target token index
``t`` in ``[0, M]`` (``M = cumsum_D[-1]``) is located as ``(position, offset)``:

- ``position = #{i : cumsum_D[i] <= t}``, the first destination whose block ends after ``t``;
- ``offset = t - (cumsum_D[position - 1] if position else 0)``.

So for ``t < M``, ``position`` holds token ``t`` and ``0 <= offset < counts[position]`` (empty
destinations are stepped over), and ``t = M`` gives ``(D, 0)``, one past the end. Example:
counts ``[2, 0, 3, 1]``, ``cumsum_D = [2, 2, 5, 6]``; targets ``[0, 1, 2, 4, 5, 6]`` give
positions ``[0, 0, 2, 2, 3, 4]`` and offsets ``[0, 1, 0, 2, 0, 0]``.

Both searches keep a window ``[lo, hi]`` of candidate positions, starting at ``[0, D]``, and
report the number of narrowing steps per target: binary needs at most ``ceil(log2(D + 1))``,
quaternary at most ``ceil(log4(D + 1))`` (``D = 256``: 9 against 5). Every target is searched at
once; the Python loop runs over steps, never over targets.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Located(NamedTuple):
    """``[Q]`` int64 each: where every target lies, and how many steps its search took."""

    position: torch.Tensor
    offset: torch.Tensor
    steps: torch.Tensor


def check_int_vector(name: str, t: torch.Tensor) -> None:
    """Raise unless ``t`` is a 1-D int64 tensor (shared by the scheduler's argument checks)."""
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor, got {getattr(t, 'shape', type(t))}")
    if t.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {t.dtype}")


def _check(cumsum_D: torch.Tensor, targets_Q: torch.Tensor) -> None:
    check_int_vector("cumsum_D", cumsum_D)
    check_int_vector("targets_Q", targets_Q)
    if cumsum_D.numel() and (int(cumsum_D[0]) < 0 or bool((cumsum_D.diff() < 0).any())):
        raise ValueError("cumsum_D must be non-negative and non-decreasing (a prefix sum of counts)")
    total = int(cumsum_D[-1]) if cumsum_D.numel() else 0
    if targets_Q.numel() and (int(targets_Q.min()) < 0 or int(targets_Q.max()) > total):
        raise ValueError(f"targets_Q must lie in [0, {total}], got "
                         f"[{int(targets_Q.min())}, {int(targets_Q.max())}]")


def _located(cumsum_D: torch.Tensor, targets_Q: torch.Tensor, position: torch.Tensor,
             steps: torch.Tensor) -> Located:
    start_D1 = torch.cat([cumsum_D.new_zeros(1), cumsum_D])  # first token of each position
    return Located(position, targets_Q - start_D1[position], steps)


def _ends_at_or_before(cumsum_D: torch.Tensor, pivot: torch.Tensor, targets_Q: torch.Tensor):
    """1 where the block at ``pivot`` ends at or before the target (the answer is past it)."""
    return (cumsum_D[pivot.clamp(max=max(cumsum_D.numel() - 1, 0))] <= targets_Q).long()


def quaternary_search(cumsum_D: torch.Tensor, targets_Q: torch.Tensor) -> Located:
    """Three pivots per step, splitting the window into quarters (one VectorCount on Ascend).

    With ``w = hi - lo`` the pivots are ``p_k = lo + k * w // 4`` for ``k = 1, 2, 3`` and
    ``c`` counts those whose block ends at or before ``t``; the new window is ``[lo, p1]``,
    ``[p1 + 1, p2]``, ``[p2 + 1, p3]`` or ``[p3 + 1, hi]`` for ``c = 0, 1, 2, 3``. The loop
    stops when ``lo == hi``.

    Example: ``cumsum_D = [2, 2, 5, 6]``, ``t = 4``. Step 1: window ``[0, 4]``, ``w = 4``,
    pivots ``1, 2, 3`` end at ``2, 5, 6``, ``c = 1``, window ``[2, 2]``: position 2, offset
    ``4 - 2 = 2``, 1 step. ``t = 6``: pivots all end ``<= 6``, window ``[4, 4]``, 1 step.
    """
    _check(cumsum_D, targets_Q)
    lo = torch.zeros_like(targets_Q)
    hi = torch.full_like(targets_Q, cumsum_D.numel())
    steps = torch.zeros_like(targets_Q)
    while bool((active := lo < hi).any()):
        w = hi - lo
        p1, p2, p3 = lo + w // 4, lo + w // 2, lo + 3 * w // 4
        c = sum(_ends_at_or_before(cumsum_D, p, targets_Q) for p in (p1, p2, p3))
        # Pivots with blocks ending at or before t form a prefix, so c picks the quarter.
        new_lo = torch.where(c == 0, lo, torch.where(c == 1, p1 + 1, torch.where(c == 2, p2 + 1, p3 + 1)))
        new_hi = torch.where(c == 0, p1, torch.where(c == 1, p2, torch.where(c == 2, p3, hi)))
        lo, hi = torch.where(active, new_lo, lo), torch.where(active, new_hi, hi)
        steps += active.long()
    return _located(cumsum_D, targets_Q, lo, steps)


def binary_search(cumsum_D: torch.Tensor, targets_Q: torch.Tensor) -> Located:
    """One pivot per step, for comparison: ``m = lo + (hi - lo) // 2``; the window becomes
    ``[m + 1, hi]`` if the block at ``m`` ends at or before ``t``, else ``[lo, m]``.

    Example: ``cumsum_D = [2, 2, 5, 6]``, ``t = 4``: windows ``[0, 4]`` (m = 2, ends at 5),
    ``[0, 2]`` (m = 1, ends at 2), ``[2, 2]``: position 2, offset 2, 2 steps.
    """
    _check(cumsum_D, targets_Q)
    lo = torch.zeros_like(targets_Q)
    hi = torch.full_like(targets_Q, cumsum_D.numel())
    steps = torch.zeros_like(targets_Q)
    while bool((active := lo < hi).any()):
        mid = lo + (hi - lo) // 2
        past = _ends_at_or_before(cumsum_D, mid, targets_Q).bool()
        lo = torch.where(active & past, mid + 1, lo)
        hi = torch.where(active & ~past, mid, hi)
        steps += active.long()
    return _located(cumsum_D, targets_Q, lo, steps)
