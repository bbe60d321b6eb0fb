"""Host time of the cuda backend's calls, on a CPU machine: the Python that picks program groups,
builds launch arguments and keys the compiled kernels, with every launch stubbed out.

    PYTHONPATH=. python benchmarks/host_path.py --sync sw --tokens 128    # no GPU, no Triton compile

One rank (W = 1) over host tensors standing in for symmetric memory; the kernels' launches become
calls that do nothing (Triton's own compiled launcher, about 12-19 µs a launch on the H200 machines,
and the GPU's time are not in these figures: ``bench_ep.py`` measures calls end to end; in the
compact layout the stubbed sizing launch writes the output's rows, every pair's, into the word the
host polls). Prints the minimum and median µs of a dispatch and of a combine over ``--iters`` calls
after a warm-up, and the Python function calls one dispatch + combine pair makes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from types import SimpleNamespace

import torch

from ubep.backends.cuda.backend import CudaBackend
from ubep.backends.cuda.launcher import Launcher, runtime_names
from ubep.config import EPConfig


class NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` and the compiled kernel's
    ``compiled[grid](...)`` both return at once, after ``on_call(args)``."""

    def __init__(self, kernel, on_call=lambda args: None):
        self.fn, self.arg_names = kernel.fn, kernel.arg_names
        self.on_call = on_call

    def __getitem__(self, grid):
        def call(*args, **options):
            self.on_call(args)
            return self

        return call


def host_symmetric(shape, dtype):
    """A one-rank symmetric buffer in host memory: its local tensor and its one-entry peer table."""
    local = torch.zeros(shape, dtype=dtype)
    return SimpleNamespace(local=local, nbytes=local.numel() * dtype.itemsize,
                           ptrs=torch.tensor([local.data_ptr()]), barrier=lambda timeout_ms: None)


def stubbed_backend(args: argparse.Namespace, launcher=Launcher) -> CudaBackend:
    """A W = 1 cuda backend on the CPU whose kernels do nothing, but for the compact layout's
    sizing launch: it writes the output's rows (every pair's) into the host's size word. Launches
    go through ``launcher(kernel, **fixed)`` (``Launcher``: the GPU's path, keys and all)."""
    cfg = EPConfig(world_size=1, rank=0, hidden=args.hidden, num_experts=args.experts,
                   top_k=args.top_k, max_tokens_per_rank=args.tokens, dtype=torch.bfloat16,
                   layout=args.layout, sync=args.sync)
    host_words = []  # the backend's pinned size word, once it exists

    def stubbed(kernel, **fixed):
        on_call = lambda launch_args: None  # noqa: E731
        if kernel.fn.__name__ == "dispatch":
            tpe = runtime_names(kernel).index("tpe_ptr")

            def on_call(launch_args):
                if launch_args[tpe] is host_words[0]:
                    host_words[0][-1] = args.tokens * args.top_k

        return launcher(NoLaunch(kernel, on_call), **fixed)

    backend = CudaBackend(cfg, None, torch.device("cpu"), symmetric=host_symmetric,
                          launcher=stubbed)
    host_words.append(backend.host_tpe)
    return backend


def _times_us(fn, iters: int) -> tuple[float, float]:
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sync", choices=("sw", "tff", "dc", "sp"), default="sw")
    parser.add_argument("--layout", choices=("padded", "compact"), default="padded")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    backend = stubbed_backend(args)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(args.experts, generator=gen)[:args.top_k]
                       for _ in range(args.tokens)])
    w = torch.rand(args.tokens, args.top_k, generator=gen)
    out, _, handle = backend.dispatch(x, idx, w)
    for _ in range(50):  # warm-up: every launch variant built once
        backend.combine(backend.dispatch(x, idx, w)[0], handle, "source", True)
    dispatch = _times_us(lambda: backend.dispatch(x, idx, w), args.iters)
    combine = _times_us(lambda: backend.combine(out, handle, "source", True), args.iters)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(100):
        backend.combine(backend.dispatch(x, idx, w)[0], handle, "source", True)
    profiler.disable()
    calls = pstats.Stats(profiler).total_calls / 100
    print(f"{args.layout} {args.sync}, {args.tokens} tokens, hidden {args.hidden}, "
          f"{args.experts} experts, top-{args.top_k}, W = 1, launches stubbed")
    print(f"dispatch: min {dispatch[0]:.1f} µs, median {dispatch[1]:.1f} µs")
    print(f"combine:  min {combine[0]:.1f} µs, median {combine[1]:.1f} µs")
    print(f"Python calls per dispatch + combine: {calls:.0f}")


if __name__ == "__main__":
    main()
