"""An MoE layer of :mod:`ubep.exact_expert` experts three ways, to check balancing bit for bit:

- :func:`balanced_step`: one rank with a :class:`ubep.BalancedBuffer` (borrowed experts);
- :func:`unbalanced_step`: one rank with a plain :class:`ubep.Buffer` (every row at its home);
- :func:`one_process_step`: every rank's tokens in one process, forward and backward written out
  by hand in the order ``docs/SEMANTICS.md`` defines (no autograd, whose accumulation order for a
  token used by ``K`` experts is its own).

Routing and gate weights are inputs (no router), so ``x``'s gradient has the dispatch path only.
Each step returns ``(y [T, H], grad_x [T, H], grad_gate [T, K] fp32, own experts' weight gradients
[L][2], handle)`` for the loss ``sum(y.float() * loss_w)``.
"""

from __future__ import annotations

import torch

from ubep.balanced import BalancedBuffer
from ubep.buffer import Buffer
from ubep.exact_expert import ExactMLP, WeightGradRecord, mlp_backward, mlp_forward
from ubep.oracle import rows_of_expert
from ubep.reduce import ordered_sum


def _experts(recv_x_NH, counts: list[int], weights_of_segment):
    """Outputs of every segment's rows, and a record per segment for the weight gradient."""
    records = [WeightGradRecord() for _ in counts]
    outs = [ExactMLP.apply(rows, *weights, record) if weights is not None else rows
            for rows, weights, record in zip(recv_x_NH.split(counts), weights_of_segment, records,
                                             strict=True)]
    return torch.cat(outs), records


def _backward(y, x, gate_w, loss_w):
    grads = torch.autograd.grad((y.float() * loss_w).sum(), [x, gate_w])
    return [g.detach() for g in grads]


def balanced_step(buf: BalancedBuffer, x_TH, topk_idx_TK, gate_w_TK, loss_w_TH, own_weights):
    x, gate_w = x_TH.detach().requires_grad_(), gate_w_TK.detach().requires_grad_()
    res = buf.dispatch(x, topk_idx_TK, gate_w)
    weights_of_segment = buf.prefetch_weights(res.handle, own_weights)
    out, records = _experts(res.recv_x, res.tokens_per_segment.tolist(), weights_of_segment)
    y = buf.combine(out, res.handle)
    grad_x, grad_gate = _backward(y, x, gate_w, loss_w_TH)
    grad_weights = buf.reduce_weight_grads(res.handle, lambda seg, acc: records[seg].accumulate(acc))
    return y.detach(), grad_x, grad_gate, grad_weights, res.handle


def unbalanced_step(buf: Buffer, x_TH, topk_idx_TK, gate_w_TK, loss_w_TH, own_weights):
    x, gate_w = x_TH.detach().requires_grad_(), gate_w_TK.detach().requires_grad_()
    res = buf.dispatch(x, topk_idx_TK, gate_w)
    out, records = _experts(res.recv_x, res.tokens_per_expert.tolist(), own_weights)
    y = buf.combine(out, res.handle)
    grad_x, grad_gate = _backward(y, x, gate_w, loss_w_TH)
    grad_weights = [r.accumulate([torch.zeros_like(w) for w in ws])
                    for r, ws in zip(records, own_weights, strict=True)]
    return y.detach(), grad_x, grad_gate, grad_weights, res.handle


def one_process_step(xs, idxs, gate_ws, loss_ws, weights):
    """Every source's ``(y, grad_x, grad_gate)`` and every expert's weight gradients ``[E][2]``,
    from lists indexed by source rank and ``weights [E][2]``."""
    dtype = xs[0].dtype
    outs = [torch.zeros(*idx.shape, x.shape[1], dtype=dtype) for x, idx in zip(xs, idxs, strict=True)]
    grad_rows = [torch.zeros_like(o) for o in outs]
    grad_gates = [torch.zeros(idx.shape, dtype=torch.float32) for idx in idxs]
    grad_ys = [lw.to(dtype) for lw in loss_ws]  # the gradient reaching y through y.float()
    grad_weights = []
    for e, (w1, w2) in enumerate(weights):
        pairs = rows_of_expert(idxs, e)  # receive order: source, then (t, k)
        rows = torch.stack([xs[s][t] for s, t, _ in pairs]) if pairs else xs[0].new_zeros(0, w2.shape[1])
        pre, hidden, out = mlp_forward(rows, w1, w2)
        out = out.to(dtype)
        gy = (torch.stack([grad_ys[s][t] for s, t, _ in pairs]) if pairs
              else torch.zeros_like(out))
        gate = torch.tensor([float(gate_ws[s][t, k]) for s, t, k in pairs], dtype=torch.float32)
        grad_out = (gy.float() * gate[:, None]).to(dtype)
        grad_pre, grad_in = mlp_backward(grad_out, pre, w1, w2)
        dots = (gy.float() * out.float()).sum(-1)
        g1, g2 = torch.zeros_like(w1), torch.zeros_like(w2)
        for r, (s, t, k) in enumerate(pairs):
            outs[s][t, k], grad_rows[s][t, k], grad_gates[s][t, k] = out[r], grad_in[r].to(dtype), dots[r]
            g1 = g1 + rows[r].float()[:, None] * grad_pre[r, None, :]
            g2 = g2 + hidden[r, :, None] * grad_out[r].float()[None, :]
        grad_weights.append([g1, g2])
    results = []
    for idx, gate, out, grad_row, grad_gate in zip(idxs, gate_ws, outs, grad_rows, grad_gates,
                                                   strict=True):
        valid = idx >= 0
        y = ordered_sum(out, valid, gate.float()).to(dtype)
        grad_x = ordered_sum(grad_row, valid).to(dtype)
        results.append((y, grad_x, grad_gate))
    return results, grad_weights
