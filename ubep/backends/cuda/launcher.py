"""Kernel launches that skip Triton's per-call argument binding once a kernel is compiled.

Triton's call path (``kernel[grid](...)``) binds and specializes every argument again on each
launch: 35-66 µs of host time per dispatch launch, against 12-19 µs through the compiled kernel's
own launcher (H200 machines, docs/BENCHMARKS.md). A compact
dispatch launches twice, so that difference is a large part of an eager call's host time.

:class:`Launcher` keys compiled kernels by everything Triton specializes on: the compile-time
constants and ``num_warps`` (one :class:`Constants`, hashed once), each tensor's dtype and 16-byte
alignment, and each integer's width class and its divisibility by 16 / equality to 1. Arguments that
never change for a launcher (a buffer's peer tables, its rank) are bound when it is made and left out
of the per-launch key. The first launch of a key goes through Triton (which compiles or finds the
kernel); later ones through the compiled kernel. Under Triton's CPU interpreter there is nothing
compiled, so every launch takes Triton's path.
"""

from __future__ import annotations

import inspect

import torch

from ubep.backends.cuda.kernels import INTERPRETED

_I32_LOW, _I32_END = -(1 << 31), 1 << 31


def _arg_key(value) -> object:
    """What Triton's specialization of one runtime argument depends on. The exact types come first:
    this runs for every argument of every launch."""
    kind = type(value)
    if kind is torch.Tensor or (kind is not int and isinstance(value, torch.Tensor)):
        return value.dtype, value.data_ptr() % 16 == 0
    if kind is int or (kind is not bool and isinstance(value, int)):
        return _I32_LOW <= value < _I32_END, value % 16 == 0, value == 1
    return kind


class Constants:
    """One launch variant's compile-time constants (``values``, by name) with its ``num_warps`` and
    register cap ``maxnreg`` (None: the compiler's choice). Hashed once: a launcher keys its cache by
    this object instead of by 30-odd constants on every launch."""

    __slots__ = ("num_warps", "maxnreg", "values", "_items", "_hash")

    def __init__(self, num_warps: int, maxnreg: int | None = None, **values):
        self.num_warps, self.maxnreg, self.values = num_warps, maxnreg, values
        self._items = (num_warps, maxnreg, tuple(values.items()))
        self._hash = hash(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Constants) and self._items == other._items


def runtime_names(kernel) -> list[str]:
    """``kernel``'s runtime parameters (not ``tl.constexpr``), in order; compiled or interpreted."""
    params = inspect.signature(getattr(kernel, "fn", kernel)).parameters.values()
    return [p.name for p in params if "constexpr" not in str(p.annotation)]


class Launcher:
    """``Launcher(kernel, **fixed)(grid, *args, constants=Constants(...))`` launches ``kernel`` on
    ``grid`` programs (1-D) like ``kernel[(grid,)](...)`` does. ``fixed``: runtime arguments bound
    once, by name; ``args``: the other runtime arguments, positional, in the kernel's order."""

    def __init__(self, kernel, **fixed):
        self.kernel = kernel
        names = runtime_names(kernel)
        unknown = sorted(set(fixed) - set(names))
        if unknown:
            raise TypeError(f"{getattr(kernel, '__name__', 'the kernel')} has no runtime "
                            f"parameters {unknown}")
        self.template = [fixed.get(n) for n in names]
        self.slots = [i for i, n in enumerate(names) if n not in fixed]  # where args go
        self.compiled: dict[tuple, tuple] = {}

    def __call__(self, grid: int, *args, constants: Constants) -> None:
        full = self.template.copy()
        for i, value in zip(self.slots, args, strict=True):
            full[i] = value
        if INTERPRETED:
            self.kernel[(grid,)](*full, num_warps=constants.num_warps, **constants.values)
            return
        key = (constants, tuple(map(_arg_key, args)))
        entry = self.compiled.get(key)
        if entry is None:
            options = {"num_warps": constants.num_warps}
            if constants.maxnreg:
                options["maxnreg"] = constants.maxnreg
            compiled = self.kernel[(grid,)](*full, **options, **constants.values)
            # the launcher takes every parameter in order, compile-time constants included
            names = self.kernel.arg_names[len(full):]
            self.compiled[key] = (compiled, [constants.values[n] for n in names])
            return
        compiled, values = entry
        compiled[(grid, 1, 1)](*full, *values)
