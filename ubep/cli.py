"""The ``ubep`` command line."""

from __future__ import annotations

import argparse
import sys

from ubep.buffer import BACKENDS
from ubep.config import DTYPES, LAYOUTS, REDUCTIONS, SYNC_MODES

DTYPE_NAMES = {"bf16": DTYPES[0], "fp16": DTYPES[1], "fp32": DTYPES[2]}


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _shape_options(parser: argparse.ArgumentParser, tokens: int) -> None:
    """The layer's shape and the library's policy, shared by ``demo`` and ``profile``."""
    parser.add_argument("--ranks", type=_positive, default=4, help="number of ranks W")
    parser.add_argument("--tokens", type=_positive, default=tokens, help="tokens per rank")
    parser.add_argument("--hidden", type=_positive, default=1024, help="hidden size H")
    parser.add_argument("--experts", type=_positive, default=64,
                        help="number of experts E (a multiple of --ranks)")
    parser.add_argument("--top-k", type=_positive, default=8, help="experts per token K")
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="bf16",
                        help="dtype of the tokens on the wire")
    parser.add_argument("--layout", choices=LAYOUTS, default="compact",
                        help="dispatch output layout")
    parser.add_argument("--reduce", choices=REDUCTIONS, default="source",
                        help="where combine sums the top-k outputs")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="ubep backend")
    parser.add_argument("--sync", choices=SYNC_MODES, default="tff",
                        help="how receivers learn that rows arrived (cuda backend)")


def _check_shape(args: argparse.Namespace) -> None:
    if args.experts % args.ranks:
        _parser().error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks}")
    if args.top_k > args.experts:
        _parser().error(f"--top-k {args.top_k} must be <= --experts {args.experts}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ubep", description="Deterministic expert-parallel dispatch and combine for MoE.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="run an MoE layer with expert parallelism on CPU ranks and check it",
        description="Spawn W CPU ranks over gloo, run a DeepSeek-style MoE layer (softmax top-k "
        "router, one SwiGLU expert per expert) with ubep dispatch -> experts -> combine, forward "
        "and backward, check outputs and gradients against the same layer computed in one "
        "process, and report bytes on the wire and per-phase times.")
    _shape_options(demo, tokens=256)
    demo.add_argument("--intermediate", type=_positive, default=256,
                      help="SwiGLU intermediate size per expert")
    demo.add_argument("--iters", type=_positive, default=3, help="steps to time")
    demo.add_argument("--seed", type=int, default=0, help="seed of weights and tokens")
    prof = sub.add_parser(
        "profile", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="per-phase latency breakdown of dispatch + combine",
        description="Spawn W ranks (CPU over gloo, or one GPU each over NCCL with --pg nccl), run "
        "dispatch + combine with per-phase timers on, print the breakdown per rank and write "
        "breakdown.csv and breakdown.png (stacked bars per phase, one bar per rank).")
    _shape_options(prof, tokens=256)
    prof.add_argument("--maxvio", type=float, default=0.0, help="routing skew: max/mean load - 1")
    prof.add_argument("--iters", type=_positive, default=10, help="timed calls after 2 warm-up")
    prof.add_argument("--num-sms", type=_positive, default=None,
                      help="cuda backend: SM budget, at most this many thread blocks per launch "
                      "(default: the backend's own caps)")
    prof.add_argument("--buffer-tokens", type=_positive, default=None,
                      help="the buffer's max_tokens_per_rank, at least --tokens: calls smaller "
                      "than the buffer, as in a decode step (default: --tokens)")
    prof.add_argument("--pg", choices=("gloo", "nccl"), default="gloo",
                      help="process-group backend (nccl: one GPU per rank)")
    prof.add_argument("--out", default="ubep-profile-out", help="folder for the CSV and PNG")
    sim = sub.add_parser(
        "simulate", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="simulate a dispatch on a superpod (UBEP paper scenarios)",
        description="Run a named scenario of the superpod simulator (a SimPy model of one MoE "
        "dispatch: BSP or decomposed, worker mapping, sync mode) and write its table (CSV, "
        "Markdown) and figure (PNG). docs/SIMULATOR.md explains the model and its numbers.")
    sim.add_argument("--scenario", default="paper-fig10", help="scenario name, or 'all'")
    sim.add_argument("--out", default="ubep-sim-out", help="folder for tables and figures")
    sim.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ubep.demo import DemoOptions, run_demo
        from ubep.moe import MoEShape

        _check_shape(args)
        shape = MoEShape(hidden=args.hidden, num_experts=args.experts, top_k=args.top_k,
                         intermediate=args.intermediate, dtype=DTYPE_NAMES[args.dtype])
        return run_demo(DemoOptions(ranks=args.ranks, tokens=args.tokens, shape=shape,
                                    layout=args.layout, backend=args.backend,
                                    reduce=args.reduce, sync=args.sync, iters=args.iters,
                                    seed=args.seed))
    if args.command == "profile":
        import importlib.util
        from pathlib import Path

        from ubep.breakdown import ProfileOptions, run_profile

        _check_shape(args)
        if args.buffer_tokens is not None and args.buffer_tokens < args.tokens:
            _parser().error(f"--buffer-tokens {args.buffer_tokens} must be >= --tokens {args.tokens}")
        if importlib.util.find_spec("matplotlib") is None:
            print("ubep profile draws its breakdown with matplotlib: pip install 'ubep[sim]'",
                  file=sys.stderr)
            return 2
        return run_profile(ProfileOptions(
            ranks=args.ranks, tokens=args.tokens, hidden=args.hidden, experts=args.experts,
            top_k=args.top_k, dtype=DTYPE_NAMES[args.dtype], layout=args.layout,
            reduce=args.reduce, backend=args.backend, sync=args.sync, maxvio=args.maxvio,
            iters=args.iters, num_sms=args.num_sms, pg_backend=args.pg,
            buffer_tokens=args.buffer_tokens), Path(args.out))
    if args.command == "simulate":
        try:
            from ubep.sim.cli import run_simulate
        except ImportError as err:  # simpy / matplotlib are the optional 'sim' extras
            print(f"ubep simulate needs the sim extras ({err.name} is missing): "
                  f"pip install 'ubep[sim]'", file=sys.stderr)
            return 2
        return run_simulate(args.scenario, args.out, args.list)
    return 2


if __name__ == "__main__":
    sys.exit(main())
