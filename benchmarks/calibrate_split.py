"""Fit ``ubep.tuning``'s H200 constants to the cuda backend's in-kernel stamps; show predicted
against measured group times.

    PYTHONPATH=. python3 benchmarks/calibrate_split.py --out calib-out      # on 2+ GPUs of one host
    PYTHONPATH=. python3 benchmarks/calibrate_split.py --ranks 1 --groups count   # one GPU
    PYTHONPATH=. python3 benchmarks/calibrate_split.py --refit benchmarks/data/calibration-....csv

For each dispatch shape (tokens per rank, hidden) and each pair of group caps (the backend's
``Tuning.max_count`` / ``max_send``, set by ``CudaBackend.retune``), times dispatches with
``profile=True``: a group's time is when its last program finished its work, from the launch's first
stamp (``dispatch count: done at``, ``dispatch token: done at``, with ``(writers)`` after
``dispatch`` in the compact layout, whose first launch counts and sends; median over the calls).
Those are ``ubep.tuning.Sample``s of the count and token groups; ``ubep.tuning.calibrate`` fits the
model on ``flat(W)`` starting from ``h200()``. Prints the fitted constants and, per sample, measured
µs and the predictions of the fit and of the ``h200()`` preset; writes ``calibration.csv`` / ``.md``
and ``params.json`` under ``--out``. ``--groups count`` samples and fits the count group alone,
which one GPU can: its terms are the pairs and the programs' chain (the model adds the link's
latency), while the token group's need the link (2+ GPUs). ``--refit`` fits the measured column of
an earlier ``calibration.csv`` again instead (no GPU needed; ``--ranks`` defaults to 2 there).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import ubep
from ubep.launch import run_ranks
from ubep.profiling import write_table
from ubep.topology import flat
from ubep.tuning import DispatchShape, Sample, calibrate, h200, predict, traffic
from ubep.workloads import origin_tokens, origin_weights, skewed_topk

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
                  NVSHMEM_DISABLE_NVLS="1")
# The cuda count group splits the pairs (pair_ns) and chains its programs' counts (chain_ns); the
# prefix sums over sources are the receivers' (no cumsum term), no work is per expert (no beta).
ONE_PASS_COUNT_TERMS = ("b_count_ns", "pair_ns", "chain_ns")
GROUPS = ("count", "token")


def sweep_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    """Median group times (µs) of every (tokens, hidden, caps) point on this rank."""
    from ubep.backends.cuda.tuning import Tuning  # needs Triton: on the GPU only

    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for tokens in args.tokens:
        for hidden in args.hidden:
            gen = torch.Generator().manual_seed(rank * 131 + tokens)
            idx = skewed_topk(tokens, args.experts, args.top_k, generator=gen).to(dev)
            x = origin_tokens(rank, tokens, hidden, torch.bfloat16).to(dev)
            w = origin_weights(rank, tokens, args.top_k).to(dev)
            layout = "padded" if tokens <= 512 else "compact"
            # the compact dispatch counts and sends in its first launch, its writers'
            launch = "dispatch" if layout == "padded" else "dispatch (writers)"
            buf = ubep.Buffer(hidden=hidden, num_experts=args.experts, top_k=args.top_k,
                              max_tokens_per_rank=tokens, dtype=torch.bfloat16, backend="cuda",
                              layout=layout, profile=True, check_inputs=False)
            backend = buf._backend
            # a count program per step of pairs, up to the cap: the cap, not the model, decides
            tuning = Tuning.h200()
            tuning = dataclasses.replace(tuning, pair_chunk=tuning.count_step)
            for n_count in args.count_groups:
                for n_send in args.token_groups:
                    backend.retune(dataclasses.replace(tuning, max_count=n_count, max_send=n_send))
                    buf.reset_phase_times()
                    for _ in range(args.warmup + args.iters):
                        dist.barrier()
                        torch.cuda.synchronize()
                        buf.dispatch(x, idx, w)
                    phases = buf.phase_times()
                    launched = backend.planner.dispatch_workers(tokens)  # the caps, bounded by the work
                    rows.append({"tokens": tokens, "hidden": hidden,
                                 "n_count": launched.count, "n_token": launched.send,
                                 **{group: statistics.median(
                                     phases[f"{launch} {group}: done at"][args.warmup:])
                                    for group in args.groups}})
            del buf
            torch.cuda.empty_cache()
    return rows


def samples_of(rows: list[dict], args: argparse.Namespace) -> list[Sample]:
    """One count and one token ``Sample`` per measured point (bf16 rows: 2 bytes per element)."""
    out = []
    for row in rows:
        shape = DispatchShape(tokens=row["tokens"], experts=args.experts, topk=args.top_k,
                              bytes_per_token=2 * row["hidden"])
        for group in args.groups:
            out.append(Sample(shape=shape, n_workers=row["n_count"] + row["n_token"],
                              n_count=row["n_count"], group=group, time_ns=1e3 * row[group]))
    return out


def samples_from_csv(path: Path, args: argparse.Namespace) -> list[Sample]:
    """The samples of an earlier run's ``calibration.csv`` (its ``measured_us`` column)."""
    with path.open(newline="") as f:
        return [Sample(shape=DispatchShape(tokens=int(r["tokens"]), experts=args.experts,
                                           topk=args.top_k, bytes_per_token=int(r["bytes_per_token"])),
                       n_workers=int(r["n_count"]) + int(r["n_token"]), n_count=int(r["n_count"]),
                       group=r["group"], time_ns=1e3 * float(r["measured_us"]))
                for r in csv.DictReader(f) if r["group"] in args.groups]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=None, help="default: every GPU (--refit: 2)")
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512, 4096])
    p.add_argument("--hidden", type=int, nargs="+", default=[2048, 7168])
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--count-groups", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--token-groups", type=int, nargs="+", default=[8, 24, 64, 128])
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("calib-out"))
    p.add_argument("--refit", type=Path, help="an earlier calibration.csv to fit again")
    p.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS),
                   help="the groups to sample and fit (count alone: one GPU is enough)")
    args = p.parse_args()
    if args.refit:
        args.ranks = args.ranks or 2
        samples = samples_from_csv(args.refit, args)
        measured_on = f"the measurements in {args.refit}"
    else:
        args.ranks = args.ranks or torch.cuda.device_count()
        if args.ranks < 2 and "token" in args.groups:
            print("the token group needs at least 2 GPUs (one GPU: --groups count)", file=sys.stderr)
            return 2
        rows = run_ranks(sweep_rank, args.ranks, args, pg_backend="nccl", timeout_s=3000)[0]
        samples = samples_of(rows, args)
        measured_on = torch.cuda.get_device_name(0)
    topology = flat(args.ranks)
    preset = h200()
    fit = calibrate(samples, topology, preset, count_terms=ONE_PASS_COUNT_TERMS)
    table = []
    for s in samples:
        tr = traffic(s.shape, topology)
        table.append({"tokens": s.shape.tokens, "bytes_per_token": s.shape.bytes_per_token,
                      "n_count": s.n_count, "n_token": s.n_workers - s.n_count, "group": s.group,
                      "measured_us": round(s.time_ns / 1e3, 2),
                      "predicted_us": round(predict(s, tr, fit.params) / 1e3, 2),
                      "preset_us": round(predict(s, tr, preset) / 1e3, 2)})
    title = (f"EP{args.ranks} on {measured_on}, {args.experts} experts, "
             f"top-{args.top_k}, bf16; rms error {fit.rms_error_ns / 1e3:.2f} µs, max relative "
             f"error {fit.max_rel_error:.1%}; fitted {fit.params}")
    print(write_table(table, args.out / "calibration", title))
    (args.out / "params.json").write_text(json.dumps(dataclasses.asdict(fit.params), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
