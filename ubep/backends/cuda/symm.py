"""Symmetric buffers of the CUDA backend: one allocation per buffer on every rank of the group,
each rank able to write any peer's copy directly over NVLink (torch symmetric memory)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem


class SymmetricBuffer:
    """A ``shape`` buffer of ``dtype`` on every rank.

    ``local`` is this rank's copy; ``ptrs`` a ``[W]`` int64 tensor of every rank's base address, which
    kernels use to write straight into a peer's copy.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, group: dist.ProcessGroup,
                 device: torch.device):
        self.local = symm_mem.empty(shape, dtype=dtype, device=device)
        self.handle = symm_mem.rendezvous(self.local, group.group_name)
        self.ptrs = torch.tensor(self.handle.buffer_ptrs, dtype=torch.int64, device=device)

    @property
    def nbytes(self) -> int:
        return self.local.numel() * self.local.element_size()

    def barrier(self, timeout_ms: int) -> None:
        """Every rank's stream reaches this point before any goes on (a device-side barrier)."""
        self.handle.barrier(channel=0, timeout_ms=timeout_ms)


def enable_for(group: dist.ProcessGroup) -> None:
    """Older torch releases need symmetric memory switched on per group; newer ones only warn that
    the call is no longer needed."""
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            enable(group.group_name)
