"""The ``ubep`` command line."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

from ubep.backends.ascend_library import LIB_ENV, library_path
from ubep.buffer import BACKENDS
from ubep.config import DTYPES, LAYOUTS, REDUCTIONS, SYNC_MODES

DTYPE_NAMES = {"bf16": DTYPES[0], "fp16": DTYPES[1], "fp32": DTYPES[2]}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds each option's default to its help, unless the help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


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
                        help="number of experts E, a multiple of --ranks")
    parser.add_argument("--top-k", type=_positive, default=8, help="experts per token K")
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="bf16",
                        help="dtype of the tokens on the wire")
    parser.add_argument("--layout", choices=LAYOUTS, default="compact",
                        help="dispatch output layout")
    parser.add_argument("--reduce", choices=REDUCTIONS, default="source",
                        help="where combine sums the top-k outputs")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="ubep backend")
    parser.add_argument("--sync", choices=SYNC_MODES, default=None,
                        help="how receivers learn that rows arrived, on the cuda and ascend backends "
                        "(default: the backend's: tff on cuda, sw on ascend)")


def _check_shape(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Options valid alone but not together: the subcommand's usage error (exit status 2)."""
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} must be a multiple of --ranks {args.ranks}")
    if args.top_k > args.experts:
        parser.error(f"--top-k {args.top_k} must be <= --experts {args.experts}")


def _cuda_problem(args: argparse.Namespace) -> str | None:
    """What this machine lacks for the GPU options in ``args``, naming the option; None if nothing."""
    gpu_options = [o for o, wanted in (("--backend cuda", args.backend == "cuda"),
                                       ("--pg nccl", getattr(args, "pg", None) == "nccl")) if wanted]
    if gpu_options and torch.cuda.device_count() == 0:
        return f"{gpu_options[0]} needs a CUDA GPU, and torch sees none on this machine"
    if args.backend == "cuda" and importlib.util.find_spec("triton") is None:
        return "--backend cuda needs Triton, which is not installed here (pip install triton)"
    return None


def _machine_problem(args: argparse.Namespace) -> str | None:
    """What this machine lacks for ``args``, found before any rank starts; None if nothing."""
    if args.backend == "ascend":
        path = library_path()
        if path is None or not path.exists():
            return (f"--backend ascend needs the Ascend operator library, which is not built: run "
                    f"./build.sh test, or set {LIB_ENV}")
    return _cuda_problem(args)


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``ubep`` parser and its subcommands' parsers by name."""
    parser = argparse.ArgumentParser(
        prog="ubep", description="Deterministic expert-parallel dispatch and combine for MoE.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", formatter_class=_HelpFormatter,
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
    demo.add_argument("--balance", choices=("none", "redundant"), default="none",
                      help="redundant: a ubep.BalancedBuffer (per-batch borrowed experts) on a "
                      "skewed routing, row-exact MLP experts, checked bit for bit")
    demo.add_argument("--maxvio", type=float, default=None,
                      help="with --balance redundant: routing skew, max/mean expert load - 1 "
                      "(default: 3)")
    prof = sub.add_parser(
        "profile", formatter_class=_HelpFormatter,
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
                      help="process-group backend; nccl: ranks on GPUs, one each or sharing them")
    prof.add_argument("--out", default="ubep-profile-out", help="folder for the CSV and PNG")
    sim = sub.add_parser(
        "simulate", formatter_class=_HelpFormatter,
        help="simulate a dispatch on a superpod (UBEP paper scenarios)",
        description="Run a named scenario of the superpod simulator (a SimPy model of one MoE "
        "dispatch: BSP or decomposed, worker mapping, sync mode) and write its table (CSV, "
        "Markdown) and figure (PNG). docs/SIMULATOR.md explains the model and its numbers.")
    sim.add_argument("--scenario", default="paper-fig10", help="scenario name, or 'all'")
    sim.add_argument("--out", default="ubep-sim-out", help="folder for tables and figures")
    sim.add_argument("--list", action="store_true", help="list the scenarios and exit")
    probe = sub.add_parser(
        "probe", formatter_class=_HelpFormatter,
        help="test the tear-free 512-byte write that the ascend backend's tff and sp modes assume",
        description="Spawn W ranks (the ascend backend's CPU twin over gloo, or one NPU each over HCCL "
        "with --device npu), let half the AIVs of every die write rows of 512-byte blocks into the next "
        "die's window round after round while the other half load them as a tff receiver does, and "
        "count the words a load saw older than their block's flag. Exit status 1 if any rank saw one: "
        "Buffer(sync='tff') and 'sp' are then unsafe on this machine (docs/ASCEND.md).")
    probe.add_argument("--ranks", type=_positive, default=2, help="number of dies W")
    probe.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                       help="cpu: the CPU twin; npu: Ascend NPUs (CANN, torch_npu, the installed package)")
    probe.add_argument("--rounds", type=_positive, default=2000, help="writes of every probe row")
    probe.add_argument("--blocks", type=_positive, default=16, help="512-byte blocks per row (at most 32)")
    probe.add_argument("--timeout", type=float, default=120.0, help="seconds a die may wait for its peer")
    return parser, {"demo": demo, "profile": prof, "simulate": sim, "probe": probe}


def _say_problem(command: str, problem: str) -> int:
    print(f"ubep {command}: {problem}", file=sys.stderr)
    return 2


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_shape(args, parser)
    if args.balance == "redundant":
        return _balanced_demo(args, parser)
    if args.backend == "cuda":  # true on any machine: the demo's Buffer holds CPU tensors
        return _say_problem("demo", "--backend cuda runs on GPUs over NCCL, but ubep demo's ranks are "
                            "CPU processes over gloo: try `ubep profile --pg nccl --backend cuda` on a "
                            "GPU machine")
    if problem := _machine_problem(args):
        return _say_problem("demo", problem)
    if args.maxvio is not None:
        parser.error("--maxvio needs --balance redundant (the plain demo routes with its router)")
    from ubep.demo import DemoOptions, run_demo
    from ubep.moe import MoEShape

    shape = MoEShape(hidden=args.hidden, num_experts=args.experts, top_k=args.top_k,
                     intermediate=args.intermediate, dtype=DTYPE_NAMES[args.dtype])
    return run_demo(DemoOptions(ranks=args.ranks, tokens=args.tokens, shape=shape, layout=args.layout,
                                backend=args.backend, reduce=args.reduce, sync=args.sync,
                                iters=args.iters, seed=args.seed))


def _balanced_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    refused = [f"--{name} {value}" for name, value, allowed in (
        ("backend", args.backend, ("auto", "reference", "ascend")), ("layout", args.layout, ("compact",)),
        ("reduce", args.reduce, ("source",))) if value not in allowed]
    if refused:
        parser.error(f"--balance redundant runs on the reference or ascend backend, compact layout, "
                     f"reduce=source; not with {', '.join(refused)}")
    if problem := _machine_problem(args):
        return _say_problem("demo", problem)
    from ubep.demo_balanced import BalancedDemoOptions, run_balanced_demo

    return run_balanced_demo(BalancedDemoOptions(
        ranks=args.ranks, tokens=args.tokens, hidden=args.hidden, num_experts=args.experts,
        top_k=args.top_k, intermediate=args.intermediate, dtype=DTYPE_NAMES[args.dtype],
        maxvio=3.0 if args.maxvio is None else args.maxvio, seed=args.seed,
        backend="reference" if args.backend == "auto" else args.backend))


def _profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_shape(args, parser)
    if args.buffer_tokens is not None and args.buffer_tokens < args.tokens:
        parser.error(f"--buffer-tokens {args.buffer_tokens} must be >= --tokens {args.tokens}")
    if importlib.util.find_spec("matplotlib") is None:
        return _say_problem("profile", "drawing the breakdown needs matplotlib: pip install 'ubep[sim]'")
    if problem := _machine_problem(args):
        return _say_problem("profile", problem)
    if args.backend == "cuda" and args.pg != "nccl":
        parser.error("--backend cuda needs --pg nccl: its ranks run on GPUs")
    from ubep.breakdown import ProfileOptions, run_profile

    return run_profile(ProfileOptions(
        ranks=args.ranks, tokens=args.tokens, hidden=args.hidden, experts=args.experts,
        top_k=args.top_k, dtype=DTYPE_NAMES[args.dtype], layout=args.layout,
        reduce=args.reduce, backend=args.backend, sync=args.sync, maxvio=args.maxvio,
        iters=args.iters, num_sms=args.num_sms, pg_backend=args.pg,
        buffer_tokens=args.buffer_tokens), Path(args.out))


def _simulate(args: argparse.Namespace) -> int:
    from ubep.sim.cli import run_simulate  # imports no simpy: --list works without the sim extras

    missing = [m for m in ("simpy", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing and not args.list:
        return _say_problem("simulate", f"running a scenario needs the sim extras (missing: "
                            f"{', '.join(missing)}): pip install 'ubep[sim]'")
    return run_simulate(args.scenario, args.out, args.list)


def _probe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ubep.backends.ascend_probe import MAX_BLOCKS, probe_rank

    if args.blocks > MAX_BLOCKS:
        parser.error(f"--blocks {args.blocks} must be <= {MAX_BLOCKS} (a probe row fits an AIV's UB)")
    path = library_path()
    if path is None or not path.exists():
        return _say_problem("probe", f"the Ascend operator library is not built: run ./build.sh test "
                            f"(the CPU twin) or ./build.sh npu, or set {LIB_ENV}")
    if args.device == "npu" and importlib.util.find_spec("torch_npu") is None:
        return _say_problem("probe", "--device npu needs torch_npu, which is not installed here")
    from ubep.launch import run_ranks

    results = run_ranks(probe_rank, args.ranks, args.rounds, args.blocks, args.timeout,
                        pg_backend="hccl" if args.device == "npu" else "gloo",
                        timeout_s=args.timeout * 2 + 120)
    for result in results:
        print(result.line())
    torn = [r.rank for r in results if r.torn]
    print(f"ubep probe: {'TORN on ranks ' + str(torn) if torn else 'every block was seen whole'} "
          f"({args.device}, W={args.ranks}, {args.blocks} blocks x {args.rounds} rounds per row)")
    return 1 if torn else 0


def main(argv: list[str] | None = None) -> int:
    parser, commands = _parsers()
    args = parser.parse_args(argv)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "probe":
        return _probe(args, commands["probe"])
    run = _demo if args.command == "demo" else _profile
    return run(args, commands[args.command])


if __name__ == "__main__":
    sys.exit(main())
