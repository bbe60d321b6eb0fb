"""Kernel launches that skip Triton's per-call argument binding once a kernel is compiled.

Triton's call path (``kernel[grid](...)``) binds and specializes every argument again on each
launch: 35-66 µs of host time per dispatch launch on the H200 machines, against 12-19 µs through
the compiled kernel's own launcher (docs/BENCHMARKS.md, "One GPU, side by side"). A compact
dispatch launches twice, so that difference is a large part of an eager call's host time.

:class:`Launcher` keys compiled kernels by everything Triton specializes on: the compile-time
constants, ``num_warps``, each tensor's dtype and 16-byte alignment, and each integer's width class
and its divisibility by 16 / equality to 1. The first launch of a key goes through Triton (which
compiles or finds the kernel); later ones through the compiled kernel. Under Triton's CPU
interpreter there is nothing compiled, so every launch takes Triton's path.
"""

from __future__ import annotations

import torch

from ubep.backends.cuda.kernels import INTERPRETED

_I32 = range(-(1 << 31), 1 << 31)


def _arg_key(value) -> object:
    """What Triton's specialization of one runtime argument depends on."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return bool
    if isinstance(value, int):
        return value in _I32, value % 16 == 0, value == 1
    return type(value)


class Launcher:
    """``Launcher(kernel)(grid, *runtime_args, num_warps=.., maxnreg=.., **constexprs)`` launches
    ``kernel`` on ``grid`` programs (1-D) like ``kernel[(grid,)](...)`` does; runtime arguments
    positional, in the kernel's order, constants by name; ``maxnreg``: a cap on registers per
    thread (None: the compiler's choice)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: int, *args, num_warps: int, maxnreg: int | None = None,
                 **constexprs) -> None:
        if INTERPRETED:
            self.kernel[(grid,)](*args, num_warps=num_warps, **constexprs)
            return
        key = (num_warps, maxnreg, tuple(constexprs.items()), tuple(_arg_key(a) for a in args))
        entry = self.compiled.get(key)
        if entry is None:
            options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
            compiled = self.kernel[(grid,)](*args, **options, **constexprs)
            # the launcher takes every parameter in order, compile-time constants included
            names = self.kernel.arg_names[len(args):]
            self.compiled[key] = (compiled, [constexprs[n] for n in names])
            return
        compiled, constants = entry
        compiled[(grid, 1, 1)](*args, *constants)
