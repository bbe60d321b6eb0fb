"""A small DeepSeek-style MoE layer (softmax top-k router + SwiGLU experts), in two forms:

- ``ep_forward``: one rank's part with expert parallelism through :class:`ubep.Buffer`;
- ``single_process_forward``: the same layer over every rank's tokens in one process, the
  computation the distributed one is checked against.

Parameters are made from a seed and the expert id alone, so every rank and the single-process check
build the same weights without communicating. Tokens travel in ``shape.dtype``; the experts keep
fp32 weights and compute in fp32 (CPU bf16 matrix products are tens of times slower than fp32),
returning their output in ``shape.dtype``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ubep.buffer import Buffer, DispatchResult
from ubep.reduce import ordered_sum, rank_partial_sum


@dataclass(frozen=True, kw_only=True)
class MoEShape:
    hidden: int = 1024
    num_experts: int = 64
    top_k: int = 8
    intermediate: int = 256
    dtype: torch.dtype = torch.bfloat16


def router_weight(shape: MoEShape, seed: int) -> torch.Tensor:
    """``[H, E]`` fp32."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape.hidden, shape.num_experts, generator=gen) * shape.hidden**-0.5


def expert_weights(shape: MoEShape, seed: int, experts: range) -> list[list[torch.Tensor]]:
    """Per expert in ``experts``: ``[gate [H, I], up [H, I], down [I, H]]`` fp32.

    One tensor per expert, not a stacked ``[E, ...]`` one: indexing a stacked tensor makes autograd
    allocate a full-size zero gradient per expert.
    """
    params = []
    for e in experts:
        gen = torch.Generator().manual_seed(seed * 100_003 + e + 1)
        h, i = shape.hidden, shape.intermediate
        params.append([torch.randn(h, i, generator=gen) * h**-0.5,
                       torch.randn(h, i, generator=gen) * h**-0.5,
                       torch.randn(i, h, generator=gen) * i**-0.5])
    return params


def route(x_TH: torch.Tensor, router_HE: torch.Tensor, top_k: int):
    """Softmax router: ``(topk_idx [T, K] int64, topk_weights [T, K] fp32)``, weights sum to 1."""
    probs = torch.softmax(x_TH.float() @ router_HE, dim=-1)
    vals, idx = probs.topk(top_k, dim=-1)
    return idx, vals / vals.sum(-1, keepdim=True)


def swiglu(rows_NH: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """``[N, H]`` rows -> ``[N, H]`` in the rows' dtype, computed in fp32."""
    gate_HI, up_HI, down_IH = params
    x = rows_NH.float()
    return ((F.silu(x @ gate_HI) * (x @ up_HI)) @ down_IH).to(rows_NH.dtype)


def run_local_experts(res: DispatchResult, weights: list[list[torch.Tensor]]) -> torch.Tensor:
    """SwiGLU of each local expert on its received rows, in the dispatch output layout."""
    counts = res.tokens_per_expert.tolist()
    if res.recv_x.dim() == 3:  # padded: [E_local, capacity, H], only the first n rows are tokens
        outs = [torch.cat([swiglu(res.recv_x[j, :n], weights[j]),
                           res.recv_x.new_zeros(res.recv_x.shape[1] - n, res.recv_x.shape[2])])
                for j, n in enumerate(counts)]
        return torch.stack(outs)
    chunks = res.recv_x.split(counts)
    return torch.cat([swiglu(c, weights[j]) for j, c in enumerate(chunks)])


def ep_forward(buf: Buffer, x_TH, router_HE, weights, reduce: str = "source"):
    """One rank's MoE output ``[T, H]`` and the dispatch handle: route, dispatch, experts, combine."""
    idx, gate_w = route(x_TH, router_HE, buf.config.top_k)
    res = buf.dispatch(x_TH, idx, gate_w)
    return buf.combine(run_local_experts(res, weights), res.handle, reduce=reduce), res.handle


def single_process_forward(xs: list[torch.Tensor], router_HE, weights, shape: MoEShape,
                           reduce: str = "source"):
    """Every rank's output ``[T_s, H]`` computed in one process: experts applied to their rows in
    receive order (source rank, then token), outputs summed as ``reduce`` defines."""
    routes = [route(x, router_HE, shape.top_k) for x in xs]
    pieces: list[list[tuple]] = [[] for _ in xs]  # per source: (token ids, k ids, outputs)
    for e in range(shape.num_experts):
        where = [(idx == e).nonzero(as_tuple=True) for idx, _ in routes]
        rows = torch.cat([x[t] for x, (t, _) in zip(xs, where, strict=True)])
        outs = swiglu(rows, weights[e]).split([len(t) for t, _ in where])
        for s, ((t, k), out) in enumerate(zip(where, outs, strict=True)):
            pieces[s].append((t, k, out))
    ys = []
    for x, (idx, w), got in zip(xs, routes, pieces, strict=True):
        t, k, out = (torch.cat(p) for p in zip(*got, strict=True))
        contrib = x.new_zeros(x.shape[0], shape.top_k, shape.hidden).index_put((t, k), out)
        if reduce == "source":
            y = ordered_sum(contrib, idx >= 0, w)
        else:
            rank = torch.div(idx, shape.num_experts // len(xs), rounding_mode="floor")
            y = rank_partial_sum(contrib, idx >= 0, rank, len(xs), shape.dtype, w)
        ys.append(y.to(shape.dtype))
    return ys
