"""Rank functions run by ``ubep.launch.run_ranks`` in the multi-process tests.

Each rank rebuilds every rank's inputs from the case's seed, so it can compute its own expected
outputs with ``ubep.oracle`` and compare locally; only a short summary travels back to pytest.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

import ubep
from ubep import oracle, protocol, workloads
from ubep.config import least_cuda_sms
from ubep.reduce import ordered_sum

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW = {2: torch.int16, 4: torch.int32}


@dataclass(frozen=True)
class Case:
    tokens: tuple[int, ...]  # T_s per rank
    hidden: int
    num_experts: int
    top_k: int
    dtype: str = "bf16"
    layout: str = "compact"
    maxvio: float = 0.0
    drop: float = 0.0
    seed: int = 0
    grads: bool = True
    max_tokens: int = 0  # 0: max(tokens)
    backend: str = "reference"
    sync: str = "tff"
    num_sms: int | None = None  # the cuda backend's SM budget (others ignore it)


def case_inputs(case: Case, rank: int):
    """``(x [T, H], topk_idx [T, K] int64, topk_weights [T, K] fp32)`` of ``rank`` in ``case``."""
    num_tokens = case.tokens[rank]
    gen = torch.Generator().manual_seed(case.seed * 1009 + rank)
    idx = workloads.skewed_topk(num_tokens, case.num_experts, case.top_k, maxvio=case.maxvio,
                                hot_experts=[case.seed % case.num_experts] if case.maxvio else [],
                                generator=gen)
    if case.drop:
        idx = workloads.drop_slots(idx, case.drop, gen)
    x = workloads.origin_tokens(rank, num_tokens, case.hidden, DTYPES[case.dtype])
    w = workloads.origin_weights(rank, num_tokens, case.top_k)
    return x, idx, w


def _experts_of_rows(tokens_per_expert: torch.Tensor, first_expert: int) -> list[int]:
    return [first_expert + j for j, n in enumerate(tokens_per_expert.tolist()) for _ in range(n)]


def _apply_experts(recv_x, tokens_per_expert, cfg):
    """Toy experts on the receive rows of either layout; padding rows stay zero."""
    first = cfg.rank * cfg.num_local_experts
    if cfg.layout == "padded":
        out = torch.zeros_like(recv_x)
        for j, n in enumerate(tokens_per_expert.tolist()):
            out[j, :n] = workloads.scale_expert(recv_x[j, :n], first + j)
        return out
    experts = _experts_of_rows(tokens_per_expert, first)
    out = torch.empty_like(recv_x)
    for e in sorted(set(experts)):
        rows = torch.tensor([i for i, ee in enumerate(experts) if ee == e], device=recv_x.device)
        out[rows] = workloads.scale_expert(recv_x[rows], e)
    return out


def _zero_padding(recv_ECH: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """Padded receive rows ``[E_local, cap, H]`` with the unspecified padding set to zero, as the
    oracle pads."""
    row = torch.arange(recv_ECH.shape[1], device=recv_ECH.device).unsqueeze(0)
    mask_EC1 = (row < tokens_per_expert.to(recv_ECH.device).unsqueeze(1)).unsqueeze(2)
    return torch.where(mask_EC1, recv_ECH, torch.zeros((), dtype=recv_ECH.dtype,
                                                       device=recv_ECH.device))


def _check_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
        diff = "shape" if got.shape != want.shape else (
            "dtype" if got.dtype != want.dtype else _where_differs(got, want))
        raise AssertionError(f"{name} differs from the oracle ({diff}): got {tuple(got.shape)} "
                             f"{got.dtype}, want {tuple(want.shape)} {want.dtype}")


def _where_differs(got: torch.Tensor, want: torch.Tensor) -> str:
    """How many elements differ, the largest difference and the first differing index."""
    bad = (got != want) & ~(got.isnan() & want.isnan())
    first = tuple(int(i) for i in torch.unravel_index(bad.flatten().nonzero()[0, 0], bad.shape))
    return (f"{int(bad.sum())} of {bad.numel()} elements, max |diff| "
            f"{(got.double() - want.double()).abs().max().item():.3g}, first at {first}")


def check_bits(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bits, except that where ``want`` is NaN ``got`` only has to be NaN (sums of the ``sp``
    sentinel, a signaling NaN, are quiet NaNs whose payload the contract leaves open)."""
    got = got.cpu()
    int_view = INT_VIEW[want.element_size()]
    same = got.shape == want.shape and bool(
        ((got.view(int_view) == want.view(int_view)) | (got.isnan() & want.isnan())).all())
    if not same:
        raise AssertionError(f"{name} differs from the oracle")


def with_sentinel(x_TH: torch.Tensor) -> torch.Tensor:
    """A copy of ``x_TH`` in which every third row carries ``sp``'s sentinel (candidate 0 of its
    dtype) in the 8 marker bytes of one 128-byte block (block ``(t / 3) mod NB``): those rows
    collide, so their batches complete through the fenced record."""
    out = x_TH.clone()
    es = x_TH.element_size()
    bits = out.view(INT_VIEW[es])
    per_block, marker = 128 // es, 8 // es
    num_blocks = -(-x_TH.shape[1] // per_block)
    sentinel = torch.tensor(protocol.sentinel_candidates(x_TH.dtype)[0]).to(bits.dtype)  # its bits
    for t in range(0, x_TH.shape[0], 3):
        start = (t // 3) % num_blocks * per_block
        bits[t, start : start + marker] = sentinel
    return out


def run_case(rank: int, world_size: int, case: Case) -> dict:
    """Dispatch, combine (both reductions, weighted or not) and gradients, checked bit for bit.

    On an NCCL group, or with the cuda backend, the rank works on its CUDA device; the oracle stays
    on the CPU.
    """
    dtype = DTYPES[case.dtype]
    inputs = [case_inputs(case, s) for s in range(world_size)]
    xs, idxs, ws = (list(v) for v in zip(*inputs, strict=True))
    max_tokens = case.max_tokens or max(max(case.tokens), 1)
    cuda = torch.device("cuda", torch.cuda.current_device()) if case.backend == "cuda" else None
    buf = ubep.Buffer(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                      max_tokens_per_rank=max_tokens, dtype=dtype, layout=case.layout,
                      profile=True, timeout_s=30 if case.backend == "cuda" else 60,
                      backend=case.backend, sync=case.sync, num_sms=case.num_sms,
                      device=cuda)
    cfg = buf.config
    x, idx, w = (t.to(buf.device) for t in inputs[rank])
    x = x.clone().requires_grad_(case.grads)
    w = w.clone().requires_grad_(case.grads)

    res = buf.dispatch(x, idx, w)
    want_x, want_tpe, want_w = oracle.dispatch(xs, idxs, ws, rank, world_size, case.num_experts)
    if case.layout == "padded":
        want_x = oracle.to_padded(want_x, want_tpe, cfg.expert_capacity)
        want_w = oracle.to_padded(want_w, want_tpe, cfg.expert_capacity)
    _check_equal("tokens_per_expert", res.tokens_per_expert, want_tpe)
    recv_x = res.recv_x.detach()
    if case.layout == "padded":
        recv_x = _zero_padding(recv_x, res.tokens_per_expert)
    _check_equal("recv_x", recv_x, want_x)
    _check_equal("recv_weights", res.recv_weights.detach(), want_w)

    expert_out = _apply_experts(res.recv_x.detach(), res.tokens_per_expert, cfg)
    outs = oracle.expert_outputs(
        idxs, lambda s, t, k, e: workloads.scale_expert(xs[s][t : t + 1], e)[0])
    for reduce in ("source", "expert_rank"):
        for weighted in (True, False):
            y = buf.combine(expert_out, res.handle, reduce=reduce, weighted=weighted)
            want_y = oracle.combine(outs, idxs, ws, rank, world_size, case.num_experts, reduce,
                                    weighted, case.hidden, dtype)
            _check_equal(f"combine(reduce={reduce}, weighted={weighted})", y.detach(), want_y)

    if case.grads:
        _check_grads(buf, res, x, w, expert_out, xs, idxs, ws, outs, rank)
    return {"rows": int(res.tokens_per_expert.sum()), "wire": res.handle.wire,
            "phases": sorted(buf.phase_times())}


def _check_grads(buf, res, x, w, expert_out, xs, idxs, ws, outs, rank) -> None:
    cfg = buf.config
    dtype, top_k = cfg.dtype, cfg.top_k
    valid = idxs[rank] >= 0
    # Dispatch backward: d loss / d recv_x = G (the toy expert of each row), d / d recv_w = 2w + 1.
    g_rows = _apply_experts(res.recv_x.detach(), res.tokens_per_expert, cfg)
    gw_rows = 2 * res.recv_weights.detach() + 1
    loss = (res.recv_x * g_rows).sum() + (res.recv_weights * gw_rows).sum()
    grad_x, grad_w = torch.autograd.grad(loss, [x, w])
    contrib = torch.stack([torch.stack(
        [o if o is not None else torch.zeros(cfg.hidden, dtype=dtype) for o in row])
        for row in outs[rank]]) if outs[rank] else torch.zeros(0, top_k, cfg.hidden, dtype=dtype)
    _check_equal("dispatch grad x", grad_x, ordered_sum(contrib, valid).to(dtype))
    _check_equal("dispatch grad weights", grad_w,
                 torch.where(valid, 2 * ws[rank] + 1, torch.zeros(())))

    # Combine backward: d loss / d y = Gy, a function of (rank, token).
    gys = [workloads.origin_tokens(s + 17, len(i), cfg.hidden, dtype) for s, i in enumerate(idxs)]
    gy = gys[rank].to(buf.device)
    out_leaf = expert_out.clone().requires_grad_(True)
    res2 = buf.dispatch(x.detach(), idxs[rank].to(buf.device), w)
    y = buf.combine(out_leaf, res2.handle)
    grad_out, grad_w = torch.autograd.grad((y * gy).sum(), [out_leaf, w])
    gy_rows, tpe, w_rows = oracle.dispatch(gys, idxs, ws, rank, cfg.world_size, cfg.num_experts)
    want_out = (gy_rows.float() * w_rows.unsqueeze(-1)).to(dtype)
    if cfg.layout == "padded":
        want_out = oracle.to_padded(want_out, tpe, cfg.expert_capacity)
    _check_equal("combine grad expert_out", grad_out, want_out)
    want_w = (gys[rank].float().unsqueeze(1) * contrib.float()).sum(-1) * valid
    if not torch.allclose(grad_w.cpu(), want_w, rtol=1e-5, atol=1e-5):
        raise AssertionError("combine grad weights differs from the oracle")


def bad_rank_worker(rank: int, world_size: int) -> None:
    """Every rank: a Buffer of the wrong group size fails; then only rank 1 has bad routing."""
    try:
        ubep.Buffer(hidden=8, num_experts=8, top_k=2, max_tokens_per_rank=4, dtype=torch.float32)
    except ValueError as err:
        assert "num_experts must be a multiple of the group size 3" in str(err), err
    else:
        raise AssertionError("a Buffer of 8 experts over 3 ranks was accepted")
    buf = ubep.Buffer(hidden=8, num_experts=6, top_k=2, max_tokens_per_rank=4,
                      dtype=torch.float32, timeout_s=3)
    idx = torch.tensor([[0, 5], [1, 2]])
    if rank == 1:
        idx[0, 0] = 6
    buf.dispatch(torch.ones(2, 8), idx, torch.ones(2, 2))


def run_cases(rank: int, world_size: int, cases: list[Case]) -> list[dict]:
    """:func:`run_case` for each case in turn on one process group; a failure names its case."""
    results = []
    for case in cases:
        try:
            results.append(run_case(rank, world_size, case))
        except Exception as err:
            raise AssertionError(f"{case}: {err}") from err
    return results


def graph_replay_case(rank: int, world_size: int, sync: str) -> None:
    """The CUDA backend's padded layout captured in a CUDA graph: replays on new inputs equal eager
    calls bit for bit (no host synchronization inside dispatch or combine; the value checks of
    ``check_inputs`` run in the eager warm-up and are skipped inside the capture)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    case = Case(tokens=(24,) * world_size, hidden=136, num_experts=4 * world_size, top_k=3,
                maxvio=1.0)
    buf = ubep.Buffer(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                      max_tokens_per_rank=24, dtype=torch.bfloat16, layout="padded",
                      backend="cuda", sync=sync, check_inputs=True, timeout_s=20, device=dev)
    x, idx, w = (t.to(dev) for t in case_inputs(case, rank))

    def step():
        res = buf.dispatch(x, idx, w)
        return (_zero_padding(res.recv_x, res.tokens_per_expert),
                buf.combine(res.recv_x, res.handle, reduce="expert_rank"))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up: Triton compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_recv, captured_y = step()
    for trial in range(3):
        x.copy_(workloads.origin_tokens(rank + 7 * trial, 24, case.hidden, torch.bfloat16))
        graph.replay()
        eager_recv, eager_y = step()
        torch.cuda.synchronize()
        _check_equal(f"graph replay {trial}: recv_x", captured_recv, eager_recv.cpu())
        _check_equal(f"graph replay {trial}: y", captured_y, eager_y.cpu())
    buf.synchronize()  # a wait that timed out inside a replay raises here


def _synchronizations(caught: list) -> list:
    """The warnings of torch's sync debug mode among ``caught`` (turning the mode on warns too)."""
    return [c for c in caught if "synchronizing CUDA operation" in str(c.message)]


def host_syncs_case(rank: int, world_size: int) -> None:
    """The host synchronizations of CUDA-backend calls, counted by torch's sync debug mode: none in
    a dispatch of either layout (the compact one polls pinned memory for its output's size) or in
    a combine, and one for the value checks of ``check_inputs``."""
    dev = torch.device("cuda", torch.cuda.current_device())
    case = Case(tokens=(24,) * world_size, hidden=136, num_experts=4 * world_size, top_k=3)
    x, idx, w = (t.to(dev) for t in case_inputs(case, rank))
    for layout, checks, want in [("padded", False, 0), ("padded", True, 1), ("compact", False, 0),
                                 ("compact", True, 1)]:
        buf = ubep.Buffer(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                          max_tokens_per_rank=24, dtype=torch.bfloat16, layout=layout,
                          backend="cuda", sync="sw", check_inputs=checks, timeout_s=20, device=dev)
        res = buf.dispatch(x, idx, w)  # compiles the kernels first
        buf.combine(res.recv_x, res.handle)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                res = buf.dispatch(x, idx, w)
                in_dispatch = _synchronizations(caught)
                buf.combine(res.recv_x, res.handle)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = (len(in_dispatch), len(_synchronizations(caught)) - len(in_dispatch))
        assert syncs == (want, 0), (f"{layout}, check_inputs={checks}: {syncs} host "
                                    f"synchronizations (dispatch, combine): "
                                    f"{[str(c.message)[:120] for c in caught]}")
        buf.synchronize()


def compact_capture_case(rank: int, world_size: int) -> None:
    """A compact-layout dispatch in a CUDA graph capture raises before any launch (its host reads
    the output's size, which a capture cannot do); the buffer then works eagerly."""
    dev = torch.device("cuda", torch.cuda.current_device())
    case = Case(tokens=(24,) * world_size, hidden=136, num_experts=4 * world_size, top_k=3)
    x, idx, w = (t.to(dev) for t in case_inputs(case, rank))
    buf = ubep.Buffer(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                      max_tokens_per_rank=24, dtype=torch.bfloat16, layout="compact",
                      backend="cuda", sync="tff", timeout_s=20, device=dev)
    buf.dispatch(x, idx, w)  # compiles outside the capture
    torch.cuda.synchronize()
    raised = ""
    try:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            buf.dispatch(x, idx, w)
    except RuntimeError as err:
        raised = str(err)
    assert "layout='compact' cannot be captured" in raised, raised
    xs, idxs, ws = zip(*[case_inputs(case, s) for s in range(world_size)], strict=True)
    want_x, _, _ = oracle.dispatch(list(xs), list(idxs), list(ws), rank, world_size,
                                   case.num_experts)
    res = buf.dispatch(x, idx, w)
    _check_equal("recv_x after the refused capture", res.recv_x, want_x)
    buf.synchronize()


def stress_case(rank: int, world_size: int, sync: str, layout: str, iters: int, hidden: int,
                tm: int) -> int:
    """``iters`` dispatch + combine calls on one CUDA buffer of rows of ``hidden`` elements, at most
    ``tm`` tokens per rank, each on one of four precomputed input sets picked at random (so buffers
    and slots are reused with changing data, routing and token counts), after a random per-rank GPU
    delay; returns how many results differed from the oracle's."""
    dev = torch.device("cuda", torch.cuda.current_device())
    experts, top_k = 8 * world_size, 4
    buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k, max_tokens_per_rank=tm,
                      dtype=torch.bfloat16, layout=layout, sync=sync, backend="cuda",
                      check_inputs=False, timeout_s=20, device=dev)
    variants = []
    for v in range(4):
        # from 0 to tm, odd counts too; rank 1 sends tm in set 2
        tokens = tuple(max(0, tm * ((v + 2 * s) % 5) // 4 - v % 2) for s in range(world_size))
        case = Case(tokens=tokens, hidden=hidden, num_experts=experts, top_k=top_k,
                    maxvio=(0.0, 1.0, 3.0, 0.0)[v], drop=0.1 * (v % 2), seed=v)
        xs, idxs, ws = (list(t) for t in zip(*[case_inputs(case, s) for s in range(world_size)],
                                              strict=True))
        want_x, want_tpe, _ = oracle.dispatch(xs, idxs, ws, rank, world_size, experts)
        outs = oracle.expert_outputs(idxs, lambda s, t, k, e, xs=xs: xs[s][t])
        want_y = oracle.combine(outs, idxs, ws, rank, world_size, experts, "source", True, hidden,
                                torch.bfloat16)
        variants.append(((xs[rank].to(dev), idxs[rank].to(dev), ws[rank].to(dev)),
                         want_x.to(dev), want_tpe.tolist(), want_y.to(dev)))
    pick = torch.Generator().manual_seed(1234)  # the same input set on every rank
    delay = torch.Generator().manual_seed(99 + rank)  # different delays per rank
    mismatches = torch.zeros((), dtype=torch.int64, device=dev)
    for _ in range(iters):
        (x, idx, w), want_x, want_tpe, want_y = variants[int(torch.randint(4, (1,), generator=pick))]
        torch.cuda._sleep(int(torch.randint(0, 20000, (1,), generator=delay)))
        res = buf.dispatch(x, idx, w)
        recv = res.recv_x
        if layout == "padded":
            recv = torch.cat([recv[j, :n] for j, n in enumerate(want_tpe)])
        torch.cuda._sleep(int(torch.randint(0, 20000, (1,), generator=delay)))
        y = buf.combine(res.recv_x, res.handle)
        if recv.shape != want_x.shape:
            mismatches += 1
        else:  # compared on the device, so calls keep queueing without a host round trip
            mismatches += (recv != want_x).any().long() + (y != want_y).any().long()
    buf.synchronize()
    return int(mismatches)


def timeout_case(rank: int, world_size: int, sync: str, layout: str) -> str:
    """Rank 0 dispatches alone: its wait for rank 1 must end in an EPCommError, not a hang (in the
    compact layout, raised by the dispatch itself, whose host waits for the output's size)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    buf = ubep.Buffer(hidden=64, num_experts=4, top_k=2, max_tokens_per_rank=8,
                      dtype=torch.bfloat16, layout=layout, backend="cuda", sync=sync, timeout_s=1,
                      device=dev)
    message = ""
    if rank == 0:
        idx = torch.tensor([[0, 3]] * 8, device=dev)
        try:
            buf.dispatch(torch.ones(8, 64, dtype=torch.bfloat16, device=dev), idx,
                         torch.ones(8, 2, device=dev))
            buf.synchronize()
        except ubep.EPCommError as err:
            message = str(err)
    torch.distributed.barrier()
    return message


def dead_peer_combine_case(rank: int, world_size: int, sync: str) -> tuple[float, str]:
    """Rank 1 dispatches, then never combines. Rank 0's combine, 16 tokens per reducer (3 programs
    a launch), must raise EPCommError; returns ``(seconds until it did, message)`` on rank 0 (-1:
    it did not raise). A reducer's row waits share one deadline, so it gives up about once for all
    of its tokens, not once per token."""
    dev = torch.device("cuda", torch.cuda.current_device())
    tokens = 48
    idx = torch.tensor([[0, 3]] * tokens, device=dev)  # expert 3 is on rank 1
    x = torch.ones(tokens, 64, dtype=torch.bfloat16, device=dev)
    weights = torch.ones(tokens, 2, device=dev)
    # The deadline is a kernel argument: a first round under a loose one compiles every kernel on
    # both ranks, so that one rank's slower compile cannot fail the strict buffer's dispatch.
    for timeout_s in (60, 1):
        if timeout_s == 1:  # the strict Buffer's collectives start together, however busy the GPU
            dist.barrier()
        buf = ubep.Buffer(hidden=64, num_experts=4, top_k=2, max_tokens_per_rank=tokens,
                          dtype=torch.bfloat16, layout="compact", backend="cuda", sync=sync,
                          timeout_s=timeout_s, num_sms=least_cuda_sms(world_size, sync),
                          device=dev)
        res = buf.dispatch(x, idx, weights)
        buf.synchronize()
        if timeout_s > 1:
            buf.combine(res.recv_x, res.handle)
            buf.synchronize()
    elapsed, message = 0.0, ""
    if rank == 0:
        start = time.perf_counter()
        try:
            buf.combine(res.recv_x, res.handle)
            buf.synchronize()
            elapsed = -1.0
        except ubep.EPCommError as err:
            elapsed, message = time.perf_counter() - start, str(err)
    torch.distributed.barrier()
    return elapsed, message


def sentinel_case(rank: int, world_size: int, layout: str, iters: int) -> None:
    """``sp`` on the CUDA backend with rows that hold the sentinel where a receiver looks for it
    (:func:`with_sentinel`), in every other call: those batches complete through the fenced record.
    Dispatch and combine (identity experts, so the rows going back collide too) equal the oracle bit
    for bit (NaN sums: NaN)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    experts, hidden, top_k, tm = 4 * world_size, 264, 2, 24
    buf = ubep.Buffer(hidden=hidden, num_experts=experts, top_k=top_k, max_tokens_per_rank=tm,
                      dtype=torch.bfloat16, layout=layout, sync="sp", backend="cuda",
                      check_inputs=False, timeout_s=20, device=dev)
    variants = []
    for v in range(2):
        case = Case(tokens=(tm,) * world_size, hidden=hidden, num_experts=experts, top_k=top_k, seed=v)
        xs, idxs, ws = (list(t) for t in zip(*[case_inputs(case, s) for s in range(world_size)],
                                              strict=True))
        if v:
            xs = [with_sentinel(x) for x in xs]
        want_x, want_tpe, _ = oracle.dispatch(xs, idxs, ws, rank, world_size, experts)
        outs = oracle.expert_outputs(idxs, lambda s, t, k, e, xs=xs: xs[s][t])
        want_y = oracle.combine(outs, idxs, ws, rank, world_size, experts, "source", True, hidden,
                                torch.bfloat16)
        variants.append(((xs[rank].to(dev), idxs[rank].to(dev), ws[rank].to(dev)), want_x,
                         want_tpe.tolist(), want_y))
    for i in range(iters):
        (x, idx, w), want_x, want_tpe, want_y = variants[i % 2]
        res = buf.dispatch(x, idx, w)
        recv = res.recv_x
        if layout == "padded":
            recv = torch.cat([recv[j, :n] for j, n in enumerate(want_tpe)])
        check_bits(f"call {i}: recv_x", recv, want_x)
        check_bits(f"call {i}: y", buf.combine(res.recv_x, res.handle), want_y)
    buf.synchronize()
