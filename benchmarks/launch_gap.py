"""The GPU's idle time between a compact dispatch's two kernels: its writers' launch, then (once the
host has read the output's size and allocated it) its receivers' launch. Measured from the kernels'
own timestamps (torch's profiler, CUDA activity only), so the host's share of an eager compact
dispatch shows apart from the host's noise, which the end-to-end figure of bench_ep.py mixes in.
One rank (W = 1) of the cuda backend, bf16, top-k routing drawn uniformly; profiling off.

    PYTHONPATH=. python3 benchmarks/launch_gap.py --tokens 1024 4096 --syncs sw tff --num-sms 0 24

Prints one Markdown row per case: the gap, the writers' and the receivers' kernel, median µs over
``--calls`` calls (each after a synchronization, as an eager call from an idle GPU), the gap's
minimum and maximum beside its median; then the host's time in the same calls (the backend's own,
without ``Buffer``'s), split where it waits for the size: ``start_dispatch`` (the Python before the
writers' launch, the launch), the wait, and ``finish_dispatch`` (the output's allocation, the
receivers' launch, the result).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

KERNEL = "dispatch"  # the Triton kernel's name in the trace


def launch_pairs(events: list[dict]) -> list[tuple[float, float, float]]:
    """``(gap, first, second)`` µs per compact dispatch in a Chrome trace's ``events``: its two
    ``dispatch`` kernels in start order (no other dispatch kernel between them), the gap from the
    first one's end to the second one's start."""
    kernels = sorted((e["ts"], e["dur"]) for e in events
                     if e.get("cat") == "kernel" and e.get("name", "").startswith(KERNEL))
    if len(kernels) % 2:
        raise ValueError(f"{len(kernels)} dispatch kernels: not two per call")
    return [(second[0] - first[0] - first[1], first[1], second[1])
            for first, second in zip(kernels[0::2], kernels[1::2], strict=True)]


def host_steps(backend, x, idx, w) -> tuple[float, float, float]:
    """A compact dispatch on ``backend`` (a ``CudaBackend``), its host µs split where it waits for
    the size: ``start_dispatch`` (the Python before the writers' launch, the launch), the wait for
    the pinned size word (or the writers' launch to end), then ``finish_dispatch`` (the output's
    allocation, the receivers' launch, the result)."""
    start = time.perf_counter()
    pending = backend.start_dispatch(x, idx, w)
    queued = time.perf_counter()
    while backend.host_rows.value < 0 and not (backend.sized is None or backend.sized.query()):
        pass
    sized = time.perf_counter()
    backend.finish_dispatch(pending)
    end = time.perf_counter()
    return tuple((b - a) * 1e6 for a, b in ((start, queued), (queued, sized), (sized, end)))


def probe_rank(rank: int, world: int, args: argparse.Namespace) -> list[str]:
    import ubep

    dev = torch.device("cuda", torch.cuda.current_device())
    med = statistics.median
    rows = []
    for tokens in args.tokens:
        gen = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, args.hidden, generator=gen).to(dev, torch.bfloat16)
        idx = torch.rand(tokens, args.experts, generator=gen).argsort(dim=1)[:, :args.top_k].to(dev)
        w = torch.rand(tokens, args.top_k, generator=gen).to(dev)
        for sync in args.syncs:
            for sms in args.num_sms:
                buf = ubep.Buffer(hidden=args.hidden, num_experts=args.experts, top_k=args.top_k,
                                  max_tokens_per_rank=tokens, dtype=torch.bfloat16, backend="cuda",
                                  layout="compact", sync=sync, check_inputs=False,
                                  num_sms=sms or None)
                for _ in range(3):  # compiles, then warms the caching allocator
                    buf.dispatch(x, idx, w)
                torch.cuda.synchronize()
                steps = []
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.calls):
                        torch.cuda.synchronize()
                        steps.append(host_steps(buf._backend, x, idx, w))
                    torch.cuda.synchronize()
                with tempfile.TemporaryDirectory() as tmp:
                    trace = Path(tmp) / "trace.json"
                    prof.export_chrome_trace(str(trace))
                    pairs = launch_pairs(json.loads(trace.read_text())["traceEvents"])
                gaps, first, second = zip(*pairs, strict=True)
                host_us = " | ".join(f"{med(part):.1f}" for part in zip(*steps, strict=True))
                rows.append(f"| {sync} | {tokens} | {sms or 'all'} | {len(pairs)} | {med(gaps):.1f} "
                            f"({min(gaps):.1f}-{max(gaps):.1f}) | {med(first):.1f} | "
                            f"{med(second):.1f} | {host_us} |")
                del buf
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--syncs", nargs="+", default=["sw", "tff"])
    p.add_argument("--num-sms", type=int, nargs="+", default=[0], help="SM budgets (0: none)")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    from ubep.launch import run_ranks

    print("| sync | tokens | SMs | calls | gap (min-max) | writers' kernel | receivers' kernel | "
          "host: start_dispatch | the wait | finish_dispatch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in run_ranks(probe_rank, 1, args, pg_backend="nccl", timeout_s=600)[0]:
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
