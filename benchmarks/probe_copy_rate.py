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
  ``[U, 256]`` boxes, loaded into shared memory and stored from there, ``REP`` stores each;
- ``bulk``: whole rows through TMA with the copies kept in flight (Gluon, which exposes the waits):
  a row is one ``[1, 32, 256]`` box of a ``[rows, 28, 256]`` view (its last 4 box rows fall
  outside the view: TMA loads them as zeros and skips them in stores); ``U`` rows' loads are in
  flight in a ring of ``U + 1`` shared slots, and a slot is refilled once its ``REP`` stores have
  read it, while the next row's stores go.

    PYTHONPATH=. python3 benchmarks/probe_copy_rate.py            # one GPU
    PYTHONPATH=. python3 benchmarks/probe_copy_rate.py --bulk --programs 1 24 132 --warps 4

Prints a Markdown table: copy kind, programs, warps, U, REP, µs per pass, GB/s stored, GB/s per program.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

HIDDEN = 7168
BE = 64  # bf16 elements per 128-byte block
BOX = 256  # elements of a TMA box's inner dimension (at most 256)
ROW_BOXES = HIDDEN // BOX  # a row as 28 box rows of 256 elements


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


@gluon.jit
def copy_rows_bulk(src_desc, dst_desc, num_rows, n_prog, U: gl.constexpr, REP: gl.constexpr):
    """Program ``pid`` copies rows ``pid, pid + n_prog, ...``; copy ``k`` of row ``r`` is row
    ``k * num_rows + r`` of ``dst``. A box is one whole row (:func:`row_descriptor`)."""
    slots: gl.constexpr = U + 1
    pid = gl.program_id(0)
    ring = gl.allocate_shared_memory(src_desc.dtype, [slots] + src_desc.block_shape, src_desc.layout)
    loaded = gl.allocate_shared_memory(gl.int64, [slots, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(slots):
        mbarrier.init(loaded.index(i), count=1)
    mine = (num_rows - pid + n_prog - 1) // n_prog
    for i in gl.static_range(U):
        row = pid + i * n_prog
        mbarrier.expect(loaded.index(i), src_desc.block_type.nbytes, pred=i < mine)
        tma.async_copy_global_to_shared(src_desc, [row, 0, 0], loaded.index(i),
                                        ring.index(i), pred=i < mine)
    for i in range(mine):
        slot = i % slots
        mbarrier.wait(loaded.index(slot), (i // slots) & 1)
        row = pid + i * n_prog
        for k in gl.static_range(REP):
            tma.async_copy_shared_to_global(dst_desc, [k * num_rows + row, 0, 0],
                                            ring.index(slot))
        # Every store but this row's has read its slot: the slot of row i - 1 takes row i + U.
        tma.store_wait(REP)
        ahead = i + U
        refill = ahead % slots
        mbarrier.expect(loaded.index(refill), src_desc.block_type.nbytes, pred=ahead < mine)
        tma.async_copy_global_to_shared(src_desc, [pid + ahead * n_prog, 0, 0],
                                        loaded.index(refill), ring.index(refill), pred=ahead < mine)
    tma.store_wait(0)
    for i in gl.static_range(slots):
        mbarrier.invalidate(loaded.index(i))


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


def row_descriptor(rows: torch.Tensor) -> GluonDescriptor:
    """``rows [N, HIDDEN]`` seen as ``[N, 28, 256]``, one row per ``[1, 32, 256]`` box (box sides
    are powers of two); no swizzle (a plain copy, and a swizzled box's inner side may not exceed
    128 bytes)."""
    boxes = rows.view(-1, ROW_BOXES, BOX)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
    return GluonDescriptor.from_tensor(boxes, [1, triton.next_power_of_2(ROW_BOXES), BOX], layout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--programs", type=int, nargs="+", default=[1, 4, 12, 24, 132])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--units", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tma", action="store_true", help="also the TMA copies box by box (Hopper)")
    ap.add_argument("--bulk", action="store_true",
                    help="also whole-row TMA copies kept in flight (Hopper, Gluon)")
    args = ap.parse_args()
    if args.rows % max(args.units):
        raise SystemExit("--rows must be a multiple of every --units")
    src = torch.randn(args.rows, HIDDEN, device="cuda", dtype=torch.bfloat16).view(torch.int16)
    cb = triton.next_power_of_2(triton.cdiv(HIDDEN, BE))
    print("| copy | programs | warps | U | REP | µs | GB/s | GB/s per program |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    kinds = ("ld/st",) + ("tma",) * args.tma + ("bulk",) * args.bulk
    for kind in kinds:
        for rep in args.reps:
            dst = torch.empty(args.rows * rep, HIDDEN, device="cuda", dtype=torch.int16)
            for p, warps, unit in itertools.product(args.programs, args.warps, args.units):
                if kind == "tma":
                    run = functools.partial(
                        copy_rows_tma[(p,)], TensorDescriptor.from_tensor(src, [unit, BOX]),
                        TensorDescriptor.from_tensor(dst, [unit, BOX]), args.rows, p, HIDDEN=HIDDEN,
                        BOX=BOX, U=unit, REP=rep, num_warps=warps)
                    last = dst.view(rep, args.rows, HIDDEN)[-1]
                elif kind == "bulk":
                    run = functools.partial(
                        copy_rows_bulk[(p,)], row_descriptor(src), row_descriptor(dst), args.rows,
                        p, U=unit, REP=rep, num_warps=warps)
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
