"""Op ids: the integer by which ``torch.ops.ubep`` finds a live Buffer (ops take tensors and
primitives only). Every Buffer takes one when it is made (``Buffer.op_id``), so a compiled function
only reads an int attribute of the Buffer (a guarded constant of the graph), whatever the torch
version; a process never reuses an id. The registry holds Buffers weakly."""

from __future__ import annotations

import itertools
import weakref

_BUFFERS: dict[int, weakref.ref] = {}  # op id -> Buffer
_NEXT_ID = itertools.count(1)


def register(buf: object) -> int:
    """A new op id for ``buf``."""
    found = next(_NEXT_ID)
    _BUFFERS[found] = weakref.ref(buf)
    return found


def lookup(op_id: int) -> tuple[object | None, bool]:
    """``(buffer, was_given)``: the Buffer of ``op_id`` (``None`` if it never was or was collected)
    and whether the id was ever given."""
    ref = _BUFFERS.get(op_id)
    return (ref() if ref is not None else None), ref is not None
