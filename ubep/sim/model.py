"""Discrete-event model of one MoE dispatch on a superpod, built on SimPy.

Every rank runs its workers as SimPy processes. A rank's egress link is one fluid resource shared
by the workers sending at once (max-min fair); each worker is capped at its own copy rate, the
longer of a token's serialization at the worker's rate and its hop latency spread over the
worker's outstanding stores (so far tokens cost more). The link saturates once enough workers push
at once (``link_gbps / worker_gbps`` of them) and no worker waits for a free lane. Ranks interact
through messages whose arrival is the sender's time plus the hop latency, and through the receiver
waiting for them.

Two executions:
- ``bsp``: all workers run Init, Token-Sending, SendFlag & Verification, CalCumSum and
  Token-Reordering in turn, each phase ended by a SyncAll (and the verification by the flags of
  every source rank);
- ``decomposed``: ``n_count`` workers count, exchange counts and run CalCumSum while the others send
  tokens into staging slots; the receiver reorders each source's batch once its data and the offsets
  are known, as data arrives.

``sync`` sets how a receiver learns that data arrived (see ``ubep/protocol``): ``sw`` fences and
writes a flag per sync unit, ``tff`` spends part of every block on a flag, ``dc`` sends one checksum
per (source, destination) batch and verifies it before the batch is used, ``sp`` checks a sentinel
per block. SP's reset of the slots after use is left out of the dispatch time: the slot is next
used two calls later, so the reset overlaps what follows (combine, the experts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ubep.protocol import MODES
from ubep.scheduler import VARIANTS, schedule
from ubep.sim.params import EXECUTIONS, SimParams, wire_bytes_per_row
from ubep.topology import Topology

PHASES = ("init", "token-sending", "flag & verification", "count exchange", "calcumsum",
          "token-reordering")


@dataclass(frozen=True)
class Routing:
    """Routing of one dispatch: ``counts_WE[s, e]`` tokens source ``s`` sends to expert ``e``."""

    counts_WE: torch.Tensor
    num_local_experts: int

    @property
    def world_size(self) -> int:
        return self.counts_WE.shape[0]

    def rank_of_expert(self) -> torch.Tensor:
        return torch.arange(self.counts_WE.shape[1]) // self.num_local_experts


@dataclass
class RankResult:
    """Phase spans ``name -> (start_ns, end_ns)`` of one rank and its workers' send finish times."""

    spans: dict[str, tuple[float, float]]
    worker_send_ns: list[float]

    @property
    def done_ns(self) -> float:
        return max(end for _, end in self.spans.values())


@dataclass(frozen=True)
class SimConfig:
    """``execution`` in ``EXECUTIONS``; ``mapping`` one of ``ubep.scheduler.VARIANTS``; ``sync``
    one of the protocol modes; ``n_count`` workers in the count group (decomposed only)."""

    execution: str
    mapping: str
    sync: str
    n_count: int = 1

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {self.execution!r}")
        if self.mapping not in VARIANTS:
            raise ValueError(f"mapping must be one of {VARIANTS}, got {self.mapping!r}")
        if self.sync not in MODES:
            raise ValueError(f"sync must be one of {MODES}, got {self.sync!r}")


def worker_plan(variant: str, counts_E: torch.Tensor, hop_E: torch.Tensor, workers: int,
                shift: int = 0):
    """``[workers, E]`` tokens each worker sends to each expert under a scheduler variant.

    The scheduler sees the experts rotated left by ``shift``: a source passes its own first expert,
    so that sources do not all start on the same destination (which would make every rank's first
    writes land on one receiver at once).
    """
    plan = schedule(variant, counts_E.roll(-shift).long(), hop_E.roll(-shift).long(), workers)
    dest = (plan.dest + shift) % counts_E.numel()
    out = torch.zeros(workers, counts_E.numel(), dtype=torch.long)
    return out.index_put_((plan.piece_worker(), dest), plan.length, accumulate=True)


class _Link:
    """One rank's egress link: the flows on it share ``gbps`` max-min fairly, each flow at most at
    its own cap (water-filling); rates are recomputed whenever a flow starts or ends."""

    def __init__(self, env, gbps: float):
        self.env, self.gbps = env, gbps
        self.flows: dict = {}  # completion event -> [bytes left, cap in bytes/ns, rate]
        self.stamp = 0.0
        self.generation = 0  # a wake-up scheduled before the last change is stale

    def send(self, nbytes: float, cap_gbps: float):
        """An event that fires once ``nbytes`` have left at up to ``cap_gbps`` (bytes per ns)."""
        done = self.env.event()
        self._advance()
        self.flows[done] = [nbytes, cap_gbps, 0.0]
        self._reschedule()
        return done

    def _advance(self) -> None:
        dt = self.env.now - self.stamp
        if dt > 0:
            for flow in self.flows.values():
                flow[0] -= flow[2] * dt
        self.stamp = self.env.now

    def _reschedule(self) -> None:
        left, active = self.gbps, sorted(self.flows.values(), key=lambda f: f[1])
        for i, flow in enumerate(active):
            flow[2] = min(flow[1], left / (len(active) - i))
            left -= flow[2]
        self.generation += 1
        generation = self.generation
        wake = self.env.timeout(max(0.0, min(f[0] / f[2] for f in active)))
        wake.callbacks.append(lambda _: self._tick(generation))

    def _tick(self, generation: int) -> None:
        if generation != self.generation:
            return
        self._advance()
        # Done: what is left would take under a femtosecond (rounding of the float clock).
        for done in [d for d, f in self.flows.items() if f[0] <= 1e-6 * f[2] + 1e-9]:
            del self.flows[done]
            done.succeed()
        if self.flows:
            self._reschedule()


class _Dispatch:
    def __init__(self, env, traffic: Routing, topo: Topology, params: SimParams, cfg: SimConfig):
        self.env, self.t, self.topo, self.p, self.cfg = env, traffic, topo, params, cfg
        world = traffic.world_size
        self.link = [_Link(env, params.link_gbps) for _ in range(world)]
        self.lat = [[topo.latency_ns[topo.hop(s, d)] for d in range(world)] for s in range(world)]
        self.rank_of_e = traffic.rank_of_expert()
        self.tokens_WW = torch.zeros(world, world, dtype=torch.long).index_add_(
            1, self.rank_of_e, traffic.counts_WE.long()).tolist()
        self.row_wire = wire_bytes_per_row(params, cfg.sync)
        serial_ns = self.row_wire / params.worker_gbps
        # A worker's copy rate to a rank: a token takes its serialization, or its hop latency
        # spread over the stores the worker keeps in flight, whichever is longer.
        self.cap = [[self.row_wire / max(serial_ns, lat / params.outstanding_stores) for lat in row]
                    for row in self.lat]
        # Cross-rank signals: when rank s's counts/flags left; when its last token to d left, known
        # once all of its token workers are done.
        self.counts_sent = [env.event() for _ in range(world)]
        self.batch_sent = [[0.0] * world for _ in range(world)]
        self.batch_pieces = [[1] * world for _ in range(world)]
        self.batches_done = [env.event() for _ in range(world)]
        self.results: list[RankResult | None] = [None] * world

    # -- token sending ----------------------------------------------------------------------------

    def _worker(self, src: int, plan_W: list[int], finish: list, slot: int, sent_to: list,
                pieces: list):
        """Send one worker's tokens, rank by rank; record when its data is visible remotely."""
        far = 0.0
        for dst, count in enumerate(plan_W):
            if not count:
                continue
            yield self.link[src].send(count * self.row_wire, self.cap[src][dst])
            if self.cfg.sync == "sw" and self.cfg.execution == "decomposed":
                # Stop-and-wait: a fence (one round trip) per sync unit before its flag. The fence
                # stalls the worker's pipeline, not the link (paper §3.4): off the link, after the run.
                yield self.env.timeout(self.p.sync_units(count * self.p.row_bytes) * 2
                                       * self.lat[src][dst])
            sent_to[dst] = max(sent_to[dst], self.env.now)
            pieces[dst] += 1
            far = max(far, self.lat[src][dst])
        finish[slot] = self.env.now + far

    def _send_tokens(self, src: int, workers: int):
        """All token workers of ``src``; returns their finish times (data visible remotely)."""
        world = self.t.world_size
        plan_NE = worker_plan(self.cfg.mapping, self.t.counts_WE[src],
                              self.topo.hops[src][self.rank_of_e], workers,
                              shift=src * self.t.num_local_experts)
        plan_NW = torch.zeros(workers, world, dtype=torch.long).index_add_(1, self.rank_of_e, plan_NE)
        finish = [0.0] * workers
        sent_to = [self.env.now] * world
        pieces = [0] * world
        procs = [self.env.process(self._worker(src, plan, finish, j, sent_to, pieces))
                 for j, plan in enumerate(plan_NW.tolist())]
        yield self.env.all_of(procs)
        self.batch_sent[src] = sent_to
        self.batch_pieces[src] = pieces
        self.batches_done[src].succeed()
        return finish

    # -- receiving --------------------------------------------------------------------------------

    def _reorder(self, dst: int, start: float, workers: int) -> float:
        """Reorder every source's batch on ``dst`` from ``start``; returns the finish time."""
        p, world = self.p, self.t.world_size
        rate = p.reorder_gbps
        arrivals = []
        for s in range(world):
            tokens = self.tokens_WW[s][dst]
            if not tokens:
                continue
            batch_bytes = tokens * p.row_bytes
            arrive = self.batch_sent[s][dst] + self.lat[s][dst]
            if self.cfg.sync == "dc":  # checksum after the batch, verified before use
                arrive += self.lat[s][dst] + batch_bytes / (p.checksum_gbps * workers)
            arrivals.append((arrive, batch_bytes, max(1, self.batch_pieces[s][dst])))
        t = start
        for arrive, batch_bytes, pieces in sorted(arrivals):
            work = batch_bytes / rate + p.sync_units(batch_bytes) * p.poll_ns / workers
            if self.cfg.sync in ("tff", "sp"):
                work += batch_bytes / p.block_bytes * p.verify_ns_per_block / workers
            if self.cfg.sync == "dc":  # nothing of the batch is usable before its checksum
                t = max(t, arrive) + work
            elif self.cfg.sync == "sw":  # one flag per sender piece: the last piece waits
                t = max(t + work, arrive + work / pieces)
            else:  # every block verifies itself: rows are reordered as they land
                t = max(t + work, arrive + p.row_bytes / rate)
        return t

    def _counts_arrived(self, dst: int) -> float:
        return max(self.counts_sent[s].value + self.lat[s][dst] for s in range(self.t.world_size))

    # -- the two executions -----------------------------------------------------------------------

    def bsp(self, rank: int):
        env, p, world = self.env, self.p, self.t.world_size
        n = p.workers_per_rank
        spans = {"init": (0.0, p.init_ns)}
        yield env.timeout(p.init_ns)
        start = env.now
        finish = yield env.process(self._send_tokens(rank, n))
        yield env.timeout(max(max(finish) - env.now, 0.0) + p.syncall_ns)
        spans["token-sending"] = (start, env.now)
        start = env.now
        # Make the tokens visible (a fence: the farthest round trip), then flags and counts.
        yield env.timeout(2 * max(self.lat[rank]) + world * p.count_msg_ns / n)
        self.counts_sent[rank].succeed(env.now)
        yield env.all_of(self.counts_sent)
        ready = max(self._counts_arrived(rank), env.now) + world * p.poll_ns / n
        yield env.timeout(ready - env.now + p.syncall_ns)
        spans["flag & verification"] = (start, env.now)
        start = env.now
        yield env.timeout(world * self.t.num_local_experts * p.cumsum_ns_per_entry / n
                          + p.syncall_ns)
        spans["calcumsum"] = (start, env.now)
        start = env.now
        end = self._reorder(rank, start, n)
        yield env.timeout(end - start)
        spans["token-reordering"] = (start, end)
        self.results[rank] = RankResult(spans, finish)

    def decomposed(self, rank: int):
        env, p, world = self.env, self.p, self.t.world_size
        n_count = self.cfg.n_count
        n_token = p.workers_per_rank - n_count
        spans = {"init": (0.0, p.init_ns)}
        yield env.timeout(p.init_ns)
        start = env.now
        token_group = env.process(self._send_tokens(rank, n_token))
        pairs = sum(self.tokens_WW[rank])
        yield env.timeout((pairs * p.count_ns_per_pair + world * p.count_msg_ns) / n_count)
        self.counts_sent[rank].succeed(env.now)
        yield env.all_of(self.counts_sent)
        verified = max(self._counts_arrived(rank), env.now) + world * p.poll_ns / n_count
        yield env.timeout(verified - env.now)
        spans["count exchange"] = (start, env.now)
        cum_start = env.now
        yield env.timeout(world * self.t.num_local_experts * p.cumsum_ns_per_entry / n_count)
        spans["calcumsum"] = (cum_start, env.now)
        offsets_ready = env.now
        finish = yield token_group
        spans["token-sending"] = (start, max(finish))
        yield env.all_of(self.batches_done)  # arrival times of every batch are known from here
        end = self._reorder(rank, offsets_ready, p.workers_per_rank)
        first = min(offsets_ready, max(finish))
        yield env.timeout(max(end - env.now, 0.0))
        spans["token-reordering"] = (first, end)
        self.results[rank] = RankResult(spans, finish)


def simulate(traffic: Routing, topo: Topology, params: SimParams, cfg: SimConfig) -> list[RankResult]:
    """Run one dispatch; one :class:`RankResult` per rank."""
    if topo.world_size != traffic.world_size:
        raise ValueError(f"topology has {topo.world_size} ranks, traffic {traffic.world_size}")
    if cfg.execution == "decomposed" and not 0 < cfg.n_count < params.workers_per_rank:
        raise ValueError(f"n_count must be in [1, {params.workers_per_rank}), got {cfg.n_count}")
    import simpy  # here, not at the top: listing the scenarios needs no simpy

    env = simpy.Environment()
    model = _Dispatch(env, traffic, topo, params, cfg)
    run = model.bsp if cfg.execution == "bsp" else model.decomposed
    for rank in range(traffic.world_size):
        env.process(run(rank))
    env.run()
    return model.results
