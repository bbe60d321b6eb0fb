"""The windows of a process group's ascend Buffers: one per die for the life of the group, shared by
every Buffer on it, as HCCL's per-communicator window is on an NPU; and the call numbering that goes
with them.

On NPUs a die's window is HCCL's ``windowsIn`` of the group's communicator (``HCCL_BUFFSIZE`` MB), which
the kernels reach through the op's HCCL context; the ops get the communicator's name and no window
tensors. That path has never run (no NPU here). On the CPU twin a die's window is a ``/dev/shm`` file of
the same size that every rank maps, made on the group's first Buffer and unlinked once every rank has
mapped it.

Why the call numbers belong to the group: flags, records and count messages carry the epoch of the
call that wrote them and stay in the window after their Buffer is gone, so a later Buffer that
numbered its calls from 1 again would take them for its own. Numbered per group (by the call counters
in the window header, on the device), the calls of every Buffer on the group form one sequence, and
Buffers of one layer may even interleave their calls with no extra cost. A layer of another layout
reads other bytes as flags, so the window is prepared again (the ``prepare`` op: zeros, sp sentinels,
and a meeting of all dies) whenever it last held another layout.
"""

from __future__ import annotations

import mmap
import os
import secrets
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ubep.backends.ascend_library import load_ops
from ubep.config import EPConfig


def window_bytes(cfg: EPConfig) -> int:
    """Bytes of the group's window that a Buffer of this layer uses on each die."""
    return torch.ops.ubep_ascend.window_bytes(cfg.world_size, cfg.hidden, cfg.num_experts, cfg.top_k,
                                              cfg.max_tokens_per_rank, cfg.dtype, cfg.sync)


def window_layout(cfg: EPConfig) -> tuple:
    """What fixes where a layer's calls put flags, records and sp sentinels in the window (the group's
    size being fixed)."""
    return cfg.hidden, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, cfg.sync


def check_hccl_buffsize(cfg: EPConfig) -> None:
    """ValueError naming ``HCCL_BUFFSIZE`` and the bytes needed when HCCL's window (``HCCL_BUFFSIZE`` MB,
    200 when unset) cannot hold this layer's window; the same check as the ops' host tiling, asked before
    any communication."""
    load_ops()
    problem = torch.ops.ubep_ascend.hccl_window_problem(
        cfg.world_size, cfg.hidden, cfg.num_experts, cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, cfg.sync,
        os.environ.get("HCCL_BUFFSIZE"))
    if problem:
        raise ValueError(f"backend='ascend': {problem}")


@dataclass(eq=False)
class GroupWindows:
    """One process group's windows and calls.

    ``name``: the HCCL group the ops find the windows in (on an NPU the communicator's name);
    ``tensors``: every die's mapping on the CPU twin, empty on an NPU; ``nonce``: random, the same on
    every rank, it makes the preparation's tokens differ from anything another group or process left
    in the memory; ``preparations``: how many the group has started (each one's number is in its
    tokens; the calls' numbers are counted on the device, from 1 after each preparation);
    ``layout``: the layer layout the windows were last prepared for (``None``: none, or a preparation
    failed); ``captured_layout``: the layout of calls an NPU graph captured on the group, which the
    windows then keep.
    """

    name: str
    tensors: list[torch.Tensor]
    nonce: int
    maps: list[mmap.mmap] = field(default_factory=list)
    preparations: int = 0
    layout: tuple | None = None
    captured_layout: tuple | None = None

    def next_preparation(self) -> int:
        """The next preparation's number, ``1, 2, 3, ...`` on every rank: preparations are decided on
        the host from the group's calls, the same sequence everywhere, and never captured."""
        self.preparations += 1
        return self.preparations


_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def group_windows(cfg: EPConfig, group: dist.ProcessGroup | None, device: torch.device) -> GroupWindows:
    """The group's windows, made on its first Buffer (a collective then); ValueError first, before any
    communication, when HCCL's window cannot hold this layer's."""
    check_hccl_buffsize(cfg)
    pg = group if group is not None else dist.group.WORLD
    windows = _GROUPS.get(pg)
    if windows is None:
        nonce = [secrets.randbits(63) if cfg.rank == 0 else None]
        dist.broadcast_object_list(nonce, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        windows = (twin_windows(cfg, group, nonce[0]) if device.type == "cpu"
                   else hccl_windows(pg, device, cfg.rank, nonce[0]))
        _GROUPS[pg] = windows
    return windows


def hccl_windows(pg, device, rank: int, nonce: int) -> GroupWindows:
    """An NPU group's windows: HCCL's, named by the group's communicator."""
    return GroupWindows(pg._get_backend(device).get_hccl_comm_name(rank), [], nonce)


def twin_windows(cfg: EPConfig, group: dist.ProcessGroup | None, nonce: int) -> GroupWindows:
    """One ``/dev/shm`` window per die of ``HCCL_BUFFSIZE`` MB (and the twin's tables after it), mapped by
    every die; sparse, so only the bytes the layers touch take memory. The files start zeroed, but like
    HCCL's they are prepared before a layer's first call."""
    nbytes = torch.ops.ubep_ascend.twin_mapping_bytes(os.environ.get("HCCL_BUFFSIZE"))
    name = f"ubep-{nonce:016x}"
    paths = [f"/dev/shm/{name}-{r}" for r in range(cfg.world_size)]
    fd = os.open(paths[cfg.rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    dist.barrier(group=group)
    maps = []
    for path in paths:
        with open(path, "r+b") as f:
            maps.append(mmap.mmap(f.fileno(), nbytes))
    dist.barrier(group=group)
    os.unlink(paths[cfg.rank])  # every rank holds its mapping; no file outlives the group's windows
    return GroupWindows(name, [torch.frombuffer(m, dtype=torch.uint8) for m in maps], nonce, maps)
