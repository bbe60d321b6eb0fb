"""An expert MLP whose bits for a row do not depend on the rows computed beside it.

``relu(x @ W1) @ W2`` with fp32 weights ``W1 [H, I]``, ``W2 [I, H]``, every product a fixed-order
sum of elementwise operations (:func:`ordered_matmul`). A batched matmul may block, vectorize and
order its sums differently for different batch sizes, so a row computed among other rows on a
borrowing rank could differ from the same row computed at home; elementwise IEEE multiplies and
adds give the same bits for an element wherever it sits. ReLU rather than SiLU: a vectorized
``exp`` and its scalar tail are different approximations.

The weight gradient is a sum over rows in row order, ``acc = acc + outer(in_r, grad_r)``
(:meth:`WeightGradRecord.accumulate`), so it can continue from an accumulator that another rank
started: that is how ``ubep.BalancedBuffer.reduce_weight_grads`` reproduces the unbalanced
layer's bits. The backward of :class:`ExactMLP` therefore returns no weight gradient through
autograd; it records what the sum needs.

Slow on purpose (``H + I`` elementwise steps per product, one step per row for the weight
gradient): it is for checking bits on small shapes, not for speed.
"""

from __future__ import annotations

import torch


def ordered_matmul(a_NI: torch.Tensor, b_IJ: torch.Tensor) -> torch.Tensor:
    """``[N, J]`` fp32: ``acc = 0; for i ascending: acc = acc + a[:, i] * b[i]``, each product and
    sum rounded (separate operations, no fused multiply-add)."""
    acc = torch.zeros(a_NI.shape[0], b_IJ.shape[1], dtype=torch.float32, device=a_NI.device)
    for i in range(a_NI.shape[1]):
        acc = acc + a_NI[:, i : i + 1].float() * b_IJ[i].float()
    return acc


def mlp_forward(x_NH: torch.Tensor, w1_HI: torch.Tensor, w2_IH: torch.Tensor):
    """``(pre [N, I], hidden [N, I], out [N, H])`` fp32 of rows ``x_NH`` (any float dtype)."""
    pre = ordered_matmul(x_NH.float(), w1_HI)
    hidden = torch.relu(pre)
    return pre, hidden, ordered_matmul(hidden, w2_IH)


def mlp_backward(grad_out_NH: torch.Tensor, pre_NI: torch.Tensor, w1_HI: torch.Tensor,
                 w2_IH: torch.Tensor):
    """``(grad_pre [N, I], grad_x [N, H])`` fp32 from the output gradient (any float dtype)."""
    grad_hidden = ordered_matmul(grad_out_NH.float(), w2_IH.t())
    grad_pre = torch.where(pre_NI > 0, grad_hidden, torch.zeros_like(grad_hidden))
    return grad_pre, ordered_matmul(grad_pre, w1_HI.t())


class WeightGradRecord:
    """One segment's per-row factors of its weight gradient, filled by :class:`ExactMLP`'s backward:
    ``x [N, H]``, ``grad_pre [N, I]``, ``hidden [N, I]``, ``grad_out [N, H]`` fp32 (empty until then)."""

    def __init__(self) -> None:
        self.factors: tuple[torch.Tensor, ...] | None = None

    def accumulate(self, acc: list[torch.Tensor]) -> list[torch.Tensor]:
        """``[g1 [H, I], g2 [I, H]]`` plus this segment's rows in row order: for each row ``r``,
        ``g1 = g1 + outer(x_r, grad_pre_r)`` then ``g2 = g2 + outer(hidden_r, grad_out_r)``."""
        g1, g2 = acc
        if self.factors is None:  # no row, or no gradient reached this segment
            return [g1, g2]
        x, grad_pre, hidden, grad_out = self.factors
        for r in range(x.shape[0]):
            g1 = g1 + x[r, :, None] * grad_pre[r, None, :]
            g2 = g2 + hidden[r, :, None] * grad_out[r, None, :]
        return [g1, g2]


class ExactMLP(torch.autograd.Function):
    """``out [N, H]`` in the rows' dtype; backward gives the rows' gradient and fills ``record``."""

    @staticmethod
    def forward(ctx, x_NH, w1_HI, w2_IH, record: WeightGradRecord):
        pre, hidden, out = mlp_forward(x_NH, w1_HI, w2_IH)
        ctx.save_for_backward(x_NH, pre, hidden, w1_HI, w2_IH)
        ctx.record = record
        return out.to(x_NH.dtype)

    @staticmethod
    def backward(ctx, grad_out_NH):
        x, pre, hidden, w1, w2 = ctx.saved_tensors
        grad_pre, grad_x = mlp_backward(grad_out_NH, pre, w1, w2)
        # detached: the record is read after backward, with autograd recording again
        ctx.record.factors = tuple(t.detach().float() for t in (x, grad_pre, hidden, grad_out_NH))
        return grad_x.to(x.dtype), None, None, None


def exact_weights(hidden: int, intermediate: int, seed: int, experts: range) -> list[list[torch.Tensor]]:
    """Per expert in ``experts``: ``[W1 [H, I], W2 [I, H]]`` fp32, from the seed and the expert id."""
    params = []
    for e in experts:
        gen = torch.Generator().manual_seed(seed * 100_003 + e + 1)
        params.append([torch.randn(hidden, intermediate, generator=gen) * hidden**-0.5,
                       torch.randn(intermediate, hidden, generator=gen) * intermediate**-0.5])
    return params
