"""How well each scheduler variant balances hop classes, and its objective (1), on the topology presets.

    PYTHONPATH=. python benchmarks/mapper_balance.py                  # every preset, ~20 s on 2 cores
    PYTHONPATH=. python benchmarks/mapper_balance.py --token-bytes 512 --presets flat8 fig10

For each preset, routings like the paper's (top-8, 8 to 128 tokens per rank, uniform or with 8 hot
experts at 4x the mean load) are scheduled from several source ranks onto 48 workers, and each
variant is scored on:

- ``over_bound``: per hop class, workers holding more than ``ceil(V[h] / n)`` of its tokens
  (mean over routings);
- ``objective_us``: the paper's objective (1) (``ubep.scheduler.worker_latency_ns``: tokens'
  transfer times plus the farthest latency, worst worker) of the slowest source rank, mean over
  routings; a dispatch ends with its slowest rank;
- ``vs_lb``: routings (one source rank each) where the variant's objective (1) is below / above
  ``load_balanced``'s;
- ``far``: the farthest class's tokens on the busiest worker over their mean, the range.

The per-hop bound can cost objective (1) on a single routing (docs/ALGORITHMS.md has a two-token
case); the comparison that matters is per preset.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import torch

from ubep import scheduler, topology, workloads

WORKERS = 48          # AIVs per die (UBEP paper)
TOKEN_BYTES = 14336   # a DeepSeek-V3 row, 7168 bf16
HOT_MAXVIO = 3.0      # the simulator's hot experts: 4x the mean load


class Preset(NamedTuple):
    name: str
    topology: topology.Topology
    experts: int


def presets() -> list[Preset]:
    """Every topology preset at the sizes the UBEP paper and our machines use."""
    return [
        Preset("flat8", topology.flat(8), 256),                  # one H200 node
        Preset("nvl72", topology.nvl72(), 288),
        Preset("cm384", topology.cm384(), 768),                  # 768 dies, one expert each
        Preset("cm384-256", topology.cm384(256), 256),           # the paper's 256-rank runs
        Preset("fig10", topology.cm384(64, dies_per_npu=1, npus_per_board=16), 256),  # its ablation
        Preset("cm384-32", topology.cm384(32), 64),              # two boards: half the ranks two hops
    ]


def routings(preset: Preset, tokens: tuple[int, ...], sources: int, top_k: int = 8):
    """``(workload, src, counts_E, hop_E)``: per workload (tokens, hot or not), ``sources`` source
    ranks spread over the world, each with its own seeded routing."""
    world, experts = preset.topology.world_size, preset.experts
    rank_of_e = torch.arange(experts) // (experts // world)
    for hot in (False, True):
        hot_e = list(range(0, experts, experts // 8)) if hot else []
        for t in tokens:
            for src in range(0, world, max(1, world // sources)):
                gen = torch.Generator().manual_seed(t * 100_003 + src * 2 + hot)
                idx = workloads.skewed_topk(t, experts, top_k, maxvio=HOT_MAXVIO if hot else 0.0,
                                            hot_experts=hot_e, generator=gen)
                counts = torch.bincount(idx.reshape(-1), minlength=experts)
                yield (t, hot), src, counts, preset.topology.hops[src][rank_of_e]


class Score(NamedTuple):
    """One variant on one preset, over ``n`` routings (NamedTuple, not a dataclass: the tests load
    this file without registering it as a module)."""

    over_bound: torch.Tensor    # [C] workers over the bound, summed over routings
    objective_ns: dict          # workload -> per-source objective (1), ns
    far_ratio: list             # per routing

    @property
    def n(self) -> int:
        return len(self.far_ratio)


def measure(preset: Preset, variants=scheduler.VARIANTS, tokens=(8, 32, 64, 128), sources=8,
            token_bytes=TOKEN_BYTES, workers=WORKERS) -> dict[str, Score]:
    topo = preset.topology
    c = topo.num_classes
    scores = {v: Score(torch.zeros(c, dtype=torch.int64), {}, []) for v in variants}
    for workload, _, counts, hops in routings(preset, tokens, sources):
        bound = scheduler.per_hop_bound(counts, hops, c, workers)
        for v in variants:
            v_nc = scheduler.schedule(v, counts, hops, workers).worker_class_counts(hops, c)
            s = scores[v]
            s.over_bound.add_((v_nc > bound).sum(0))
            worst = float(scheduler.worker_latency_ns(v_nc, topo, token_bytes).max())
            s.objective_ns.setdefault(workload, []).append(worst)
            far = v_nc[:, c - 1].double()
            s.far_ratio.append(float(far.max() / far.mean()) if far.sum() else 1.0)
    return scores


def slowest_rank_ns(score: Score) -> list[float]:
    """Per workload, objective (1) of the slowest source rank."""
    return [max(per_src) for per_src in score.objective_ns.values()]


def per_routing(score: Score) -> list[float]:
    return [x for per_src in score.objective_ns.values() for x in per_src]


def table(presets_: list[Preset], token_bytes: int) -> str:
    lines = ["| preset | variant | over_bound per class | objective_us | vs_lb below / above | far |",
             "|---|---|---|---|---|---|"]
    for p in presets_:
        scores = measure(p, token_bytes=token_bytes)
        lb = per_routing(scores["load_balanced"])
        for v, s in scores.items():
            over = " / ".join(f"{x:.2f}" for x in (s.over_bound / s.n).tolist())
            slow = slowest_rank_ns(s)
            mine = per_routing(s)
            below = sum(a < b - 1e-6 for a, b in zip(mine, lb, strict=True))
            above = sum(a > b + 1e-6 for a, b in zip(mine, lb, strict=True))
            lines.append(f"| {p.name} | {v} | {over} | {sum(slow) / len(slow) / 1e3:.3f} | "
                         f"{below} / {above} of {len(lb)} | "
                         f"{min(s.far_ratio):.3f}-{max(s.far_ratio):.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-bytes", type=int, default=TOKEN_BYTES)
    parser.add_argument("--presets", nargs="*", help="names, default all")
    args = parser.parse_args(argv)
    chosen = [p for p in presets() if not args.presets or p.name in args.presets]
    print(f"{WORKERS} workers, {args.token_bytes}-byte tokens, objective (1) in µs\n")
    print(table(chosen, args.token_bytes))


if __name__ == "__main__":
    main()
