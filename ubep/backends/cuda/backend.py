"""The CUDA backend: one node of W GPUs over NVLink symmetric memory, synchronized by the data.

A dispatch is one kernel (``dispatch_kernels``; the compact layout launches it twice, around the
host's read of its output's size, which the first launch writes into pinned memory) and a combine
is one kernel (``combine_kernels``). Their program groups run at once and meet only through
per-source records and per-row arrival rules (``sync``, ``wire``): no barrier, no host
synchronization, so a padded dispatch and a combine can be captured in a CUDA graph and replayed.
Results equal the reference backend's bit for bit in every sync mode (``ubep.protocol``).

Which launches a call makes is the planner's (``plan``, from a ``tuning.Tuning``); the memory is
``buffers``'. Every operation is ``finish_*(start_*(...))``: ``start_*`` checks the error word,
allocates the call's tensors and queues its plan's ``start`` launches; ``finish_*`` queues the rest
(a compact dispatch first reads its output's size) and returns the result. Ranks emulated in one
process run every rank's ``start_*`` before any rank's ``finish_*`` (``Tuning(phased=True)``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends import lifetime
from ubep.backends.base import CALL_BITS, Backend, EPCommError, Handle, call_code
from ubep.backends.cuda import combine_kernels as ck
from ubep.backends.cuda import dispatch_kernels as dk
from ubep.backends.cuda import records, sync
from ubep.backends.cuda.buffers import Allocate, symmetric_buffers
from ubep.backends.cuda.geometry import INT_VIEW
from ubep.backends.cuda.launcher import Launcher
from ubep.backends.cuda.plan import Launch, Plan, Planner
from ubep.backends.cuda.stamps import LaunchStamps, between_launches
from ubep.backends.cuda.symm import SymmetricBuffer, enable_for
from ubep.backends.cuda.tuning import Tuning
from ubep.config import EPConfig


@dataclass(frozen=True, eq=False)
class Routes:
    """Where a dispatch's rows went, on both sides.

    Source side: ``idx_P`` int64 ``[T * K]`` (the expert of each pair, -1 for none); ``sent_WT`` int8
    ``[W, T_max]``, token ``t`` went to rank ``r``. Destination side: ``rows_WMK`` int64 ``[W, T_max,
    K]``, the receive row of pair ``k`` of source ``s``'s token ``t``, or -1; ``weights_WMK`` fp32, its
    weight.
    """

    idx_P: torch.Tensor
    sent_WT: torch.Tensor
    rows_WMK: torch.Tensor
    weights_WMK: torch.Tensor


@dataclass(eq=False)
class Pending:
    """An operation between ``start_*`` and ``finish_*``. ``inputs`` / ``outputs``: the kernel's
    per-call arguments before and after its stamps (a compact dispatch's ``outputs`` are the sizing
    launch's until ``awaiting_size`` is cleared); ``phase``: the timer phase open since start;
    ``keep``: what finish builds the result from."""

    plan: Plan
    code: int
    inputs: tuple
    outputs: tuple
    phase: contextlib.AbstractContextManager
    keep: tuple = ()
    awaiting_size: bool = False


class CudaBackend(Backend):
    """``tuning``: caps and thresholds (``Tuning.h200()``); ``symmetric``: the allocator of the
    symmetric buffers (``buffers``; default: torch symmetric memory over ``group``); ``launcher``:
    ``launcher(kernel, **fixed)`` makes a kernel's launch function (``launcher.Launcher``)."""

    name = "cuda"

    def __init__(self, config: EPConfig, group: dist.ProcessGroup | None, device: torch.device, *,
                 tuning: Tuning | None = None, symmetric: Allocate | None = None,
                 launcher=Launcher):
        super().__init__(config, group, device)
        cfg = config
        self.tuning = tuning or Tuning.h200()
        if self.tuning.max_count > self.tuning.count_scratch:
            raise ValueError(f"max_count {self.tuning.max_count} exceeds count_scratch "
                             f"{self.tuning.count_scratch}")
        self.planner = Planner(cfg, self.tuning)
        if symmetric is None:
            group = group or dist.group.WORLD
            enable_for(group)
            symmetric = lambda shape, dtype: SymmetricBuffer(shape, dtype, group, device)  # noqa: E731
        w, tm, el = cfg.world_size, cfg.max_tokens_per_rank, cfg.num_local_experts
        self.sentinel = self.planner.sentinel
        self.int_view = INT_VIEW[cfg.dtype.itemsize]
        self.sym = symmetric_buffers(cfg, symmetric, self.sentinel)
        self.symmetric_bytes = sum(b.nbytes for b in self.sym.values())
        i64 = torch.int64
        # dc: the state holds the shares of the most verifiers a call has
        self.verifiers = self.planner.most_verifiers
        words = records.state_words(w, max(1, self.verifiers // w))
        self.dispatch_state = torch.zeros(words, dtype=i64, device=device)
        self.combine_state = torch.zeros(words, dtype=i64, device=device)
        self.no_stamps = torch.empty(1, dtype=i64, device=device)  # the stamps argument, unused
        scratch = self.tuning.count_scratch
        self.count_hist = torch.empty(scratch, self.planner.e_block, dtype=torch.int32, device=device)
        self.count_flags = torch.zeros(scratch, dtype=i64, device=device)
        # Written by timed-out waits, read by the host without a sync: pinned, device-addressable.
        self.errors = torch.zeros(3, dtype=i64, pin_memory=device.type == "cuda")
        # What the kernels get (sync's module doc): [halted, address of errors], in device memory,
        # so that the waits' early give-up polls no host memory.
        self.error_block = torch.tensor([0, self.errors.data_ptr()], dtype=i64, device=device)
        self.timeout_ns = int(cfg.timeout_s * 1e9)
        # The compact layout's rows per local expert, then their sum, written by its sizing launch
        # for the host to poll (``_received_rows``): pinned, device-addressable.
        self.host_tpe = torch.zeros(el + 1, dtype=i64, pin_memory=device.type == "cuda")
        self.host_rows = ctypes.c_int64.from_address(self.host_tpe.data_ptr() + 8 * el)
        self.sized = torch.cuda.Event() if device.type == "cuda" else None  # recorded per dispatch
        self.last_launches: dict[str, LaunchStamps] = {}  # per op, with profiling on
        self._first_launch: dict[str, LaunchStamps] = {}  # per op, a call's launch before its last
        # what never changes for this buffer is bound once: the per-launch key leaves it out
        sym = self.sym
        self.launch_dispatch = launcher(
            dk.dispatch, stage_ptrs=sym["stage"].ptrs, route_ptrs=sym["route"].ptrs,
            count_ptrs=sym["count"].ptrs, sig_ptrs=sym["sig"].ptrs, ack_ptrs=sym["ack"].ptrs,
            rec_ptrs=sym["rec"].ptrs, intent_ptrs=sym["intent"].ptrs, state_ptr=self.dispatch_state,
            hist_ptr=self.count_hist, flags_ptr=self.count_flags, rank=cfg.rank, tokens_max=tm,
            capacity=cfg.expert_capacity if cfg.layout == "padded" else 0,
            err_addr=self.error_block.data_ptr())
        self.launch_combine = launcher(
            ck.combine, back_ptrs=sym["back"].ptrs, sig_ptrs=sym["back_sig"].ptrs,
            ack_ptrs=sym["back_ack"].ptrs, rec_ptrs=sym["back_rec"].ptrs,
            intent_ptrs=sym["back_intent"].ptrs, state_ptr=self.combine_state, rank=cfg.rank,
            tokens_max=tm, rows_max=max(tm * cfg.top_k, w * tm),
            err_addr=self.error_block.data_ptr())

    def retune(self, tuning: Tuning) -> None:
        """Plans the calls from now on with ``tuning``, within what this buffer allocated (its count
        scratch and its verifiers' state words)."""
        planner = Planner(self.config, tuning)
        if tuning.count_scratch != self.tuning.count_scratch or tuning.max_count > tuning.count_scratch:
            raise ValueError("the count scratch is allocated once: keep count_scratch, and "
                             "max_count within it")
        if planner.most_verifiers > self.verifiers:
            raise ValueError(f"{planner.most_verifiers} dc verifiers exceed the "
                             f"{self.verifiers} this buffer's state holds")
        self.tuning, self.planner = tuning, planner

    def programs(self, num_tokens: int) -> int:
        """Thread blocks of a dispatch of ``num_tokens`` tokens' widest launch (at most that many
        SMs busy)."""
        return self.planner.programs(num_tokens)

    def combine_programs(self, num_tokens: int) -> int:
        """Thread blocks of the widest launch of a combine of ``num_tokens`` tokens."""
        return self.planner.combine_programs(num_tokens)

    # -- errors -----------------------------------------------------------------------------------

    def _check_errors(self) -> None:
        """Raises ``EPCommError`` for a wait of this Buffer that timed out, or of a destroyed Buffer's
        call replayed by a CUDA graph (``lifetime``); else notes whether this call is being
        captured in a graph. Every operation starts here."""
        code, peer, tag = self.errors.tolist()
        if code:
            raise EPCommError(f"ubep rank {self.config.rank}: {_timed_out(code, peer, tag, self.config)}; "
                              f"this Buffer's device state is no longer consistent, create a new one")
        for gone in lifetime.destroyed_for_graphs():
            code, peer, tag = gone.errors.tolist()
            if code:
                gone.errors.zero_()
                cfg = gone.config
                raise EPCommError(f"ubep rank {cfg.rank}: a CUDA graph replayed a call of a destroyed "
                                  f"Buffer (hidden={cfg.hidden}, num_experts={cfg.num_experts}, "
                                  f"layout={cfg.layout!r}), and {_timed_out(code, peer, tag, cfg)}")
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            lifetime.keep_for_graphs(self)

    def synchronize(self) -> None:
        super().synchronize()
        self._check_errors()

    def destroy(self) -> None:
        """Every queued call done, then the device memory given back, but where a CUDA graph
        captured a call of this Buffer (``lifetime``: kept until ``ubep.release_graph_memory``)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.destroyed = True
        if not lifetime.held_for_graphs(self):
            self.release()

    def release(self) -> None:
        """Drop every reference to the device memory and pinned words this backend holds; torch
        frees them (symmetric memory after a device synchronization of its own)."""
        super().release()
        for name in _DEVICE_STATE:
            setattr(self, name, None)

    def _received_rows(self) -> int:
        """The compact output's rows, once the sizing launch (``sized``: an event recorded after it;
        None under the interpreter, which has run it) has written them to ``host_rows``. Polled
        instead of synchronizing the stream: no synchronization in a dispatch, and the host goes on
        as soon as the counts are in (in ``tff`` / ``dc`` / ``sp`` that can be before the sizing
        launch's senders are done). Ends like a stream synchronization would: when the launch is
        done (its waits time out, so it ends), a CUDA error raised by the event's query, or a
        timed-out wait reported in the error word."""
        polls, sized = 0, self.sized
        while (rows := self.host_rows.value) < 0 and sized is not None:
            if sized.query():  # done: the word is final
                rows = self.host_rows.value
                break
            polls += 1
            if polls > self.tuning.spin_polls:
                time.sleep(0)  # a long wait (peers late) lets the process's other threads run
        self._check_errors()
        if rows < 0:
            raise RuntimeError(f"ubep rank {self.config.rank}: the dispatch's sizing launch ended "
                               "without writing its output's rows")
        return rows

    # -- launch helpers ---------------------------------------------------------------------------

    def _stamps(self, op: str, sizes: tuple[int, ...], final: bool) -> torch.Tensor:
        """Where a launch writes its in-kernel stamps: a fresh ``[programs, 4]`` buffer whose phases
        the timer reads later, with profiling on; else a placeholder the kernel never touches. The
        timeline keeps the last launch of each kind: an operation's final launch and, where it has
        one, the launch of its writing groups before it (``"<op> (writers)"``); the timer also gets
        the time between those two launches of a call."""
        if not self.timer.enabled:
            return self.no_stamps
        label = op if final else f"{op} (writers)"
        launch = LaunchStamps(op, sizes, torch.zeros(sum(sizes), 4, dtype=torch.int64,
                                                     device=self.device), label)
        self.timer.defer(launch.phases)
        self.last_launches[label] = launch
        if not final:
            self._first_launch[op] = launch
        elif (first := self._first_launch.pop(op, None)) is not None:
            self.timer.defer(functools.partial(between_launches, first, launch))
        return launch.stamps

    def worker_timeline(self) -> list[dict]:
        rows = []
        for launch in self.last_launches.values():
            rows += launch.timeline()
        return rows

    # -- launches ---------------------------------------------------------------------------------

    def _launch_dispatch(self, p: Pending, launch: Launch) -> None:
        """One launch of the dispatch kernel (or of ``dispatch_like``'s); in a compact dispatch the
        host reads the output's size before the receivers' (final) launch."""
        if p.awaiting_size and launch.final:
            self._size_outputs(p)
        w = launch.workers
        x_bits = p.inputs[0]
        self.launch_dispatch(
            w.total, *p.inputs[:3], x_bits.shape[0],
            self._stamps("dispatch", (w.count, w.send, w.verify, w.recv), launch.final),
            p.inputs[3], *p.outputs, self.timeout_ns, w.count, w.send, w.recv, launch.writers,
            p.code, constants=launch.constants)
        if launch.sizing and self.sized is not None:
            self.sized.record()

    def _launch_combine(self, p: Pending, launch: Launch) -> None:
        w = launch.workers
        self.launch_combine(
            w.total, *p.inputs, self._stamps("combine", (w.send, w.verify, w.recv), launch.final),
            *p.outputs, self.timeout_ns, w.send, w.recv, p.code, constants=launch.constants)

    def _queue(self, p: Pending, launches: tuple[Launch, ...], launch_one, close: bool) -> None:
        """``launch_one`` of each of ``launches``; then (``close``) the call's timer phase ends. An
        error ends the phase too, and propagates."""
        try:
            for launch in launches:
                launch_one(p, launch)
        except BaseException as err:
            p.phase.__exit__(type(err), err, err.__traceback__)
            raise
        if close:
            p.phase.__exit__(None, None, None)

    def _open(self, phase: str | None) -> contextlib.AbstractContextManager:
        if not (phase and self.timer.enabled):
            return _NO_PHASE
        context = self.timer.phase(phase)
        context.__enter__()
        return context

    # -- dispatch ---------------------------------------------------------------------------------

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        return self.finish_dispatch(self.start_dispatch(x_TH, topk_idx_TK, topk_weights_TK))

    def start_dispatch(self, x_TH, topk_idx_TK, topk_weights_TK) -> Pending:
        self._check_errors()
        cfg, dev = self.config, self.device
        w, tm, k = cfg.world_size, cfg.max_tokens_per_rank, cfg.top_k
        x_bits = x_TH.contiguous().view(self.int_view)
        idx = topk_idx_TK.long().contiguous().view(-1)
        weights = topk_weights_TK.detach().float().contiguous()  # the kernel takes its address only
        sent = torch.empty(w, tm, dtype=torch.int8, device=dev)
        rows = torch.empty(w, tm, k, dtype=torch.int64, device=dev)
        pair_w = torch.empty(w, tm, k, dtype=torch.float32, device=dev)
        tpe = torch.empty(cfg.num_local_experts, dtype=torch.int64, device=dev)
        plan = self.planner.dispatch(x_TH.shape[0], self.timer.enabled)
        inputs = (x_bits, idx, weights, sent)
        keep = (x_TH, topk_weights_TK, rows, pair_w, tpe)
        if cfg.layout == "padded":
            num_rows = cfg.num_local_experts * cfg.expert_capacity
            out = x_TH.new_empty(num_rows, cfg.hidden)  # padding rows are not written
            # the kernel writes both weight outputs, padding included: no memset, no copy kernel
            row_weights = torch.empty(num_rows, dtype=torch.float32, device=dev)
            recv_w = torch.empty(num_rows, dtype=torch.float32, device=dev)
            outputs = (out.view(self.int_view), row_weights, recv_w, rows, pair_w, tpe)
            p = Pending(plan, call_code("dispatch"), inputs, outputs, self._open("dispatch"),
                        (*keep, out))
        else:
            # nothing is placed yet: no output; the sizes go to the host
            sizes = (x_bits, weights, weights, rows, pair_w, self.host_tpe)
            self.host_rows.value = -1
            p = Pending(plan, call_code("dispatch"), inputs, sizes,
                        self._open("dispatch: count exchange"), keep, awaiting_size=True)
        self._queue(p, plan.start, self._launch_dispatch, close=False)
        return p

    def _size_outputs(self, p: Pending) -> None:
        """The compact dispatch's one wait of the host: its output's rows, then its outputs."""
        num_rows = self._received_rows()
        x_TH, _, rows, pair_w, tpe = p.keep
        out = x_TH.new_empty(num_rows, self.config.hidden)
        row_weights = torch.empty(num_rows, dtype=torch.float32, device=self.device)
        recv_w = torch.empty(num_rows, dtype=torch.float32, device=self.device)
        p.outputs = (out.view(self.int_view), row_weights, recv_w, rows, pair_w, tpe)
        p.keep, p.awaiting_size = (*p.keep, out), False
        p.phase.__exit__(None, None, None)
        p.phase = self._open("dispatch: reorder")

    def finish_dispatch(self, p: Pending):
        self._queue(p, p.plan.finish, self._launch_dispatch, close=True)
        cfg = self.config
        x_TH, topk_weights_TK, rows, pair_w, tpe, out = p.keep
        _, idx, _, sent = p.inputs
        _, row_weights, recv_w = p.outputs[:3]
        self.dispatches += 1
        handle = Handle(cfg, x_TH.shape[0], topk_weights_TK, row_weights, tpe, out.shape[0], None,
                        Routes(idx, sent, rows, pair_w), self.dispatches)
        return out.view(handle.rows_shape(cfg.hidden)), recv_w.view(handle.rows_shape()), handle

    def dispatch_like(self, x_TH, handle):
        return self.finish_dispatch_like(self.start_dispatch_like(x_TH, handle))

    def start_dispatch_like(self, x_TH, handle) -> Pending:
        """New rows along the handle's routes: once to each rank the dispatch sent the token to,
        then into the receive rows it recorded."""
        self._check_errors()
        routes = handle.routes
        out = x_TH.new_zeros(handle.num_rows, x_TH.shape[1])
        unused = routes.weights_WMK  # the row weights: written by a dispatch, not here
        plan = self.planner.dispatch_like(handle.num_tokens, self.timer.enabled)
        p = Pending(plan, call_code("dispatch_like", handle.call),
                    (x_TH.contiguous().view(self.int_view), routes.idx_P, routes.weights_WMK,
                     routes.sent_WT),
                    (out.view(self.int_view), unused, unused, routes.rows_WMK, routes.weights_WMK,
                     handle.tokens_per_expert),
                    self._open("dispatch"), (out, handle))
        self._queue(p, plan.start, self._launch_dispatch, close=False)
        return p

    def finish_dispatch_like(self, p: Pending):
        self._queue(p, p.plan.finish, self._launch_dispatch, close=True)
        out, handle = p.keep
        return out.view(handle.rows_shape(out.shape[1]))

    # -- combine ----------------------------------------------------------------------------------

    def combine(self, expert_out, handle, reduce, weighted):
        return self.finish_combine(self.start_combine(expert_out, handle, reduce, weighted))

    def start_combine(self, expert_out, handle, reduce, weighted) -> Pending:
        self._check_errors()
        hidden = expert_out.shape[-1]
        rows_RH = expert_out.reshape(handle.num_rows, hidden).contiguous()
        y = expert_out.new_empty(handle.num_tokens, hidden)
        source_w = handle.topk_weights.detach().float().contiguous()
        plan = self.planner.combine(handle.num_tokens, hidden, rows_RH.element_size(),
                                    partial=reduce == "expert_rank", weighted=weighted, gather=False,
                                    profile=self.timer.enabled)
        code = call_code("combine", handle.call, reduce, weighted)
        return self._start_combine(plan, code, rows_RH, handle, source_w, y, "combine")

    def _start_combine(self, plan: Plan, code: int, rows_RF, handle, source_w, y,
                       phase: str | None) -> Pending:
        """The combine kernel along ``handle``'s routes, from ``rows_RF`` into ``y``."""
        routes = handle.routes
        inputs = (rows_RF, rows_RF.view(INT_VIEW[rows_RF.element_size()]), routes.rows_WMK,
                  routes.weights_WMK, routes.idx_P, source_w, routes.sent_WT, handle.num_tokens)
        p = Pending(plan, code, inputs, (y,), self._open(phase), (y, routes))
        self._queue(p, plan.start, self._launch_combine, close=False)
        return p

    def finish_combine(self, p: Pending):
        self._queue(p, p.plan.finish, self._launch_combine, close=True)
        return p.keep[0]

    def return_pair_values(self, values_R, handle):
        return self.finish_return_pair_values(self.start_return_pair_values(values_R, handle))

    def start_return_pair_values(self, values_R, handle) -> Pending:
        self._check_errors()
        values = values_R.float().reshape(-1, 1).contiguous()
        y = torch.empty(handle.num_tokens, self.config.top_k, 1, dtype=torch.float32,
                        device=self.device)
        plan = self.planner.combine(handle.num_tokens, 1, 4, partial=False, weighted=False,
                                    gather=True, profile=self.timer.enabled)
        return self._start_combine(plan, call_code("return_pair_values", handle.call), values,
                                   handle, values, y, None)

    def finish_return_pair_values(self, p: Pending):
        y = self.finish_combine(p)
        _, routes = p.keep
        num_tokens, k = y.shape[0], self.config.top_k
        return torch.where(routes.idx_P.view(num_tokens, k) >= 0, y.view(num_tokens, k), 0.0)


# The phase of every call that is not timed: one shared no-op context (nullcontext keeps no state),
# so that an untimed call builds none.
_NO_PHASE = contextlib.nullcontext()

# What ``release`` drops: every attribute that holds device memory or a pinned word, or a launcher
# bound to them.
_DEVICE_STATE = ("sym", "launch_dispatch", "launch_combine", "dispatch_state", "combine_state",
                 "count_hist", "count_flags", "no_stamps", "errors", "error_block", "host_tpe",
                 "host_rows", "sized", "last_launches", "_first_launch")


def _timed_out(code: int, peer: int, tag: int, cfg: EPConfig) -> str:
    """A timed-out wait reported in an error word, in words (its epoch is the call number)."""
    return (f"phase '{sync.PHASES[code]}' (call {tag & ((1 << CALL_BITS) - 1)}, waiting on rank "
            f"{peer}) timed out after {cfg.timeout_s:g} s: the peer is late, failed, or called "
            f"another operation")
