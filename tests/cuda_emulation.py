"""The CUDA backend's kernels on the CPU: W ranks emulated one after another in one process, through
Triton's interpreter, checked bit for bit against the oracle.

The backend's symmetric buffers become host tensors that every emulated rank addresses through the
same base-address tables, and the backend runs with ``Tuning(phased=True)`` (each group that waits
for peers gets a launch of its own, queued by ``finish_*``), so every rank runs its writers before
any rank waits. Run only in a process whose
environment had ``TRITON_INTERPRET=1`` before Triton was imported (tests/test_cuda_emulated.py).

Every launch runs its programs one after another in id order, so a program that waited for a higher
id would find nothing (the interpreter has no timer: a wait checks once and reports a timeout);
``dc``'s verifiers run before the receivers that wait for them.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import replace
from types import SimpleNamespace

import torch

from tests.workers import (
    DTYPES,
    Case,
    _apply_experts,
    _check_equal,
    _zero_padding,
    case_inputs,
    check_bits,
    with_sentinel,
)
from ubep import oracle, workloads


def emulated_tuning(**changes):
    """The emulation's ``Tuning``: every group that waits for peers in a launch of its own; count
    programs of 4 pairs a step, so small cases have several (those starting past pair 8 wait for
    the rows of the ones before); ``changes`` on top."""
    from ubep.backends.cuda.tuning import Tuning  # imports Triton: only once the interpreter is set

    return Tuning(phased=True, pair_chunk=4, prefix_pairs=8, **changes)


def emulated_backends(case: Case, max_count: int | None = None, tuning=None) -> list[EmulatedRank]:
    """One ``CudaBackend`` per rank of ``case``, over host tensors shared in one process, with
    ``tuning`` (``emulated_tuning()``; ``max_count`` caps the count programs)."""
    from ubep.backends.cuda.backend import CudaBackend
    from ubep.config import EPConfig

    world = len(case.tokens)
    tuning = tuning or emulated_tuning()
    if max_count is not None:
        tuning = replace(tuning, max_count=max_count)
    shared: list[list[torch.Tensor]] = []  # the i-th allocation, one tensor per rank

    def symmetric(rank, made, shape, dtype):
        i = next(made)
        if i == len(shared):
            shared.append([torch.zeros(shape, dtype=dtype) for _ in range(world)])
        peers = shared[i]
        return SimpleNamespace(local=peers[rank], nbytes=peers[rank].numel() * dtype.itemsize,
                               ptrs=torch.tensor([t.data_ptr() for t in peers], dtype=torch.int64),
                               barrier=lambda timeout_ms: None)

    backends = []
    for rank in range(world):
        made = itertools.count()
        cfg = EPConfig(world_size=world, rank=rank, hidden=case.hidden,
                       num_experts=case.num_experts, top_k=case.top_k,
                       max_tokens_per_rank=case.max_tokens or max(max(case.tokens), 1),
                       dtype=DTYPES[case.dtype], layout=case.layout, sync=case.sync,
                       num_sms=case.num_sms)
        backend = CudaBackend(cfg, None, torch.device("cpu"), tuning=tuning,
                              symmetric=functools.partial(symmetric, rank, made))
        backend.timeout_ns = 0  # the interpreter has no timer: a wait checks once
        backends.append(EmulatedRank(backend))
    return backends


class EmulatedRank:
    """A rank's backend whose operations are also steps for :func:`lockstep`: ``dispatch_steps``
    and the like run the call's ``start_*`` at the first step and its ``finish_*`` at the second,
    which returns the result (every other attribute is the backend's)."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def dispatch_steps(self, x, idx, w):
        return self._steps(self.backend.start_dispatch, self.backend.finish_dispatch, x, idx, w)

    def dispatch_like_steps(self, x, handle):
        return self._steps(self.backend.start_dispatch_like, self.backend.finish_dispatch_like, x,
                           handle)

    def combine_steps(self, expert_out, handle, reduce, weighted):
        return self._steps(self.backend.start_combine, self.backend.finish_combine, expert_out,
                           handle, reduce, weighted)

    def return_pair_values_steps(self, values, handle):
        return self._steps(self.backend.start_return_pair_values,
                           self.backend.finish_return_pair_values, values, handle)

    @staticmethod
    def _steps(start, finish, *args):
        pending = start(*args)
        yield
        return finish(pending)


def lockstep(steps: list) -> list:
    """Every rank's launches, one step of each rank at a time; each operation's result."""
    results, live = [None] * len(steps), set(range(len(steps)))
    while live:
        for rank in sorted(live):
            try:
                next(steps[rank])
            except StopIteration as done:
                results[rank] = done.value
                live.discard(rank)
    return results


def _check_idle(backends: list, after: str) -> None:
    """``sp``: every 128-byte block of every rank's staging and back buffers holds the sentinel in
    its two marker words again (each consumed row was reset)."""
    if backends[0].config.sync != "sp":
        return
    from ubep.backends.cuda.wire import BLOCK_BYTES

    for rank, backend in enumerate(backends):
        idle = torch.tensor(backend.sentinel, dtype=torch.int64).to(torch.int32)
        for name in ("stage", "back"):
            markers = backend.sym[name].local.view(torch.int32).view(-1, BLOCK_BYTES // 4)[:, :2]
            if not bool((markers == idle).all()):
                raise AssertionError(f"rank {rank} {name}: markers not reset after {after}")


GUARD_BYTES = 64  # after every allocation of an operation, filled with GUARD_BYTE
GUARD_BYTE = 0xA5


@contextlib.contextmanager
def _guarded_outputs(label: str):
    """Every ``torch.empty`` / ``Tensor.new_empty`` / ``Tensor.new_zeros`` of the operations run
    inside: followed by ``GUARD_BYTES`` bytes that must still hold ``GUARD_BYTE`` when the block
    ends (a kernel that wrote past the end of an output fails the test: on a GPU that write lands
    in the caching allocator's next block, or past its segment); ``empty`` ones filled with NaN
    (integers: -7), values no result holds, so an output element the kernels leave unwritten (a
    padding row's weight, say) differs from the oracle."""
    real_empty, real_new_empty, real_new_zeros = torch.empty, torch.Tensor.new_empty, torch.Tensor.new_zeros
    guards: list[tuple[str, torch.Tensor]] = []

    def guarded(shape, dtype, poison: bool) -> torch.Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        numel = 1
        for n in shape:
            numel *= int(n)
        size = numel * dtype.itemsize
        raw = real_empty(size + GUARD_BYTES, dtype=torch.uint8)
        raw[size:] = GUARD_BYTE
        guards.append((f"{dtype}{list(shape)}", raw[size:]))
        t = raw[:size].view(dtype).view(shape)
        if poison:
            return t.fill_(float("nan") if t.is_floating_point() else -7)
        return t.zero_()

    def empty(*shape, dtype=None, device=None, **_):
        return guarded(shape, dtype or torch.get_default_dtype(), True)

    def new_empty(self, *shape, dtype=None, **_):
        return guarded(shape, dtype or self.dtype, True)

    def new_zeros(self, *shape, dtype=None, **_):
        return guarded(shape, dtype or self.dtype, False)

    torch.empty, torch.Tensor.new_empty, torch.Tensor.new_zeros = empty, new_empty, new_zeros
    try:
        yield
    finally:
        torch.empty, torch.Tensor.new_empty, torch.Tensor.new_zeros = (real_empty, real_new_empty,
                                                                     real_new_zeros)
    for what, guard in guards:
        if not bool((guard == GUARD_BYTE).all()):
            raise AssertionError(f"{label}: a kernel wrote past the end of a {what} output")


def _inputs(case: Case, world: int) -> tuple[list, list, list]:
    """Every rank's ``(x, topk_idx, topk_weights)`` of ``case``, as three lists."""
    return tuple(list(v) for v in zip(*[case_inputs(case, s) for s in range(world)], strict=True))


def _dispatch(backends: list, xs, idxs, ws) -> list:
    """One dispatch on every emulated rank: each rank's ``(recv_x, recv_w, handle)``."""
    return lockstep([b.dispatch_steps(x, i, w) for b, x, i, w in zip(backends, xs, idxs, ws, strict=True)])


def _check_combine(backends: list, experts_out: list, handles: list, outs, idxs, ws, cfg, reduce: str,
                   weighted: bool, label: str, check) -> None:
    """One combine of ``experts_out`` on every emulated rank, each rank's ``y`` against the oracle's
    by ``check(label.format(rank=r), got, want)``."""
    with _guarded_outputs(label.format(rank="every")):
        ys = lockstep([b.combine_steps(o, h, reduce, weighted)
                       for b, o, h in zip(backends, experts_out, handles, strict=True)])
    for rank, y in enumerate(ys):
        want = oracle.combine(outs, idxs, ws, rank, len(backends), cfg.num_experts, reduce, weighted,
                              cfg.hidden, cfg.dtype)
        check(label.format(rank=rank), y, want)


def _check_received(dispatched: list, xs, idxs, ws, cfg, label: str, check) -> None:
    """Each rank's received rows of ``dispatched`` against the oracle's, padding rows zeroed, by
    ``check(what, got, want)``."""
    for rank, (recv_x, _, handle) in enumerate(dispatched):
        want_x, want_tpe, _ = oracle.dispatch(xs, idxs, ws, rank, len(dispatched), cfg.num_experts)
        if cfg.layout == "padded":
            want_x = oracle.to_padded(want_x, want_tpe, cfg.expert_capacity)
            recv_x = _zero_padding(recv_x, handle.tokens_per_expert)
        check(f"{label}: rank {rank} recv_x", recv_x, want_x)


def _check_no_timeout(backends: list) -> None:
    for rank, backend in enumerate(backends):
        assert backend.errors.tolist() == [0, 0, 0], f"rank {rank} timed out: {backend.errors}"


def _check_acks(backends: list) -> None:
    """Each buffer set's acks: a call acks the one before it as it starts (``sync.publish_ack``), so
    after a rank's last call ``e`` every peer holds ``e - 1`` for that rank (0 before any call)."""
    for rank, backend in enumerate(backends):
        for acks, state in (("ack", backend.dispatch_state), ("back_ack", backend.combine_state)):
            want = max(int(state[0]) - 1, 0)
            held = [int(peer.sym[acks].local[rank]) for peer in backends]
            assert held == [want] * len(backends), f"rank {rank} {acks}: {held}, want {want}"


def emulated_case(_rank: int, _world: int, case: Case, max_count: int | None = None) -> None:
    """Dispatch, combine (both reductions, weighted or not), ``dispatch_like`` and
    ``return_pair_values`` of ``case`` on emulated ranks, each equal to the oracle."""
    backends = emulated_backends(case, max_count)
    world, cfg = len(backends), backends[0].config
    xs, idxs, ws = _inputs(case, world)
    with _guarded_outputs("dispatch"):
        dispatched = _dispatch(backends, xs, idxs, ws)
    _check_idle(backends, "dispatch")
    outs = oracle.expert_outputs(
        idxs, lambda s, t, k, e: workloads.scale_expert(xs[s][t : t + 1], e)[0])
    gys = [workloads.origin_tokens(s + 17, len(i), cfg.hidden, cfg.dtype) for s, i in enumerate(idxs)]
    experts_out = []
    for rank, (recv_x, recv_w, handle) in enumerate(dispatched):
        want_x, want_tpe, want_w = oracle.dispatch(xs, idxs, ws, rank, world, cfg.num_experts)
        if cfg.layout == "padded":
            want_x = oracle.to_padded(want_x, want_tpe, cfg.expert_capacity)
            want_w = oracle.to_padded(want_w, want_tpe, cfg.expert_capacity)
            recv_x = _zero_padding(recv_x, handle.tokens_per_expert)
        _check_equal(f"rank {rank} tokens_per_expert", handle.tokens_per_expert, want_tpe)
        _check_equal(f"rank {rank} recv_x", recv_x, want_x)
        _check_equal(f"rank {rank} recv_weights", recv_w, want_w)
        experts_out.append(_apply_experts(recv_x, handle.tokens_per_expert, backends[rank].config))
    handles = [h for _, _, h in dispatched]
    for reduce, weighted in itertools.product(("source", "expert_rank"), (True, False)):
        _check_combine(backends, experts_out, handles, outs, idxs, ws, cfg, reduce, weighted,
                       f"rank {{rank}} combine({reduce}, weighted={weighted})", _check_equal)
        _check_idle(backends, f"combine({reduce}, weighted={weighted})")
    with _guarded_outputs("dispatch_like"):
        resent = lockstep([b.dispatch_like_steps(gy, h) for b, gy, h in zip(backends, gys, handles,
                                                                          strict=True)])
    with _guarded_outputs("return_pair_values"):
        returned = lockstep([b.return_pair_values_steps(recv_w.reshape(-1), h)
                             for b, (_, recv_w, h) in zip(backends, dispatched, strict=True)])
    _check_idle(backends, "dispatch_like and return_pair_values")
    for rank, (rows, values) in enumerate(zip(resent, returned, strict=True)):
        want_rows, want_tpe, _ = oracle.dispatch(gys, idxs, ws, rank, world, cfg.num_experts)
        if cfg.layout == "padded":
            want_rows = oracle.to_padded(want_rows, want_tpe, cfg.expert_capacity)
        _check_equal(f"rank {rank} dispatch_like", rows, want_rows)
        _check_equal(f"rank {rank} return_pair_values", values,
                     torch.where(idxs[rank] >= 0, ws[rank], torch.zeros(())))
    _check_no_timeout(backends)
    _check_acks(backends)


def emulated_sentinel_case(_rank: int, _world: int, case: Case, calls: int) -> None:
    """``sp`` with rows that hold the sentinel where a receiver looks for it, in every other call
    (so a slot whose batch took the fenced record is reused by one that did not): dispatch, combine
    of the same rows (identity experts, so the rows going back collide too) and ``dispatch_like``,
    equal to the oracle bit for bit (NaN sums: NaN), every slot idle again after each call."""
    backends = emulated_backends(case)
    world, cfg = len(backends), backends[0].config
    plain_xs, idxs, ws = _inputs(case, world)
    for call in range(calls):
        xs = [with_sentinel(x) for x in plain_xs] if call % 2 == 0 else plain_xs
        dispatched = _dispatch(backends, xs, idxs, ws)
        _check_received(dispatched, xs, idxs, ws, cfg, f"call {call}", check_bits)
        _check_idle(backends, f"call {call}: dispatch")
        handles = [h for _, _, h in dispatched]
        outs = oracle.expert_outputs(idxs, lambda s, t, k, e, xs=xs: xs[s][t])
        for reduce, weighted in (("source", False), ("expert_rank", True)):
            _check_combine(backends, [x for x, _, _ in dispatched], handles, outs, idxs, ws, cfg,
                           reduce, weighted, f"call {call}: rank {{rank}} combine({reduce})",
                           check_bits)
            _check_idle(backends, f"call {call}: combine({reduce})")
        resent = lockstep([b.dispatch_like_steps(x, h) for b, x, h in zip(backends, xs, handles,
                                                                         strict=True)])
        for rank, rows in enumerate(resent):
            want_rows, want_tpe, _ = oracle.dispatch(xs, idxs, ws, rank, world, cfg.num_experts)
            if cfg.layout == "padded":
                want_rows = oracle.to_padded(want_rows, want_tpe, cfg.expert_capacity)
            check_bits(f"call {call}: rank {rank} dispatch_like", rows, want_rows)
        _check_idle(backends, f"call {call}: dispatch_like")
    _check_no_timeout(backends)


def emulated_receivers_change_case(_rank: int, _world: int, case: Case, receivers: list[int],
                                   verify_tokens: list[int] | None = None) -> None:
    """One dispatch and one combine per entry of ``receivers``, each call with that many receiving
    programs on every rank (``Tuning.max_recv``; a call acks the one before it, so a slot is freed
    whatever the number of programs that read it): every result equal to the oracle, no wait timed
    out, each call acked by the next. ``verify_tokens`` (``dc``): each call's tokens per verifier
    program (``Tuning.verify_tokens``, with no floor), so that the verifiers per source change
    between calls over the same state words (sized for the most)."""
    tuning = emulated_tuning(verify_min=1, verify_tokens=min(verify_tokens)) if verify_tokens \
        else emulated_tuning()
    backends = emulated_backends(case, tuning=tuning)
    world, cfg = len(backends), backends[0].config
    xs, idxs, ws = _inputs(case, world)
    outs = oracle.expert_outputs(idxs, lambda s, t, k, e: xs[s][t])
    for call, n in enumerate(receivers):
        retuned = replace(tuning, max_recv=n)
        if verify_tokens:
            retuned = replace(retuned, verify_tokens=verify_tokens[call])
        for backend in backends:
            backend.retune(retuned)
            assert backend.planner.receivers == n
        label = f"call {call} ({n} receivers, {backends[0].planner.verifiers(len(xs[0]))} verifiers)"
        dispatched = _dispatch(backends, xs, idxs, ws)
        _check_received(dispatched, xs, idxs, ws, cfg, label, _check_equal)
        _check_combine(backends, [x for x, _, _ in dispatched], [h for _, _, h in dispatched], outs,
                       idxs, ws, cfg, "source", False, f"{label}: rank {{rank}} combine", _check_equal)
        _check_idle(backends, f"call {call}")
    _check_no_timeout(backends)
    _check_acks(backends)


def compact_dispatch_alone_case(_rank: int, _world: int, sync: str) -> None:
    """Rank 0 of two dispatches in the compact layout and rank 1 never does: the sizing launch's
    wait for rank 1's counts times out, and the dispatch raises ``EPCommError`` naming the phase and
    the peer (the host's poll of the output's rows ends on the error word) instead of sizing an
    output from counts that never came."""
    import pytest

    from ubep import EPCommError

    case = Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync=sync)
    backends = emulated_backends(case)  # rank 1's too: its buffers are rank 0's peer memory
    with pytest.raises(EPCommError, match=r"phase 'dispatch: wait for counts and routes' \(call 1, "
                                          r"waiting on rank 1\)"):
        backends[0].dispatch(*case_inputs(case, 0))


def _errors_after(backends: list, steps: list) -> list[str]:
    """Runs each rank's operation (``steps``, in lockstep) and then its ``synchronize()``; each rank's
    ``EPCommError`` message, or ``""`` if it raised none."""
    from ubep import EPCommError

    raised = [""] * len(backends)
    live = dict(enumerate(steps))
    while live:
        for rank in sorted(live):
            try:
                next(live[rank])
            except StopIteration:
                del live[rank]
            except EPCommError as err:
                raised[rank] = str(err)
                del live[rank]
    for rank, backend in enumerate(backends):
        if not raised[rank]:
            try:
                backend.synchronize()
            except EPCommError as err:
                raised[rank] = str(err)
    return raised


def emulated_disagreement_case(_rank: int, _world: int, case: Case, kind: str) -> list[str]:
    """Two emulated ranks that disagree on a call after one dispatch in step: ``reduce`` (rank 0
    combines with ``reduce="source"``, rank 1 with ``"expert_rank"``), ``weighted``, ``like`` (rank
    0 dispatches again, rank 1 runs ``dispatch_like``), ``handle`` (a second dispatch, then rank 0
    combines the first one's rows and rank 1 the second's). Returns each rank's ``EPCommError``
    message: every rank must have one (the call's words carry its code, ``sync.call_tag``)."""
    backends = emulated_backends(case)
    xs, idxs, ws = _inputs(case, len(backends))
    dispatched = _dispatch(backends, xs, idxs, ws)
    if kind == "handle":
        second = _dispatch(backends, xs, idxs, ws)
        dispatched = [dispatched[0], second[1]]
    if kind == "like":
        steps = [backends[0].dispatch_steps(xs[0], idxs[0], ws[0]),
                 backends[1].dispatch_like_steps(xs[1], dispatched[1][2])]
    else:
        steps = [b.combine_steps(recv_x, handle, "expert_rank" if kind == "reduce" and rank else "source",
                                 kind != "weighted" or rank == 0)
                 for rank, (b, (recv_x, _, handle)) in enumerate(zip(backends, dispatched, strict=True))]
    return _errors_after(backends, steps)


def emulated_destroy_case(_rank: int, _world: int, case: Case) -> None:
    """``destroy()`` after a dispatch and a combine: each rank's backend drops every reference to its
    symmetric buffers, state words and pinned words (none was captured in a graph)."""
    import weakref

    from ubep.backends.cuda.backend import _DEVICE_STATE

    backends = emulated_backends(case)
    xs, idxs, ws = _inputs(case, len(backends))
    dispatched = _dispatch(backends, xs, idxs, ws)
    lockstep([b.combine_steps(x, h, "source", True) for b, (x, _, h) in zip(backends, dispatched,
                                                                            strict=True)])
    stage = [weakref.ref(b.sym["stage"].local) for b in backends]
    for backend in backends:
        backend.destroy()
        assert backend.destroyed and all(getattr(backend, name) is None for name in _DEVICE_STATE)
    del dispatched
    assert [ref() for ref in stage] == [None] * len(backends), "a symmetric buffer outlived destroy()"
