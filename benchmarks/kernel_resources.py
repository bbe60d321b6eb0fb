"""Registers, stack and synchronization of the cuda backend's dispatch and combine kernels as ptxas
builds them for sm_90, on a CPU machine (Triton and the ptxas it ships; no GPU).

    PYTHONPATH=. python3 benchmarks/kernel_resources.py --modes sw dc --worlds 2 8 --tokens 16 4096
    PYTHONPATH=. python3 benchmarks/kernel_resources.py --kernel combine --worlds 2 8 --tokens 128

Each (mode, W, tokens) is built with the constants of the launch a call of that many tokens per
rank makes (7168 bf16 elements, 256 experts, top-8, no SM budget), as ``tests/test_cuda_compile.py``
builds them: at most 512 tokens the padded layout's one launch (one row per sender and receiver
step, the count programs' prefix as wide as the call's pairs), above that the compact layout's
writers' launch. Prints registers and stack bytes per thread, and the kernel's reductions (TTGIR
``tt.reduce``) and ``bar.sync`` instructions (PTX), counted in the code, not as executed: one in a
loop counts once. The combine kernel (``--kernel combine``), both reductions, under the register
budget the backend gives it (``Tuning.combine_registers``): two reducers per token in calls of at
most ``DECODE_TOKENS`` tokens (one in ``sp``, whose reducers take whole tokens), one above.
"""

from __future__ import annotations

import argparse

import torch

from tests.test_cuda_compile import POINTERS, _build, _dispatch_constants, _mode, _resources, ck, dk
from ubep.backends.cuda.geometry import (
    reducer_tile,
    row_meta,
    step_rows,
    verify_split,
    verify_step,
)
from ubep.backends.cuda.tuning import Tuning
from ubep.backends.cuda.verify import RETURNED_ROWS

DECODE_TOKENS = 512  # calls up to this many tokens are decode steps here (padded layout)


def dispatch_constants(mode: str, world: int, tokens: int) -> dict:
    """The dispatch kernel's constants for a call of ``tokens`` tokens per rank at W = ``world``."""
    decode = tokens <= DECODE_TOKENS
    constants = dict(_dispatch_constants(mode, like=False, replicate=decode, tokens=tokens,
                                         counts_first=mode == "tff" and decode, profile=False),
                     WORLD=world, W_BLOCK=world, E_LOCAL=256 // world, L_BLOCK=256 // world)
    if decode:
        constants.update(ROWS=1, RECV_ROWS=1, PREFIX=max(32, 1 << (tokens * 8 - 1).bit_length()))
    return constants


def combine_constants(mode: str, world: int, tokens: int, partial: bool) -> dict:
    """The combine kernel's constants for a call of ``tokens`` tokens per rank at W = ``world``:
    ``partial``, ``reduce="expert_rank"`` (W partial sums a token), else ``"source"`` (K rows)."""
    top_k, k_block = 8, max(8, world)
    meta = row_meta(mode, 7168, 2, tokens)
    r_block, rcb, parts = reducer_tile(mode, meta, world if partial else top_k,
                                       tokens <= DECODE_TOKENS and mode != "sp")
    split = verify_split(world, None, tokens)
    most = RETURNED_ROWS if partial else RETURNED_ROWS // k_block
    return {"WORLD": world, "W_BLOCK": world, "E_LOCAL": 256 // world, "TOP_K": top_k,
            "K_BLOCK": k_block, **_mode(mode, torch.bfloat16), "PARTIAL": partial,
            "WEIGHTED": partial, "SUM_WEIGHTED": not partial, "GATHER": False,
            "VERIFY": mode == "dc", "SPLIT": split, "VERIFY_STEP": verify_step(tokens, split, most),
            "FINAL": True, "PROFILE": False, **meta, "ROWS": min(k_block, step_rows(meta)),
            "R_BLOCK": r_block, "RCB": rcb, "RECV_PARTS": parts}


def _combine_rows(args: argparse.Namespace) -> None:
    print("| mode | W | tokens | reduce | registers | stack bytes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in args.modes:
        for world in args.worlds:
            for tokens in args.tokens:
                for partial in (False, True):
                    kernel = _build(ck.combine, POINTERS["combine"],
                                    combine_constants(mode, world, tokens, partial),
                                    Tuning.h200().registers(mode))
                    used = _resources(kernel.asm["cubin"])
                    reduce = "expert_rank" if partial else "source"
                    print(f"| {mode} | {world} | {tokens} | {reduce} | {used['REG']} | "
                          f"{used['STACK']} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["sw", "tff", "dc", "sp"],
                        choices=["sw", "tff", "dc", "sp"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 8], choices=[2, 4, 8])
    parser.add_argument("--tokens", nargs="+", type=int, default=[16, 128, 4096])
    parser.add_argument("--kernel", choices=["dispatch", "combine"], default="dispatch")
    args = parser.parse_args()
    if args.kernel == "combine":
        _combine_rows(args)
        return
    print("| mode | W | tokens | registers | stack bytes | tt.reduce | bar.sync |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode in args.modes:
        for world in args.worlds:
            for tokens in args.tokens:
                kernel = _build(dk.dispatch, POINTERS["dispatch"],
                                dispatch_constants(mode, world, tokens))
                used = _resources(kernel.asm["cubin"])
                reductions = kernel.asm["ttgir"].count('"tt.reduce"')
                print(f"| {mode} | {world} | {tokens} | {used['REG']} | {used['STACK']} | "
                      f"{reductions} | {kernel.asm['ptx'].count('bar.sync')} |", flush=True)


if __name__ == "__main__":
    main()
