"""Finding and loading the Ascend operator library, which registers ``torch.ops.ubep_ascend``."""

from __future__ import annotations

import os
from pathlib import Path

import torch

LIB_ENV = "UBEP_ASCEND_LIB"
_LIB_NAMES = ("libubep_ascend_twin.so", "libubep_ascend.so")


def library_path() -> Path | None:
    """The built operator library: ``$UBEP_ASCEND_LIB``, else ``build/ascend_ops/`` of this checkout (the
    CPU twin's; the NPU binding that ``./build.sh npu`` puts in ``build-npu/ascend_ops/`` is found
    through ``$UBEP_ASCEND_LIB`` only, so that a checkout holding both runs its CPU tests on the twin)."""
    if os.environ.get(LIB_ENV):
        return Path(os.environ[LIB_ENV])
    build = Path(__file__).resolve().parents[2] / "build" / "ascend_ops"
    return next((build / n for n in _LIB_NAMES if (build / n).exists()), None)


def load_ops() -> None:
    """Registers ``torch.ops.ubep_ascend`` once; ValueError saying how to build it if missing."""
    if hasattr(torch.ops, "ubep_ascend") and hasattr(torch.ops.ubep_ascend, "dispatch"):
        return
    path = library_path()
    if path is None or not path.exists():
        raise ValueError("backend='ascend' needs the operator library: run ./build.sh test (or cmake -S . -B "
                         f"build && cmake --build build), on an NPU ./build.sh npu, or set {LIB_ENV}; not "
                         f"found: {path}")
    torch.ops.load_library(str(path))
