"""One GPU (W = 1): each ubep call beside the plain kernels that move exactly its rows, in one run.

    PYTHONPATH=. python3 benchmarks/one_gpu.py --out one-gpu-out
    PYTHONPATH=. python3 benchmarks/one_gpu.py --shapes 7168:256:8 --tokens 128 4096 --syncs sw tff

At W = 1 every row stays in the GPU's memory, so a call costs its kernels and its host, with no
link: the part of every call that carries over to any W. Per model shape and token count, in one
process: a plain Triton gather of x's rows in expert-sorted order (the rows a dispatch moves), a
plain Triton weighted fp32 reduce of each token's K rows (what a combine computes), torch's own
permute (argsort + index_select) and un-permute (index_select + weighted sum), and ubep's dispatch
and combine (reduce="source") in each layout and sync mode: eager, timed with CUDA events, with the
host's own time per call beside (the call's Python and launches, measured on the host clock with the
GPU idle before it), and for the padded layout dispatch + combine as one CUDA-graph replay beside the
two plain kernels replayed as one graph.
``ratio`` is ubep's time over its plain kernel's. Writes results.csv and results.md under --out and
prints the table. Padded buffers hold T rows per local expert: above --padded-max tokens they are
skipped (a decode layout; 8192 tokens x 256 experts x 7168 bf16 would be 30 GB).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import ubep
from ubep.launch import run_ranks
from ubep.profiling import write_table
from ubep.workloads import origin_tokens, origin_weights, skewed_topk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ep import graphed, parse_shape, time_calls  # noqa: E402  (benchmarks/ is not a package)

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
BLOCK = 1024  # elements of a row one program moves at a time in the plain kernels


def plain_kernels():
    """``(gather, weighted_reduce)``: the plain Triton kernels (imported here: the module loads
    without Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def gather_rows(x_ptr, rows_ptr, out_ptr, H: tl.constexpr, BLOCK: tl.constexpr):
        """out[i] = x[rows[i]], one program per row."""
        i = tl.program_id(0)
        src = tl.load(rows_ptr + i).to(tl.int64)
        for h in range(0, H, BLOCK):
            offs = h + tl.arange(0, BLOCK)
            keep = offs < H
            row = tl.load(x_ptr + src * H + offs, mask=keep)
            tl.store(out_ptr + i.to(tl.int64) * H + offs, row, mask=keep)

    @triton.jit
    def weighted_reduce(rows_ptr, pos_ptr, w_ptr, y_ptr, K: tl.constexpr, H: tl.constexpr,
                        BLOCK: tl.constexpr):
        """y[t] = sum over k, in k order, of w[t, k] * rows[pos[t, k]] in fp32 (pos -1: none)."""
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < H
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(K):
            p = tl.load(pos_ptr + t * K + k).to(tl.int64)
            row = tl.load(rows_ptr + p * H + offs, mask=keep & (p >= 0), other=0.0).to(tl.float32)
            acc += tl.load(w_ptr + t * K + k) * row
        tl.store(y_ptr + t * H + offs, acc.to(y_ptr.dtype.element_ty), mask=keep)

    def gather(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(rows.numel(), x.shape[1])
        if rows.numel():
            gather_rows[(rows.numel(),)](x, rows, out, H=x.shape[1], BLOCK=BLOCK)
        return out

    def reduce(rows: torch.Tensor, pos: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        T, K = pos.shape
        y = rows.new_empty(T, rows.shape[1])
        if T:
            weighted_reduce[(T, triton.cdiv(rows.shape[1], BLOCK))](rows, pos, w, y, K=K, H=rows.shape[1],
                                                                     BLOCK=BLOCK)
        return y

    return gather, reduce


def sorted_pairs(idx: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows [N] int32, pos [T, K] int32)``: the token of each routed pair in (expert, token) order,
    as a dispatch delivers them, and each pair's place in that order (-1: no expert)."""
    flat = idx.flatten()
    order = torch.argsort(torch.where(flat >= 0, flat, experts), stable=True)[: int((flat >= 0).sum())]
    pos = torch.full_like(flat, -1, dtype=torch.int32)
    pos[order] = torch.arange(order.numel(), dtype=torch.int32, device=idx.device)
    return (order // idx.shape[1]).int(), pos.view(idx.shape)


def host_us(fn, iters: int) -> float:
    """Median host time of one call of ``fn`` (µs), the GPU idle before each."""
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def one_shape_rank(rank: int, world: int, args: argparse.Namespace,
                   shape: tuple[int, int, int]) -> list[dict]:
    kernels = plain_kernels()
    return [row for tokens in args.tokens for row in one_case(shape, tokens, args, kernels)]


def one_case(shape: tuple[int, int, int], tokens: int, args: argparse.Namespace, kernels) -> list[dict]:
    """Every row of one model shape at ``tokens`` tokens."""
    hidden, experts, top_k = shape
    gather, reduce = kernels
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(tokens)
    idx = skewed_topk(tokens, experts, top_k, maxvio=0.0, hot_experts=[], generator=gen).to(dev)
    x = origin_tokens(0, tokens, hidden, torch.bfloat16).to(dev)
    w = origin_weights(0, tokens, top_k).to(dev)
    order, pos = sorted_pairs(idx, experts)
    expert_out = gather(x, order)
    med = lambda fn: statistics.median(time_calls(fn, args.iters, args.warmup))  # noqa: E731
    case = {"hidden": hidden, "experts": experts, "top_k": top_k, "tokens": tokens, "rows": order.numel()}
    plain = {"dispatch": med(lambda: gather(x, order)), "combine": med(lambda: reduce(expert_out, pos, w))}
    torch_us = {  # uniform routing: every pair has an expert, so pos holds no -1
        "dispatch": med(lambda: x.index_select(0, torch.argsort(idx.flatten(), stable=True) // top_k)),
        "combine": med(lambda: (expert_out.index_select(0, pos.flatten().long()).view(tokens, top_k, hidden)
                                .float() * w.unsqueeze(2)).sum(1).to(x.dtype))}
    plain_graph = None  # the two plain kernels as one CUDA-graph replay, beside ubep's replays
    if "padded" in args.layouts and tokens <= args.padded_max:
        graph, _ = graphed(lambda: reduce(gather(x, order), pos, w))
        plain_graph = med(graph.replay)
        del graph
    rows = []
    for layout in args.layouts:
        if layout == "padded" and tokens > args.padded_max:
            continue
        for sync in args.syncs:
            buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k, max_tokens_per_rank=tokens,
                              dtype=torch.bfloat16, backend="cuda", layout=layout, sync=sync,
                              check_inputs=False, device=dev)
            res = buf.dispatch(x, idx, w)
            calls = {"dispatch": lambda b=buf: b.dispatch(x, idx, w),
                     "combine": lambda b=buf, r=res: b.combine(r.recv_x, r.handle)}
            for op, call in calls.items():
                rows.append(_row(case, f"{op} {layout} {sync}", "eager", med(call), host_us(call, args.iters),
                                 plain[op], torch_us[op]))
            if layout == "padded":
                graph, _ = graphed(lambda b=buf: _step(b, x, idx, w))
                rows.append(_row(case, f"dispatch+combine {layout} {sync}", "graph", med(graph.replay),
                                 host_us(graph.replay, args.iters), plain_graph,
                                 torch_us["dispatch"] + torch_us["combine"]))
                del graph
            buf.destroy()
            del buf, res
            torch.cuda.empty_cache()
    return rows


def _row(case: dict, call: str, mode: str, us: float, host: float, plain: float, torch_us: float) -> dict:
    return {**case, "call": call, "mode": mode, "ubep_us": round(us, 1), "host_us": round(host, 1),
            "plain_us": round(plain, 1), "ratio": round(us / plain, 2), "torch_us": round(torch_us, 1)}


def _step(buf: ubep.Buffer, x, idx, w) -> torch.Tensor:
    """One dispatch and the combine of its rows, as a decode step's graph holds them."""
    res = buf.dispatch(x, idx, w)
    return buf.combine(res.recv_x, res.handle)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=parse_shape, nargs="+", metavar="H:E:K",
                   default=[(7168, 256, 8), (4096, 128, 8), (2048, 64, 4)],
                   help="model shapes, each HIDDEN:EXPERTS:TOP_K (default: DeepSeek-V3's, two smaller)")
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512, 4096, 8192])
    p.add_argument("--layouts", nargs="+", default=["compact", "padded"])
    p.add_argument("--syncs", nargs="+", default=["sw", "tff"])
    p.add_argument("--padded-max", type=int, default=4096, help="largest token count of a padded buffer")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("one-gpu-out"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("one_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    table = []
    for shape in args.shapes:
        table += run_ranks(one_shape_rank, 1, args, shape, pg_backend="nccl", timeout_s=3000)[0]
    header = (f"W = 1 on {torch.cuda.get_device_name(0)}, bf16, uniform routing; medians of {args.iters} "
              f"calls after {args.warmup} warm-up (CUDA events; host_us: the host clock); torch "
              f"{torch.__version__}; {time.perf_counter() - t0:.0f} s")
    print(write_table(table, args.out / "results", header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
