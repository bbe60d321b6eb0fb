"""Fit :class:`CostParams` to measured group times by linear least squares.

Each sample is one group's time from in-kernel timestamps (count group, token group, or reorder
tail), so each group's model is linear in its unknowns once ``max_token_workers`` is fixed:

- count:   ``t - L = b_count + beta * ceil(E / n_c) + pair * ceil(T * K / n_c) + chain * n_c
  + cumsum * W * ceil(E_local / n_c)``, over the terms asked for (the rest kept)
- token:   ``t - L = b_token + alpha * c + (1 / eff) * c * B * n_sat * nu``, ``c`` copies per worker
- reorder: ``t = (1 / reorder_gbps) * ceil(T * K / n) * B``

``max_token_workers`` (``n_sat``) is found by exact search: one fit per candidate in
``[1, largest n_token sampled]``, keeping the least squared error. Totals alone would make the
model a ``max`` of two planes, not linear; they are not accepted here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ubep.checks import check_int
from ubep.topology import Topology
from ubep.tuning.model import (
    DispatchShape,
    Traffic,
    count_group_ns,
    reorder_tail_ns,
    token_group_ns,
    traffic,
)
from ubep.tuning.params import CostParams

GROUPS = ("count", "token", "reorder")


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured group time: ``group`` of a dispatch of ``shape`` split ``n_count`` of
    ``n_workers`` workers (``reorder`` runs on all of them), ``time_ns`` long."""

    shape: DispatchShape
    n_workers: int
    n_count: int
    group: str
    time_ns: float

    def __post_init__(self) -> None:
        if not isinstance(self.shape, DispatchShape):
            raise TypeError(f"shape must be a DispatchShape, got {type(self.shape).__name__}")
        check_int("n_workers", self.n_workers, 2)
        check_int("n_count", self.n_count, 1)
        if self.n_count >= self.n_workers:
            raise ValueError(f"n_count must be < n_workers ({self.n_workers}), got {self.n_count}")
        if self.group not in GROUPS:
            raise ValueError(f"group must be one of {GROUPS}, got {self.group!r}")
        if not (isinstance(self.time_ns, int | float) and math.isfinite(self.time_ns)
                and self.time_ns >= 0):
            raise ValueError(f"time_ns must be a finite number >= 0, got {self.time_ns!r}")


@dataclass(frozen=True)
class Calibration:
    """Fitted parameters and how well they reproduce the samples."""

    params: CostParams
    rms_error_ns: float
    max_rel_error: float


def predict(sample: Sample, tr: Traffic, params: CostParams) -> float:
    """The model's time for ``sample``'s group.

    Example: a ``token`` sample with ``n_workers=48, n_count=12`` is ``token_group_ns(shape, 36, ...)``
    (24134.3 for ``cm384(256)``, ``T=64, E=256, K=8, B=14336``, ``cm384_ascend``).
    """
    if sample.group == "count":
        return count_group_ns(sample.shape, sample.n_count, tr, params)
    if sample.group == "token":
        return token_group_ns(sample.shape, sample.n_workers - sample.n_count, tr, params)
    return reorder_tail_ns(sample.shape, sample.n_workers, params)


def _lstsq(rows: list[list[float]], y: list[float], times: list[float],
           what: str) -> tuple[np.ndarray, float]:
    """Least squares of the relative error: each sample's row and target divided by its measured
    time (samples span microseconds to milliseconds; absolute errors would let the longest decide)."""
    weight = 1.0 / np.maximum(np.array(times, dtype=np.float64), 1.0)[:, None]
    a, b = np.array(rows, dtype=np.float64) * weight, np.array(y, dtype=np.float64) * weight[:, 0]
    scale = np.linalg.norm(a, axis=0)  # columns span 1 to ~1e6: solve on unit columns
    if not scale.all() or np.linalg.matrix_rank(a / scale) < a.shape[1]:
        raise ValueError(f"samples do not determine {what}: vary the shape and split more")
    coef = np.linalg.lstsq(a / scale, b, rcond=None)[0] / scale
    return coef, float(np.sum((a @ coef - b) ** 2))


COUNT_TERMS = ("b_count_ns", "beta_ns", "cumsum_ns_per_source", "pair_ns", "chain_ns")


def _count_fit(samples: list[Sample], tr: dict[tuple[int, int], Traffic], base: CostParams,
               terms: Sequence[str]) -> dict[str, float]:
    """The count group's ``terms`` (a subset of :data:`COUNT_TERMS`); the others as in ``base``."""
    unknown = set(terms) - set(COUNT_TERMS)
    if unknown or not terms:
        raise ValueError(f"count_terms must be a non-empty subset of {COUNT_TERMS}, got {tuple(terms)}")
    rows, y = [], []
    for s in samples:
        t = tr[s.shape.experts, s.shape.topk]
        local = s.shape.experts // t.world_size
        column = {"b_count_ns": 1.0, "beta_ns": math.ceil(s.shape.experts / s.n_count),
                  "cumsum_ns_per_source": t.world_size * math.ceil(local / s.n_count),
                  "pair_ns": math.ceil(s.shape.tokens * s.shape.topk / s.n_count),
                  "chain_ns": s.n_count}
        rows.append([column[name] for name in terms])
        kept = sum(getattr(base, name) * value for name, value in column.items() if name not in terms)
        y.append(s.time_ns - t.latency_ns - kept)
    coef = _lstsq(rows, y, [s.time_ns for s in samples], ", ".join(terms))[0]
    return {name: max(float(c), 0.0) for name, c in zip(terms, coef, strict=True)}


def _token_fit(samples: list[Sample], tr: dict[tuple[int, int], Traffic]) -> tuple[np.ndarray, int]:
    best: tuple[float, int, np.ndarray] | None = None
    for n_sat in range(1, max(s.n_workers - s.n_count for s in samples) + 1):
        rows, y = [], []
        for s in samples:
            t = tr[s.shape.experts, s.shape.topk]
            copies = math.ceil(s.shape.tokens * t.copies_per_token / min(s.n_workers - s.n_count, n_sat))
            rows.append([1.0, copies, copies * s.shape.bytes_per_token * n_sat * t.ns_per_byte])
            y.append(s.time_ns - t.latency_ns)
        try:
            coef, sse = _lstsq(rows, y, [s.time_ns for s in samples],
                               "b_token_ns, alpha_ns and link_efficiency")
        except ValueError:
            continue  # this n_sat makes two columns proportional; another may not
        if best is None or sse < best[0]:
            best = (sse, n_sat, coef)
    if best is None:
        raise ValueError("samples do not determine b_token_ns, alpha_ns and link_efficiency: vary "
                         "bytes_per_token and the token worker count, on both sides of saturation")
    return best[2], best[1]


def calibrate(samples: Sequence[Sample], topology: Topology, base: CostParams,
              count_terms: Sequence[str] = COUNT_TERMS) -> Calibration:
    """Fit the groups that have samples; the rest, and ``barrier_ns``, stay as in ``base``. Of the
    count group, only ``count_terms``: a group that owns whole experts has no ``pair`` / ``chain``
    cost, a one-pass group no ``beta`` / ``cumsum`` (samples of one expert count cannot tell them
    apart).

    A negative ``b_*``, ``alpha``, ``beta``, ``pair``, ``chain`` or ``cumsum`` estimate means that term
    is below the noise: it is set to 0 and the reported error is that of the parameters returned.

    Example: token samples made by :func:`predict` from ``h200()`` on ``flat(2)``, over
    ``T in {64, 512}``, ``B in {7168, 14336}``, ``n_token in {8, 16, 48, 130}``, give back its
    ``alpha_ns``, ``b_token_ns``, ``link_efficiency`` and ``max_token_workers``.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("samples must not be empty")
    if not all(isinstance(s, Sample) for s in samples):
        raise TypeError("samples must all be Sample")
    if not isinstance(base, CostParams):
        raise TypeError(f"base must be a CostParams, got {type(base).__name__}")
    tr = {}
    for s in samples:
        key = (s.shape.experts, s.shape.topk)
        if key not in tr:
            tr[key] = traffic(s.shape, topology)
    by_group = {g: [s for s in samples if s.group == g] for g in GROUPS}
    fitted: dict[str, float | int] = {}
    if by_group["count"]:
        fitted.update(_count_fit(by_group["count"], tr, base, tuple(count_terms)))
    if by_group["token"]:
        (b, alpha, inv_eff), n_sat = _token_fit(by_group["token"], tr)
        if inv_eff <= 0:
            raise ValueError(f"samples give a non-positive byte cost ({inv_eff:.3g}): link_efficiency "
                             "is not determined; vary bytes_per_token")
        fitted.update(b_token_ns=max(float(b), 0.0), alpha_ns=max(float(alpha), 0.0),
                      link_efficiency=1.0 / float(inv_eff), max_token_workers=n_sat)
    if by_group["reorder"]:
        rows = [[math.ceil(s.shape.tokens * s.shape.topk / s.n_workers) * s.shape.bytes_per_token]
                for s in by_group["reorder"]]
        times = [s.time_ns for s in by_group["reorder"]]
        (inv_gbps,), _ = _lstsq(rows, times, times, "reorder_gbps")
        if inv_gbps <= 0:
            raise ValueError(f"samples give a non-positive reorder cost ({inv_gbps:.3g})")
        fitted["reorder_gbps"] = 1.0 / float(inv_gbps)
    params = replace(base, **fitted)
    errors = [(predict(s, tr[s.shape.experts, s.shape.topk], params), s.time_ns) for s in samples]
    rms = math.sqrt(sum((p - t) ** 2 for p, t in errors) / len(errors))
    rel = max((abs(p - t) / t for p, t in errors if t > 0), default=0.0)
    return Calibration(params, rms, rel)
