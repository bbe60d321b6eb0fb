"""``ubep demo --balance redundant``: a skewed MoE layer on W CPU ranks through a BalancedBuffer,
forward and backward, checked bit for bit against the same layer computed in one process.

Per rank it reports the rows received with and without balancing, the experts each rank
borrowed, and the weight bytes moved (borrowed weights in, gradient accumulators out). The experts
are :mod:`ubep.exact_expert` MLPs, whose bits for a row do not depend on the rows beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ubep import workloads
from ubep.balance.chain import chain_steps
from ubep.balanced import BalancedBuffer
from ubep.balanced_layer import balanced_step, one_process_step
from ubep.exact_expert import exact_weights
from ubep.launch import run_ranks


@dataclass(frozen=True)
class BalancedDemoOptions:
    ranks: int = 4
    tokens: int = 256
    hidden: int = 1024
    num_experts: int = 64
    top_k: int = 8
    intermediate: int = 256
    dtype: torch.dtype = torch.bfloat16
    maxvio: float = 3.0
    seed: int = 0
    backend: str = "reference"  # what moves the rows: reference or ascend (the CPU twin)


def demo_inputs(opts: BalancedDemoOptions, rank: int):
    """``(x [T, H], topk_idx [T, K], gate [T, K] fp32, loss_w [T, H] fp32)`` of ``rank``; expert 0
    is hot (``maxvio``), so rank 0 is the overloaded home."""
    gen = torch.Generator().manual_seed(opts.seed * 7919 + rank)
    idx = workloads.skewed_topk(opts.tokens, opts.num_experts, opts.top_k, maxvio=opts.maxvio,
                                generator=gen)
    x = torch.randn(opts.tokens, opts.hidden, generator=gen).to(opts.dtype)
    gate = torch.softmax(torch.randn(opts.tokens, opts.top_k, generator=gen), -1)
    return x, idx, gate, torch.randn(opts.tokens, opts.hidden, generator=gen)


def demo_rank(rank: int, world_size: int, opts: BalancedDemoOptions) -> dict:
    buf = BalancedBuffer(hidden=opts.hidden, num_experts=opts.num_experts, top_k=opts.top_k,
                         max_tokens_per_rank=opts.tokens, dtype=opts.dtype,
                         weight_shapes=[(opts.hidden, opts.intermediate),
                                        (opts.intermediate, opts.hidden)], backend=opts.backend)
    own = exact_weights(opts.hidden, opts.intermediate, opts.seed, buf.config.local_experts)
    t0 = time.perf_counter()
    y, grad_x, grad_gate, grad_weights, handle = balanced_step(buf, *demo_inputs(opts, rank), own)
    return {"y": y, "grad_x": grad_x, "grad_gate": grad_gate, "grad_weights": grad_weights,
            "plan": handle.plan, "step_s": time.perf_counter() - t0,
            "weight_bytes": buf.weight_numel * buf.weight_dtype.itemsize, "pool": buf.pool_bytes}


def _check(opts: BalancedDemoOptions, results: list[dict]) -> list[tuple[str, bool]]:
    inputs = [demo_inputs(opts, s) for s in range(opts.ranks)]
    weights = exact_weights(opts.hidden, opts.intermediate, opts.seed, range(opts.num_experts))
    sources, grad_weights = one_process_step(*map(list, zip(*inputs, strict=True)), weights)
    rows = [(name, all(torch.equal(res[name], want[i]) for res, want in
                       zip(results, sources, strict=True)))
            for i, name in enumerate(("y", "grad_x", "grad_gate"))]
    got = [g for res in results for expert in res["grad_weights"] for g in expert]
    want = [g for expert in grad_weights for g in expert]
    return [*rows, ("grad_weights", all(map(torch.equal, got, want)))]


def report(opts: BalancedDemoOptions, results: list[dict], checks, elapsed: float) -> bool:
    plan, w = results[0]["plan"], opts.ranks
    local = opts.num_experts // w
    per_expert = plan.alloc_WE.sum(0)
    unbalanced = per_expert.view(w, local).sum(1).tolist()
    balanced = plan.tokens_per_segment_WG.sum(1).tolist()
    size = results[0]["weight_bytes"]
    borrowed = plan.borrowed_WL.tolist()
    homes = [sum(1 for d in range(w) for e in borrowed[d] if e >= 0 and e // local == h)
             for h in range(w)]
    steps = chain_steps(plan.alloc_WE)
    grads_out = [sum(1 for s in steps if s.rank == r and s.to != r) for r in range(w)]
    dt = str(opts.dtype).removeprefix("torch.")
    print(f"\nubep demo --balance redundant: {w} CPU ranks over gloo, rows through backend "
          f"{opts.backend}, routing skew maxvio {opts.maxvio:g} (expert 0 hot)")
    print(f"layer: hidden {opts.hidden}, {opts.num_experts} experts ({local} per rank), "
          f"top-{opts.top_k}, row-exact ReLU MLP intermediate {opts.intermediate}, {dt}, "
          f"{opts.tokens} tokens per rank ({opts.tokens * opts.top_k} rows)")
    print(f"\n{'rank':>4} {'rows unbalanced':>16} {'rows balanced':>14}  {'borrowed experts':<18}"
          f"{'weights sent':>13} {'weights in':>11} {'grads sent':>11}")
    for r in range(w):
        mine = [e for e in borrowed[r] if e >= 0]
        print(f"{r:>4} {unbalanced[r]:>16} {balanced[r]:>14}  {str(mine):<18}"
              f"{homes[r] * size:>11} B {len(mine) * size:>9} B {grads_out[r] * size:>9} B")
    moved = sum(homes) * size
    print(f"weight bytes moved: {moved} B of borrowed weights, {sum(grads_out) * size} B of "
          f"gradient accumulators ({size} B per expert; pool {results[0]['pool']} B per rank, "
          f"{local} slots)")
    print(f"max / mean rows: {max(unbalanced) * w / sum(unbalanced):.2f} unbalanced, "
          f"{max(balanced) * w / max(sum(balanced), 1):.2f} balanced")
    print("\ncheck against the one-process layer:")
    for name, exact in checks:
        print(f"  {name:<15} {'bit-exact' if exact else 'differs':<12} {'PASS' if exact else 'FAIL'}")
    ok = all(exact for _, exact in checks)
    print(f"\n{'PASS' if ok else 'FAIL'} ({elapsed:.1f} s)")
    return ok


def run_balanced_demo(opts: BalancedDemoOptions) -> int:
    start = time.perf_counter()
    print(f"spawning {opts.ranks} ranks over gloo", flush=True)
    results = run_ranks(demo_rank, opts.ranks, opts, timeout_s=1800)
    checks = _check(opts, results)
    return 0 if report(opts, results, checks, time.perf_counter() - start) else 1
