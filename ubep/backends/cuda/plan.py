"""Which kernel launches each operation makes: program groups and compile-time constants, as pure
functions of the buffer's config, its ``Tuning`` and the call's tokens (no tensors, no device).

A launch's program ids go, in order, ``[count | senders | dc verifiers | receivers]`` (dispatch) or
``[senders | dc verifiers | reducers]`` (combine). Without an SM budget the groups have the tuning's
caps and the count programs the cost model's choice (``ubep.tuning``); with ``num_sms`` every launch
has at most that many programs: the compact layout gives its sending and receiving groups launches of
their own (its host waits between them anyway), the padded layout keeps one launch (CUDA graphs),
its receivers taking half of what the verifiers leave.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ubep.backends.cuda import checksum, wire
from ubep.backends.cuda.geometry import (
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
from ubep.backends.cuda.launcher import Constants
from ubep.backends.cuda.tuning import Tuning
from ubep.backends.cuda.verify import RETURNED_ROWS, STAGED_TOKENS
from ubep.config import EPConfig
from ubep.topology import flat
from ubep.tuning import DispatchShape, SplitCache


@dataclass(frozen=True)
class Workers:
    """Programs per group of one launch (a program is one thread block on one SM); ``verify``:
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


@dataclass(frozen=True)
class Launch:
    """One launch: its groups, its compile-time constants (the launcher's cache key), whether it
    ends the call (``final``: its programs advance the epochs), ``writers`` (the dispatch's programs
    that publish its record: count, and in ``sw`` the senders) and ``sizing``: it holds the compact
    dispatch's sizing program, after which the host reads the output's rows."""

    workers: Workers
    constants: Constants
    final: bool
    writers: int = 0
    sizing: bool = False


@dataclass(frozen=True)
class Plan:
    """An operation's launches: ``start`` queued by the backend's ``start_*``, ``finish`` by its
    ``finish_*`` (a compact dispatch reads its output's size between its sizing launch and the
    next one)."""

    start: tuple[Launch, ...]
    finish: tuple[Launch, ...] = ()


class Planner:
    """The launches of one buffer's operations. Plans are built once per call size and kind."""

    def __init__(self, config: EPConfig, tuning: Tuning):
        cfg = self.config = config
        self.tuning = tuning
        w, tm = cfg.world_size, cfg.max_tokens_per_rank
        self.mode = wire.MODE_CODES[cfg.sync]
        # sp's marker word; the same in every view of the rows (the gate-weight gradient moves fp32)
        self.sentinel = checksum.sentinel_word(cfg.dtype) if cfg.sync == "sp" else 0
        self.e_block = pow2_at_least(cfg.num_experts)
        self.w_block = pow2_at_least(w)
        # at least 2 lanes: with one (W = 1, K = 1) the tff combine returned zeros for 16-bit rows
        self.k_block = pow2_at_least(max(cfg.top_k, w, 2))
        # dc: a call's verifiers at most (the state words hold their shares)
        self.most_verifiers = self.verifiers(tm)
        self.split_launches = cfg.num_sms is not None and cfg.layout == "compact"
        self.receive_items = w * tm  # (source, token) items the receivers share
        if cfg.num_sms is None:
            rows = row_meta(cfg.sync, cfg.hidden, cfg.dtype.itemsize, tm)
            shared = cfg.sync != "dc" and self.receive_items <= PARTS_ITEMS
            parts = (recv_parts(tuning.max_recv, self.receive_items, rows["NB"], rows["CB"])
                     if shared else 1)
            self.receivers = min(parts * self.receive_items, tuning.max_recv)
        else:
            shared = 1 if self.split_launches else 2
            self.receivers = min(self.receive_items, (cfg.num_sms - self.most_verifiers) // shared)
        self.splits = SplitCache(flat(w), tuning.cost, bucket_tokens=tuning.split_bucket_tokens)
        self._plans: dict[tuple, Plan] = {}

    # -- program groups -----------------------------------------------------------------------------

    def verifiers(self, num_tokens: int) -> int:
        """``dc``'s verifier programs of a call of ``num_tokens`` tokens (0 in other modes)."""
        cfg = self.config
        if cfg.sync != "dc":
            return 0
        return cfg.world_size * verify_split(cfg.world_size, cfg.num_sms, num_tokens, self.tuning)

    def senders(self, groups_with_them: int) -> int:
        """Programs an SM budget leaves to a launch's sending groups, beside ``groups_with_them``
        programs of other groups where the senders have a launch of their own."""
        if self.split_launches:
            return self.config.num_sms - groups_with_them
        return self.config.num_sms - self.most_verifiers - self.receivers

    def dispatch_workers(self, num_tokens: int) -> Workers:
        cfg, tuning = self.config, self.tuning
        count, send = tuning.max_count, tuning.max_send
        if cfg.num_sms is not None:
            split = self.splits.split(self._shape(num_tokens), self.senders(1))  # 1: the sizing one
            count, send = min(split.n_count, tuning.max_count), split.n_token
        return Workers(count=self.count_programs(num_tokens, count),
                       send=max(1, min(num_tokens, send)), recv=self.receivers,
                       verify=self.verifiers(num_tokens))

    def like_workers(self, num_tokens: int) -> Workers:
        """Programs of ``dispatch_like``: the dispatch's senders and receivers, no count group."""
        workers = replace(self.dispatch_workers(num_tokens), count=0)
        if self.split_launches:
            workers = replace(workers, send=max(1, min(num_tokens, self.senders(0))))
        return workers

    def combine_workers(self, num_tokens: int) -> Workers:
        """The senders move back the rows this rank received (up to the buffer's size: the peers'
        token counts are not known here); the reducers take this rank's ``num_tokens`` tokens, at
        most ``reducer_parts`` per token (an idle one still holds an SM) and at least one."""
        cfg = self.config
        send = min(cfg.world_size * cfg.max_tokens_per_rank,
                   self.tuning.max_combine_send if cfg.num_sms is None else self.senders(0))
        recv = max(1, min(self.receivers, self.reducer_parts() * num_tokens))
        return Workers(0, send, recv, verify=self.verifiers(num_tokens))

    def reducer_parts(self) -> int:
        """Combine reducers that may share a token: ``RECV_PARTS``, but in ``sp``, whose reducers
        take whole tokens (sharing costs its kernel registers: ``geometry.RECV_PARTS``)."""
        return 1 if self.config.sync == "sp" else RECV_PARTS

    def count_programs(self, num_tokens: int, cap: int) -> int:
        """Count programs, at most ``cap``: one per step of pairs where that many fit and never wait
        for one another; else one per ``pair_chunk`` pairs where that is set; else, without an SM
        budget, as many as the cost model's count term is least with (under a budget ``cap`` is
        the model's split already)."""
        pairs = num_tokens * self.config.top_k
        if pairs <= self.tuning.prefix_pairs:
            decode = max(1, -(-pairs // self.count_step()))
            if decode <= cap:
                return decode
        if self.tuning.pair_chunk is not None:
            return max(1, min(-(-pairs // self.tuning.pair_chunk), cap))
        if self.config.num_sms is None:
            return self.splits.count(self._shape(num_tokens), cap)
        return cap

    def count_step(self) -> int:
        """Pairs a count program orders per step (fewer where ``pair_chunk`` is)."""
        chunk = self.tuning.pair_chunk
        return self.tuning.count_step if chunk is None else min(chunk, self.tuning.count_step)

    def prefix_width(self, num_tokens: int) -> int:
        """``PREFIX``: the pairs a count program loads at once to count those before its range, no
        more than the call has (a power of 2: one kernel variant per power), at least a step."""
        pairs = num_tokens * self.config.top_k
        return min(self.tuning.prefix_pairs, pow2_at_least(max(pairs, self.count_step())))

    def _shape(self, num_tokens: int) -> DispatchShape:
        cfg = self.config
        return DispatchShape(tokens=num_tokens, experts=cfg.num_experts, topk=cfg.top_k,
                             bytes_per_token=cfg.hidden * cfg.dtype.itemsize)

    def _widest(self, workers: Workers, writers_extra: int) -> int:
        if self.split_launches:
            return max(workers.count + workers.send + writers_extra, workers.recv + workers.verify)
        return workers.total

    def programs(self, num_tokens: int) -> int:
        """Thread blocks of the widest launch of a dispatch of ``num_tokens`` tokens."""
        extra = 1 if self.config.layout == "compact" else 0  # the sizing program
        return self._widest(self.dispatch_workers(num_tokens), extra)

    def combine_programs(self, num_tokens: int) -> int:
        """Thread blocks of the widest launch of a combine of ``num_tokens`` tokens."""
        return self._widest(self.combine_workers(num_tokens), 0)

    # -- plans --------------------------------------------------------------------------------------

    def dispatch(self, num_tokens: int, profile: bool) -> Plan:
        key = ("dispatch", num_tokens, profile)
        if (plan := self._plans.get(key)) is None:
            plan = self._plans[key] = self._dispatch(num_tokens, profile)
        return plan

    def dispatch_like(self, num_tokens: int, profile: bool) -> Plan:
        key = ("dispatch_like", num_tokens, profile)
        if (plan := self._plans.get(key)) is None:
            workers = self.like_workers(num_tokens)
            plan = self._plans[key] = self._two_sided(
                workers, lambda w, final: self._dispatch_launch(
                    num_tokens, w, like=True, replicate=final, final=final, profile=profile))
        return plan

    def combine(self, num_tokens: int, hidden: int, elem_bytes: int, *, partial: bool,
                weighted: bool, gather: bool, profile: bool) -> Plan:
        """A combine of rows of ``hidden`` elements of ``elem_bytes`` bytes (``gather``: of
        ``return_pair_values``; ``partial``: ``reduce="expert_rank"``)."""
        key = ("combine", num_tokens, hidden, elem_bytes, partial, weighted, gather, profile)
        if (plan := self._plans.get(key)) is None:
            meta = row_meta(self.config.sync, hidden, elem_bytes, num_tokens)
            plan = self._plans[key] = self._two_sided(
                self.combine_workers(num_tokens),
                lambda w, final: self._combine_launch(num_tokens, meta, w, partial, weighted,
                                                      gather, final, profile))
        return plan

    def _two_sided(self, workers: Workers, launch) -> Plan:
        """One launch of every group; or (``phased``, or an SM budget in the compact layout) the
        senders' launch in ``start`` and the rest's in ``finish``."""
        if self.tuning.phased or self.split_launches:
            return Plan((launch(replace(workers, recv=0, verify=0), False),),
                        (launch(replace(workers, send=0), True),))
        return Plan((launch(workers, True),))

    def _dispatch(self, num_tokens: int, profile: bool) -> Plan:
        workers = self.dispatch_workers(num_tokens)
        writers = Workers(workers.count, workers.send, 0)
        receivers = Workers(0, 0, workers.recv, workers.verify)

        def launch(w: Workers, final: bool, sizing: bool = False) -> Launch:
            return self._dispatch_launch(num_tokens, w, like=False, replicate=final, final=final,
                                         profile=profile, sizing=sizing)

        if self.config.layout == "padded":
            if self.tuning.phased:
                return Plan((launch(writers, False),), (launch(receivers, True),))
            return Plan((launch(workers, True),))
        # compact: the writers' launch holds one more program, which sums the counts for the host
        if self.tuning.phased:  # its wait for every peer's counts in a launch of its own
            return Plan((launch(writers, False),),
                        (launch(Workers(0, 0, 1), False, True), launch(receivers, True)))
        return Plan((launch(replace(writers, recv=1), False, True),), (launch(receivers, True),))

    def _dispatch_launch(self, num_tokens: int, workers: Workers, *, like: bool, replicate: bool,
                         final: bool, profile: bool = False, sizing: bool = False) -> Launch:
        cfg = self.config
        meta = row_meta(cfg.sync, cfg.hidden, cfg.dtype.itemsize, num_tokens)
        split = workers.split(cfg.world_size)
        rows = step_rows(meta)
        counts_first = (cfg.sync == "tff" and not like
                        and num_tokens <= self.tuning.counts_first_tokens)
        constants = Constants(
            NUM_WARPS, WORLD=cfg.world_size, E_LOCAL=cfg.num_local_experts, W_BLOCK=self.w_block,
            L_BLOCK=pow2_at_least(cfg.num_local_experts), TOP_K=cfg.top_k, K_BLOCK=self.k_block,
            E_BLOCK=self.e_block, CHUNK=self.count_step(), PREFIX=self.prefix_width(num_tokens),
            J_BLOCK=max(1, 4096 // self.e_block), N_BLOCK=self.tuning.count_scratch, MODE=self.mode,
            SENTINEL=self.sentinel, LIKE=like, RECORDS=(not like) or cfg.sync == "sw",
            REPLICATE=replicate, VERIFY=workers.verify > 0, SPLIT=split,
            VERIFY_STEP=verify_step(num_tokens, split, STAGED_TOKENS) if workers.verify else 1,
            FINAL=final, PROFILE=profile, COUNTS_FIRST=counts_first,
            ROWS=rows if num_tokens > workers.send > 0 else 1,
            RECV_ROWS=rows if self.receive_items > workers.recv > 0 else 1,
            RECV_PARTS=recv_parts(workers.recv, self.receive_items, meta["NB"], meta["CB"]), **meta)
        writers = workers.count + (workers.send if cfg.sync == "sw" else 0)
        return Launch(workers, constants, final, writers, sizing)

    def _combine_launch(self, num_tokens: int, meta: dict, workers: Workers, partial: bool,
                        weighted: bool, gather: bool, final: bool, profile: bool) -> Launch:
        cfg = self.config
        parts = self.reducer_parts()
        shared = parts > 1 and workers.recv >= parts * num_tokens
        split = workers.split(cfg.world_size)
        # a returned-rows step: tokens of one partial sum each, or of K_BLOCK pair rows each
        most = RETURNED_ROWS if partial else RETURNED_ROWS // self.k_block
        r_block, rcb, parts = reducer_tile(cfg.sync, meta, cfg.world_size if partial else cfg.top_k,
                                           shared)
        constants = Constants(
            NUM_WARPS, self.tuning.registers(cfg.sync), WORLD=cfg.world_size, W_BLOCK=self.w_block,
            E_LOCAL=cfg.num_local_experts, TOP_K=cfg.top_k, K_BLOCK=self.k_block, MODE=self.mode,
            SENTINEL=self.sentinel, PARTIAL=partial, WEIGHTED=weighted and partial,
            SUM_WEIGHTED=weighted and not partial, GATHER=gather, VERIFY=workers.verify > 0,
            SPLIT=split, VERIFY_STEP=verify_step(num_tokens, split, most) if workers.verify else 1,
            FINAL=final, PROFILE=profile, ROWS=min(self.k_block, step_rows(meta)), R_BLOCK=r_block,
            RCB=rcb, RECV_PARTS=parts, **meta)
        return Launch(workers, constants, final)
