"""Assign one source rank's tokens to ``n`` workers (AIVs / thread blocks) that send them.

Inputs, per source rank: ``counts_D [D]`` int64, tokens for each destination (expert or rank) in
the natural order, and ``hop_D [D]`` int64, each destination's hop class from this source (e.g.
``topology.hops[src][rank_of_dest]``). Each destination's tokens are numbered ``0..counts-1``.

Every variant lays the destinations out in some order, cuts the token sequence in that order into
contiguous slices, and gives each worker its slices as *pieces* ``(dest, start, length)``:

- :func:`expert_contiguous`: whole destinations, ``ceil(D / n)`` per worker (CANN EP);
- :func:`load_balanced`: natural order, ``n`` slices equal to within one token (topology-agnostic);
- :func:`hop_aware`: the paper's transposition order (:func:`transpose_order`), then the same
  equal slices; it never reads ``hop_D``;
- :func:`hop_balanced`, UBEP's mapper (:data:`DEFAULT_VARIANT`): each hop class cut on its own,
  so totals are within one token *and* ``v[j, h] <= ceil(V[h] / n)`` holds exactly.

The paper derives its mapper from the per-hop bound (latency homogenization) and builds it from a
transposition plus equal slices. That pair meets the bound when every destination has one token
and each class is one contiguous run of destinations, but not in general: a hot destination's
tokens stay contiguous, so its slice is mostly one class. Counterexample: ``counts_D = [1, 1, 1,
5]``, ``hop_D = [0, 0, 1, 1]``, ``n = 2``: the order is ``[0, 2, 1, 3]``, the slices are tokens
``[0, 4)`` and ``[4, 8)``, and worker 0 sends 2 class-0 tokens (bound ``ceil(2 / 2) = 1``) while
worker 1 sends 4 class-1 tokens (bound ``ceil(6 / 2) = 3``). :func:`hop_balanced` gives each
worker 1 class-0 and 3 class-1 tokens, with the same parts (contiguous slices found by quaternary
search), so it is UBEP's mapper here: the simulator runs it as UBEP, and the C++ twin gives each
kernel worker its own share (``hop_balanced_slice`` in ``scheduler/include/ubep/mapping.h``).

Running example below: ``counts_D = [3, 1, 2, 0, 1, 0]``, ``hop_D = [0, 0, 1, 1, 2, 2]``,
``n = 2``; ``M = 7`` tokens, class totals ``V = [4, 2, 1]``, bound ``[2, 1, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ubep.scheduler.search import check_int_vector, quaternary_search
from ubep.topology import Topology


def _check_workers(num_workers: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
        raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")


def _check_counts(counts_D: torch.Tensor, hop_D: torch.Tensor | None = None) -> None:
    check_int_vector("counts_D", counts_D)
    if counts_D.numel() and int(counts_D.min()) < 0:
        raise ValueError(f"counts_D must be >= 0, got min {int(counts_D.min())}")
    if hop_D is not None:
        check_int_vector("hop_D", hop_D)
        if hop_D.shape != counts_D.shape:
            raise ValueError(f"hop_D must have counts_D's shape {tuple(counts_D.shape)}, "
                             f"got {tuple(hop_D.shape)}")
        if hop_D.numel() and int(hop_D.min()) < 0:
            raise ValueError(f"hop_D must be >= 0, got min {int(hop_D.min())}")


@dataclass(frozen=True, eq=False)
class Assignment:
    """Pieces per worker, in CSR form: worker ``j`` sends pieces ``worker_ptr[j]:worker_ptr[j+1]``.

    - ``worker_ptr``: ``[n + 1]`` int64, non-decreasing, from 0 to ``P``;
    - ``dest``, ``start``, ``length``: ``[P]`` int64; a piece is tokens
      ``[start, start + length)`` of destination ``dest``, ``length >= 1``.

    Running example, :func:`hop_aware`: ``worker_ptr = [0, 2, 5]``, ``dest = [0, 2, 2, 4, 1]``,
    ``start = [0, 0, 1, 0, 0]``, ``length = [3, 1, 1, 1, 1]``.
    """

    worker_ptr: torch.Tensor
    dest: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("worker_ptr", "dest", "start", "length"):
            check_int_vector(name, getattr(self, name))
        p = self.worker_ptr
        if p.numel() < 2 or int(p[0]) != 0 or int(p[-1]) != self.dest.numel() or bool((p.diff() < 0).any()):
            raise ValueError(f"worker_ptr must rise from 0 to the piece count {self.dest.numel()} "
                             f"with at least one worker, got {p.tolist()}")
        if not self.dest.shape == self.start.shape == self.length.shape:
            raise ValueError("dest, start and length must have one entry per piece")
        if self.dest.numel() and (int(self.dest.min()) < 0 or int(self.start.min()) < 0
                                  or int(self.length.min()) < 1):
            raise ValueError("pieces need dest >= 0, start >= 0 and length >= 1")

    @property
    def num_workers(self) -> int:
        return self.worker_ptr.numel() - 1

    def piece_worker(self) -> torch.Tensor:
        """``[P]`` int64, the worker of each piece. Running example: ``[0, 0, 1, 1, 1]``."""
        return torch.repeat_interleave(torch.arange(self.num_workers), self.worker_ptr.diff())

    def worker_totals(self) -> torch.Tensor:
        """``[n]`` int64 tokens per worker. Running example, :func:`hop_aware`: ``[4, 3]``."""
        return torch.zeros(self.num_workers, dtype=torch.int64).index_add_(0, self.piece_worker(),
                                                                           self.length)

    def worker_class_counts(self, hop_D: torch.Tensor, num_classes: int) -> torch.Tensor:
        """``[n, C]`` int64 tokens per worker and hop class, ``v[j, h]``.

        Running example, :func:`hop_aware`: ``[[3, 1, 0], [1, 1, 1]]``.
        """
        check_int_vector("hop_D", hop_D)
        if self.dest.numel() and int(self.dest.max()) >= hop_D.numel():
            raise ValueError(f"hop_D must cover destination {int(self.dest.max())}, has {hop_D.numel()}")
        if hop_D.numel() and not 0 <= int(hop_D.min()) <= int(hop_D.max()) < num_classes:
            raise ValueError(f"hop_D values must lie in [0, {num_classes}), "
                             f"got [{int(hop_D.min())}, {int(hop_D.max())}]")
        flat = self.piece_worker() * num_classes + hop_D[self.dest]
        out = torch.zeros(self.num_workers * num_classes, dtype=torch.int64)
        return out.index_add_(0, flat, self.length).view(self.num_workers, num_classes)


def transpose_order(num_dests: int, num_workers: int) -> torch.Tensor:
    """The remapped destination order, ``[D]`` int64: destination at each position.

    Lay destinations row-major into ``k = ceil(D / n)`` rows of ``n`` columns, one column per
    worker (the last row may be short), and read column-major. With one token per destination
    the equal slices of :func:`slice_bounds` then coincide with the columns, so worker ``j`` sends
    destinations ``j, j + n, j + 2n, ...``: a stride across all ranks and boards, hence a mix
    of hop classes. Example, ``D = 10``, ``n = 4``::

        0 1 2 3
        4 5 6 7      ->  [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]
        8 9

    The other reading of the paper, ``n`` rows (row ``j`` = :func:`expert_contiguous`'s worker
    ``j``) read column-major, strides only once a slice spans a whole column (``D >= n * n``);
    below that a slice is a run of adjacent rows. Example: ``D = 6``, ``n = 3``, one token per
    destination, ``hop_D = [0, 0, 0, 1, 1, 1]``: rows ``[0, 1], [2, 3], [4, 5]`` read as
    ``[0, 2, 4, 1, 3, 5]`` give worker 0 destinations 0 and 2, two class-0 tokens against a
    bound of 1; the order above gives each worker one token of each class.
    """
    _check_workers(num_workers)
    if isinstance(num_dests, bool) or not isinstance(num_dests, int) or num_dests < 0:
        raise ValueError(f"num_dests must be a non-negative int, got {num_dests!r}")
    k = -(-num_dests // num_workers)
    d = torch.arange(num_dests)
    return torch.argsort((d % num_workers) * k + d // num_workers)


def slice_bounds(total: int, num_workers: int) -> torch.Tensor:
    """``[n + 1]`` int64 token bounds of ``n`` slices of ``total`` tokens; the first
    ``total % n`` slices hold one token more. Worker ``j`` gets ``[b[j], b[j + 1])``,
    ``b[j] = j * (total // n) + min(j, total % n)``. Example: ``total = 10``, ``n = 4``:
    ``[0, 3, 6, 8, 10]``.
    """
    _check_workers(num_workers)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"total must be a non-negative int, got {total!r}")
    j = torch.arange(num_workers + 1)
    return j * (total // num_workers) + j.clamp(max=total % num_workers)


def per_hop_bound(counts_D: torch.Tensor, hop_D: torch.Tensor, num_classes: int,
                  num_workers: int) -> torch.Tensor:
    """``[C]`` int64, the paper's capacity ``ceil(V[h] / n)``, ``V[h]`` the class's tokens.

    Running example: ``V = [4, 2, 1]``, bound ``[2, 1, 1]``.
    """
    _check_counts(counts_D, hop_D)
    _check_workers(num_workers)
    if hop_D.numel() and int(hop_D.max()) >= num_classes:
        raise ValueError(f"hop_D values must be < num_classes = {num_classes}, got {int(hop_D.max())}")
    totals_C = torch.zeros(num_classes, dtype=torch.int64).index_add_(0, hop_D, counts_D)
    return -torch.div(-totals_C, num_workers, rounding_mode="floor")


def _cut(order_D: torch.Tensor, counts_D: torch.Tensor, lo_S: torch.Tensor, hi_S: torch.Tensor,
         num_workers: int) -> Assignment:
    """Pieces of slices ``[lo_S, hi_S)`` of the token sequence laid out in ``order_D``.

    Slices come worker-major, ``S / n`` per worker. Each slice's ends are located by quaternary
    search; the positions between them become pieces, and empty destinations are dropped.
    Running example, natural order (cumulative ``[3, 4, 6, 6, 7, 7]``), slice ``[4, 7)``:
    ``4 -> (2, 0)``, ``7 -> (6, 0)``, so positions 2..5 and pieces ``(2, 0, 2), (4, 0, 1)``
    (destinations 3 and 5 are empty).
    """
    counts_P = counts_D[order_D]
    cumsum_P = torch.cumsum(counts_P, 0)
    a = quaternary_search(cumsum_P, lo_S)
    b = quaternary_search(cumsum_P, hi_S)
    # The slice's last position is b's, unless the slice ends exactly at a block boundary.
    num_pos = (b.position - (b.offset == 0).long() - a.position + 1).clamp(min=0)
    slice_of = torch.repeat_interleave(torch.arange(lo_S.numel()), num_pos)
    first = torch.cumsum(num_pos, 0) - num_pos
    pos = a.position[slice_of] + torch.arange(slice_of.numel()) - first[slice_of]
    start = torch.where(pos == a.position[slice_of], a.offset[slice_of], 0)
    end = torch.where(pos == b.position[slice_of], b.offset[slice_of], counts_P[pos])
    keep = end > start
    worker = torch.div(slice_of[keep], lo_S.numel() // num_workers, rounding_mode="floor")
    ptr = torch.cat([torch.zeros(1, dtype=torch.int64),
                     torch.cumsum(torch.bincount(worker, minlength=num_workers), 0)])
    return Assignment(ptr, order_D[pos[keep]], start[keep], (end - start)[keep])


def _prefix(counts: torch.Tensor) -> torch.Tensor:
    """Exclusive-and-total prefix sum, ``[len + 1]``. Example: ``[3, 0, 2]`` -> ``[0, 3, 3, 5]``."""
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def expert_contiguous(counts_D: torch.Tensor, num_workers: int) -> Assignment:
    """Worker ``j`` sends all tokens of destinations ``[j * k, (j + 1) * k)``, ``k = ceil(D / n)``.

    Hot destinations overload their worker. Running example: ``k = 3``, worker 0 sends
    ``(0, 0, 3), (1, 0, 1), (2, 0, 2)``, worker 1 ``(4, 0, 1)``: totals ``[6, 1]``.
    """
    _check_counts(counts_D)
    _check_workers(num_workers)
    k = -(-counts_D.numel() // num_workers)
    rows = (torch.arange(num_workers + 1) * k).clamp(max=counts_D.numel())
    bounds = _prefix(counts_D)[rows]
    return _cut(torch.arange(counts_D.numel()), counts_D, bounds[:-1], bounds[1:], num_workers)


def load_balanced(counts_D: torch.Tensor, num_workers: int) -> Assignment:
    """Equal slices (:func:`slice_bounds`) of the tokens in the natural order, topology-agnostic.

    Running example: bounds ``[0, 4, 7]``; worker 0 gets ``(0, 0, 3), (1, 0, 1)``, worker 1
    ``(2, 0, 2), (4, 0, 1)``; class counts ``[[4, 0, 0], [0, 2, 1]]``, over the bound
    ``[2, 1, 1]`` in classes 0 and 1.
    """
    _check_counts(counts_D)
    _check_workers(num_workers)
    bounds = slice_bounds(int(counts_D.sum()), num_workers)
    return _cut(torch.arange(counts_D.numel()), counts_D, bounds[:-1], bounds[1:], num_workers)


def hop_aware(counts_D: torch.Tensor, num_workers: int) -> Assignment:
    """The paper's transposition read literally: :func:`transpose_order`, then equal slices.

    Totals are within one token; the per-hop bound is not guaranteed (module docstring), as it
    spreads destinations by index without knowing their classes. Kept as a baseline.
    Running example: order ``[0, 2, 4, 1, 3, 5]`` (cumulative ``[3, 5, 6, 7, 7, 7]``), bounds
    ``[0, 4, 7]`` located at ``(0, 0), (1, 1), (6, 0)``: worker 0 gets ``(0, 0, 3), (2, 0, 1)``,
    worker 1 ``(2, 1, 1), (4, 0, 1), (1, 0, 1)``; class counts ``[[3, 1, 0], [1, 1, 1]]``,
    still over the bound in class 0.
    """
    _check_counts(counts_D)
    bounds = slice_bounds(int(counts_D.sum()), num_workers)
    return _cut(transpose_order(counts_D.numel(), num_workers), counts_D, bounds[:-1], bounds[1:],
                num_workers)


def hop_balanced(counts_D: torch.Tensor, hop_D: torch.Tensor, num_workers: int) -> Assignment:
    """UBEP's mapper (:data:`DEFAULT_VARIANT`): ``v[j, h] <= ceil(V[h] / n)`` and totals within one.

    Destinations are taken class by class (natural order inside a class) and each class ``h``'s
    ``V[h]`` tokens are cut into ``n`` contiguous slices, one per worker: ``V[h] // n`` tokens,
    plus one spare for ``r[h] = V[h] % n`` of them. Class ``h``'s spares go to workers ``o[h],
    ..., o[h] + r[h] - 1`` (mod ``n``), ``o[h]`` being the spares dealt before it (mod ``n``):
    the spares go round the workers without restarting, so worker ``j`` ends with
    ``M // n + (j < M % n)`` tokens, the totals of :func:`slice_bounds`. A worker's pieces come
    by class, then destination.

    The classes are dealt nearest first, then from the farthest down (``0, C-1, ..., 1``). Once
    the spares wrap past worker ``n - 1``, workers ``0 .. M % n - 1`` hold a spare of the first
    class dealt and one of the last; dealing the farthest class second puts its spares on
    workers with one spare, so fewer workers with an extra token pay its latency (objective (1)).
    Example: ``counts_D = [2, 3, 1]``, ``hop_D = [0, 1, 2]``, ``n = 4``: class 0 goes to workers
    0, 1, class 2 to worker 2, class 1 to workers 3, 0, 1; ``v = [[1, 1, 0], [1, 1, 0],
    [0, 0, 1], [0, 1, 0]]``. Dealt 0, 1, 2, class 2 would wrap onto worker 1: ``v[1] = [1, 0,
    1]``, two tokens and the two-hop latency on one worker.

    Running example: ``V = [4, 2, 1]``, ``r = [0, 0, 1]``, ``o = [0, 1, 0]``; class sizes per
    worker ``[[2, 1, 1], [2, 1, 0]]``: worker 0 gets ``(0, 0, 2), (2, 0, 1), (4, 0, 1)``,
    worker 1 ``(0, 2, 1), (1, 0, 1), (2, 1, 1)``.
    """
    _check_counts(counts_D, hop_D)
    _check_workers(num_workers)
    n = num_workers
    num_classes = int(hop_D.max()) + 1 if hop_D.numel() else 1
    order_D = torch.argsort(hop_D, stable=True)
    totals_C = torch.zeros(num_classes, dtype=torch.int64).index_add_(0, hop_D, counts_D)
    spare_C = totals_C % n
    deal = torch.cat([torch.zeros(1, dtype=torch.int64), torch.arange(num_classes - 1, 0, -1)])
    dealt_before = torch.cumsum(spare_C[deal], 0) - spare_C[deal]
    offset_C = torch.empty_like(spare_C).index_put_((deal,), dealt_before % n)
    j = torch.arange(n).unsqueeze(1)
    sizes_NC = totals_C // n + ((j - offset_C) % n < spare_C).long()
    # Class h's block starts after all earlier classes; its slices follow in worker order.
    lo_NC = _prefix(totals_C)[:-1] + torch.cumsum(sizes_NC, 0) - sizes_NC
    return _cut(order_D, counts_D, lo_NC.reshape(-1), (lo_NC + sizes_NC).reshape(-1), n)


VARIANTS = ("expert_contiguous", "load_balanced", "hop_aware", "hop_balanced")
DEFAULT_VARIANT = "hop_balanced"  # UBEP's mapper: the only variant that meets the per-hop bound


def schedule(variant: str, counts_D: torch.Tensor, hop_D: torch.Tensor, num_workers: int) -> Assignment:
    """Run one of :data:`VARIANTS` by name (only ``hop_balanced`` reads ``hop_D``)."""
    if variant == "hop_balanced":
        return hop_balanced(counts_D, hop_D, num_workers)
    if variant == "expert_contiguous":
        return expert_contiguous(counts_D, num_workers)
    if variant == "load_balanced":
        return load_balanced(counts_D, num_workers)
    if variant == "hop_aware":
        return hop_aware(counts_D, num_workers)
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def worker_latency_ns(class_counts_NC: torch.Tensor, topology: Topology, token_bytes: int) -> torch.Tensor:
    """``[n]`` float64 estimate of each worker's send time, the paper's objective (1).

    ``sum_h v[j, h] * l[h] + max(latency_ns[h] for classes with v[j, h] > 0)`` (0 for an idle
    worker), where ``l[h] = token_bytes * n / bandwidth_gbps[h]`` ns: the ``n`` workers send at
    once and share the rank's bandwidth of a class equally. Example: ``flat(2)`` (one-hop 1000 ns,
    394 GB/s), ``token_bytes = 197``, ``n = 2``: ``l[1] = 1`` ns, so ``v = [[0, 5], [0, 0]]``
    gives ``[1005.0, 0.0]``.
    """
    if class_counts_NC.dim() != 2 or class_counts_NC.shape[1] != topology.num_classes:
        raise ValueError(f"class_counts_NC must be [n, {topology.num_classes}], got "
                         f"{tuple(class_counts_NC.shape)}")
    if token_bytes <= 0:
        raise ValueError(f"token_bytes must be > 0, got {token_bytes}")
    n = class_counts_NC.shape[0]
    token_ns_C = token_bytes * n / torch.tensor(topology.bandwidth_gbps, dtype=torch.float64)
    latency_C = torch.tensor(topology.latency_ns, dtype=torch.float64)
    v = class_counts_NC.to(torch.float64)
    worst = torch.where(class_counts_NC > 0, latency_C, 0.0).amax(1)
    return (v * token_ns_C).sum(1) + worst
