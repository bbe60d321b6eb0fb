"""Backends whose device memory a CUDA graph holds: kept past their Buffer's ``destroy()``.

A captured kernel addresses the buffers it was captured with by their raw device addresses, so the
memory of a Buffer whose calls a graph captured must outlive the Buffer object as long as the graph
may be replayed; ubep cannot see when the user deletes a graph. Such backends are listed here from
their first captured call: ``destroy()`` then leaves their memory in place (the graph keeps working),
the waits of a replay that time out are reported by the next call of any live Buffer of the same
kind, and :func:`release_graph_memory` frees the memory once the user says the graphs are gone.

The ascend backend's windows belong to the process group; an NPU graph that captured calls of one
layer pins them to that layer's layout (``ascend_windows.GroupWindows.captured_layout``) until
:func:`release_graph_memory` says the graphs are gone.
"""

from __future__ import annotations

import weakref

_CAPTURED: list = []  # backends with a captured call, in the order of their first capture
_PINNED: weakref.WeakSet = weakref.WeakSet()  # ascend group windows an NPU graph captured calls on


def pin_for_graphs(windows) -> None:
    """An NPU graph captured a call on the ascend group ``windows``: they keep its layout until
    :func:`release_graph_memory`."""
    _PINNED.add(windows)


def keep_for_graphs(backend) -> None:
    """``backend`` had a call captured in a CUDA graph: its device memory stays until
    :func:`release_graph_memory`, even after its Buffer is destroyed."""
    if not any(b is backend for b in _CAPTURED):
        _CAPTURED.append(backend)


def held_for_graphs(backend) -> bool:
    return any(b is backend for b in _CAPTURED)


def destroyed_for_graphs() -> list:
    """The destroyed backends whose memory a graph may still use."""
    return [b for b in _CAPTURED if b.destroyed]


def release_graph_memory() -> int:
    """Free the device memory that destroyed Buffers kept for the CUDA graphs that captured their
    calls, and let the ascend groups that NPU graphs captured calls on be prepared for other layers
    again; returns the bytes of symmetric memory given back. Call it only once those graphs are
    deleted (a replay afterwards would address freed memory or re-prepared windows). Buffers not yet
    destroyed keep theirs."""
    for windows in list(_PINNED):
        windows.captured_layout = None
    _PINNED.clear()
    freed = 0
    for backend in destroyed_for_graphs():
        freed += getattr(backend, "symmetric_bytes", 0)
        backend.release()
        _CAPTURED.remove(backend)
    return freed
