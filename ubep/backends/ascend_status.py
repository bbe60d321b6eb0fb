"""The status words of an ascend Buffer's calls, read without making the host wait for the device.

Every op returns, last, a copy of its kernel's status words (``[4]`` int64: error, phase, peer; all 0
when the call completed). A wait that timed out on the device is reported the way the cuda backend
reports it (``cuda/backend.py``, ``_check_errors``): the next call of the Buffer, or
``Buffer.synchronize()``, raises :class:`EPCommError` naming the rank, the phase and the peer, and every
later call raises again, since the group's windows are then in an unknown state.

- CPU twin: an op returns once its kernel has ended, so its words are read at once and the call
  itself raises; the same path as on an NPU, only earlier.
- NPU: each call's words go to pinned host memory with a non-blocking copy and an event behind it;
  the next call reads those whose event has completed (``Event.query``, no waiting),
  ``synchronize()`` waits for all. A call captured in a graph records no copy or event (a capture may
  record neither); its words, rewritten by every replay, are read at ``synchronize()``.
"""

from __future__ import annotations

import torch

from ubep.backends.base import EPCommError

HINT = ("a peer is late, failed, or called another operation (the ranks must run the same calls in the "
        "same order)")


class StatusWatch:
    def __init__(self, device: torch.device, rank: int, timeout_s: float):
        self.device, self.rank, self.timeout_s = device, rank, timeout_s
        self.pending: list[tuple[torch.Tensor, object]] = []  # NPU: (host copy, event after it)
        self.captured: list[torch.Tensor] = []  # NPU: words of calls a graph captured
        self.failure: str | None = None

    def watch(self, status: torch.Tensor) -> None:
        """Takes one call's status words (on the op's device)."""
        if self.device.type == "cpu":
            self._read(status)
        elif npu_capturing():
            self.captured.append(status)
        else:
            self.pending.append(_copy_to_host(status))

    def check(self, wait: bool = False) -> None:
        """Raises EPCommError for a call that timed out, among those whose words are final (all of them
        with ``wait``, after the caller synchronized the device)."""
        if self.failure is not None:
            raise EPCommError(f"{self.failure} (an earlier call of this Buffer); create a new Buffer, whose "
                              "preparation fills the group's windows again")
        while self.pending and (wait or self.pending[0][1].query()):
            self._read(self.pending.pop(0)[0])
        if wait:
            for status in self.captured:
                self._read(status.cpu())

    def _read(self, status: torch.Tensor) -> None:
        message = torch.ops.ubep_ascend.status_message(status, self.rank, self.timeout_s)
        if message:
            self.failure = message
            self.pending.clear()
            raise EPCommError(f"{message}: {HINT}")


def _copy_to_host(status: torch.Tensor) -> tuple[torch.Tensor, object]:
    """A non-blocking copy of NPU status words into pinned host memory, and an event recorded after it
    on the current stream (GUESS: torch_npu's pinned allocator and ``torch.npu.Event``, as on CUDA)."""
    host = torch.empty(status.shape, dtype=status.dtype, pin_memory=True)
    host.copy_(status, non_blocking=True)
    done = torch.npu.Event()
    done.record()
    return host, done


def npu_capturing() -> bool:
    """Whether an NPU graph is being captured on the current stream (GUESS: torch_npu mirrors
    ``torch.cuda.is_current_stream_capturing``; False where it does not, and without torch_npu)."""
    capturing = getattr(getattr(torch, "npu", None), "is_current_stream_capturing", None)
    return bool(capturing and capturing())
