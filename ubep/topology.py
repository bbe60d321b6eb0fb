"""Which rank pairs are how many switch tiers apart, and what each tier costs.

A :class:`Topology` holds a ``[W, W]`` matrix of *hop classes* (0 = same device, or the other die of
the same package; 1 = one switch tier; 2 = two tiers; ...) and, per class, a one-way latency and a
per-rank link bandwidth. The scheduler balances each class across workers; the simulator and the
cost model turn classes into time.

Presets build nested groups: ``tiers=(2, 16)`` means ranks ``2i, 2i+1`` share a package (class 0),
ranks in the same block of 16 share a first-tier switch (class 1), everything else crosses the second
tier (class 2). Example: ``hierarchical("x", 32, (2, 16), ...)`` gives ``hop(0, 1) == 0``,
``hop(0, 5) == 1``, ``hop(0, 20) == 2``.

Figures that the sources give are marked as such in ``docs/ALGORITHMS.md``; the rest are assumptions
a later calibration replaces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class Topology:
    """Hop class per (source, destination) rank pair and the cost of each class.

    - ``hops``: ``[W, W]`` int64, ``hops[s, d]`` in ``[0, C)``, 0 on the diagonal;
    - ``class_names``, ``latency_ns``, ``bandwidth_gbps``: ``C`` entries each; latency is one-way
      (non-decreasing with the class), bandwidth is what one rank can push over that class, GB/s.
    """

    name: str
    hops: torch.Tensor
    class_names: tuple[str, ...]
    latency_ns: tuple[float, ...]
    bandwidth_gbps: tuple[float, ...]

    def __post_init__(self) -> None:
        h = self.hops
        if not isinstance(h, torch.Tensor) or h.dim() != 2 or h.shape[0] != h.shape[1]:
            raise ValueError(f"hops must be a square [W, W] tensor, got {getattr(h, 'shape', h)}")
        if h.dtype != torch.int64:
            raise TypeError(f"hops must be int64, got {h.dtype}")
        num_classes = len(self.class_names)
        for field in ("latency_ns", "bandwidth_gbps"):
            if len(getattr(self, field)) != num_classes:
                raise ValueError(f"{field} must have one entry per class ({num_classes}), "
                                 f"got {len(getattr(self, field))}")
        if h.numel() and (int(h.min()) < 0 or int(h.max()) >= num_classes):
            raise ValueError(f"hops values must be in [0, {num_classes}), "
                             f"got [{int(h.min())}, {int(h.max())}]")
        if h.numel() and bool((h.diagonal() != 0).any()):
            raise ValueError("hops must be 0 on the diagonal (a rank reaching itself)")
        if any(v <= 0 for v in self.bandwidth_gbps) or any(v < 0 for v in self.latency_ns):
            raise ValueError("bandwidth_gbps must be > 0 and latency_ns >= 0 for every class")
        if list(self.latency_ns) != sorted(self.latency_ns):
            raise ValueError(f"latency_ns must not decrease with the hop class, got "
                             f"{self.latency_ns}")

    @property
    def world_size(self) -> int:
        return self.hops.shape[0]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def hop(self, src: int, dst: int) -> int:
        return int(self.hops[src, dst])

    def class_counts(self, src: int, dest_ranks: torch.Tensor) -> torch.Tensor:
        """``[C]`` int64: how many of ``dest_ranks`` (any shape, ``-1`` ignored) are in each class."""
        d = dest_ranks.reshape(-1)
        d = d[d >= 0].long()
        return torch.bincount(self.hops[src][d], minlength=self.num_classes)

    def transfer_ns(self, src: int, dst: int, num_bytes: int) -> float:
        """Latency plus serialization of ``num_bytes`` from ``src`` to ``dst``, in ns."""
        c = self.hop(src, dst)
        return self.latency_ns[c] + num_bytes / self.bandwidth_gbps[c]


def hierarchical(
    name: str,
    world_size: int,
    tiers: tuple[int, ...],
    class_names: tuple[str, ...],
    latency_ns: tuple[float, ...],
    bandwidth_gbps: tuple[float, ...],
) -> Topology:
    """Nested groups: ranks in the same block of ``tiers[i]`` ranks are at most class ``i`` apart;
    ranks in no common block are class ``len(tiers)``. ``tiers`` must grow, each dividing the next."""
    if world_size <= 0:
        raise ValueError(f"world_size must be > 0, got {world_size}")
    for small, big in zip(tiers, tiers[1:], strict=False):
        if big <= small or big % small:
            raise ValueError(f"tiers must grow, each a multiple of the last, got {tiers}")
    r = torch.arange(world_size)
    hops = torch.full((world_size, world_size), len(tiers), dtype=torch.int64)
    for level in reversed(range(len(tiers))):
        block = torch.div(r, tiers[level], rounding_mode="floor")
        hops = torch.where(block.unsqueeze(0) == block.unsqueeze(1), level, hops)
    return Topology(name, hops, class_names, latency_ns, bandwidth_gbps)


# An NVSwitch node: measured 394 GB/s GPU-to-GPU copy on H200 (docs/BENCHMARKS.md); the 1 µs
# one-way store-to-visible latency is an assumption until measured.
def flat(world_size: int, *, latency_ns: float = 1000.0, bandwidth_gbps: float = 394.0,
         name: str = "flat") -> Topology:
    """One switch tier: every other rank is one hop away."""
    return hierarchical(name, world_size, (1,), ("self", "one-hop"), (0.0, latency_ns),
                        (4000.0, bandwidth_gbps))


def nvl72(world_size: int = 72) -> Topology:
    """An NVL72-style rack: up to 72 GPUs behind one tier of NVLink switches (900 GB/s per GPU
    per direction, vendor figure; the 1 µs latency is an assumption)."""
    if world_size > 72:
        raise ValueError(f"world_size must be <= 72 for nvl72, got {world_size}")
    return flat(world_size, latency_ns=1000.0, bandwidth_gbps=900.0, name="nvl72")


def cm384(num_dies: int = 768, *, dies_per_npu: int = 2, npus_per_board: int = 8) -> Topology:
    """CloudMatrix384-style two-tier fabric, one rank per die.

    Class 0: the same NPU (the die itself or its sibling); class 1: another NPU on the same board,
    through a first-tier switch; class 2: another board, through the second tier. The 392 GB/s
    links and "hundreds of ns" latencies are the UBEP paper's; the exact latencies (intra-NPU
    150 ns, one hop 600 ns, two hops 1700 ns, about 11x local as the paper reports at most 11.5x)
    and 8 NPUs per board are assumptions.
    """
    if not 0 < num_dies <= 768:
        raise ValueError(f"num_dies must be in [1, 768], got {num_dies}")
    tiers = (dies_per_npu, dies_per_npu * npus_per_board)
    return hierarchical("cm384", num_dies, tiers, ("intra-npu", "one-hop", "two-hop"),
                        (150.0, 600.0, 1700.0), (784.0, 392.0, 392.0))


def detect_nvidia(world_size: int | None = None) -> Topology:
    """The local GPUs: class 1 where peer access works (NVLink or PCIe P2P), class 2 where traffic
    would be staged through the host. Falls back to :func:`flat` without CUDA."""
    if not torch.cuda.is_available():
        return flat(world_size or 1)
    count = torch.cuda.device_count()
    world_size = world_size or count
    if world_size > count:
        raise ValueError(f"world_size {world_size} is more than the {count} visible GPUs")
    hops = torch.ones(world_size, world_size, dtype=torch.int64)
    for s in range(world_size):
        for d in range(world_size):
            if s == d:
                hops[s, d] = 0
            elif not torch.cuda.can_device_access_peer(s, d):
                hops[s, d] = 2
    return Topology("detected-nvidia", hops, ("self", "peer", "host-staged"),
                    (0.0, 1000.0, 10000.0), (4000.0, 394.0, 25.0))
