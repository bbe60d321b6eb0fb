"""Rank functions for the Ascend backend tests that the shared case runner does not cover: a stress
loop with random delays, live Buffers with interleaved calls, a window prepared over garbage, ranks
that skip a call or a Buffer, and a preparation while a late rank still writes."""

from __future__ import annotations

import os
import random
import time

import torch
import torch.distributed as dist

import ubep
from tests.workers import DTYPES, Case, _check_equal, case_inputs
from ubep import oracle, workloads
from ubep.backends.ascend_windows import window_bytes


def checked_dispatch(buf, case: Case, rank: int, world_size: int, label: str):
    """``buf.dispatch`` of ``case``'s inputs, ``recv_x`` checked against the oracle (compact layout);
    returns the result and every rank's inputs ``(xs, idxs, ws)``."""
    inputs = [case_inputs(case, s) for s in range(world_size)]
    xs, idxs, ws = (list(v) for v in zip(*inputs, strict=True))
    res = buf.dispatch(*inputs[rank])
    want_x, _, _ = oracle.dispatch(xs, idxs, ws, rank, world_size, case.num_experts)
    _check_equal(f"{label}: recv_x", res.recv_x, want_x)
    return res, (xs, idxs, ws)


def checked_combine(buf, case: Case, res, inputs, rank: int, world_size: int, reduce: str,
                    label: str) -> None:
    """``buf.combine`` of the received rows themselves (identity experts), checked against the oracle."""
    xs, idxs, ws = inputs
    y = buf.combine(res.recv_x, res.handle, reduce=reduce)
    outs = oracle.expert_outputs(idxs, lambda s, t, k, e: xs[s][t])
    want_y = oracle.combine(outs, idxs, ws, rank, world_size, case.num_experts, reduce, True, case.hidden,
                            DTYPES[case.dtype])
    _check_equal(f"{label}: combine({reduce})", y, want_y)


def stress_worker(rank: int, world_size: int, sync: str, iterations: int) -> int:
    """``iterations`` dispatch + combine calls on one buffer, new routing each time, every rank
    sleeping a random 0-3 ms before each call and every AIV a random 0-200 µs before each window
    copy (the twin's UBEP_TWIN_JITTER_US); raises on the first mismatch, else returns 0."""
    os.environ["UBEP_TWIN_JITTER_US"] = "200"
    hidden, experts, top_k, max_tokens = 32, 2 * world_size, 3, 6
    buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k, max_tokens_per_rank=max_tokens,
                      dtype=torch.bfloat16, backend="ascend", sync=sync, timeout_s=60)
    delays = random.Random(1000 + rank)
    for it in range(iterations):
        case = Case(tokens=tuple((it + 3 * s) % (max_tokens + 1) for s in range(world_size)), hidden=hidden,
                    num_experts=experts, top_k=top_k, maxvio=float(it % 3), drop=0.2 * (it % 2), seed=it)
        time.sleep(delays.uniform(0, 0.003))
        res, inputs = checked_dispatch(buf, case, rank, world_size, f"iteration {it}")
        time.sleep(delays.uniform(0, 0.003))
        checked_combine(buf, case, res, inputs, rank, world_size, ("source", "expert_rank")[it % 2],
                        f"iteration {it}")
    return 0


def interleaved_worker(rank: int, world_size: int) -> int:
    """Three live Buffers on one group, their calls interleaved: A and C have one layout (sw, bf16), B
    another (sp, fp16, more experts per token); every dispatch and combine checked against the oracle."""
    shape = {"hidden": 32, "num_experts": 2 * world_size, "top_k": 2, "max_tokens": 5}
    specs = {
        "A": Case(tokens=tuple(5 - s % 3 for s in range(world_size)), sync="sw", seed=11, **shape),
        "B": Case(tokens=tuple(2 + s % 3 for s in range(world_size)), hidden=48, num_experts=2 * world_size,
                  top_k=3, dtype="fp16", sync="sp", max_tokens=4, maxvio=1.0, seed=12),
        "C": Case(tokens=tuple(s % 4 for s in range(world_size)), sync="sw", drop=0.3, seed=13, **shape),
    }
    bufs = {name: ubep.Buffer(hidden=c.hidden, num_experts=c.num_experts, top_k=c.top_k,
                              max_tokens_per_rank=c.max_tokens, dtype=DTYPES[c.dtype], backend="ascend",
                              sync=c.sync, timeout_s=60) for name, c in specs.items()}
    held = {}
    steps = [("A", "dispatch"), ("B", "dispatch"), ("C", "dispatch"), ("A", "source"), ("C", "expert_rank"),
             ("B", "source"), ("A", "dispatch"), ("A", "expert_rank")]
    for name, step in steps:
        case, label = specs[name], f"buffer {name}, {step}"
        if step == "dispatch":
            held[name] = checked_dispatch(bufs[name], case, rank, world_size, label)
        else:
            checked_combine(bufs[name], case, *held[name], rank, world_size, step, label)
    return 0


def skip_worker(rank: int, world_size: int, sync: str) -> str:
    """Rank 1 builds the buffer and skips the dispatch; rank 0 must raise EPCommError, not hang."""
    buf = ubep.Buffer(hidden=16, num_experts=4, top_k=2, max_tokens_per_rank=4, dtype=torch.float32,
                      backend="ascend", sync=sync, timeout_s=2)
    if rank == 1:
        return "skipped"
    x = workloads.origin_tokens(rank, 4, 16, torch.float32)
    idx = torch.tensor([[0, 3], [1, 2], [2, -1], [3, 0]])
    start = time.monotonic()
    try:
        buf.dispatch(x, idx, torch.ones(4, 2))
    except ubep.EPCommError as err:
        return f"{time.monotonic() - start:.1f}|{err}"
    return "no error"


def dirty_window_worker(rank: int, world_size: int, sync: str) -> dict:
    """What a Buffer's preparation leaves in this die's window when the window held garbage, as HCCL's
    may: a first Buffer makes the group's windows, every die writes 0xAB over twice the layer's
    window, then a second Buffer of the same layer prepares them. Returns this window's ready tokens
    ``[W, 2]`` (nonce, epoch) and the group's nonce, the 512-byte blocks after the tokens as runs
    ``[kind, count]`` (``garbage``, ``zero``, or a block of zeros with the sentinel of ``bf16`` / ``fp32``
    in its first 32 bytes), whether the bytes past the layer's window kept the garbage, and checks a
    dispatch and a combine on the prepared window."""
    layer = {"hidden": 40, "num_experts": 4, "top_k": 2, "max_tokens_per_rank": 4, "dtype": torch.bfloat16,
             "backend": "ascend", "sync": sync, "timeout_s": 30}
    first = ubep.Buffer(**layer)
    window, nbytes = first._backend.windows.tensors[rank], window_bytes(first.config)
    window[: 2 * nbytes] = 0xAB
    dist.barrier()  # no die prepares before every die wrote its garbage
    buf = ubep.Buffer(**layer)
    token_bytes = 2 * world_size * 32
    ready = window[token_bytes // 2: token_bytes].view(torch.int64).view(world_size, 4)[:, :2]
    markers = {bytes.fromhex("a5ff") * 16: "bf16", bytes.fromhex("a5a5a5ff") * 8: "fp32", bytes(32): "zero"}
    runs: list[list] = []
    for block in window[-(-token_bytes // 512) * 512: nbytes].view(-1, 512):
        kind = "garbage" if bool((block == 0xAB).all()) else "other"
        if bool((block[32:] == 0).all()):
            kind = markers.get(bytes(block[:32].tolist()), "other")
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    dist.barrier()  # no die sends into a window before every die has read its own
    case = Case(tokens=tuple(range(world_size)), hidden=40, num_experts=4, top_k=2, max_tokens=4, seed=3)
    res, inputs = checked_dispatch(buf, case, rank, world_size, "after the preparation")
    checked_combine(buf, case, res, inputs, rank, world_size, "source", "after the preparation")
    return {"ready": ready.tolist(), "nonce": buf._backend.windows.nonce, "runs": runs,
            "past_layer_kept": bool((window[nbytes: 2 * nbytes] == 0xAB).all())}


def late_die_worker(rank: int, world_size: int) -> str:
    """Rank 1 comes 4 s late to a call (sp, bf16) and rank 0 times out after 2 s; rank 0 then calls a
    live Buffer of another layout (sp, fp16, same geometry), which prepares the windows again with
    no host collective first (a new Buffer's creation would have one, which on the twin would wait
    for rank 1's late call to end) while rank 1's late call still writes rows into rank 0's window.
    The preparation must not fill before rank 1 has arrived: after the fp16 Buffer's call, in which
    rank 1 sends rank 0 nothing, every block that held a sentinel marker after the fp16 layer's
    first preparation holds it again. Returns rank 0's timeout message; "late" on rank 1."""
    layer = {"hidden": 40, "num_experts": 4, "top_k": 2, "max_tokens_per_rank": 4, "backend": "ascend",
             "sync": "sp"}
    other = ubep.Buffer(dtype=torch.float16, timeout_s=30, **layer)
    blocks = other._backend.windows.tensors[rank][: window_bytes(other.config)].view(-1, 512)
    marked = (blocks[:, :32] != 0).any(1) & (blocks[:, 32:] == 0).all(1)  # a sentinel marker, zeros after it
    markers = blocks[marked, :32].clone()
    late = ubep.Buffer(dtype=torch.bfloat16, timeout_s=2, **layer)
    case = Case(tokens=(4,) * world_size, hidden=40, num_experts=4, top_k=2, max_tokens=4, seed=21)
    if rank == 1:
        time.sleep(4)
        checked_dispatch(late, case, rank, world_size, "the late call")
        outcome = "late"
    else:
        try:
            late.dispatch(*case_inputs(case, rank))
            outcome = "no error"
        except ubep.EPCommError as err:
            outcome = str(err)
    none_from_1 = Case(tokens=(3,) + (0,) * (world_size - 1), hidden=40, num_experts=4, top_k=2, dtype="fp16",
                       max_tokens=4, seed=22)
    checked_dispatch(other, none_from_1, rank, world_size, "after the preparation")
    if not torch.equal(blocks[marked, :32], markers):
        raise AssertionError(f"rank {rank}: {int((blocks[marked, :32] != markers).any(1).sum())} sentinel "
                             "markers of the fp16 layer were overwritten after its preparation")
    return outcome


def repeated_launch_worker(rank: int, world_size: int) -> bool:
    """Two dispatches of different routings; rank 1 sleeps 1 s before the second. Every integer
    argument of the two dispatch ops is the same (what a replayed graph launch repeats); both calls'
    rows must match the oracle. Returns whether the integer arguments were identical."""
    layer = {"hidden": 40, "num_experts": 4, "top_k": 2, "max_tokens_per_rank": 6, "backend": "ascend",
             "sync": "tff"}
    buf = ubep.Buffer(dtype=torch.float32, timeout_s=30, **layer)
    seen, op = [], torch.ops.ubep_ascend.dispatch

    def recording(*args):
        seen.append([a for a in args if isinstance(a, int | str | bool | float)])
        return op(*args)

    ops_module = torch.ops.ubep_ascend
    first = Case(tokens=(6,) * world_size, hidden=40, num_experts=4, top_k=2, dtype="fp32", max_tokens=6,
                 seed=31)
    second = Case(tokens=(5,) * world_size, hidden=40, num_experts=4, top_k=2, dtype="fp32", max_tokens=6,
                  seed=32)
    try:
        ops_module.dispatch = recording
        checked_dispatch(buf, first, rank, world_size, "the first call")
        if rank == 1:
            time.sleep(1)
        checked_dispatch(buf, second, rank, world_size, "the repeated launch")
    finally:
        ops_module.dispatch = op
    return len(seen) == 2 and seen[0] == seen[1]


def slow_aiv_worker(rank: int, world_size: int) -> bool:
    """AIV 3 of die 0 sleeps 20 ms before each window copy (the twin's UBEP_TWIN_SLOW_AIV), so its
    share of the preparation's fill ends long after the other AIVs' shares; die 1's first call must
    still find die 0's window filled before its rows land there. A dispatch and a combine right
    after the Buffer's creation, against the oracle."""
    os.environ["UBEP_TWIN_SLOW_AIV"] = "0:3:20000"
    buf = ubep.Buffer(hidden=1024, num_experts=4, top_k=2, max_tokens_per_rank=16, dtype=torch.float32,
                      backend="ascend", sync="sw", timeout_s=20)
    case = Case(tokens=(16,) * world_size, hidden=1024, num_experts=4, top_k=2, dtype="fp32", max_tokens=16,
                seed=41)
    res, inputs = checked_dispatch(buf, case, rank, world_size, "after a preparation with a slow AIV")
    checked_combine(buf, case, res, inputs, rank, world_size, "source", "after a preparation with a slow AIV")
    return True


def skip_prepare_worker(rank: int, world_size: int) -> str:
    """Both ranks make a Buffer; only rank 0 makes a second one (rank 1 stays alive, busy with
    something else): its creation must raise EPCommError on rank 0 within the timeout, not hang."""
    layer = {"hidden": 16, "num_experts": 4, "top_k": 2, "max_tokens_per_rank": 4, "dtype": torch.float32,
             "backend": "ascend", "sync": "sp", "timeout_s": 2}
    ubep.Buffer(**layer)
    if rank == 1:
        time.sleep(4)
        return "skipped"
    start = time.monotonic()
    try:
        ubep.Buffer(**layer)
    except ubep.EPCommError as err:
        return f"{time.monotonic() - start:.1f}|{err}"
    return "no error"
