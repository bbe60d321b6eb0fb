"""The one reduction order and rounding every backend reproduces bit for bit.

``acc = 0; for k ascending: if valid[k]: acc = acc + w[k] * o[k]`` in fp32, where the product and the
sum each round (separate torch ops, so no fused multiply-add can creep in).
"""

from __future__ import annotations

import torch


def ordered_sum(
    contrib_MKH: torch.Tensor,
    valid_MK: torch.Tensor,
    weights_MK: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum ``[M, K, H]`` contributions over ``K`` in ascending order, skipping invalid slots.

    ``valid_MK`` is bool ``[M, K]``; ``weights_MK`` is fp32 ``[M, K]`` or ``None`` (unweighted).
    Returns fp32 ``[M, H]``. Example: ``o = [[[1.], [2.]]]``, ``w = [[0.5, 0.25]]``, all valid
    gives ``[[1.0]]`` (``0 + 0.5 * 1 = 0.5``, then ``0.5 + 0.25 * 2 = 1.0``).
    """
    num_rows, top_k, hidden = contrib_MKH.shape
    acc = torch.zeros(num_rows, hidden, dtype=torch.float32, device=contrib_MKH.device)
    for k in range(top_k):
        term = contrib_MKH[:, k].float()
        if weights_MK is not None:
            term = term * weights_MK[:, k : k + 1]
        acc = torch.where(valid_MK[:, k : k + 1], acc + term, acc)
    return acc


def rank_partial_sum(
    contrib_MKH: torch.Tensor,
    valid_MK: torch.Tensor,
    rank_MK: torch.Tensor,
    world_size: int,
    wire_dtype: torch.dtype,
    weights_MK: torch.Tensor | None = None,
) -> torch.Tensor:
    """``reduce="expert_rank"``: each rank's slots summed by :func:`ordered_sum`, rounded to
    ``wire_dtype`` (what travels), then added in ascending rank order in fp32.

    ``rank_MK`` is int ``[M, K]``, the rank holding each slot's expert. A rank that holds none of
    a row's slots sends nothing for it and is skipped. Returns fp32 ``[M, H]``.
    """
    acc = torch.zeros(contrib_MKH.shape[0], contrib_MKH.shape[2], dtype=torch.float32,
                      device=contrib_MKH.device)
    for r in range(world_size):
        on_r = valid_MK & (rank_MK == r)
        partial = ordered_sum(contrib_MKH, on_r, weights_MK).to(wire_dtype).float()
        acc = torch.where(on_r.any(1, keepdim=True), acc + partial, acc)
    return acc
