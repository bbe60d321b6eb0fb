"""Cost parameters of the dispatch model: plain numbers, JSON round-trippable, calibrated later.

Where a preset's figure comes from is said next to it: "paper" (the UBEP paper), "measured" (on
H200s, docs/BENCHMARKS.md), "fitted to the paper" (chosen so the model reproduces a
split the paper reports), or "assumption" (a guess that calibration on hardware replaces).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

# Workers per rank: AIVs of one Ascend die (UBEP paper), SMs of one H200.
CM384_AIVS = 48
H200_SMS = 132

_NONNEGATIVE_NS = ("alpha_ns", "beta_ns", "pair_ns", "chain_ns", "b_count_ns", "b_token_ns",
                   "cumsum_ns_per_source", "barrier_ns")


@dataclass(frozen=True, kw_only=True)
class CostParams:
    """Per-worker costs of the two dispatch groups, the reorder tail and the BSP barrier.

    - ``alpha_ns``: software cost of one token copy on one token worker (slot lookup, issue,
      flag), on top of its bytes.
    - ``beta_ns``: cost of one expert's count on one count worker (count, send to its rank).
    - ``pair_ns``: cost per (token, top-k) pair where the count workers split the pairs and order
      each pair within its expert in one pass (the CUDA count group: ``T * K / n_count`` pairs
      each); 0 where a count worker handles whole experts (``beta_ns``).
    - ``chain_ns``: cost per count worker where each one adds up the per-expert counts of the
      workers before it (the CUDA count group: worker ``j`` reads ``j`` rows of counts, the last
      one all of them); 0 where count workers do not depend on one another.
    - ``b_count_ns``, ``b_token_ns``: constant start-up cost of each group, kept in the model
      because at decode batch sizes they are not small next to the variable part.
    - ``cumsum_ns_per_source``: CalCumSum, per source rank and local expert: the exclusive prefix
      sum over source ranks (UniEP's offsets) after checking each source's count has arrived.
    - ``max_token_workers``: token workers that saturate the link; each gets ``1 / max`` of the
      link, so more than ``max`` only queue behind it (UBEP: half of the 48 AIVs saturate).
    - ``link_efficiency``: achieved over the topology's ``bandwidth_gbps`` (1.0 = as stated).
    - ``reorder_gbps``: one worker's local copy rate moving received rows to their final place.
    - ``barrier_ns``: one global barrier (SyncAll) of the BSP baseline.
    """

    name: str
    alpha_ns: float
    beta_ns: float
    pair_ns: float
    chain_ns: float
    b_count_ns: float
    b_token_ns: float
    cumsum_ns_per_source: float
    max_token_workers: int
    link_efficiency: float
    reorder_gbps: float
    barrier_ns: float

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "name":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{f.name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{f.name} must be finite, got {value}")
        for name in _NONNEGATIVE_NS:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not isinstance(self.max_token_workers, int):
            raise TypeError(f"max_token_workers must be an int, got "
                            f"{type(self.max_token_workers).__name__}")
        if self.max_token_workers < 1:
            raise ValueError(f"max_token_workers must be >= 1, got {self.max_token_workers}")
        for name in ("link_efficiency", "reorder_gbps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CostParams:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"text must hold a JSON object, got {type(data).__name__}")
        expected = {f.name for f in fields(cls)}
        if set(data) != expected:
            raise ValueError(f"text must have exactly the keys {sorted(expected)}; missing "
                             f"{sorted(expected - set(data))}, unknown {sorted(set(data) - expected)}")
        return cls(**data)


def cm384_ascend() -> CostParams:
    """One CloudMatrix384 die, 48 AIVs, over :func:`ubep.topology.cm384` (392 GB/s links).

    - ``max_token_workers=24``: paper (half of the AIVs saturate the link; 24 -> 48 cores gives
      minimal benefit, Fig. 3b).
    - ``b_token_ns=1000``: paper (the hierarchical mapper that starts the token group "stays
      within 1 µs").
    - ``beta_ns=175``, ``cumsum_ns_per_source=70``: fitted to the paper for 14 336-byte rows: the
      model then picks 12 count AIVs at 256 ranks, batch 64 and 1 at 128 ranks, batch 128, the
      two allocations the paper reports (§5.2), given the assumptions below and the assumed
      latencies of :func:`ubep.topology.cm384`.
    - ``barrier_ns=3500``: fitted to the paper: two SyncAlls are then about 15 % of the BSP time
      at its default point (128 ranks, batch 64, one expert per die), the share it reports.
    - ``alpha_ns=100``, ``b_count_ns=500``, ``reorder_gbps=30``, ``link_efficiency=1.0``:
      assumptions.
    - ``pair_ns=0``, ``chain_ns=0``: the AIV count workers own whole experts.
    """
    return CostParams(name="cm384-ascend", alpha_ns=100.0, beta_ns=175.0, pair_ns=0.0, chain_ns=0.0,
                      b_count_ns=500.0, b_token_ns=1000.0, cumsum_ns_per_source=70.0,
                      max_token_workers=24, link_efficiency=1.0, reorder_gbps=30.0, barrier_ns=3500.0)


def h200() -> CostParams:
    """One H200 (132 SMs) over :func:`ubep.topology.flat` (394 GB/s measured P2P copy).

    - ``alpha_ns``, ``pair_ns``, ``chain_ns``, ``b_count_ns``, ``b_token_ns``,
      ``max_token_workers``, ``link_efficiency``: fitted to the cuda backend's in-kernel group
      times at EP2 (``benchmarks/calibrate_split.py --refit
      benchmarks/data/calibration-h200-ep2-onepass-2026-12-01.csv``, rounded; errors in
      docs/BENCHMARKS.md). Its count group orders the pairs in one pass, each program adding up the
      counts of the programs before it, and leaves the prefix sums over sources to the receivers:
      ``beta_ns = cumsum_ns_per_source = 0``.
    - ``reorder_gbps=30``, ``barrier_ns=2000``: assumptions (not sampled).
    """
    return CostParams(name="h200", alpha_ns=194.0, beta_ns=0.0, pair_ns=32.4, chain_ns=106.0,
                      b_count_ns=267.0, b_token_ns=7266.0, cumsum_ns_per_source=0.0,
                      max_token_workers=42, link_efficiency=1.254, reorder_gbps=30.0,
                      barrier_ns=2000.0)
