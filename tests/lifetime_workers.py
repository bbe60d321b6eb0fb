"""Rank functions of tests/test_cuda_lifetime.py: cuda Buffers made, used and destroyed one after
another in one process, as a serving engine holds them, every result checked exactly.

At W = 1 the expected rows are torch's own permute of ``x`` (``x[argsort(topk_idx.flatten(),
stable=True) // K]``: rows by (expert, token)) and the expected combine its ordered fp32 sum
(``ubep.reduce.ordered_sum``), both computed on the GPU, so large calls stay cheap to check.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import ubep
from tests.workers import Case, case_inputs
from ubep.reduce import ordered_sum

# The model shapes (hidden, experts, top-k) of the serving sequence: expert counts whose
# tokens_per_expert fills whole 512-byte allocator blocks at W = 1 (128, 256, 384), and one that does not.
SHAPES = ((7168, 256, 8), (4096, 128, 8), (2048, 128, 8), (7168, 384, 8), (4096, 8, 2))


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def _inputs(tokens: int, hidden: int, experts: int, top_k: int, seed: int):
    case = Case(tokens=(tokens,), hidden=hidden, num_experts=experts, top_k=top_k, seed=seed,
                maxvio=1.0 if seed % 2 else 0.0, drop=0.1 if seed % 3 == 2 else 0.0)
    return tuple(t.to(_device()) for t in case_inputs(case, 0))


def _expected(x, idx, w, experts: int):
    """``(rows, tokens_per_expert, y)`` of a W = 1 dispatch and an unweighted-experts combine
    (expert output = the received row), on the GPU: the rows by (expert, token), as a compact
    dispatch returns them and as a padded one places them expert by expert."""
    top_k = idx.shape[1]
    flat = idx.flatten()
    order = torch.argsort(torch.where(flat >= 0, flat, experts), stable=True)
    order = order[: int((flat >= 0).sum())]
    tpe = torch.bincount(flat[flat >= 0], minlength=experts)
    y = ordered_sum(x.unsqueeze(1).expand(-1, top_k, -1), idx >= 0, w).to(x.dtype)
    return x[order // top_k], tpe, y


def _positions(recv_x: torch.Tensor, tokens_per_expert: torch.Tensor):
    """``(expert, slot)`` of every row a padded dispatch (``recv_x [E, capacity, H]``) placed, by
    expert then slot, for ``tokens_per_expert``; ``None`` for a compact one. One host wait, so that
    the checks of calls queued back to back need none (and no padded-sized temporaries: a padded
    output at 4096 tokens and 384 experts is 21 GiB)."""
    if recv_x.dim() != 3:
        return None
    slots = torch.arange(recv_x.shape[1], device=recv_x.device)
    return (slots[None, :] < tokens_per_expert[:, None]).nonzero(as_tuple=True)


def _placed(recv_x: torch.Tensor, where) -> torch.Tensor:
    """The rows a dispatch placed, ``[rows, H]``: a padded output's rows at ``where``
    (:func:`_positions`), a compact one as it is."""
    return recv_x if where is None else recv_x[where]


def _check(label: str, res, y, want) -> None:
    want_x, want_tpe, want_y = want
    problems = []
    if not torch.equal(res.tokens_per_expert, want_tpe):
        problems.append("tokens_per_expert")
    elif not torch.equal(_placed(res.recv_x, _positions(res.recv_x, want_tpe)), want_x):
        problems.append("recv_x")
    if not torch.equal(y, want_y):
        problems.append("y")
    if problems:
        raise AssertionError(f"{label}: {', '.join(problems)} differ from torch's permute")


def _mismatches(res, y, want, where) -> torch.Tensor:
    """How many of the outputs differ (0 to 3), summed on the device (no host round trip)."""
    want_x, want_tpe, want_y = want
    got_x = _placed(res.recv_x, where)
    rows = ((got_x != want_x).any().long() if got_x.shape == want_x.shape
            else torch.ones((), dtype=torch.int64, device=y.device))
    return (res.tokens_per_expert != want_tpe).any().long() + rows + (y != want_y).any().long()


def _captured(buf: ubep.Buffer, x, idx, w):
    """``(graph, result, y)``: one dispatch + combine of ``buf`` captured in a CUDA graph, after an
    eager one (Triton compiles outside the capture); the graph's outputs are filled by replays."""
    res = buf.dispatch(x, idx, w)
    buf.combine(res.recv_x, res.handle)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = buf.dispatch(x, idx, w)
        y = buf.combine(res.recv_x, res.handle)
    return graph, res, y


def _serve(buf: ubep.Buffer, cfg: tuple, back_to_back: int, label: str) -> int:
    """One Buffer's life in the serving sequence; returns the mismatches of its unchecked calls."""
    hidden, experts, top_k, tokens, layout, sync = cfg
    x, idx, w = _inputs(tokens, hidden, experts, top_k, seed=tokens + experts)
    want = _expected(x, idx, w, experts)
    first = buf.dispatch(x, idx, w)
    _check(f"{label} first call", first, buf.combine(first.recv_x, first.handle), want)
    where = _positions(first.recv_x, want[1])
    kept = _placed(first.recv_x, where).clone()  # compared again after the calls queued behind it
    bad = torch.zeros((), dtype=torch.int64, device=x.device)
    for _ in range(back_to_back):  # queued without a host synchronization between them
        res = buf.dispatch(x, idx, w)
        bad += _mismatches(res, buf.combine(res.recv_x, res.handle), want, where)
        bad += (buf.combine(first.recv_x, first.handle) != want[2]).any().long()
        del res
    if not torch.equal(_placed(first.recv_x, where), kept):
        raise AssertionError(f"{label}: the first dispatch's rows changed while later calls ran")
    del first, kept
    if layout == "padded" and tokens <= 128:
        graph, captured, captured_y = _captured(buf, x, idx, w)
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        _check(f"{label} graph replay", captured, captured_y, want)
        del graph, captured, captured_y
    for seed in range(5):
        x2, idx2, w2 = _inputs(tokens, hidden, experts, top_k, seed=seed + 7)
        res = buf.dispatch(x2, idx2, w2)
        _check(f"{label} new routing {seed}", res, buf.combine(res.recv_x, res.handle),
               _expected(x2, idx2, w2, experts))
        del res
    buf.synchronize()
    return int(bad)


def serving_sequence_case(rank: int, world_size: int, shapes: tuple, tokens: tuple, syncs: tuple,
                          back_to_back: int) -> dict:
    """Buffers of every (shape, tokens, layout, sync) in order, each made, used (a checked call,
    ``back_to_back`` unchecked dispatch + combine pairs queued behind it, the first call's outputs
    checked again afterwards, a CUDA-graph capture and 20 replays for small padded Buffers, five
    checked calls on new routings), destroyed and its cached memory emptied before the next one.
    Returns the mismatches of each Buffer's unchecked calls (all must be 0)."""
    found = {}
    for hidden, experts, top_k in shapes:
        for t in tokens:
            for layout in ("compact", "padded"):
                for sync in syncs:
                    cfg = (hidden, experts, top_k, t, layout, sync)
                    buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k,
                                      max_tokens_per_rank=t, dtype=torch.bfloat16, backend="cuda",
                                      layout=layout, sync=sync, check_inputs=False, timeout_s=30,
                                      device=_device())
                    found[str(cfg)] = _serve(buf, cfg, back_to_back, str(cfg))
                    buf.destroy()
                    del buf
                    torch.cuda.empty_cache()
    return found


def two_buffers_case(rank: int, world_size: int, rounds: int) -> None:
    """A prefill Buffer (compact, 1024 tokens, tff) and a decode Buffer (padded, 64 tokens, sw, its
    call captured in a CUDA graph) alive at once and used alternately, as an engine holds them;
    every result exact."""
    hidden, experts, top_k = 2048, 128, 8
    common = {"hidden": hidden, "num_experts": experts, "top_k": top_k, "dtype": torch.bfloat16,
              "backend": "cuda", "check_inputs": False, "timeout_s": 30, "device": _device()}
    prefill = ubep.Buffer(max_tokens_per_rank=1024, layout="compact", sync="tff", **common)
    decode = ubep.Buffer(max_tokens_per_rank=64, layout="padded", sync="sw", **common)
    dx, didx, dw = _inputs(64, hidden, experts, top_k, seed=1)
    graph, step, step_y = _captured(decode, dx, didx, dw)
    for r in range(rounds):
        x, idx, w = _inputs(1024 - 37 * r, hidden, experts, top_k, seed=r)
        res = prefill.dispatch(x, idx, w)
        _check(f"round {r} prefill", res, prefill.combine(res.recv_x, res.handle),
               _expected(x, idx, w, experts))
        new = _inputs(64, hidden, experts, top_k, seed=100 + r)
        for static, fresh in zip((dx, didx, dw), new, strict=True):
            static.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        _check(f"round {r} decode graph", step, step_y, _expected(dx, didx, dw, experts))
        eager = decode.dispatch(dx, didx, dw)
        _check(f"round {r} decode eager", eager, decode.combine(eager.recv_x, eager.handle),
               _expected(dx, didx, dw, experts))
    prefill.destroy()
    decode.destroy()


def destroyed_graph_case(rank: int, world_size: int) -> str:
    """A padded Buffer whose dispatch + combine a CUDA graph captured, then destroyed: the graph
    still replays exactly on every rank (the Buffer's memory stays for it); then only rank 0
    replays it, its waits for rank 1 time out, and the next call of a live Buffer on rank 0 raises
    EPCommError saying so. ``ubep.release_graph_memory()`` then frees the kept memory. Returns rank
    0's message."""
    hidden, experts, top_k, tokens = 256, 4 * world_size, 2, 16
    common = {"hidden": hidden, "num_experts": experts, "top_k": top_k, "dtype": torch.bfloat16,
              "backend": "cuda", "layout": "padded", "sync": "tff", "timeout_s": 1,
              "max_tokens_per_rank": tokens, "device": _device()}
    buf = ubep.Buffer(**common)
    case = Case(tokens=(tokens,) * world_size, hidden=hidden, num_experts=experts, top_k=top_k)
    x, idx, w = (t.to(_device()) for t in case_inputs(case, rank))
    graph, captured, captured_y = _captured(buf, x, idx, w)
    graph.replay()
    torch.cuda.synchronize()
    where = _positions(captured.recv_x, captured.tokens_per_expert)
    want_x, want_y = _placed(captured.recv_x, where).clone(), captured_y.clone()
    buf.destroy()
    try:
        buf.dispatch(x, idx, w)
        raise AssertionError("a destroyed Buffer dispatched")
    except RuntimeError as err:
        assert "was destroyed" in str(err), err
    captured_y.zero_()
    graph.replay()  # every rank: the kept memory serves it
    torch.cuda.synchronize()
    assert torch.equal(_placed(captured.recv_x, where), want_x)
    assert torch.equal(captured_y, want_y)
    live = ubep.Buffer(**common)  # a collective: every rank makes it
    message = ""
    if rank == 0:
        graph.replay()  # rank 1 does not: the replay's waits time out after 1 s
        torch.cuda.synchronize()
        try:
            live.dispatch(x, idx, w)
        except ubep.EPCommError as err:
            message = str(err)
    dist.barrier()  # rank 0's replay is over before any rank frees memory it wrote into
    del graph, captured, captured_y
    assert ubep.release_graph_memory() > 0
    live.destroy()
    return message
