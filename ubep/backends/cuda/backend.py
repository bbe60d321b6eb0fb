"""The CUDA backend: one node of W GPUs over NVLink symmetric memory, synchronized by the data.

A dispatch is one kernel (``dispatch_kernels``; the compact layout launches it twice, around the
host's read of its output's size, which the first launch writes into pinned memory) and a combine
is one kernel (``combine_kernels``). Their program groups run at once and meet only through
per-source records and per-row arrival rules (``sync``, ``wire``): no barrier, no host
synchronization, so a padded dispatch and a combine can be captured in a CUDA graph and replayed
(a compact dispatch cannot: its host waits for the size). Results equal the reference backend's bit for
bit in every sync mode (``sw``, ``tff``, ``dc``, ``sp``; ``ubep.protocol``).

Each direction has its own buffer set (symmetric buffers with two slots by call parity, and device
epoch words): dispatch and ``dispatch_like`` share one, combine and ``return_pair_values`` the other.
Group sizes (``Workers``): without an SM budget, fixed caps and the count programs chosen by
``ubep.tuning``; with ``num_sms``, at most that many programs per launch, the count / token split
chosen by ``ubep.tuning`` (H200 constants calibrated from in-kernel stamps,
``benchmarks/calibrate_split.py``).
"""

from __future__ import annotations

import ctypes
import functools
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ubep.backends import lifetime
from ubep.backends.base import CALL_BITS, Backend, EPCommError, Handle, call_code
from ubep.backends.cuda import checksum, records, sync, wire
from ubep.backends.cuda import combine_kernels as ck
from ubep.backends.cuda import dispatch_kernels as dk
from ubep.backends.cuda.geometry import (
    INT_VIEW,
    NUM_WARPS,
    PARTS_ITEMS,
    RECV_PARTS,
    pow2_at_least,
    recv_parts,
    reducer_tile,
    row_meta,
    step_rows,
    verify_split,
    verify_step,
)
from ubep.backends.cuda.launcher import Constants, Launcher
from ubep.backends.cuda.stamps import LaunchStamps, between_launches
from ubep.backends.cuda.symm import SymmetricBuffer, enable_for
from ubep.backends.cuda.verify import RETURNED_ROWS, STAGED_TOKENS
from ubep.config import EPConfig
from ubep.topology import flat
from ubep.tuning import DispatchShape, SplitCache, h200

# Pairs a count program orders per step (``CHUNK``: a [CHUNK, CHUNK] comparison), in every call.
# The dispatch is one kernel for all its groups, so this step sets every program's registers: 64 per
# thread with 32-pair steps, four programs per SM, against 236 and one with 128-pair steps (ptxas,
# sm_90). The token senders then run beside the count programs instead of after them (W = 1, 4096
# tokens: the compact writers' launch done at 39 µs instead of 65; H200, docs/BENCHMARKS.md). Calls
# of at most PREFIX_PAIRS pairs (decode), whose count programs never wait for one another, have one
# count program per step: the count group ends sooner with more, shorter programs.
COUNT_STEP = 32
# Larger calls, whose count programs wait for the rows of the lower ones, take as many as the cost
# model's count term is least with (``ubep.tuning.best_count``: each program orders its share of the
# pairs, then adds the rows of all before it), at most MAX_COUNT (W = 1, 4096 tokens: count group
# done at 30.3 µs against 38.5 with 128 pairs a program; H200, docs/BENCHMARKS.md).
# A count program whose range starts within PREFIX_PAIRS pairs counts those before it itself, in one
# load, instead of waiting for the rows of the programs that hold them (256 tokens of top-8). That
# load and its histogram are only as wide as the call's pairs (a power of 2, so one kernel variant
# per power): 2048 wide in every call, they keep a 16-token call's count group about 1 µs longer
# (W = 1, H200, docs/BENCHMARKS.md).
PREFIX_PAIRS = 2048
# Registers per thread the combine kernel may use, by sync mode: enough for a reducer to keep its
# row loads in flight, few enough for two programs per SM. Left to itself ptxas gives the `sw`
# kernel 85 and fewer loads in flight, the `tff` kernel 222 (one program per SM; at 128 it keeps 16
# bytes on the stack). W = 1, 4096 tokens: `sw` reducers under 24 SMs done in 603-609 µs instead of
# 1076 (H200, docs/BENCHMARKS.md). The sp kernel (245) would spill hundreds of bytes at 128.
COMBINE_REGISTERS = {"sw": 128, "tff": 128}
# Programs per group: lower ids are scheduled first and never wait on higher ones, so a grid larger
# than the GPU holds at once still completes.
MAX_COUNT, MAX_SEND, MAX_RECV = 256, 128, 256
# Combine senders move up to K rows per item, one tile after another; more of them hide latency.
MAX_COMBINE_SEND = 512
# With an SM budget the count / token split is re-tuned once per bucket of this many tokens.
SPLIT_BUCKET_TOKENS = 128
# Up to this many tokens, senders wait for the counts to leave first: the receivers then know their
# rows before the tokens land, instead of seeing the counts behind the tokens on the link.
COUNTS_FIRST_TOKENS = 512
# Polls of the compact layout's size word (a load and an event query each, about a µs) before each
# further poll yields the GIL: a wait that long is for late peers, not for the count exchange.
SPIN_POLLS = 1000


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


@dataclass(frozen=True)
class Workers:
    """Programs per group of one launch (each program is one thread block on one SM); ``verify``:
    ``dc``'s verifiers (0, or ``W * verify_split``), placed just before the receivers."""

    count: int
    send: int
    recv: int
    verify: int = 0

    @property
    def total(self) -> int:
        return self.count + self.send + self.verify + self.recv

    def split(self, world: int) -> int:
        """Verifiers per source (the kernels' ``SPLIT``; 1 without verifiers)."""
        return max(1, self.verify // world)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, config: EPConfig, group: dist.ProcessGroup | None, device: torch.device):
        super().__init__(config, group, device)
        group = group or dist.group.WORLD
        enable_for(group)
        cfg = config
        w, tm, k, el = cfg.world_size, cfg.max_tokens_per_rank, cfg.top_k, cfg.num_local_experts
        es = cfg.dtype.itemsize
        self.mode = wire.MODE_CODES[cfg.sync]
        # sp's marker word; the same in every view of the rows (the gate-weight gradient moves fp32)
        self.sentinel = checksum.sentinel_word(cfg.dtype) if cfg.sync == "sp" else 0
        self.int_view = INT_VIEW[es]
        self.rows_max = max(tm * k, w * tm)
        be, fe, nb = wire.geometry(cfg.sync, cfg.hidden, es)
        i64 = torch.int64
        shapes = {
            "stage": ((2, w, tm, nb * be), self.int_view), "route": ((2, w, tm * k, 4), i64),
            "count": ((2, w, el + 1), i64), "sig": ((2, w), i64),
            "ack": ((w,), i64), "rec": ((2, w, 2), i64),
            "back": ((2, self.rows_max, nb * be), self.int_view),
            "back_sig": ((2, w), i64), "back_ack": ((w,), i64), "back_rec": ((2, w, 2), i64),
            "intent": ((2, w), i64), "back_intent": ((2, w), i64),
        }
        self.sym = {name: SymmetricBuffer(shape, dtype, group, device)
                    for name, (shape, dtype) in shapes.items()}
        for buf in self.sym.values():
            buf.local.zero_()  # epoch 0 is never used: zeroed flags and records match no call
        if cfg.sync == "sp":  # idle slots hold the sentinel in every 128-byte block's two marker words
            fill = torch.tensor(self.sentinel, dtype=torch.int64).to(torch.int32)  # the u32's bits
            for name in ("stage", "back"):
                self.sym[name].local.view(torch.int32).view(-1, wire.BLOCK_BYTES // 4)[:, :2] = fill
        self.sym["sig"].barrier(int(cfg.timeout_s * 1000))  # every rank zeroed before any peer writes
        self.symmetric_bytes = sum(b.nbytes for b in self.sym.values())
        # dc: the most verifiers a call has (the state holds their shares; an SM budget sets them aside)
        self.verifiers = self._verifiers(tm)
        words = records.state_words(w, max(1, self.verifiers // w))
        self.dispatch_state = torch.zeros(words, dtype=i64, device=device)
        self.combine_state = torch.zeros(words, dtype=i64, device=device)
        self.no_stamps = torch.empty(1, dtype=i64, device=device)  # the stamps argument, unused
        self.e_block = pow2_at_least(cfg.num_experts)
        self.w_block = pow2_at_least(w)
        self.count_hist = torch.empty(MAX_COUNT, self.e_block, dtype=torch.int32, device=device)
        self.count_flags = torch.zeros(MAX_COUNT, dtype=i64, device=device)
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
        # Lanes of the per-token pair vectors, at least 2: with one lane (W = 1, K = 1) the tff
        # combine returned zeros for 16-bit rows on an H200, likely through a tile split over warps,
        # which MIN_TILE_BLOCKS prevents; 2 until a GPU run shows one lane right (docs/BENCHMARKS.md).
        self.k_block = pow2_at_least(max(k, w, 2))
        # Under an SM budget the compact layout (prefill, training) gives its sending and receiving
        # groups launches of their own, each with the whole budget: its dispatch synchronizes the
        # host between them anyway, and every group then has every SM (W = 1, 4096 tokens, 24 SMs:
        # sw dispatch 861-887 µs against 1502-1677; H200, docs/BENCHMARKS.md).
        # The padded layout (decode, CUDA graphs) keeps one launch: receivers take half of what the
        # verifiers leave, the senders share the rest.
        budget = cfg.num_sms
        self.split_launches = budget is not None and cfg.layout == "compact"
        self.receive_items = w * tm  # (source, token) items the receivers share
        if budget is None:
            rows = row_meta(cfg.sync, cfg.hidden, es, tm)
            shared = cfg.sync != "dc" and self.receive_items <= PARTS_ITEMS
            parts = recv_parts(MAX_RECV, self.receive_items, rows["NB"], rows["CB"]) if shared else 1
            self.receivers = min(parts * self.receive_items, MAX_RECV)
        else:
            shared = 1 if self.split_launches else 2
            self.receivers = min(self.receive_items, (budget - self.verifiers) // shared)
        # the count / token split under a budget, the count programs alone without one
        self.splits = SplitCache(flat(w), h200(), bucket_tokens=SPLIT_BUCKET_TOKENS)
        self.last_launches: dict[str, LaunchStamps] = {}  # per op, with profiling on
        self._first_launch: dict[str, LaunchStamps] = {}  # per op, a call's launch before its last
        self.phased = False  # see the dispatch section
        # Caps of the count and token groups: free to change between calls (the receiving group is
        # fixed per buffer); benchmarks/calibrate_split.py sweeps them.
        self.max_count, self.max_send = MAX_COUNT, MAX_SEND
        # where set, at most this many pairs per count program in calls past prefix_pairs, and per
        # step (a power of 2): tests lower it to get several count programs; None: the model's count
        self.pair_chunk: int | None = None
        self.prefix_pairs = PREFIX_PAIRS  # a power of 2; tests lower it to take both paths
        # what never changes for this buffer is bound once: the per-launch key leaves it out
        sym = self.sym
        self.launch_dispatch = Launcher(
            dk.dispatch, stage_ptrs=sym["stage"].ptrs, route_ptrs=sym["route"].ptrs,
            count_ptrs=sym["count"].ptrs, sig_ptrs=sym["sig"].ptrs, ack_ptrs=sym["ack"].ptrs,
            rec_ptrs=sym["rec"].ptrs, intent_ptrs=sym["intent"].ptrs, state_ptr=self.dispatch_state,
            hist_ptr=self.count_hist,
            flags_ptr=self.count_flags, rank=cfg.rank, tokens_max=tm,
            capacity=cfg.expert_capacity if cfg.layout == "padded" else 0,
            err_addr=self.error_block.data_ptr())
        self.launch_combine = Launcher(
            ck.combine, back_ptrs=sym["back"].ptrs, sig_ptrs=sym["back_sig"].ptrs,
            ack_ptrs=sym["back_ack"].ptrs, rec_ptrs=sym["back_rec"].ptrs,
            intent_ptrs=sym["back_intent"].ptrs, state_ptr=self.combine_state, rank=cfg.rank,
            tokens_max=tm, rows_max=self.rows_max, err_addr=self.error_block.data_ptr())
        self._constants: dict[tuple, Constants] = {}  # per launch variant, built once each

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
            if polls > SPIN_POLLS:
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

    def _senders(self, groups_with_them: int) -> int:
        """Programs an SM budget leaves to a launch's sending groups, beside ``groups_with_them``
        programs of other groups where the senders have a launch of their own."""
        if self.split_launches:
            return self.config.num_sms - groups_with_them
        return self.config.num_sms - self.verifiers - self.receivers

    def _workers(self, num_tokens: int) -> Workers:
        cfg = self.config
        count, send = self.max_count, self.max_send
        if cfg.num_sms is not None:
            split = self.splits.split(self._shape(num_tokens), self._senders(1))  # 1: compact's sizing
            count, send = min(split.n_count, MAX_COUNT), split.n_token
        return Workers(count=self._count_programs(num_tokens, count),
                       send=max(1, min(num_tokens, send)), recv=self.receivers,
                       verify=self._verifiers(num_tokens))

    def _shape(self, num_tokens: int) -> DispatchShape:
        cfg = self.config
        return DispatchShape(tokens=num_tokens, experts=cfg.num_experts, topk=cfg.top_k,
                             bytes_per_token=cfg.hidden * cfg.dtype.itemsize)

    def _decode_programs(self, num_tokens: int) -> int:
        """Count programs of a call of ``num_tokens`` tokens here at one decode step of pairs each, in
        calls where every count program counts the pairs before it itself (``counting``); 0 in
        larger calls."""
        pairs = num_tokens * self.config.top_k
        if pairs > self.prefix_pairs:
            return 0
        return max(1, -(-pairs // self._count_step()))

    def _count_programs(self, num_tokens: int, cap: int) -> int:
        """Count programs of a call of ``num_tokens`` tokens here, at most ``cap``: one per step of
        pairs where that many fit and never wait for one another; else one per ``pair_chunk`` pairs
        where that is set; else, without an SM budget, as many as the cost model's count term is
        least with (under a budget ``cap`` is the model's split already)."""
        decode = self._decode_programs(num_tokens)
        if 0 < decode <= cap:
            return decode
        if self.pair_chunk is not None:
            return max(1, min(-(-num_tokens * self.config.top_k // self.pair_chunk), cap))
        if self.config.num_sms is None:
            return self.splits.count(self._shape(num_tokens), cap)
        return cap

    def _prefix_width(self, num_tokens: int) -> int:
        """``PREFIX`` of a call of ``num_tokens`` tokens: the pairs a count program loads at once to
        count those before its range (``PREFIX_PAIRS`` says why no more than the call has): a power
        of 2, at least a count step, at most ``prefix_pairs``."""
        pairs = num_tokens * self.config.top_k
        return min(self.prefix_pairs, pow2_at_least(max(pairs, self._count_step())))

    def _count_step(self) -> int:
        """Pairs a count program orders per step (``COUNT_STEP``; fewer where ``pair_chunk`` is)."""
        return COUNT_STEP if self.pair_chunk is None else min(self.pair_chunk, COUNT_STEP)

    def _verifiers(self, num_tokens: int) -> int:
        """``dc``'s verifier programs of a call with ``num_tokens`` tokens here (0 in other modes)."""
        cfg = self.config
        if cfg.sync != "dc":
            return 0
        return cfg.world_size * verify_split(cfg.world_size, cfg.num_sms, num_tokens)

    def _like_workers(self, num_tokens: int) -> Workers:
        """Programs of ``dispatch_like``: the dispatch's senders and receivers, no count group."""
        workers = replace(self._workers(num_tokens), count=0)
        if self.split_launches:
            workers = replace(workers, send=max(1, min(num_tokens, self._senders(0))))
        return workers

    def _combine_workers(self, num_tokens: int) -> Workers:
        """The combine's senders move back the rows this rank received (up to the buffer's size:
        the peers' token counts are not known here); its reducers take this rank's own
        ``num_tokens`` tokens, so a call needs no more of them than ``_reducer_parts`` per token
        (an idle reducer still holds an SM slot and waits for the record in ``sw`` or the verifiers
        in ``dc``), and at least one."""
        cfg = self.config
        send = min(cfg.world_size * cfg.max_tokens_per_rank,
                   MAX_COMBINE_SEND if cfg.num_sms is None else self._senders(0))
        recv = max(1, min(self.receivers, self._reducer_parts() * num_tokens))
        return Workers(0, send, recv, verify=self._verifiers(num_tokens))

    def _reducer_parts(self) -> int:
        """Combine reducers that may share a token: ``RECV_PARTS``, but in ``sp``, whose reducers
        take whole tokens (sharing costs its kernel registers: see ``RECV_PARTS``)."""
        return 1 if self.config.sync == "sp" else RECV_PARTS

    def _widest(self, workers: Workers, writers_extra: int) -> int:
        """Programs of the widest launch of an operation of ``workers``; ``writers_extra``: programs
        the writers' launch holds besides them (the compact dispatch's sizing program)."""
        if self.split_launches:
            return max(workers.count + workers.send + writers_extra, workers.recv + workers.verify)
        return workers.total

    def programs(self, num_tokens: int) -> int:
        """Thread blocks of a dispatch of ``num_tokens`` tokens' widest launch (at most that many
        SMs busy)."""
        return self._widest(self._workers(num_tokens), 1 if self.config.layout == "compact" else 0)

    def combine_programs(self, num_tokens: int) -> int:
        """Thread blocks of the widest launch of a combine of ``num_tokens`` tokens."""
        return self._widest(self._combine_workers(num_tokens), 0)

    def _dispatch_launch(self, workers: Workers, x_bits, idx, weights, sent, out_bits, out_w, recv_w,
                         rows, pair_w, tpe, *, like: bool, replicate: bool, final: bool,
                         handle_call: int = 0) -> None:
        """One launch of the dispatch kernel; ``like``: of ``dispatch_like``, along the routes of
        the handle of dispatch number ``handle_call``."""
        cfg = self.config
        num_tokens = x_bits.shape[0]
        meta = row_meta(cfg.sync, cfg.hidden, cfg.dtype.itemsize, num_tokens)
        split = workers.split(cfg.world_size)
        step = verify_step(num_tokens, split, STAGED_TOKENS) if workers.verify else 1
        # row_meta keeps one dict per row geometry: its identity stands for the geometry
        key = ("dispatch", id(meta), like, replicate, final, workers.verify > 0, split, step,
               self.timer.enabled, self._count_step(), self._prefix_width(num_tokens),
               cfg.sync == "tff" and not like and num_tokens <= COUNTS_FIRST_TOKENS,
               step_rows(meta) if num_tokens > workers.send > 0 else 1,
               step_rows(meta) if self.receive_items > workers.recv > 0 else 1, workers.recv)
        constants = self._constants.get(key)
        if constants is None:
            constants = self._constants[key] = self._dispatch_constants(meta, *key[2:])
        writers = workers.count + (workers.send if cfg.sync == "sw" else 0)
        self.launch_dispatch(
            workers.total, x_bits, idx, weights, num_tokens,
            self._stamps("dispatch", (workers.count, workers.send, workers.verify, workers.recv),
                         final), sent,
            out_bits, out_w, recv_w, rows, pair_w, tpe, self.timeout_ns, workers.count, workers.send,
            workers.recv, writers, call_code("dispatch_like" if like else "dispatch", handle_call),
            constants=constants)

    def _dispatch_constants(self, meta: dict, like, replicate, final, verify, split, verify_tokens,
                            profile, chunk, prefix, counts_first, rows, recv_rows,
                            recv) -> Constants:
        """The dispatch kernel's compile-time constants for one launch variant (``_dispatch_launch``
        builds each once per buffer)."""
        cfg = self.config
        parts = recv_parts(recv, self.receive_items, meta["NB"], meta["CB"])
        return Constants(
            NUM_WARPS, WORLD=cfg.world_size, E_LOCAL=cfg.num_local_experts, W_BLOCK=self.w_block,
            L_BLOCK=pow2_at_least(cfg.num_local_experts), TOP_K=cfg.top_k, K_BLOCK=self.k_block,
            E_BLOCK=self.e_block, CHUNK=chunk, PREFIX=prefix, J_BLOCK=max(1, 4096 // self.e_block),
            N_BLOCK=MAX_COUNT, MODE=self.mode, SENTINEL=self.sentinel, LIKE=like,
            RECORDS=(not like) or cfg.sync == "sw", REPLICATE=replicate, VERIFY=verify, SPLIT=split,
            VERIFY_STEP=verify_tokens, FINAL=final, PROFILE=profile, COUNTS_FIRST=counts_first,
            ROWS=rows, RECV_ROWS=recv_rows, RECV_PARTS=parts, **meta)

    def _combine_launches(self, rows_RF, handle: Handle, source_w, y, *, partial: bool,
                          weighted: bool, gather: bool):
        """The combine kernel along ``handle``'s routes: one launch, or (``phased``,
        ``split_launches``) the senders, ``yield``, the reducers. ``gather``: of
        ``return_pair_values``."""
        workers = self._combine_workers(handle.num_tokens)
        code = (call_code("return_pair_values", handle.call) if gather else
                call_code("combine", handle.call, "expert_rank" if partial else "source", weighted))
        args = (rows_RF, handle.routes, handle.num_tokens, source_w, y)
        if self.phased or self.split_launches:
            self._combine_launch(replace(workers, recv=0, verify=0), *args, code, partial=partial,
                                 weighted=weighted, gather=gather, final=False)
            yield
            workers = replace(workers, send=0)
        self._combine_launch(workers, *args, code, partial=partial, weighted=weighted, gather=gather,
                             final=True)

    def _combine_launch(self, workers: Workers, rows_RF, routes: Routes, num_tokens, source_w, y,
                        code: int, *, partial: bool, weighted: bool, gather: bool,
                        final: bool) -> None:
        cfg = self.config
        elem = rows_RF.element_size()
        meta = row_meta(cfg.sync, rows_RF.shape[1], elem, num_tokens)
        parts = self._reducer_parts()
        shared = parts > 1 and workers.recv >= parts * num_tokens
        split = workers.split(cfg.world_size)
        # a returned-rows step: tokens of one partial sum each, or of K_BLOCK pair rows each
        most = RETURNED_ROWS if partial else RETURNED_ROWS // self.k_block
        step = verify_step(num_tokens, split, most) if workers.verify else 1
        key = ("combine", id(meta), partial, weighted, gather, workers.verify > 0, split, step,
               final, self.timer.enabled, shared)
        constants = self._constants.get(key)
        if constants is None:
            constants = self._constants[key] = self._combine_constants(meta, *key[2:])
        self.launch_combine(
            workers.total, rows_RF, rows_RF.view(INT_VIEW[elem]), routes.rows_WMK,
            routes.weights_WMK, routes.idx_P, source_w, routes.sent_WT, num_tokens,
            self._stamps("combine", (workers.send, workers.verify, workers.recv), final), y,
            self.timeout_ns, workers.send, workers.recv, code, constants=constants)

    def _combine_constants(self, meta: dict, partial, weighted, gather, verify, split,
                           verify_tokens, final, profile, shared) -> Constants:
        """The combine kernel's compile-time constants for one launch variant; ``shared``: there are
        ``RECV_PARTS`` reducers per token."""
        cfg = self.config
        r_block, rcb, parts = reducer_tile(cfg.sync, meta,
                                           cfg.world_size if partial else cfg.top_k, shared)
        return Constants(
            NUM_WARPS, COMBINE_REGISTERS.get(cfg.sync), WORLD=cfg.world_size, W_BLOCK=self.w_block,
            E_LOCAL=cfg.num_local_experts, TOP_K=cfg.top_k, K_BLOCK=self.k_block, MODE=self.mode,
            SENTINEL=self.sentinel, PARTIAL=partial, WEIGHTED=weighted and partial,
            SUM_WEIGHTED=weighted and not partial, GATHER=gather, VERIFY=verify, SPLIT=split,
            VERIFY_STEP=verify_tokens, FINAL=final, PROFILE=profile,
            ROWS=min(self.k_block, step_rows(meta)), R_BLOCK=r_block, RCB=rcb, RECV_PARTS=parts,
            **meta)

    # -- dispatch ---------------------------------------------------------------------------------
    # Each operation is a generator of launches. On a GPU they run back to back (`_finish`), the
    # groups fused where they can be; with ``phased``, every group that waits for peers gets a launch
    # of its own after a ``yield``, so that ranks emulated one after another in one process (Triton's
    # CPU interpreter, tests/cuda_emulation.py) reach each wait only once every peer has written.

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        return _finish(self.dispatch_steps(x_TH, topk_idx_TK, topk_weights_TK))

    def dispatch_steps(self, x_TH, topk_idx_TK, topk_weights_TK):
        self._check_errors()
        cfg, dev = self.config, self.device
        w, tm, k, hidden = cfg.world_size, cfg.max_tokens_per_rank, cfg.top_k, cfg.hidden
        num_tokens = x_TH.shape[0]
        x_bits = x_TH.contiguous().view(self.int_view)
        idx = topk_idx_TK.long().contiguous().view(-1)
        weights = topk_weights_TK.detach().float().contiguous().view(-1)
        sent = torch.empty(w, tm, dtype=torch.int8, device=dev)
        rows = torch.empty(w, tm, k, dtype=torch.int64, device=dev)
        pair_w = torch.empty(w, tm, k, dtype=torch.float32, device=dev)
        tpe = torch.empty(cfg.num_local_experts, dtype=torch.int64, device=dev)
        workers = self._workers(num_tokens)
        writers = Workers(workers.count, workers.send, 0)
        receivers = Workers(0, 0, workers.recv, workers.verify)
        common = (x_bits, idx, weights, sent)
        if cfg.layout == "padded":
            num_rows = cfg.num_local_experts * cfg.expert_capacity
            out = x_TH.new_empty(num_rows, hidden)  # padding rows are not written
            # the kernel writes both weight outputs, padding included: no memset, no copy kernel
            row_weights, recv_w = torch.empty(2, num_rows, dtype=torch.float32, device=dev)
            received = (out.view(self.int_view), row_weights, recv_w, rows, pair_w, tpe)
            with self.timer.phase("dispatch"):
                if self.phased:
                    self._dispatch_launch(writers, *common, *received, like=False, replicate=False,
                                          final=False)
                    yield
                    workers = receivers
                self._dispatch_launch(workers, *common, *received, like=False, replicate=True,
                                      final=True)
        else:
            # nothing is placed yet: no output; the sizes go to the host
            sizes = (x_bits, weights, weights, rows, pair_w, self.host_tpe)
            self.host_rows.value = -1
            with self.timer.phase("dispatch: count exchange"):
                if self.phased:
                    self._dispatch_launch(writers, *common, *sizes, like=False, replicate=False,
                                          final=False)
                    yield
                    writers = Workers(0, 0, 0)
                self._dispatch_launch(replace(writers, recv=1), *common, *sizes,
                                      like=False, replicate=False, final=False)
                if self.sized is not None:
                    self.sized.record()
                num_rows = self._received_rows()  # the compact layout's one wait of the host
            out = x_TH.new_empty(num_rows, hidden)
            row_weights, recv_w = torch.empty(2, num_rows, dtype=torch.float32, device=dev)
            with self.timer.phase("dispatch: reorder"):
                self._dispatch_launch(receivers, *common, out.view(self.int_view), row_weights, recv_w,
                                      rows, pair_w, tpe, like=False, replicate=True, final=True)
        routes = Routes(idx, sent, rows, pair_w)
        self.dispatches += 1
        handle = Handle(cfg, num_tokens, topk_weights_TK, row_weights, tpe, num_rows, None, routes,
                        self.dispatches)
        return out.view(handle.rows_shape(hidden)), recv_w.view(handle.rows_shape()), handle

    def dispatch_like(self, x_TH, handle):
        return _finish(self.dispatch_like_steps(x_TH, handle))

    def dispatch_like_steps(self, x_TH, handle):
        """New rows along the handle's routes: once to each rank the dispatch sent the token to,
        then into the receive rows it recorded."""
        self._check_errors()
        routes, hidden = handle.routes, x_TH.shape[1]
        x_bits = x_TH.contiguous().view(self.int_view)
        out = x_TH.new_zeros(handle.num_rows, hidden)
        workers = self._like_workers(handle.num_tokens)
        unused = routes.weights_WMK  # the row weights: written by a dispatch, not here
        args = (x_bits, routes.idx_P, routes.weights_WMK, routes.sent_WT, out.view(self.int_view),
                unused, unused, routes.rows_WMK, routes.weights_WMK, handle.tokens_per_expert)
        with self.timer.phase("dispatch"):
            if self.phased or self.split_launches:
                self._dispatch_launch(replace(workers, recv=0, verify=0), *args, like=True,
                                      replicate=False, final=False, handle_call=handle.call)
                yield
                workers = replace(workers, send=0)
            self._dispatch_launch(workers, *args, like=True, replicate=True, final=True,
                                  handle_call=handle.call)
        return out.view(handle.rows_shape(hidden))

    # -- combine ----------------------------------------------------------------------------------

    def combine(self, expert_out, handle, reduce, weighted):
        return _finish(self.combine_steps(expert_out, handle, reduce, weighted))

    def combine_steps(self, expert_out, handle, reduce, weighted):
        self._check_errors()
        hidden, num_tokens = expert_out.shape[-1], handle.num_tokens
        rows_RH = expert_out.reshape(handle.num_rows, hidden).contiguous()
        y = expert_out.new_empty(num_tokens, hidden)
        source_w = handle.topk_weights.detach().float().contiguous()
        with self.timer.phase("combine"):
            yield from self._combine_launches(rows_RH, handle, source_w, y,
                                              partial=reduce == "expert_rank", weighted=weighted,
                                              gather=False)
        return y

    def return_pair_values(self, values_R, handle):
        return _finish(self.return_pair_values_steps(values_R, handle))

    def return_pair_values_steps(self, values_R, handle):
        self._check_errors()
        k, num_tokens, routes = self.config.top_k, handle.num_tokens, handle.routes
        values = values_R.float().reshape(-1, 1).contiguous()
        y = torch.empty(num_tokens, k, 1, dtype=torch.float32, device=self.device)
        yield from self._combine_launches(values, handle, values, y, partial=False,
                                          weighted=False, gather=True)
        return torch.where(routes.idx_P.view(num_tokens, k) >= 0, y.view(num_tokens, k), 0.0)


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


def _finish(steps):
    """Runs an operation's launches to the end and returns its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
