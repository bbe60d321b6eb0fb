"""``ubep profile``: run dispatch and combine on W ranks and report where the time goes, per phase
and per rank, as a table, a CSV and stacked bars (PNG).

The phases are those each backend records through its ``PhaseTimer`` (``Buffer(profile=True)``):
for the reference backend, count exchange, route send, token send and reorder for dispatch, and
send, local reduce and reduce for combine; for the cuda backend, the launches (host CUDA events) and,
measured inside the kernels, each program group's longest wait and when its work was done
(``ubep.backends.cuda.stamps``). The cuda backend also gives a per-worker timeline of the last
dispatch and combine: ``workers.csv`` and ``workers.png`` (one bar per program).
"""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ubep.buffer import Buffer
from ubep.launch import run_ranks
from ubep.profiling import breakdown_table, median, write_table
from ubep.workloads import origin_tokens, origin_weights, skewed_topk


@dataclass(frozen=True)
class ProfileOptions:
    ranks: int = 4
    tokens: int = 256
    hidden: int = 1024
    experts: int = 64
    top_k: int = 8
    dtype: torch.dtype = torch.bfloat16
    layout: str = "compact"
    reduce: str = "source"
    backend: str = "auto"
    sync: str | None = None  # None: the backend's default (ubep.buffer.DEFAULT_SYNC)
    maxvio: float = 0.0
    iters: int = 10
    warmup: int = 2
    num_sms: int | None = None
    pg_backend: str = "gloo"
    buffer_tokens: int | None = None  # the buffer's max_tokens_per_rank; None: tokens


def profile_rank(rank: int, world_size: int, opts: ProfileOptions) -> dict:
    """``{"phases": per-phase µs samples of opts.iters dispatch + combine calls, "timeline": the
    per-program rows of the last ones (cuda backend)}`` on this rank."""
    device = torch.device("cuda", torch.cuda.current_device()) if opts.pg_backend == "nccl" \
        else torch.device("cpu")
    buf = Buffer(hidden=opts.hidden, num_experts=opts.experts, top_k=opts.top_k,
                 max_tokens_per_rank=opts.buffer_tokens or opts.tokens, dtype=opts.dtype,
                 backend=opts.backend, layout=opts.layout, sync=opts.sync, num_sms=opts.num_sms,
                 profile=True, check_inputs=False)
    gen = torch.Generator().manual_seed(rank)
    idx = skewed_topk(opts.tokens, opts.experts, opts.top_k, maxvio=opts.maxvio,
                      generator=gen).to(device)
    x = origin_tokens(rank, opts.tokens, opts.hidden, opts.dtype).to(device)
    w = origin_weights(rank, opts.tokens, opts.top_k).to(device)
    for step in range(opts.warmup + opts.iters):
        if step == opts.warmup:
            buf.reset_phase_times()
        if device.type == "cuda":  # ranks start each step together: waits then measure the kernels
            torch.distributed.barrier()
            torch.cuda.synchronize()
        res = buf.dispatch(x, idx, w)
        buf.combine(res.recv_x, res.handle, reduce=opts.reduce)
    return {"phases": buf.phase_times(), "timeline": buf.worker_timeline()}


def _figure_title(fig, title: str, fontsize: float = 9) -> None:
    """``title`` over the whole figure, wrapped to its width: a run's options make a line wider than
    a figure of a few ranks, which a centred title would lose at both edges."""
    em_chars = fig.get_figwidth() * 72 / fontsize
    fig.suptitle(textwrap.fill(title, int(em_chars / 0.6)), fontsize=fontsize)  # ~0.6 em per char


def write_outputs(per_rank: list[dict[str, list[float]]], steps: int, out: Path, title: str, *,
                  ranks: list[int] | None = None,
                  ylabel: str = "µs per dispatch + combine (median per phase)") -> list[Path]:
    """``breakdown.csv`` / ``.md`` (rank, phase, calls, median, min, max µs) and ``breakdown.png``:
    one bar per rank, stacked by phase, each segment the phase's median times its calls per step.
    ``ranks``: the rank of each entry of ``per_rank`` (default: their positions)."""
    ranks = list(range(len(per_rank))) if ranks is None else ranks
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = list(dict.fromkeys(p for samples in per_rank for p in samples))
    write_table([{"rank": rank, "phase": phase, "calls": len(v), "median_us": round(median(v), 1),
                  "min_us": round(min(v), 1), "max_us": round(max(v), 1)}
                 for rank, samples in zip(ranks, per_rank, strict=True) for phase in phases
                 if (v := samples.get(phase))], out / "breakdown", title)
    fig, ax = plt.subplots(figsize=(1.2 * len(per_rank) + 4, 4))
    bottom = [0.0] * len(per_rank)
    for phase in phases:
        heights = [median(s[phase]) * len(s[phase]) / steps if phase in s else 0.0
                   for s in per_rank]
        ax.bar(range(len(per_rank)), heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xticks(range(len(per_rank)), [f"rank {r}" for r in ranks])
    ax.set_ylabel(ylabel)
    _figure_title(fig, title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out / "breakdown.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [out / "breakdown.csv", out / "breakdown.md", out / "breakdown.png"]


def write_timeline(timelines: list[list[dict]], out: Path, title: str) -> list[Path]:
    """``workers.csv`` (every rank's per-program stamps) and ``workers.png`` (rank 0: one bar per
    program, pale while it waits, in its group's colour while it works, grey while it finishes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    write_table([{"rank": rank, **row} for rank, rows in enumerate(timelines) for row in rows],
                out / "workers", title)
    ops = list(dict.fromkeys(row["op"] for row in timelines[0]))
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 5), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        rows = [r for r in timelines[0] if r["op"] == op]
        groups = list(dict.fromkeys(r["group"] for r in rows))
        for gi, group in enumerate(groups):
            mine = [r for r in rows if r["group"] == group]
            ys = [r["program"] for r in mine]
            color = f"C{gi}"
            ax.barh(ys, [r["wait_end_us"] - r["start_us"] for r in mine],
                    left=[r["start_us"] for r in mine], color=color, alpha=0.25, height=1.0)
            ax.barh(ys, [r["work_end_us"] - r["wait_end_us"] for r in mine],
                    left=[r["wait_end_us"] for r in mine], color=color, height=1.0, label=group)
            ax.barh(ys, [r["end_us"] - r["work_end_us"] for r in mine],
                    left=[r["work_end_us"] for r in mine], color="grey", height=1.0)
        ax.set_xlabel("µs from the launch's first stamp")
        ax.set_ylabel("program (thread block)")
        ax.set_title(f"rank 0 {op}", fontsize=9)
        ax.legend(fontsize=7)
    _figure_title(fig, title)
    fig.tight_layout()
    fig.savefig(out / "workers.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [out / "workers.csv", out / "workers.md", out / "workers.png"]


def run_profile(opts: ProfileOptions, out: Path) -> int:
    start = time.perf_counter()
    print(f"profiling {opts.iters} dispatch + combine calls on {opts.ranks} ranks "
          f"({opts.pg_backend}) ...", flush=True)
    results = run_ranks(profile_rank, opts.ranks, opts, pg_backend=opts.pg_backend,
                        timeout_s=1800)
    per_rank = [r["phases"] for r in results]
    dt = str(opts.dtype).removeprefix("torch.")
    title = (f"{opts.ranks} ranks, {opts.tokens} tokens, hidden {opts.hidden}, {opts.experts} "
             f"experts, top-{opts.top_k}, {dt}, {opts.layout}, reduce={opts.reduce}"
             + (f", num_sms={opts.num_sms}" if opts.num_sms else "")
             + (f", buffer of {opts.buffer_tokens} tokens"
                if opts.buffer_tokens not in (None, opts.tokens) else ""))
    print(title)
    for rank, samples in enumerate(per_rank):
        print(f"\nrank {rank}")
        print(breakdown_table(samples))
    files = write_outputs(per_rank, opts.iters, out, title)
    if results[0]["timeline"]:
        files += write_timeline([r["timeline"] for r in results], out, title)
    print(f"\nwrote {', '.join(map(str, files))} ({time.perf_counter() - start:.1f} s)")
    return 0
