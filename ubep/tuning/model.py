"""Analytical model of one dispatch: count group and token group side by side (UBEP appendix 9).

Per rank, ``n`` workers split into ``n_count`` count workers (per-expert counts, count exchange,
CalCumSum) and ``n_token = n - n_count`` token workers (token copies into staging slots). Unlike the
appendix's closed form, the constant overheads stay in, the link saturates, and worker loads are
whole numbers (the scheduler's shares differ by at most one)::

    T_count(n_c) = b_count + L + ceil(E / n_c) * beta + ceil(T * K / n_c) * pair + chain * n_c
                   + cumsum * W * ceil(E_local / n_c)
    T_token(n_t) = b_token + L + ceil(T * d / min(n_t, n_sat)) * (alpha + B * n_sat * nu / eff)
    T_tail       = ceil(T * K / n) * B / reorder_gbps
    T_total      = max(T_count, T_token) + T_tail

``W`` ranks hold ``E_local = E / W`` experts each; ``T`` tokens per rank go to ``K`` experts as
``B``-byte rows. ``L`` is the one-way latency of the farthest hop class (both groups wait for the
farthest rank: its counts, or the arrival of the last copy). ``d`` is the expected number of
destination ranks per token (a token crosses once per rank, UniEP relay; ``d = K`` with one expert
per rank), ``nu`` the mean of ``1 / bandwidth_gbps`` over those copies, ``eff`` the
``link_efficiency``, ``n_sat`` the ``max_token_workers``: each token worker gets ``1 / n_sat`` of the
link. Routing is taken as uniform over experts; skew is the scheduler's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from ubep.checks import check_int
from ubep.topology import Topology
from ubep.tuning.params import CostParams


@dataclass(frozen=True, kw_only=True)
class DispatchShape:
    """One rank's dispatch: ``tokens`` rows of ``bytes_per_token`` bytes, each to ``topk`` of
    ``experts`` experts."""

    tokens: int
    experts: int
    topk: int
    bytes_per_token: int

    def __post_init__(self) -> None:
        check_int("tokens", self.tokens, 0)
        check_int("experts", self.experts, 1)
        check_int("topk", self.topk, 1)
        check_int("bytes_per_token", self.bytes_per_token, 1)
        if self.topk > self.experts:
            raise ValueError(f"topk must be <= experts ({self.experts}), got {self.topk}")


@dataclass(frozen=True)
class Traffic:
    """What a source rank puts on the fabric per token, under uniform routing.

    ``copies_per_token`` is exact (a Fraction) so that, say, 8 copies never round up to an extra
    one per worker. ``ns_per_byte`` (the mean of ``1 / bandwidth_gbps`` over the copies) and
    ``latency_ns`` are each the worst over source ranks: the slowest rank ends the dispatch.
    """

    world_size: int
    experts: int
    topk: int
    copies_per_token: Fraction
    ns_per_byte: float
    latency_ns: float


def traffic(shape: DispatchShape, topology: Topology) -> Traffic:
    """Hop mix of one token's copies over ``topology``.

    A destination rank holds ``E_local = E / W`` experts and is reached with probability
    ``p = 1 - C(E - E_local, K) / C(E, K)``; each class ``h`` then gets ``p * count_h`` copies.

    Example: ``flat(2)`` (self 4000 GB/s; peer 394 GB/s, 1000 ns), ``E=256, K=8``: ``p = 0.99651``,
    ``copies_per_token = 1.99302``, ``ns_per_byte = (1/4000 + 1/394) / 2 = 0.00139404``,
    ``latency_ns = 1000``. ``cm384(256)``, ``E=256, K=8``: ``p = 1/32``, ``copies_per_token = 8``;
    classes of (2, 14, 240) ranks at (784, 392, 392) GB/s -> ``ns_per_byte = 0.00254106``,
    ``latency_ns = 1700``.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a Topology, got {type(topology).__name__}")
    w = topology.world_size
    if shape.experts % w:
        raise ValueError(f"shape.experts ({shape.experts}) must be a multiple of "
                         f"topology.world_size ({w})")
    local = shape.experts // w
    reach = 1 - Fraction(math.comb(shape.experts - local, shape.topk), math.comb(shape.experts, shape.topk))
    counts = torch.nn.functional.one_hot(topology.hops, topology.num_classes).sum(dim=1)  # [W, C]
    inv_bw = [1.0 / bw for bw in topology.bandwidth_gbps]
    # p cancels: sum_h p*count_h/bw_h over p*W copies. Summed in class order on the host: a float64
    # matmul's order (and so its last bit) depends on the CPU's BLAS kernel.
    ns_per_byte = max(sum(c * inv for c, inv in zip(row, inv_bw, strict=True))
                      for row in counts.tolist()) / w
    latency = torch.tensor(topology.latency_ns, dtype=torch.float64)
    latency_ns = float(torch.where(counts > 0, latency, 0.0).max())
    return Traffic(w, shape.experts, shape.topk, reach * w, ns_per_byte, latency_ns)


def count_group_ns(shape: DispatchShape, n_count: int, tr: Traffic, params: CostParams) -> float:
    """``T_count``: counts of every expert, their exchange, then CalCumSum over source ranks.

    Example: ``cm384(256)``, ``E=256`` (``E_local=1``), the ``cm384_ascend`` preset, ``n_count=12``:
    ``500 + 1700 + 175 * ceil(256/12) + 70 * 256 * ceil(1/12) = 500 + 1700 + 3850 + 17920 = 23970``.
    The prefix sum of one local expert is a chain over W sources: more count workers cannot shorten it.
    A one-pass count group (``pair_ns``, ``chain_ns``) splits the ``T * K`` pairs instead, and its
    workers add up the counts of the workers before them: e.g. ``T=4096, K=8, n_count=4``, pair 27,
    chain 100 ns: ``27 * 8192 + 100 * 4 = 221584`` on top of the constants.
    """
    check_int("n_count", n_count, 1)
    local = shape.experts // tr.world_size
    return (params.b_count_ns + tr.latency_ns + params.beta_ns * math.ceil(shape.experts / n_count)
            + params.pair_ns * math.ceil(shape.tokens * shape.topk / n_count)
            + params.chain_ns * n_count
            + params.cumsum_ns_per_source * tr.world_size * math.ceil(local / n_count))


def per_copy_ns(shape: DispatchShape, tr: Traffic, params: CostParams) -> float:
    """One token worker's time for one copy: software cost plus its bytes at ``1 / n_sat`` of the link.

    Example: ``cm384(256)``, ``B=14336``, the ``cm384_ascend`` preset:
    ``100 + 14336 * 24 * 0.00254106 / 1.0 = 974.29``.
    """
    return (params.alpha_ns
            + shape.bytes_per_token * params.max_token_workers * tr.ns_per_byte / params.link_efficiency)


def token_group_ns(shape: DispatchShape, n_token: int, tr: Traffic, params: CostParams) -> float:
    """``T_token``: token copies into staging slots; past ``max_token_workers`` workers only queue.

    Example: ``cm384(256)``, ``T=64, B=14336``, ``cm384_ascend``: 512 copies; ``n_token=36`` counts
    as 24 -> ``ceil(512/24) = 22`` copies each: ``1000 + 1700 + 22 * 974.29 = 24134.3``.
    ``n_token=12``: ``ceil(512/12) = 43`` copies: ``1000 + 1700 + 43 * 974.29 = 44594.3``.
    """
    check_int("n_token", n_token, 1)
    workers = min(n_token, params.max_token_workers)
    copies = math.ceil(shape.tokens * tr.copies_per_token / workers)
    return params.b_token_ns + tr.latency_ns + copies * per_copy_ns(shape, tr, params)


def reorder_tail_ns(shape: DispatchShape, n_workers: int, params: CostParams) -> float:
    """``T_tail``: every worker moves received rows (``T * K`` per rank) to their final place once
    offsets and data are known. Counted whole after the slower group: overlap with a slow token
    group is not modelled, and it does not depend on the split.

    Example: ``T=64, K=8, B=14336, n=48``, ``reorder_gbps=30``: ``ceil(512/48) = 11`` rows each,
    ``11 * 14336 / 30 = 5256.5``.
    """
    check_int("n_workers", n_workers, 1)
    return math.ceil(shape.tokens * shape.topk / n_workers) * shape.bytes_per_token / params.reorder_gbps
