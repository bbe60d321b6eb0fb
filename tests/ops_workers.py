"""Rank functions for tests/test_ops.py: ``torch.ops.ubep.dispatch`` / ``combine`` against
``Buffer.dispatch`` / ``combine`` and the oracle, under ``torch.compile``, under ``opcheck``, after
a Buffer is gone, and (on a GPU) in a CUDA graph.

Each rank rebuilds every rank's inputs from the case's seed (``tests.workers.case_inputs``), as
the Buffer tests do, and checks its own results locally.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

import ubep
from tests.workers import (
    DTYPES,
    Case,
    _apply_experts,
    _check_equal,
    _check_grads,
    _zero_padding,
    case_inputs,
)
from ubep import ops, oracle, workloads

REDUCE_WEIGHTED = [(r, wt) for r in ("source", "expert_rank") for wt in (True, False)]


class OpsFacade:
    """``Buffer``'s ``dispatch`` / ``combine`` surface, through the torch ops (so that the Buffer
    tests' checks run on the ops unchanged); the handle is the ops' :class:`ubep.ops.Dispatched`."""

    def __init__(self, buf: ubep.Buffer):
        self.buf, self.config, self.device = buf, buf.config, buf.device

    def dispatch(self, x, topk_idx, topk_weights) -> ubep.DispatchResult:
        d = ops.dispatch(self.buf, x, topk_idx, topk_weights)
        return ubep.DispatchResult(d.recv_x, d.tokens_per_expert, d.recv_weights, d)

    def combine(self, expert_out, handle, *, reduce="source", weighted=True):
        return ops.combine(self.buf, expert_out, handle, reduce=reduce, weighted=weighted)


def _buffer(case: Case, device: torch.device | None = None, **kw) -> ubep.Buffer:
    max_tokens = case.max_tokens or max(max(case.tokens), 1)
    return ubep.Buffer(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                       max_tokens_per_rank=max_tokens, dtype=DTYPES[case.dtype], layout=case.layout,
                       backend=case.backend, sync=case.sync, timeout_s=30, device=device, **kw)


def _rows(recv: torch.Tensor, tokens_per_expert: torch.Tensor, layout: str) -> torch.Tensor:
    """Receive rows with the unspecified padding rows zeroed."""
    return _zero_padding(recv, tokens_per_expert) if layout == "padded" else recv


def _check_forward(face: OpsFacade, buf: ubep.Buffer, case: Case, rank: int, world: int):
    """Dispatch and every combine through the ops, bit for bit against the oracle and against the
    Buffer; returns ``(ops result, expert outputs, oracle's per-pair outputs)``."""
    cfg, dtype = buf.config, DTYPES[case.dtype]
    xs, idxs, ws = (list(v) for v in zip(*[case_inputs(case, s) for s in range(world)], strict=True))
    x, idx, w = (t.to(buf.device) for t in (xs[rank], idxs[rank], ws[rank]))
    res, ref = face.dispatch(x, idx, w), buf.dispatch(x, idx, w)
    want_x, want_tpe, want_w = oracle.dispatch(xs, idxs, ws, rank, world, case.num_experts)
    if case.layout == "padded":
        want_x = oracle.to_padded(want_x, want_tpe, cfg.expert_capacity)
        want_w = oracle.to_padded(want_w, want_tpe, cfg.expert_capacity)
    got_x = _rows(res.recv_x, res.tokens_per_expert, case.layout)
    for name, got, want, buffer_gave in [
        ("tokens_per_expert", res.tokens_per_expert, want_tpe, ref.tokens_per_expert),
        ("recv_x", got_x, want_x, _rows(ref.recv_x, ref.tokens_per_expert, case.layout)),
        ("recv_weights", res.recv_weights, want_w, ref.recv_weights),
    ]:
        _check_equal(f"op {name} vs oracle", got, want)
        _check_equal(f"op {name} vs Buffer", got, buffer_gave.cpu())
    expert_out = _apply_experts(res.recv_x, res.tokens_per_expert, cfg)
    outs = oracle.expert_outputs(idxs, lambda s, t, k, e: workloads.scale_expert(xs[s][t : t + 1], e)[0])
    for reduce, weighted in REDUCE_WEIGHTED:
        name = f"combine(reduce={reduce}, weighted={weighted})"
        y = face.combine(expert_out, res.handle, reduce=reduce, weighted=weighted)
        want_y = oracle.combine(outs, idxs, ws, rank, world, case.num_experts, reduce, weighted,
                                case.hidden, dtype)
        _check_equal(f"op {name} vs oracle", y, want_y)
        _check_equal(f"op {name} vs Buffer", y,
                     buf.combine(expert_out, ref.handle, reduce=reduce, weighted=weighted).cpu())
    return res, expert_out, (xs, idxs, ws, outs)


def _chain_grads(dispatch: Callable, combine: Callable, x, idx, w, reduce: str, weighted: bool, rank: int):
    """``d loss / d (x, w)`` through dispatch -> an elementwise expert -> combine, with a loss on
    ``y`` and on ``recv_weights``: both backward paths at once, padding rows included."""
    x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    res = dispatch(x, idx, w)
    y = combine(res.recv_x * 3, res.handle, reduce=reduce, weighted=weighted)
    gy = workloads.origin_tokens(rank + 17, x.shape[0], x.shape[1], torch.float32).to(x.device)
    loss = (y.float() * gy).sum() + (res.recv_weights * 0.5).sum()
    return torch.autograd.grad(loss, [x, w])


def parity_case(rank: int, world: int, case: Case) -> int:
    """The ops against the oracle and the Buffer, forward and backward; returns the rows received."""
    device = torch.device("cuda", torch.cuda.current_device()) if case.backend == "cuda" else None
    buf = _buffer(case, device)
    face = OpsFacade(buf)
    res, expert_out, (xs, idxs, ws, outs) = _check_forward(face, buf, case, rank, world)
    x, idx, w = (t.to(buf.device) for t in (xs[rank], idxs[rank], ws[rank]))
    if case.grads:
        # the Buffer tests' gradient checks against the oracle, on the ops ...
        x_leaf, w_leaf = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        _check_grads(face, face.dispatch(x_leaf, idx, w_leaf), x_leaf, w_leaf, expert_out, xs, idxs, ws,
                     outs, rank)
        # ... and every gradient bit for bit against the Buffer's, through each reduction (whether
        # weighted alternates with the case's seed: two cases cover all four combines)
        for reduce, weighted in [("source", case.seed % 2 == 0), ("expert_rank", case.seed % 2 == 1)]:
            got = _chain_grads(face.dispatch, face.combine, x, idx, w, reduce, weighted, rank)
            want = _chain_grads(buf.dispatch, buf.combine, x, idx, w, reduce, weighted, rank)
            for name, g, h in zip(("x", "topk_weights"), got, want, strict=True):
                _check_equal(f"grad {name} (reduce={reduce}, weighted={weighted}) vs Buffer", g, h.cpu())
    buf.destroy()
    return int(res.tokens_per_expert.sum())


def run_parity(rank: int, world: int, cases: list[Case]) -> list[int]:
    """:func:`parity_case` for each case; a failure names its case."""
    rows = []
    for case in cases:
        try:
            rows.append(parity_case(rank, world, case))
        except Exception as err:
            raise AssertionError(f"{case}: {err}") from err
    return rows


# -- torch.compile ---------------------------------------------------------------------------------


def _moe(buf: ubep.Buffer, x, idx, w, scale_E11, weight_EHH):
    """A small MoE layer on the padded layout: dispatch, per-expert ``relu(scale * x) @ W``,
    weighted combine."""
    d = ops.dispatch(buf, x, idx, w)
    h = torch.bmm(torch.relu(d.recv_x * scale_E11), weight_EHH)
    return ops.combine(buf, h, d)


def compile_case(rank: int, world: int, case: Case, compilers: list[str]) -> list[str]:
    """``torch.compile(fullgraph=True)`` of :func:`_moe` with each compiler: no graph break, and
    the forward and every gradient give eager's bits. Returns the compilers checked."""
    torch._inductor.config.compile_threads = 1  # no pool of compile workers to start on 2 cores
    buf = _buffer(case)
    cfg = buf.config
    x, idx, w = case_inputs(case, rank)
    gen = torch.Generator().manual_seed(5)
    scale = torch.rand(cfg.num_local_experts, 1, 1, generator=gen).to(x.dtype)
    weight = (torch.randn(cfg.num_local_experts, cfg.hidden, cfg.hidden, generator=gen) / 8).to(x.dtype)

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, weight)]
        y = fn(buf, leaves[0], idx, leaves[1], scale, leaves[2])
        return [y, *torch.autograd.grad((y.float() ** 2).sum(), leaves)]

    want = run(_moe)
    for compiler in compilers:
        torch._dynamo.reset()
        got = run(torch.compile(_moe, fullgraph=True, backend=compiler))
        for name, g, h in zip(("y", "grad x", "grad topk_weights", "grad expert weights"), got, want,
                              strict=True):
            _check_equal(f"{compiler}: {name}", g, h)
    buf.destroy()
    return compilers


def compile_compact_case(rank: int, world: int, case: Case) -> tuple[int, int]:
    """The compact layout under ``torch.compile(fullgraph=True)``: its row count is an unbacked
    size in the graph; the compiled layer gives eager's bits. Returns ``(rows, rows of eager)``."""
    buf = _buffer(case)
    x, idx, w = case_inputs(case, rank)

    def layer(x, idx, w):
        d = ops.dispatch(buf, x, idx, w)
        return ops.combine(buf, torch.relu(d.recv_x * 2), d), d.recv_x.shape[0]

    # compiled first: the Buffer gets its op id while dynamo traces
    y, rows = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, idx, w)
    want_y, want_rows = layer(x, idx, w)
    _check_equal("compact compiled y", y, want_y)
    buf.destroy()
    return int(rows), int(want_rows)


def compile_cases(rank: int, world: int, padded: Case, compact: Case, compilers: list[str]):
    """:func:`compile_case` of ``padded``, then :func:`compile_compact_case` of ``compact``."""
    return compile_case(rank, world, padded, compilers), compile_compact_case(rank, world, compact)


# -- opcheck ---------------------------------------------------------------------------------------


def _without_call(tree):
    """A dispatch's outputs with the call number in its host words zeroed: the one value that
    differs between two calls of the same inputs (each dispatch gets the next number)."""
    if isinstance(tree, tuple) and len(tree) == 4 and isinstance(tree[3], list):
        host = tree[3][0].clone()
        host[1] = 0
        return (*tree[:3], [host, *tree[3][1:]])
    return tree


def _same_but_call(got, want, msg=None) -> None:
    torch.testing.assert_close(_without_call(got), _without_call(want), rtol=0, atol=0, msg=msg)


def opcheck_case(rank: int, world: int, case: Case) -> list[str]:
    """``torch.library.opcheck`` on every ubep op, with inputs that need gradients. The dispatch's
    AOTAutograd comparison runs through ``optests.aot_autograd_check`` with a comparison that
    ignores the call number (opcheck's own compares every output word)."""
    from torch.testing._internal.optests import aot_autograd_check

    buf = _buffer(case)
    bid = ops.op_id(buf)
    x, idx, w = case_inputs(case, rank)
    x.requires_grad_(True)
    w.requires_grad_(True)
    dispatch, combine = torch.ops.ubep.dispatch.default, torch.ops.ubep.combine.default
    torch.library.opcheck(dispatch, (bid, x, idx, w),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    aot_autograd_check(dispatch, (bid, x, idx, w), {}, dynamic=True, assert_equals_fn=_same_but_call)
    d = ops.dispatch(buf, x.detach(), idx, w.detach())
    out = (d.recv_x * 2).requires_grad_(True)
    checked = ["dispatch"]
    for reduce, weighted in REDUCE_WEIGHTED:
        torch.library.opcheck(combine, (bid, out, w, d.recv_weights, d.routes, reduce, weighted))
        checked.append(f"combine({reduce}, {weighted})")
    grad_rows = torch.ones_like(d.recv_x)
    torch.library.opcheck(torch.ops.ubep.dispatch_backward.default,
                          (bid, grad_rows, d.recv_weights * 2, w.detach(), d.recv_weights,
                           d.tokens_per_expert, d.routes, True, True))
    torch.library.opcheck(torch.ops.ubep.combine_backward.default,
                          (bid, torch.ones_like(x.detach()), out.detach(), w.detach(), d.recv_weights,
                           d.routes, True, True, True))
    buf.destroy()
    return [*checked, "dispatch_backward", "combine_backward"]


def opcheck_cases(rank: int, world: int, cases: list[Case]) -> list[str]:
    """:func:`opcheck_case` for each case: what was checked, by layout."""
    return [f"{case.layout}: {op}" for case in cases for op in opcheck_case(rank, world, case)]


def parity_and_opcheck(rank: int, world: int, cases: list[Case], checked: list[Case]) -> list[str]:
    """:func:`run_parity` of ``cases``, then :func:`opcheck_cases` of ``checked``, in one spawn."""
    run_parity(rank, world, cases)
    return opcheck_cases(rank, world, checked)


# -- lifetime ----------------------------------------------------------------------------------------


def _raises(fn: Callable, kind: type, text: str) -> None:
    try:
        fn()
    except kind as err:
        assert text in str(err), f"{kind.__name__} without {text!r}: {err}"
    else:
        raise AssertionError(f"no {kind.__name__} ({text!r})")


def lifetime_case(rank: int, world: int) -> int:
    """A destroyed Buffer's id, a deleted Buffer's id and an id never given raise ``RuntimeError``
    naming it; routes of another Buffer raise ``ValueError``; all before any communication."""
    case = Case(tokens=(4,) * world, hidden=8, num_experts=2 * world, top_k=2, dtype="fp32")
    x, idx, w = case_inputs(case, rank)
    first, second = _buffer(case), _buffer(case)
    other = ops.op_id(second)
    d = ops.dispatch(first, x, idx, w)
    _raises(lambda: ops.combine(other, d.recv_x, d), ValueError, "routes come from a dispatch of")
    first.destroy()
    dead = ops.op_id(first)
    _raises(lambda: ops.dispatch(dead, x, idx, w), RuntimeError, f"op id {dead} was destroyed")
    _raises(lambda: ops.combine(dead, d.recv_x, d), RuntimeError, f"op id {dead} was destroyed")
    second = None  # the registry holds Buffers weakly: this was the last reference
    gc.collect()
    _raises(lambda: ops.dispatch(other, x, idx, w), RuntimeError, "belonged to a Buffer that was deleted")
    _raises(lambda: torch.ops.ubep.dispatch(10**9, x, idx, w), RuntimeError, "was never given")
    return 5


# -- CUDA graphs ---------------------------------------------------------------------------------------


def graph_case(rank: int, world: int, sync: str) -> None:
    """On the cuda backend: the ops of a padded dispatch and combine, eager and compiled
    (``aot_eager``), captured in a CUDA graph; replays on new inputs give eager calls' bits."""
    dev = torch.device("cuda", torch.cuda.current_device())
    case = Case(tokens=(24,) * world, hidden=136, num_experts=4 * world, top_k=3, maxvio=1.0,
                layout="padded", backend="cuda", sync=sync)
    buf = _buffer(case, dev, check_inputs=True)
    x, idx, w = (t.to(dev) for t in case_inputs(case, rank))

    def step(x, idx, w):
        d = ops.dispatch(buf, x, idx, w)
        return (_zero_padding(d.recv_x, d.tokens_per_expert),
                ops.combine(buf, d.recv_x, d, reduce="expert_rank"))

    for name, fn in [("eager ops", step),
                     ("compiled ops", torch.compile(step, fullgraph=True, backend="aot_eager"))]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(x, idx, w)  # warm up: Triton and the compiler run outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn(x, idx, w)
        for trial in range(3):
            x.copy_(workloads.origin_tokens(rank + 7 * trial, 24, case.hidden, torch.bfloat16))
            graph.replay()
            eager = step(x, idx, w)
            torch.cuda.synchronize()
            for part, got, want in zip(("recv_x", "y"), captured, eager, strict=True):
                _check_equal(f"{name}, replay {trial}: {part}", got, want.cpu())
        buf.synchronize()
    buf.destroy()


def reference_checks(rank: int, world: int, parity: list[Case], checked: list[Case], padded: Case,
                     compact: Case, compilers: list[str]) -> dict:
    """Every check of the reference backend on one process group (a spawn costs every rank a torch
    import): ids of Buffers that are gone, parity, opcheck, then torch.compile. Each check's
    result by name."""
    return {"lifetime": lifetime_case(rank, world), "parity": run_parity(rank, world, parity),
            "opcheck": opcheck_cases(rank, world, checked),
            "compile": compile_cases(rank, world, padded, compact, compilers)}


# -- the cuda backend's routes, on Triton's interpreter ------------------------------------------------


def _storages(tensors) -> list[int]:
    return [t.untyped_storage()._cdata for t in tensors]


def emulated_cuda_routes_case(_rank: int, _world: int, cases: list[Case]) -> None:
    """:func:`emulated_cuda_routes` for each case; a failure names its case."""
    for case in cases:
        try:
            emulated_cuda_routes(case)
        except Exception as err:
            raise AssertionError(f"{case}: {err}") from err


def emulated_cuda_routes(case: Case) -> None:
    """The cuda backend's handles, packed into route tensors and rebuilt, on W ranks emulated in one
    process (tests/cuda_emulation.py, ``TRITON_INTERPRET=1``): the route tensors share storage with
    no input and no other output of the dispatch (as an op's outputs must not), and combine (both
    reductions, weighted or not), ``dispatch_like`` and ``return_pair_values`` along the rebuilt
    handles give the original handles' bits."""
    from tests.cuda_emulation import _inputs, emulated_backends, lockstep
    from ubep.backends import route_tensors

    backends = emulated_backends(case)
    xs, idxs, ws = _inputs(case, len(backends))
    dispatched = lockstep([b.dispatch_steps(x, i, w) for b, x, i, w in zip(backends, xs, idxs, ws,
                                                                          strict=True)])
    originals, rebuilt = [], []
    for rank, (backend, (recv_x, recv_w, handle)) in enumerate(zip(backends, dispatched, strict=True)):
        routes = route_tensors.pack(7, "cuda", handle, idxs[rank])
        owners = _storages([xs[rank], idxs[rank], ws[rank], recv_x, recv_w, handle.tokens_per_expert,
                            *routes])
        assert len(set(owners)) == len(owners), f"rank {rank}: route tensors share storage"
        words = route_tensors.host_words(7, "cuda", backend.config, backend.device, routes,
                                         handle.num_tokens)
        originals.append(handle)
        rebuilt.append(route_tensors.unpack(words, "cuda", backend.config, routes, ws[rank], recv_w))
    outs = [recv_x * 2 for recv_x, _, _ in dispatched]
    dtype = DTYPES[case.dtype]
    gys = [workloads.origin_tokens(s + 17, len(i), case.hidden, dtype) for s, i in enumerate(idxs)]
    values = [recv_w.reshape(-1) * 3 for _, recv_w, _ in dispatched]
    calls = {f"combine({r}, {wt})": lambda b, h, i, r=r, wt=wt: b.combine_steps(outs[i], h, r, wt)
             for r, wt in REDUCE_WEIGHTED}
    calls["dispatch_like"] = lambda b, h, i: b.dispatch_like_steps(gys[i], h)
    calls["return_pair_values"] = lambda b, h, i: b.return_pair_values_steps(values[i], h)
    for name, call in calls.items():
        want = lockstep([call(b, h, i) for i, (b, h) in enumerate(zip(backends, originals, strict=True))])
        got = lockstep([call(b, h, i) for i, (b, h) in enumerate(zip(backends, rebuilt, strict=True))])
        for rank, (g, h) in enumerate(zip(got, want, strict=True)):
            _check_equal(f"{name} along rank {rank}'s rebuilt handle", g, h)
