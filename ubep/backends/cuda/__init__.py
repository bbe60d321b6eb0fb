"""The CUDA backend: dispatch and combine over NVLink symmetric memory, kernels in Triton.

Importing this package imports Triton; ``ubep.buffer`` imports it only when ``backend="cuda"`` is
asked for, so the package works on machines without CUDA or Triton.
"""

from ubep.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
