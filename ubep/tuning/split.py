"""The best count/token split by exact search, and the BSP (global barrier) baseline it replaces."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ubep.checks import check_int
from ubep.topology import Topology
from ubep.tuning.model import (
    DispatchShape,
    Traffic,
    count_group_ns,
    per_copy_ns,
    reorder_tail_ns,
    token_group_ns,
    traffic,
)
from ubep.tuning.params import CostParams


@dataclass(frozen=True)
class Split:
    """A split of ``n_count + n_token`` workers and its predicted times, ns.

    ``closed_form_n_count`` is appendix 9's ``(beta / alpha) * n * E / (K * T)``, with the paper's
    ``alpha`` read as this model's cost per top-k slot (``per_copy_ns * d / K``), for comparison.
    """

    n_count: int
    n_token: int
    count_ns: float
    token_ns: float
    tail_ns: float
    total_ns: float
    closed_form_n_count: float


@dataclass(frozen=True)
class BspTime:
    """The BSP dispatch: all workers send, barrier, all workers count and CalCumSum, barrier,
    all workers reorder. Times in ns."""

    send_ns: float
    count_ns: float
    barriers_ns: float
    tail_ns: float
    total_ns: float


def resolve_traffic(shape: DispatchShape, fabric: Topology | Traffic, params: CostParams) -> Traffic:
    """Checks the arguments shared by :func:`best_split` and :func:`bsp_time`; the hop mix."""
    if not isinstance(shape, DispatchShape):
        raise TypeError(f"shape must be a DispatchShape, got {type(shape).__name__}")
    if not isinstance(params, CostParams):
        raise TypeError(f"params must be a CostParams, got {type(params).__name__}")
    if isinstance(fabric, Topology):
        return traffic(shape, fabric)
    if not isinstance(fabric, Traffic):
        raise TypeError(f"fabric must be a Topology or a Traffic, got {type(fabric).__name__}")
    if (fabric.experts, fabric.topk) != (shape.experts, shape.topk):
        raise ValueError(f"fabric was built for experts={fabric.experts}, topk={fabric.topk}; "
                         f"shape has experts={shape.experts}, topk={shape.topk}")
    return fabric


def best_split(shape: DispatchShape, n_workers: int, fabric: Topology | Traffic,
               params: CostParams) -> Split:
    """The ``n_count`` in ``[1, n_workers - 1]`` with the least ``T_total``; ties go to fewer count
    workers (the paper: extra count workers add scheduling and contention for no gain).

    Example: ``cm384(256)``, ``T=64, E=256, K=8, B=14336``, 48 AIVs, ``cm384_ascend``:
    ``T_token = 24134.3`` for any ``n_count <= 24`` (24 or more token workers count as 24), and
    ``T_count(11) = 500 + 1700 + 175 * 24 + 17920 = 24320`` is above it while
    ``T_count(12) = 23970`` is below, so ``n_count = 12``, ``total = 24134.3 + 5256.5 = 29390.8``.
    The closed form says 4.31: it ignores the constants and the CalCumSum chain over 256 sources.
    """
    check_int("n_workers", n_workers, 2)
    tr = resolve_traffic(shape, fabric, params)
    tail = reorder_tail_ns(shape, n_workers, params)
    best: tuple[float, int, float, float] | None = None
    for n_count in range(1, n_workers):
        t_count = count_group_ns(shape, n_count, tr, params)
        t_token = token_group_ns(shape, n_workers - n_count, tr, params)
        total = max(t_count, t_token)
        if best is None or total < best[0]:  # strict: the first (fewest count workers) wins ties
            best = (total, n_count, t_count, t_token)
    total, n_count, t_count, t_token = best
    alpha_slot_ns = per_copy_ns(shape, tr, params) * float(tr.copies_per_token) / shape.topk
    closed = (math.inf if shape.tokens == 0 else
              params.beta_ns / alpha_slot_ns * n_workers * shape.experts / (shape.topk * shape.tokens))
    return Split(n_count, n_workers - n_count, t_count, t_token, tail, total + tail, closed)


def best_count(shape: DispatchShape, n_max: int, fabric: Topology | Traffic,
               params: CostParams) -> int:
    """The ``n_count`` in ``[1, n_max]`` with the least ``T_count``, for a count group whose
    workers take no slots from the token group (no worker budget to split); ties go to fewer.

    Example: ``flat(1)``, ``T=4096, E=256, K=8``, the ``h200`` preset (``pair_ns=32.4``,
    ``chain_ns=106``), ``n_max=256``: ``32.4 * ceil(32768 / n) + 106 * n`` is least at ``n = 99``
    (``32.4 * 331 + 106 * 99 = 21218.4`` on top of the constants); ``T=1024``: ``n = 50``.
    """
    check_int("n_max", n_max, 1)
    tr = resolve_traffic(shape, fabric, params)
    return min(range(1, n_max + 1), key=lambda n: count_group_ns(shape, n, tr, params))


def bsp_time(shape: DispatchShape, n_workers: int, fabric: Topology | Traffic,
             params: CostParams) -> BspTime:
    """The same work in phases behind two global barriers (UBEP Fig. 2: SyncAll after sending,
    SyncAll after flag verification), every phase on all ``n_workers``.

    Example: ``cm384(128)``, ``T=64, E=128, K=8, B=14336``, 48 AIVs, ``cm384_ascend``:
    ``send = 1000 + 1700 + 22 * 970.86 = 24058.9``, ``count = 500 + 1700 + 175 * 3 + 70 * 128 = 11685``,
    ``barriers = 7000``, ``tail = 5256.5``: ``total = 48000.4`` (decomposed, 2 count AIVs: 29315.4).
    """
    check_int("n_workers", n_workers, 1)
    tr = resolve_traffic(shape, fabric, params)
    send = token_group_ns(shape, n_workers, tr, params)
    count = count_group_ns(shape, n_workers, tr, params)
    barriers = 2 * params.barrier_ns
    tail = reorder_tail_ns(shape, n_workers, params)
    return BspTime(send, count, barriers, tail, send + count + barriers + tail)
