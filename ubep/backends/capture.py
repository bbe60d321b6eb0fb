"""Whether a graph is being captured: CUDA graphs (torch.cuda) and NPU (ACL) graphs
(``ascend_status.npu_capturing``). A capture may record only work with fixed shapes and no host
synchronization, so the calls that need either refuse to run inside one."""

from __future__ import annotations

import torch

from ubep.backends.ascend_status import npu_capturing


def graph_capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA or NPU graph is being captured on ``t``'s current stream (never for CPU
    tensors: CPU builds of torch cannot ask)."""
    if t.is_cuda:
        return torch.cuda.is_current_stream_capturing()
    return t.device.type == "npu" and npu_capturing()
