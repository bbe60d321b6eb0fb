"""Registers, stack and synchronization of the cuda backend's dispatch kernel as ptxas builds it for
sm_90, on a CPU machine (Triton and the ptxas it ships; no GPU).

    PYTHONPATH=. python3 benchmarks/kernel_resources.py --modes sw dc --worlds 2 8 --tokens 16 4096

Each (mode, W, tokens) is built with the constants of the launch a call of that many tokens per
rank makes (7168 bf16 elements, 256 experts, top-8, no SM budget), as ``tests/test_cuda_compile.py``
builds them: at most 512 tokens the padded layout's one launch (one row per sender and receiver
step, the count programs' prefix as wide as the call's pairs), above that the compact layout's
writers' launch. Prints registers and stack bytes per thread, and the kernel's reductions (TTGIR
``tt.reduce``) and ``bar.sync`` instructions (PTX), counted in the code, not as executed: one in a
loop counts once.
"""

from __future__ import annotations

import argparse

from tests.test_cuda_compile import POINTERS, _build, _dispatch_constants, _resources, dk

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["sw", "tff", "dc", "sp"],
                        choices=["sw", "tff", "dc", "sp"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 8], choices=[2, 4, 8])
    parser.add_argument("--tokens", nargs="+", type=int, default=[16, 128, 4096])
    args = parser.parse_args()
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
