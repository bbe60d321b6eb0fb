"""``ubep demo``: an MoE layer run with expert parallelism on W CPU ranks over gloo, forward and
backward, checked against the same layer computed in one process, with a report of bytes on the wire
and per-phase times."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends.base import WireStats
from ubep.buffer import Buffer
from ubep.launch import run_ranks
from ubep.moe import MoEShape, ep_forward, expert_weights, router_weight, single_process_forward
from ubep.profiling import breakdown_table


@dataclass(frozen=True)
class DemoOptions:
    ranks: int = 4
    tokens: int = 256
    shape: MoEShape = MoEShape()
    layout: str = "compact"
    backend: str = "auto"
    reduce: str = "source"
    sync: str | None = None  # None: the backend's default (ubep.buffer.DEFAULT_SYNC)
    iters: int = 3
    seed: int = 0


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2e-2


def _inputs(opts: DemoOptions, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [T, H] in dtype, loss weights [T, H] fp32)`` of ``rank``."""
    gen = torch.Generator().manual_seed(opts.seed * 7919 + rank)
    x = torch.randn(opts.tokens, opts.shape.hidden, generator=gen).to(opts.shape.dtype)
    return x, torch.randn(opts.tokens, opts.shape.hidden, generator=gen)


def _say(start: float, text: str) -> None:
    print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)


def demo_rank(rank: int, world_size: int, opts: DemoOptions, start: float) -> dict:
    shape = opts.shape
    if rank == 0:
        _say(start, f"{world_size} ranks up: making the buffer and the layer's weights")
    buf = Buffer(hidden=shape.hidden, num_experts=shape.num_experts, top_k=shape.top_k,
                 max_tokens_per_rank=opts.tokens, dtype=shape.dtype, backend=opts.backend,
                 layout=opts.layout, sync=opts.sync, profile=True)
    router = router_weight(shape, opts.seed).requires_grad_()
    local = expert_weights(shape, opts.seed, buf.config.local_experts)
    params = [p.requires_grad_() for expert in local for p in expert]
    x, loss_w = _inputs(opts, rank)
    x.requires_grad_()
    step_ms = []
    for it in range(opts.iters):
        if rank == 0:
            _say(start, f"step {it + 1}/{opts.iters}: dispatch -> experts -> combine, backward")
        t0 = time.perf_counter()
        y, handle = ep_forward(buf, x, router, local, opts.reduce)
        grads = torch.autograd.grad((y.float() * loss_w).sum(), [x, router, *params])
        step_ms.append((time.perf_counter() - t0) * 1e3)
    grad_x, grad_router, *grad_params = grads
    dist.all_reduce(grad_router)
    # [gate [E_local, H, I], up [E_local, H, I], down [E_local, I, H]] for the gather to rank 0.
    grad_local = [torch.stack(grad_params[i::3]) for i in range(3)]
    stats = {"backend": buf.backend_name, "wire": handle.wire,
             "rows": int(handle.tokens_per_expert.sum()),
             "step_ms": step_ms, "phases": buf.phase_times()}
    gathered = [[torch.empty_like(t) for _ in range(world_size)] if rank == 0 else None
                for t in (y, grad_x, *grad_local)]
    for t, into in zip((y, grad_x, *grad_local), gathered, strict=True):
        dist.gather(t.detach().contiguous(), into, dst=0)
    if rank != 0:
        return stats
    _say(start, "checking against the same layer computed in one process")
    y_all, gx_all, *g_local_all = gathered
    stats["checks"] = _check(opts, y_all, gx_all, grad_router, g_local_all)
    return stats


def _check(opts: DemoOptions, y_all, gx_all, grad_router, g_local_all) -> list[tuple]:
    """Rows of (what, max |diff| / max |want|, bit-exact, pass)."""
    shape = opts.shape
    inputs = [_inputs(opts, s) for s in range(opts.ranks)]
    xs = [x.clone().requires_grad_() for x, _ in inputs]
    router = router_weight(shape, opts.seed).requires_grad_()
    weights = expert_weights(shape, opts.seed, range(shape.num_experts))
    params = [p.requires_grad_() for expert in weights for p in expert]
    ys = single_process_forward(xs, router, weights, shape, opts.reduce)
    loss = sum((y.float() * lw).sum() for y, (_, lw) in zip(ys, inputs, strict=True))
    grads = torch.autograd.grad(loss, [*xs, router, *params])
    grad_params = grads[opts.ranks + 1 :]
    want = {
        "forward y": (torch.cat(y_all), torch.cat([y.detach() for y in ys])),
        "grad x": (torch.cat(gx_all), torch.cat(grads[: opts.ranks])),
        "grad router": (grad_router, grads[opts.ranks]),
    }
    for i, name in enumerate(("grad gate_proj", "grad up_proj", "grad down_proj")):
        want[name] = (torch.cat(g_local_all[i]), torch.stack(grad_params[i::3]))
    rows = []
    for name, (got, ref) in want.items():
        err = float((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(
            min=1e-30))
        rows.append((name, err, torch.equal(got, ref), err <= _tolerance(shape.dtype)))
    return rows


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _wire_line(wire: list[WireStats | None]) -> str:
    """The last dispatch's bytes to other ranks, summed over the ranks; ``None``: not counted (a
    backend may leave them out, as counting them would cost it a host synchronization)."""
    if any(stats is None for stats in wire):
        return "dispatch bytes to other ranks: not reported by this backend"
    relay = sum(x.token_bytes for x in wire)
    naive = sum(x.naive_token_bytes for x in wire)
    meta = sum(x.route_bytes + x.count_bytes for x in wire)
    return (f"dispatch bytes to other ranks, all ranks: tokens {_mb(relay)} (once per destination "
            f"rank) vs {_mb(naive)} for a per-expert all-to-all ({naive / max(relay, 1):.2f}x); "
            f"routing and counts {_mb(meta)}")


def report(opts: DemoOptions, results: list[dict], elapsed: float) -> bool:
    shape, w = opts.shape, opts.ranks
    dt = str(shape.dtype).removeprefix("torch.")
    print(f"\nubep demo: {w} CPU ranks over gloo, backend {results[0]['backend']} "
          f"(asked: {opts.backend}), layout {opts.layout}, "
          f"combine reduce={opts.reduce}")
    print(f"layer: hidden {shape.hidden}, {shape.num_experts} experts ({shape.num_experts // w} "
          f"per rank), top-{shape.top_k}, SwiGLU intermediate {shape.intermediate}, {dt}, "
          f"{opts.tokens} tokens per rank")
    print(f"rows received per rank: {[r['rows'] for r in results]}")
    print(_wire_line([r["wire"] for r in results]))
    step = sorted(results[0]["step_ms"])[len(results[0]["step_ms"]) // 2]
    print(f"\nrank 0, median over {opts.iters} steps (forward + backward: {step:.1f} ms per step):")
    print(breakdown_table(results[0]["phases"]))
    print("\ncheck against the single-process layer:")
    ok = True
    for name, err, exact, passed in results[0]["checks"]:
        ok &= passed
        tag = "bit-exact" if exact else f"max rel diff {err:.2e}"
        print(f"  {name:<15} {tag:<26} {'PASS' if passed else 'FAIL'}")
    print(f"\n{'PASS' if ok else 'FAIL'} ({elapsed:.1f} s)")
    return ok


def run_demo(opts: DemoOptions) -> int:
    start = time.perf_counter()
    _say(start, f"spawning {opts.ranks} ranks over gloo")
    results = run_ranks(demo_rank, opts.ranks, opts, start, timeout_s=1800)
    sys.stdout.flush()
    return 0 if report(opts, results, time.perf_counter() - start) else 1
