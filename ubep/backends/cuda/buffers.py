"""The symmetric buffers of both buffer sets (dispatch's and combine's), made through an injectable
allocator: ``allocate(shape, dtype)`` returns an object with ``local`` (this rank's tensor), ``ptrs``
(``[W]`` int64 base addresses of every rank's copy), ``nbytes`` and ``barrier(timeout_ms)``, as
``symm.SymmetricBuffer`` does on GPUs; tests and benchmarks pass host or meta tensors instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ubep.backends.cuda import wire
from ubep.backends.cuda.geometry import INT_VIEW
from ubep.config import EPConfig

Allocate = Callable[[tuple[int, ...], torch.dtype], object]


def symmetric_shapes(config: EPConfig) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every symmetric buffer's shape and dtype (docs/CUDA.md, Memory); the leading 2 is the slot."""
    w, tm, k = config.world_size, config.max_tokens_per_rank, config.top_k
    el, i64 = config.num_local_experts, torch.int64
    be, _, nb = wire.geometry(config.sync, config.hidden, config.dtype.itemsize)
    rows = INT_VIEW[config.dtype.itemsize]
    return {
        "stage": ((2, w, tm, nb * be), rows), "route": ((2, w, tm * k, 4), i64),
        "count": ((2, w, el + 1), i64), "sig": ((2, w), i64),
        "ack": ((w,), i64), "rec": ((2, w, 2), i64),
        "back": ((2, max(tm * k, w * tm), nb * be), rows),
        "back_sig": ((2, w), i64), "back_ack": ((w,), i64), "back_rec": ((2, w, 2), i64),
        "intent": ((2, w), i64), "back_intent": ((2, w), i64),
    }


def symmetric_buffers(config: EPConfig, allocate: Allocate, sentinel: int) -> dict[str, object]:
    """Every symmetric buffer, zeroed (epoch 0 is never used: zeroed flags and records match no
    call), in ``sp`` every 128-byte block's two marker words set to ``sentinel`` (idle slots), then
    a barrier: no peer writes before every rank has done so."""
    buffers = {name: allocate(shape, dtype)
               for name, (shape, dtype) in symmetric_shapes(config).items()}
    for buf in buffers.values():
        buf.local.zero_()
    if config.sync == "sp":
        fill = torch.tensor(sentinel, dtype=torch.int64).to(torch.int32)  # the u32's bits
        for name in ("stage", "back"):
            buffers[name].local.view(torch.int32).view(-1, wire.BLOCK_BYTES // 4)[:, :2] = fill
    buffers["sig"].barrier(int(config.timeout_s * 1000))
    return buffers
