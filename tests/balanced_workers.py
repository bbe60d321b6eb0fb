"""Rank functions for tests/test_balanced_buffer.py, run by ``ubep.launch.run_ranks``.

Every rank rebuilds every rank's inputs from the case, runs the layer of
:mod:`ubep.balanced_layer` balanced and unbalanced, and compares both with the one-process layer
itself; only booleans and the plan travel back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import ubep
from ubep import balanced_layer, workloads
from ubep.balanced import BalancedBuffer
from ubep.exact_expert import exact_weights


@dataclass(frozen=True)
class BalancedCase:
    tokens: tuple[int, ...]  # T_s per rank
    hidden: int = 12
    intermediate: int = 6
    experts_per_rank: int = 2
    top_k: int = 2
    maxvio: float = 3.0
    hot: tuple[int, ...] = (0,)
    drop: float = 0.0
    dtype: torch.dtype = torch.float32
    seed: int = 0
    backend: str = "reference"  # the backend that moves the BalancedBuffer's rows


def case_inputs(case: BalancedCase, rank: int, world: int):
    """``(x [T, H], topk_idx [T, K], gate [T, K] fp32, loss_w [T, H] fp32)`` of ``rank``."""
    num_tokens, experts = case.tokens[rank], case.experts_per_rank * world
    gen = torch.Generator().manual_seed(case.seed * 1009 + rank)
    idx = workloads.skewed_topk(num_tokens, experts, case.top_k, maxvio=case.maxvio,
                                hot_experts=list(case.hot), generator=gen)
    if case.drop:
        idx = workloads.drop_slots(idx, case.drop, generator=gen)
    x = workloads.origin_tokens(rank, num_tokens, case.hidden, case.dtype)
    gate = workloads.origin_weights(rank, num_tokens, case.top_k)
    return x, idx, gate, torch.randn(num_tokens, case.hidden, generator=gen)


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def compare_rank(rank: int, world: int, case: BalancedCase) -> dict:
    experts = case.experts_per_rank * world
    shape = {"hidden": case.hidden, "num_experts": experts, "top_k": case.top_k,
             "max_tokens_per_rank": max(max(case.tokens), 1), "dtype": case.dtype}
    balanced = BalancedBuffer(**shape, weight_shapes=[(case.hidden, case.intermediate),
                                                      (case.intermediate, case.hidden)], backend=case.backend)
    plain = ubep.Buffer(**shape)
    weights = exact_weights(case.hidden, case.intermediate, case.seed, range(experts))
    own = weights[rank * case.experts_per_rank : (rank + 1) * case.experts_per_rank]
    inputs = [case_inputs(case, s, world) for s in range(world)]
    got = balanced_layer.balanced_step(balanced, *inputs[rank], own)
    ref = balanced_layer.unbalanced_step(plain, *inputs[rank], own)
    sources, grad_weights = balanced_layer.one_process_step(*map(list, zip(*inputs, strict=True)),
                                                            weights)
    want = [*sources[rank], grad_weights[rank * case.experts_per_rank :
                                         (rank + 1) * case.experts_per_rank]]
    checks = {}
    for name, i in (("y", 0), ("grad_x", 1), ("grad_gate", 2)):
        checks[name] = (torch.equal(got[i], ref[i]), torch.equal(ref[i], want[i]))
    checks["grad_weights"] = (all(_same(g, r) for g, r in zip(got[3], ref[3], strict=True)),
                              all(_same(r, w) for r, w in zip(ref[3], want[3], strict=True)))
    plan = got[4].plan
    rows_backend = balanced.rows_backend
    balanced.destroy()
    return {"checks": checks, "rows_backend": rows_backend, "rows": int(got[4].tokens_per_segment.sum()),
            "rows_unbalanced": int(ref[4].tokens_per_expert.sum()),
            "borrowed": plan.borrowed_WL[rank].tolist(), "targets": plan.targets_W.tolist()}


def compare_rank_on_gpu(rank: int, world: int, case: BalancedCase) -> dict:
    """The balanced layer with its rows on the cuda backend against the unbalanced reference layer
    on the same GPU, bit for bit (outputs and every gradient), over an NCCL group; and the rows
    each rank computed."""
    dev = torch.device("cuda", torch.cuda.current_device())
    experts = case.experts_per_rank * world
    shape = {"hidden": case.hidden, "num_experts": experts, "top_k": case.top_k,
             "max_tokens_per_rank": max(max(case.tokens), 1), "dtype": case.dtype, "device": dev}
    balanced = BalancedBuffer(**shape, weight_shapes=[(case.hidden, case.intermediate),
                                                      (case.intermediate, case.hidden)], backend="cuda")
    plain = ubep.Buffer(**shape, backend="reference")
    weights = exact_weights(case.hidden, case.intermediate, case.seed, range(experts))
    own = [[w.to(dev) for w in ws] for ws in weights[rank * case.experts_per_rank :
                                                     (rank + 1) * case.experts_per_rank]]
    inputs = [t.to(dev) for t in case_inputs(case, rank, world)]
    got = balanced_layer.balanced_step(balanced, *inputs, own)
    ref = balanced_layer.unbalanced_step(plain, *inputs, own)
    same = [torch.equal(got[i], ref[i]) for i in range(3)]
    same.append(all(_same(g, r) for g, r in zip(got[3], ref[3], strict=True)))
    rows_backend = balanced.rows_backend
    balanced.destroy()
    return {"same": same, "rows_backend": rows_backend, "rows": int(got[4].tokens_per_segment.sum()),
            "targets": got[4].plan.targets_W.tolist()}


def compare_cases(rank: int, world: int, cases: list[BalancedCase]) -> list[dict]:
    return [compare_rank(rank, world, case) for case in cases]


def disagreeing_rank(rank: int, world: int, what: str) -> None:
    """Rank 0 makes a BalancedBuffer; rank 1 one with other weight shapes, its rows on another
    backend, or a plain Buffer."""
    shape = {"hidden": 8, "num_experts": 2 * world, "top_k": 2, "max_tokens_per_rank": 4}
    if what == "plain" and rank == 1:
        ubep.Buffer(**shape)
    else:
        inner = 6 if rank == 1 and what == "shapes" else 4
        rows = "ascend" if rank == 1 and what == "rows" else "reference"
        BalancedBuffer(**shape, weight_shapes=[(8, inner), (inner, 8)], backend=rows)
