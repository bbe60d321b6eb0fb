"""Side-by-side timing of expert-parallel dispatch and combine on W GPUs of one host.

    python benchmarks/bench_ep.py --out bench-out            # every visible GPU, default shapes
    python benchmarks/bench_ep.py --shapes 7168:256:8 2048:64:4 --tokens 128 4096   # a sweep

One run measures, per routing case: the ubep backends (reference on NCCL, cuda on NVLink symmetric
memory, in each sync mode; dispatch, combine with each reduction), NCCL's
``all_to_all_single`` sending every (token, expert) pair (the naive per-expert all-to-all), the same
rows through torch's NVSHMEM ``all_to_all_vdev`` with ``--vdev`` where it runs, and once per run a large
peer-to-peer copy between GPU 0 and GPU 1 as the link ceiling, and an all-to-all of 1 GiB per rank
as the ceiling of every rank sending at once (on one GPU, ``--ranks 1``: a copy within it, and no
all-to-all or ``all_to_all_vdev``; every row then stays on the GPU, which isolates the kernels' own
costs and the host's from the link). Times come from CUDA events after a warm-up (the padded
layout's CUDA-graph replays also queued behind a delay kernel, the host's launch latency hidden as
inside a model's graph); each figure is the median over the iterations with the min-max spread, on
rank 0, plus the slowest rank's median. Bytes are those that crossed between rank 0 and the other
ranks: for dispatch what rank 0 sent, for combine what came back to rank 0. ``programs`` is the
cuda backend's grid (thread blocks, each on one SM at a time; at most that many SMs). ``--shapes``
runs every case once per model shape (hidden, experts, top-k), each row naming its shape. Writes
``results.csv``, ``results.md`` and ``results.png`` (the first shape) under ``--out`` and prints
the table.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ubep
from ubep.backends.base import WireStats
from ubep.launch import run_ranks
from ubep.profiling import write_table
from ubep.workloads import origin_tokens, origin_weights, skewed_topk

# NVLink multicast stays off on the machines we run on.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1")
A2A_BYTES = 1 << 30  # what each rank sends in the all-to-all ceiling, split evenly over all ranks
PADDED_MAX_TOKENS = 512  # the padded (decode) layout holds W * T rows per local expert
DELAY_CYCLES = 400_000  # a delay kernel of about 200 µs at 2 GHz: longer than queueing a graph replay


def link_ceiling_gbps(num_bytes: int = 1 << 30, iters: int = 10, peer: int = 1) -> float:
    """One-direction GPU 0 -> GPU ``peer`` copy bandwidth in GB/s (median); ``peer=0``: a copy
    within GPU 0 (on one GPU every row stays in its memory)."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda:0").random_(0, 255)
    dst = torch.empty(num_bytes, dtype=torch.uint8, device=f"cuda:{peer}")
    times = []
    for i in range(iters + 2):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record(torch.cuda.current_stream(0))
        dst.copy_(src)
        end.record(torch.cuda.current_stream(0))
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(peer)
        if i >= 2:
            times.append(start.elapsed_time(end) / 1e3)
    return num_bytes / statistics.median(times) / 1e9


def a2a_ceiling_rank(rank: int, world: int, args: argparse.Namespace) -> float:
    """GB/s this rank sends to its peers while every rank sends to every other at once: NCCL's
    ``all_to_all_single`` of ``A2A_BYTES`` in equal parts, the part to itself not counted. At W > 2
    the ceiling of an EP all-to-all, which one pair's copy (``link_ceiling_gbps``) does not give."""
    dev = torch.device("cuda", torch.cuda.current_device())
    part = A2A_BYTES // world
    inp = torch.empty(world * part, dtype=torch.uint8, device=dev)
    out = torch.empty_like(inp)
    us = time_calls(lambda: dist.all_to_all_single(out, inp), args.iters, args.warmup)
    return (world - 1) * part / (statistics.median(us) * 1e-6) / 1e9


def time_calls(fn, iters: int, warmup: int, queued: bool = False) -> list[float]:
    """µs per call of ``fn`` (CUDA events, a barrier before each call so ranks start together).
    ``queued``: each call queued behind a delay kernel, so that the GPU reaches the start event with
    the call already queued: the GPU's time alone, without the host's launch latency (what a call
    costs inside a larger graph, the previous kernel still running); raises if the host took longer
    to queue the call than the delay lasted."""
    out = []
    for i in range(warmup + iters):
        dist.barrier()
        torch.cuda.synchronize()
        before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        before.record()
        if queued:
            torch.cuda._sleep(DELAY_CYCLES)
        start.record()
        t0 = time.perf_counter()
        fn()
        end.record()
        queued_ms = (time.perf_counter() - t0) * 1e3
        end.synchronize()
        if queued and before.elapsed_time(start) <= queued_ms:
            raise RuntimeError(f"the delay kernel ({before.elapsed_time(start):.3f} ms) ended before "
                               f"the host had queued the call ({queued_ms:.3f} ms): raise DELAY_CYCLES")
        if i >= warmup:
            out.append(start.elapsed_time(end) * 1e3)
    return out


def routing(rank: int, tokens: int, maxvio: float, args, dev):
    """This rank's ``(x [T, H] bf16, topk_idx [T, K], topk_weights [T, K])`` for one case."""
    gen = torch.Generator().manual_seed(rank * 131 + tokens)
    idx = skewed_topk(tokens, args.experts, args.top_k, maxvio=maxvio,
                      hot_experts=list(range(0, args.experts, args.experts // 8))
                      if maxvio else [], generator=gen).to(dev)
    x = origin_tokens(rank, tokens, args.hidden, torch.bfloat16).to(dev)
    return x, idx, origin_weights(rank, tokens, args.top_k).to(dev)


def _wire(idx, rank: int, world: int, args) -> WireStats:
    """What this rank's dispatch puts on the wire (the same for every backend; the CUDA backend
    does not count it, which would cost a host synchronization)."""
    dest_TK = torch.where(idx >= 0, idx // (args.experts // world), -1)
    remote_TK = (dest_TK >= 0) & (dest_TK != rank)
    tokens = sum(int((dest_TK == d).any(dim=1).sum()) for d in range(world) if d != rank)
    return WireStats.of(tokens, int(remote_TK.sum()), hidden=args.hidden, itemsize=2,
                        top_k=args.top_k, world=world, num_experts=args.experts)


def bench_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for tokens in args.tokens:
        for maxvio in args.maxvio:
            x, idx, w = routing(rank, tokens, maxvio, args, dev)
            case = {"tokens": tokens, "maxvio": maxvio}
            wire = _wire(idx, rank, world, args)
            capacity = max(tokens, args.buffer_tokens)  # the buffer's tokens per rank
            for backend, sync, layout, sms in _variants(args):
                if layout == "padded" and capacity > PADDED_MAX_TOKENS:
                    continue
                buf = ubep.Buffer(hidden=args.hidden, num_experts=args.experts, top_k=args.top_k,
                                  max_tokens_per_rank=capacity, dtype=torch.bfloat16,
                                  backend=backend, layout=layout, sync=sync, check_inputs=False,
                                  num_sms=sms)
                res = buf.dispatch(x, idx, w)
                name = f"{backend}/{layout}" + (f"/{sync}" if backend == "cuda" else "") \
                    + (f"/sms{sms}" if sms else "") \
                    + (f"/buf{capacity}" if capacity > tokens else "")
                programs = (buf._backend.programs(tokens), buf._backend.combine_programs(tokens)) \
                    if backend == "cuda" else (None, None)
                rows.append({**case, "what": f"{name} dispatch", "bytes": wire.total_bytes,
                             "programs": programs[0],
                             "us": time_calls(lambda b=buf, x=x, i=idx, w=w: b.dispatch(x, i, w),
                                         args.iters, args.warmup)})
                for reduce in ("source", "expert_rank"):
                    out_bytes = (wire.pairs_sent if reduce == "source" else wire.tokens_sent) \
                        * args.hidden * 2
                    rows.append({**case, "what": f"{name} combine {reduce}", "bytes": out_bytes,
                                 "programs": programs[1],
                                 "us": time_calls(lambda b=buf, r=res, red=reduce: b.combine(
                                     r.recv_x, r.handle, reduce=red), args.iters, args.warmup)})
                if (backend, layout) == ("cuda", "padded"):
                    rows += _graph_rows(buf, x, idx, w, case, wire, name, programs, args)
                del buf, res
                torch.cuda.empty_cache()
            rows.append({**case, "what": "nccl a2a per expert", "bytes": wire.naive_token_bytes,
                         "us": _naive_a2a(x, idx, args, world)})
    return rows


def graphed(fn):
    """``(graph, output)``: ``fn`` warmed up on a side stream, then captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _variants(args) -> list[tuple[str, str, str, int | None]]:
    """``(backend, sync, layout, num_sms)`` to time; the reference ignores the sync mode and the SM
    budget."""
    out = []
    for backend in args.backends:
        cuda = backend == "cuda"
        for sync in (args.syncs if cuda else ["sw"]):
            for sms in (args.num_sms if cuda else [0]):
                out += [(backend, sync, layout, sms or None) for layout in args.layouts]
    return out


def _graph_rows(buf, x, idx, w, case: dict, wire, name: str, programs, args) -> list[dict]:
    """The padded layout's dispatch and combines as CUDA-graph replays (no Python launch cost), each
    timed twice: from an idle GPU ("graph", the replay's own launch latency included) and queued
    behind a delay kernel ("queued graph": the GPU's time alone)."""
    dispatch_graph, res = graphed(lambda: buf.dispatch(x, idx, w))
    # the captured dispatch's outputs, the combines' handle, hold its rows once it has replayed:
    # a combine of an unreplayed capture's handle follows routes of uninitialized memory
    dispatch_graph.replay()
    torch.cuda.synchronize()
    graphs = [("dispatch", dispatch_graph, wire.total_bytes, programs[0])]
    for reduce in ("source", "expert_rank"):
        graph, _ = graphed(lambda red=reduce: buf.combine(res.recv_x, res.handle, reduce=red))
        out_bytes = (wire.pairs_sent if reduce == "source" else wire.tokens_sent) * args.hidden * 2
        graphs.append((f"combine {reduce}", graph, out_bytes, programs[1]))
    rows = []
    for label, queued in (("graph", False), ("queued graph", True)):
        rows += [{**case, "what": f"{name} {label} {op}", "bytes": num_bytes, "programs": grid,
                  "us": time_calls(graph.replay, args.iters, args.warmup, queued)}
                 for op, graph, num_bytes, grid in graphs]
    return rows


def _per_expert_rows(x, idx, args, world: int):
    """``(rows [P, H], rows per destination rank [W])``: one row per (token, expert) pair, ordered by
    expert, as a per-expert all-to-all sends them."""
    local = args.experts // world
    flat = idx.flatten()
    order = torch.argsort(torch.where(flat >= 0, flat, args.experts), stable=True)
    send = x[order[: int((flat >= 0).sum())] // args.top_k]
    return send, torch.bincount(flat[flat >= 0] // local, minlength=world)


def _naive_a2a(x, idx, args, world: int) -> list[float]:
    """NCCL all_to_all_single of one row per (token, expert) pair, split sizes known in advance."""
    send, send_counts = _per_expert_rows(x, idx, args, world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    recv = send.new_empty(int(recv_counts.sum()), x.shape[1])
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    return time_calls(lambda: dist.all_to_all_single(recv, send, rc, sc), args.iters, args.warmup)


def vdev_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    """torch's ``all_to_all_vdev`` (NVSHMEM) moving the per-expert all-to-all's rows, uniform routing,
    in processes of its own (it switches symmetric memory to NVSHMEM); ``[{"error": why}]`` where it
    cannot run."""
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NVSHMEM")
        group = dist.group.WORLD.group_name
        rows = []
        for tokens in args.tokens:
            x, idx, _ = routing(rank, tokens, 0.0, args, dev)
            send, counts = _per_expert_rows(x, idx, args, world)
            cap = tokens * args.top_k * args.hidden  # elements one rank sends at most
            inp = symm_mem.empty(cap, dtype=torch.bfloat16, device=dev)
            out = symm_mem.empty(world * cap, dtype=torch.bfloat16, device=dev)
            splits = symm_mem.empty(world, dtype=torch.int64, device=dev)
            out_splits = symm_mem.empty(2, world, dtype=torch.int64, device=dev)
            for t in (inp, out, splits, out_splits):
                symm_mem.rendezvous(t, group)
            inp[: send.numel()].copy_(send.flatten())
            splits.copy_(counts * args.hidden)
            remote = int(counts.sum() - counts[rank]) * args.hidden * 2
            call = functools.partial(torch.ops.symm_mem.all_to_all_vdev, inp, out, splits,
                                     out_splits, group)
            rows.append({"tokens": tokens, "maxvio": 0.0, "what": "torch all_to_all_vdev per expert",
                         "bytes": remote, "us": time_calls(call, args.iters, args.warmup)})
        return rows
    except Exception as err:  # the op, NVSHMEM or its bootstrap missing: report, do not fail the run
        return [{"error": f"{type(err).__name__}: {err}"}]


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"HIDDEN:EXPERTS:TOP_K"`` (say ``7168:256:8``) as three ints, for ``--shapes``."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--shapes: {text!r} is not HIDDEN:EXPERTS:TOP_K of positive integers (say 7168:256:8)")
    hidden, experts, top_k = (int(p) for p in parts)
    return hidden, experts, top_k


def shape_runs(args: argparse.Namespace) -> list[argparse.Namespace]:
    """One copy of ``args`` per model shape to time: ``--shapes`` in order, else ``--hidden``,
    ``--experts`` and ``--top-k``."""
    shapes = args.shapes or [(args.hidden, args.experts, args.top_k)]
    return [argparse.Namespace(**{**vars(args), "hidden": h, "experts": e, "top_k": k})
            for h, e, k in shapes]


def summarize(per_rank: list[list[dict]], ceiling: float, a2a: float | None, world: int,
              shape: argparse.Namespace) -> list[dict]:
    """One row per measured thing: rank 0's median with spread, the slowest rank's median, bytes,
    GB/s, and that rate as % of the link ceiling and of the all-to-all ceiling ``a2a`` (None on one
    GPU)."""
    table = []
    for i, row in enumerate(per_rank[0]):
        us = row["us"]
        med = statistics.median(us)
        slowest = max(statistics.median(r[i]["us"]) for r in per_rank)
        gbps = row["bytes"] / (med * 1e-6) / 1e9 if med else 0.0
        table.append({"W": world, "hidden": shape.hidden, "experts": shape.experts,
                      "top_k": shape.top_k, "tokens": row["tokens"], "maxvio": row["maxvio"],
                      "what": row["what"], "median_us": round(med, 1),
                      "min_us": round(min(us), 1), "max_us": round(max(us), 1),
                      "slowest_rank_us": round(slowest, 1), "bytes_rank0": row["bytes"],
                      "GBps": round(gbps, 1), "pct_link": round(100 * gbps / ceiling, 1),
                      "pct_a2a": round(100 * gbps / a2a, 1) if a2a else "",
                      "programs": row.get("programs") or ""})
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count())
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512, 4096, 8192])
    p.add_argument("--maxvio", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--shapes", type=parse_shape, nargs="+", metavar="H:E:K",
                   help="model shapes to sweep, each HIDDEN:EXPERTS:TOP_K (replace --hidden, "
                        "--experts, --top-k)")
    p.add_argument("--buffer-tokens", type=int, default=0,
                   help="size every buffer for at least this many tokens per rank (a decode step "
                        "smaller than the batch the buffer was made for); rows then name it")
    p.add_argument("--layouts", nargs="+", default=["compact", "padded"])
    p.add_argument("--backends", nargs="+", default=["reference", "cuda"],
                   help="the reference comes first: its handle counts the bytes")
    p.add_argument("--syncs", nargs="+", default=["sw", "tff", "dc", "sp"],
                   help="sync modes of the cuda backend")
    p.add_argument("--num-sms", type=int, nargs="+", default=[0],
                   help="SM budgets of the cuda backend (Buffer num_sms; 0: its fixed group caps)")
    p.add_argument("--vdev", action="store_true",
                   help="also time torch's all_to_all_vdev (NVSHMEM; 2 or more ranks)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = p.parse_args()
    if args.ranks < 1:
        print("needs a GPU", file=sys.stderr)
        return 2
    one = args.ranks == 1  # no link: the ceiling is a copy within the GPU, no NVSHMEM run
    ceiling = link_ceiling_gbps(peer=0 if one else 1)
    t0 = time.perf_counter()
    # the slowest rank's rate: an all-to-all ends when its slowest sender does
    a2a = None if one else min(run_ranks(a2a_ceiling_rank, args.ranks, args, pg_backend="nccl",
                                         timeout_s=300))
    runs = shape_runs(args)
    table, notes = [], []
    for shape in runs:
        per_rank = run_ranks(bench_rank, args.ranks, shape, pg_backend="nccl", timeout_s=3000)
        table += summarize(per_rank, ceiling, a2a, args.ranks, shape)
        if args.vdev and not one:
            vdev = run_ranks(vdev_rank, args.ranks, shape, pg_backend="nccl", timeout_s=300)
            if "error" in vdev[0][0]:
                notes.append(f"torch all_to_all_vdev not measured: {vdev[0][0]['error']}")
            else:
                table += summarize(vdev, ceiling, a2a, args.ranks, shape)
    shapes = ", ".join(f"hidden {r.hidden} / {r.experts} experts / top-{r.top_k}" for r in runs)
    header = "; ".join([
        f"EP{args.ranks} on {torch.cuda.get_device_name(0)}, {shapes}, bf16",
        f"{'ceiling (copy within GPU0' if one else 'link ceiling (GPU0->GPU1 copy'}, 1 GiB) "
        f"{ceiling:.0f} GB/s",
        *([] if one else [f"all-to-all ceiling (NCCL, 1 GiB per rank) {a2a:.0f} GB/s per rank"]),
        f"{args.iters} iterations after {args.warmup} warm-up",
        f"torch {torch.__version__}", f"{time.perf_counter() - t0:.0f} s", *dict.fromkeys(notes)])
    print(write_table(table, args.out / "results", header))
    first = runs[0]
    plot([r for r in table if (r["hidden"], r["experts"], r["top_k"])
          == (first.hidden, first.experts, first.top_k)], args.out / "results.png", header)
    return 0


def plot(table: list[dict], path: Path, title: str) -> None:
    """Median µs against tokens per rank, one line per measured thing, uniform routing (maxvio 0);
    skipped without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r["maxvio"] == 0]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, op in zip(axes, ("dispatch", "combine"), strict=True):
        for what in dict.fromkeys(r["what"] for r in rows if op in r["what"] or "a2a" in r["what"]):
            pts = [(r["tokens"], r["median_us"]) for r in rows if r["what"] == what]
            ax.plot(*zip(*pts, strict=True), marker="o", label=what)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel("median µs")
        ax.set_title(op)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
