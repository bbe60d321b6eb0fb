"""How fast does one program (one thread block on one SM) copy rows, and what raises it?

The CUDA backend's senders and receivers move rows one step at a time: load a tile, store it, then
the next. Under an SM budget a few programs must move the whole call, so their per-program rate
bounds it. This probe copies 7168-element bf16 rows (14 KiB) between two buffers of one GPU with
``P`` programs (rows strided over programs) and reports GB/s in all and per program for:

- ``U`` rows per step: the program loads ``U`` whole rows (one ``[U * CB, BE]`` tile of 128-byte
  blocks) before it stores any of them, so ``U`` rows' loads are in flight at once;
- ``REP`` stores per loaded row (a receiver writes a row once per local expert of its token);
- ``num_warps`` 4, 8, 16;
- ``tma``: the same through the copy engine of each SM (Hopper's TMA, Triton tensor descriptors):
  ``[U, 256]`` boxes, loaded into shared memory and stored from there, ``REP`` stores each.

    PYTHONPATH=. python3 benchmarks/probe_copy_rate.py            # one GPU

Prints a Markdown table: copy kind, programs, warps, U, REP, µs per pass, GB/s stored, GB/s per program.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

HIDDEN = 7168
BE = 64  # bf16 elements per 128-byte block
BOX = 256  # elements of a TMA box's inner dimension (at most 256)


@triton.jit
def copy_rows(src, dst, num_rows, n_prog, HIDDEN: tl.constexpr, BE: tl.constexpr,
              CB: tl.constexpr, U: tl.constexpr, REP: tl.constexpr):
    """Program ``pid`` copies rows ``U * pid .. U * pid + U - 1``, then the ``U`` rows
    ``U * n_prog`` further, and so on; each into ``REP`` destination rows (``dst [rows * REP, H]``)."""
    pid = tl.program_id(0)
    r = tl.arange(0, U * CB)[:, None]  # block-row of the tile: row u = r // CB, block b = r % CB
    o = tl.arange(0, BE)[None, :]
    u = r // CB
    elem = (r % CB) * BE + o
    in_row = elem < HIDDEN
    start = pid * U
    while start < num_rows:
        row = start + u
        ok = in_row & (row < num_rows)
        values = tl.load(src + row.to(tl.int64) * HIDDEN + elem, mask=ok, cache_modifier=".cg")
        for k in tl.static_range(REP):
            tl.store(dst + (row.to(tl.int64) * REP + k) * HIDDEN + elem, values, mask=ok)
        start += n_prog * U


@triton.jit
def copy_rows_tma(src_desc, dst_desc, num_rows, n_prog, HIDDEN: tl.constexpr, BOX: tl.constexpr,
                  U: tl.constexpr, REP: tl.constexpr):
    """As :func:`copy_rows` through TMA boxes of ``[U, BOX]``; copy ``k`` of row ``r`` is row
    ``k * num_rows + r`` of ``dst [REP * rows, H]``."""
    start = tl.program_id(0) * U
    while start < num_rows:
        for col in range(0, HIDDEN, BOX):
            values = src_desc.load([start, col])
            for k in tl.static_range(REP):
                dst_desc.store([k * num_rows + start, col], values)
        start += n_prog * U


def time_us(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--programs", type=int, nargs="+", default=[1, 4, 12, 24, 132])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--units", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tma", action="store_true", help="also the TMA copies (Hopper)")
    args = ap.parse_args()
    if args.rows % max(args.units):
        raise SystemExit("--rows must be a multiple of every --units")
    src = torch.randn(args.rows, HIDDEN, device="cuda", dtype=torch.bfloat16).view(torch.int16)
    cb = triton.next_power_of_2(triton.cdiv(HIDDEN, BE))
    print("| copy | programs | warps | U | REP | µs | GB/s | GB/s per program |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in ("ld/st", "tma") if args.tma else ("ld/st",):
        for rep in args.reps:
            dst = torch.empty(args.rows * rep, HIDDEN, device="cuda", dtype=torch.int16)
            for p, warps, unit in itertools.product(args.programs, args.warps, args.units):
                if kind == "tma":
                    run = functools.partial(
                        copy_rows_tma[(p,)], TensorDescriptor.from_tensor(src, [unit, BOX]),
                        TensorDescriptor.from_tensor(dst, [unit, BOX]), args.rows, p, HIDDEN=HIDDEN,
                        BOX=BOX, U=unit, REP=rep, num_warps=warps)
                    last = dst.view(rep, args.rows, HIDDEN)[-1]
                else:
                    run = functools.partial(copy_rows[(p,)], src, dst, args.rows, p, HIDDEN=HIDDEN,
                                            BE=BE, CB=cb, U=unit, REP=rep, num_warps=warps)
                    last = dst.view(args.rows, rep, HIDDEN)[:, -1]
                dst.zero_()
                us = time_us(run, args.iters)
                assert torch.equal(last, src), (kind, p, warps, unit, rep)
                gbs = args.rows * rep * HIDDEN * 2 / us / 1e3
                print(f"| {kind} | {p} | {warps} | {unit} | {rep} | {us:.1f} | {gbs:.1f} | "
                      f"{gbs / p:.2f} |", flush=True)


if __name__ == "__main__":
    main()
