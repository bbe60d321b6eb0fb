"""Several ranks on one GPU, so the multi-rank GPU tests also run where a machine has fewer GPUs
than ranks (one H200 and W = 2, 4 or 8).

torch symmetric memory refuses two ranks whose allocations share a device, so each rank here
allocates plain device memory and maps every peer's copy through a CUDA IPC handle; the ranks talk
over a gloo group. Their kernels take turns on the GPU (time slices between processes), which checks
the protocol's logic with real device memory (epochs, acks, slot reuse, waits on peers), but not
NVLink: ordering and store atomicity across GPUs need GPUs of their own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from ubep.launch import run_ranks


class IpcBuffer:
    """What :class:`ubep.backends.cuda.symm.SymmetricBuffer` offers (``local``, ``ptrs``, ``nbytes``,
    ``barrier``), with the peers' copies opened through CUDA IPC."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, group: dist.ProcessGroup,
                 device: torch.device):
        from torch.multiprocessing.reductions import reduce_tensor

        self.group = group
        self.local = torch.empty(shape, dtype=dtype, device=device)
        handles: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(handles, reduce_tensor(self.local), group=group)
        me = dist.get_rank(group)
        # the opened peer tensors stay referenced: their mappings must outlive the kernels
        self.peers = [self.local if r == me else rebuild(*args)
                      for r, (rebuild, args) in enumerate(handles)]
        self.ptrs = torch.tensor([p.data_ptr() for p in self.peers], dtype=torch.int64,
                                 device=device)

    @property
    def nbytes(self) -> int:
        return self.local.numel() * self.local.element_size()

    def barrier(self, timeout_ms: int) -> None:
        torch.cuda.synchronize()
        dist.barrier(group=self.group)


def _on_shared_gpu(rank: int, world_size: int, fn: Callable, *args):
    import ubep.backends.cuda.backend as cuda_backend

    torch.cuda.set_device(0)
    cuda_backend.SymmetricBuffer = IpcBuffer  # this process only
    return fn(rank, world_size, *args)


def run_on_gpus(fn: Callable, world_size: int, *args, timeout_s: float) -> list:
    """``fn(rank, world_size, *args)`` on ``world_size`` ranks: over NCCL with a GPU per rank where
    the machine has enough, otherwise over gloo with every rank on GPU 0. ``fn`` must build its
    Buffer with ``device=`` the current CUDA device (a gloo group would otherwise mean the CPU)."""
    if torch.cuda.device_count() >= world_size:
        return run_ranks(fn, world_size, *args, pg_backend="nccl", timeout_s=timeout_s)
    return run_ranks(_on_shared_gpu, world_size, fn, *args, pg_backend="gloo",
                     timeout_s=timeout_s)
