"""Every kernel launch the cuda backend makes over a grid of calls, as sorted text: a refactor of
its host side must leave this output unchanged.

    PYTHONPATH=. python benchmarks/launch_variants.py > variants.txt    # CPU, no GPU, no compile

For W in {1, 2, 4, 8}, call tokens in {0, 1, 16, 128, 512, 4096} (each in a buffer of that many
tokens, and all in turn in a buffer of 4096), ``num_sms`` in {None, 24, 132}, every sync mode and
both layouts: a dispatch, combine with each reduction weighted and not, ``dispatch_like`` and
``return_pair_values``, on rank 0 of a backend whose tensors live on torch's meta device (nothing
is allocated) and whose launcher records each launch instead of running it. A line per launch:
the call, its launch number, the kernel, the grid, every compile-time constant and every integer
argument by name, tensors as dtype and shape.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from ubep.backends.cuda.backend import CudaBackend
from ubep.backends.cuda.launcher import runtime_names
from ubep.config import EPConfig

WORLDS = (1, 2, 4, 8)
TOKENS = (0, 1, 16, 128, 512, 4096)
BUDGETS = (None, 24, 132)
SYNCS = ("sw", "tff", "dc", "sp")
LAYOUTS = ("compact", "padded")
REDUCES = (("source", True), ("source", False), ("expert_rank", True), ("expert_rank", False))
SKIPPED = {"err_addr"}  # an address: differs between processes


class _MetaBuffer:
    """A symmetric buffer on the meta device: shape and dtype only; peer tables of zeros."""

    def __init__(self, shape, dtype, world: int):
        self.local = torch.zeros(shape, dtype=dtype, device="meta")
        self.nbytes = self.local.numel() * dtype.itemsize
        self.ptrs = torch.zeros(world, dtype=torch.int64)

    def barrier(self, timeout_ms: int) -> None:
        pass


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return repr(value)


class Recorder:
    """A launcher (``CudaBackend(launcher=...)``) that appends a line per launch to ``lines`` with
    the current ``label``. A dispatch launch that sizes the compact output (its ``tpe_ptr`` is the
    host's word, on the CPU while everything else is on the meta device) gets ``rows`` written into
    that word, as the GPU's sizing program would."""

    def __init__(self, lines: list[str], rows: int):
        self.lines, self.rows, self.label, self.launched = lines, rows, "", 0

    def start(self, label: str) -> None:
        """Labels the launches that follow; numbers them from 0 (their order within the call)."""
        self.label, self.launched = label, 0

    def __call__(self, kernel, **fixed):
        names = runtime_names(kernel)
        free = [n for n in names if n not in fixed]
        fixed_text = [f"{n}={_describe(v)}" for n, v in sorted(fixed.items())
                      if isinstance(v, int) and n not in SKIPPED]
        kernel_name = kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__

        def launch(grid: int, *args, constants) -> None:
            named = dict(zip(free, args, strict=True))
            tpe = named.get("tpe_ptr")
            if isinstance(tpe, torch.Tensor) and tpe.device.type == "cpu":
                tpe[-1] = self.rows
            runtime = [f"{n}={_describe(v)}" for n, v in sorted(named.items()) if n not in SKIPPED]
            consts = [f"{n}={v!r}" for n, v in sorted(constants.values.items())]
            self.lines.append(" ".join([self.label, f"launch={self.launched}",
                                        f"kernel={kernel_name}", f"grid={grid}",
                                        f"num_warps={constants.num_warps}",
                                        f"maxnreg={constants.maxnreg}", *consts, *fixed_text,
                                        *runtime]))
            self.launched += 1

        return launch


def launches(world: int, buffer_tokens: int, calls: tuple[int, ...], num_sms: int | None,
             sync: str, layout: str, hidden: int, experts: int, top_k: int) -> list[str]:
    """Every launch line of the calls of ``calls`` tokens each on one buffer (module doc)."""
    lines: list[str] = []
    recorder = Recorder(lines, 0)
    cfg = EPConfig(world_size=world, rank=0, hidden=hidden, num_experts=experts, top_k=top_k,
                   max_tokens_per_rank=buffer_tokens, dtype=torch.bfloat16, layout=layout,
                   sync=sync, num_sms=num_sms)
    backend = CudaBackend(cfg, None, torch.device("meta"),
                          symmetric=lambda shape, dtype: _MetaBuffer(shape, dtype, world),
                          launcher=recorder)
    for tokens in calls:
        recorder.rows = tokens * top_k
        where = (f"W={world} buffer={buffer_tokens} tokens={tokens} num_sms={num_sms} sync={sync} "
                 f"layout={layout}")
        _calls(backend, recorder, where, tokens, hidden, top_k)
    return lines


def _calls(backend: CudaBackend, recorder: Recorder, where: str, tokens: int, hidden: int,
           top_k: int) -> None:
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device="meta")
    idx = torch.zeros(tokens, top_k, dtype=torch.int64, device="meta")
    w = torch.zeros(tokens, top_k, dtype=torch.float32, device="meta")
    recorder.start(f"{where} op=dispatch")
    out, recv_w, handle = backend.dispatch(x, idx, w)
    for reduce, weighted in REDUCES:
        recorder.start(f"{where} op=combine({reduce},weighted={weighted})")
        backend.combine(out, handle, reduce, weighted)
    recorder.start(f"{where} op=dispatch_like")
    backend.dispatch_like(x, handle)
    recorder.start(f"{where} op=return_pair_values")
    backend.return_pair_values(recv_w.reshape(-1), handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--top-k", type=int, default=8)
    args = parser.parse_args()
    lines = []
    shape = (args.hidden, args.experts, args.top_k)
    for world, num_sms, sync, layout in itertools.product(WORLDS, BUDGETS, SYNCS, LAYOUTS):
        for tokens in TOKENS:  # a buffer sized for the call
            lines += launches(world, max(tokens, 1), (tokens,), num_sms, sync, layout, *shape)
        # one buffer of the largest call taking every call size in turn
        lines += launches(world, max(TOKENS), TOKENS, num_sms, sync, layout, *shape)
    print("\n".join(sorted(lines)))


if __name__ == "__main__":
    main()
