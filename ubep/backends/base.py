"""The interface every backend implements, and the handle a dispatch leaves for combine and backward.

A backend moves rows; it does not own autograd or input checks (``ubep.buffer`` does). It provides four
primitives, each a collective over the group (every rank calls it, in the same order):

- ``dispatch``: route tokens to the ranks of their experts and build the :class:`Handle`;
- ``dispatch_like``: route new ``[T, H]`` rows exactly as a handle routed its tokens (combine backward);
- ``combine``: bring expert outputs back and reduce them on the source;
- ``return_pair_values``: bring one fp32 value per receive row back to its ``(t, k)`` slot (the
  gradients of the gate weights).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.config import EPConfig
from ubep.profiling import PhaseTimer


class EPCommError(RuntimeError):
    """A collective did not complete: a peer failed, raised early, did not arrive in time, or called
    another operation."""


# The last two are the balanced buffer's weight calls (ubep.balanced), on the reference backend.
OPS = ("dispatch", "dispatch_like", "combine", "return_pair_values", "prefetch_weights",
       "reduce_weight_grads")
REDUCE_CODES = {"source": 0, "expert_rank": 1}
HANDLE_CALL_BITS = 17  # a handle's dispatch number, modulo 2**17, in a call code
CALL_BITS = 40  # in the words kernels exchange, a call's number (epoch) below its code


def call_code(op: str, handle_call: int = 0, reduce: str = "source", weighted: bool = False) -> int:
    """What every rank must agree on for one call, as a 22-bit integer: the operation (bits 0-2,
    its index in ``OPS`` plus one), ``reduce="expert_rank"`` (bit 3), ``weighted`` (bit 4) and the
    number of the dispatch whose handle the call reuses (bits 5-21, modulo ``2**17``; 0 for a
    dispatch). Backends that synchronize in their kernels carry it inside the words their ranks
    exchange, so ranks that called different operations wait for words that never come and fail
    with :class:`EPCommError` instead of computing.

    Example: ``call_code("combine", 3, "expert_rank", True) == 3 | 8 | 16 | 3 << 5 == 123``.
    """
    handle = handle_call % (1 << HANDLE_CALL_BITS)
    return (OPS.index(op) + 1) | REDUCE_CODES[reduce] << 3 | int(weighted) << 4 | handle << 5


def describe_call(code: int) -> str:
    """:func:`call_code` in words, e.g. ``combine(reduce='expert_rank', weighted=True) of dispatch 3``."""
    op = OPS[(code & 7) - 1] if 1 <= code & 7 <= len(OPS) else f"operation {code & 7}"
    handle = code >> 5
    if op == "dispatch":
        return op
    if op == "combine":
        reduce = next(r for r, c in REDUCE_CODES.items() if c == code >> 3 & 1)
        op = f"combine(reduce={reduce!r}, weighted={bool(code >> 4 & 1)})"
    return f"{op} of dispatch {handle}"


@dataclass(frozen=True)
class WireStats:
    """What one dispatch put on the wire from this rank to the other ranks (self-sends excluded).

    ``token_bytes`` counts each token once per destination rank (relay); ``naive_token_bytes`` is what
    a per-expert all-to-all would send (once per (token, expert) pair).
    """

    tokens_sent: int
    pairs_sent: int
    token_bytes: int
    naive_token_bytes: int
    route_bytes: int
    count_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.token_bytes + self.route_bytes + self.count_bytes

    @classmethod
    def of(cls, tokens_sent: int, pairs_sent: int, *, hidden: int, itemsize: int, top_k: int,
           world: int, num_experts: int) -> WireStats:
        """The bytes of a dispatch that sends ``tokens_sent`` tokens (``pairs_sent`` pairs) to other
        ranks: token rows, a route entry (row, weight) per pair slot, a count matrix to each peer."""
        return cls(tokens_sent=tokens_sent, pairs_sent=pairs_sent,
                   token_bytes=tokens_sent * hidden * itemsize,
                   naive_token_bytes=pairs_sent * hidden * itemsize,
                   route_bytes=tokens_sent * 2 * top_k * 4,
                   count_bytes=(world - 1) * (num_experts + world) * 8)


@dataclass(frozen=True, eq=False)
class Handle:
    """Everything a dispatch learned about routing; combine and backward reuse it without new counts.

    - ``num_tokens``: ``T``, this rank's tokens; ``topk_weights``: ``[T, K]`` fp32, the gate weights
      as passed to dispatch (autograd-connected);
    - ``row_weights``: ``[num_rows]`` fp32, gate weight per receive row (0 on padding rows);
    - ``tokens_per_expert``: ``[E_local]`` int64; ``num_rows``: rows of the flat receive buffer
      (``sum(tokens_per_expert)`` in the compact layout, ``E_local * capacity`` in the padded one);
    - ``wire``: bytes this rank put on the wire, or ``None`` where counting them would cost a host
      synchronization the backend otherwise avoids;
    - ``routes``: the backend's own record of where rows came from and go back to;
    - ``call``: the number of the dispatch that made it on this Buffer (1, 2, ...): calls that
      reuse the handle name it in their :func:`call_code`.
    """

    config: EPConfig
    num_tokens: int
    topk_weights: torch.Tensor
    row_weights: torch.Tensor
    tokens_per_expert: torch.Tensor
    num_rows: int
    wire: WireStats | None
    routes: object
    call: int = 0

    def rows_shape(self, *trailing: int) -> tuple[int, ...]:
        """Shape of a receive-side tensor in this handle's layout, e.g. ``rows_shape(H)``."""
        cfg = self.config
        if cfg.layout == "padded":
            return (cfg.num_local_experts, cfg.expert_capacity, *trailing)
        return (self.num_rows, *trailing)


class Backend(ABC):
    """One way of moving rows between the ranks of ``group``; see the module docstring."""

    name: str

    def __init__(self, config: EPConfig, group: dist.ProcessGroup | None, device: torch.device):
        self.config = config
        self.group = group
        self.device = device
        self.timer = PhaseTimer(device=device)
        self.dispatches = 0  # dispatches so far: the next handle's ``call`` is this plus one
        self.destroyed = False

    def destroy(self) -> None:
        """Wait for this rank's queued work and give back what the backend holds; later calls raise
        (``ubep.Buffer.destroy``). Backends that hold device memory release it here (``release``),
        unless a CUDA graph captured one of their calls (``ubep.backends.lifetime``)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.destroyed = True
        self.release()

    def release(self) -> None:
        """Drop what this backend holds: here its timer's samples (CUDA events on a GPU); backends
        with device memory drop that too."""
        self.timer.reset()

    @abstractmethod
    def dispatch(
        self, x_TH: torch.Tensor, topk_idx_TK: torch.Tensor, topk_weights_TK: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, Handle]:
        """Returns ``(recv_x, recv_weights, handle)`` in the configured layout."""

    @abstractmethod
    def dispatch_like(self, x_TH: torch.Tensor, handle: Handle) -> torch.Tensor:
        """Routes ``[T, H]`` rows as ``handle`` routed its tokens; returns ``handle.rows_shape(H)``."""

    @abstractmethod
    def combine(
        self, expert_out: torch.Tensor, handle: Handle, reduce: str, weighted: bool
    ) -> torch.Tensor:
        """``expert_out`` in ``handle.rows_shape(H)``; returns ``[T, H]`` in its dtype."""

    @abstractmethod
    def return_pair_values(self, values_R: torch.Tensor, handle: Handle) -> torch.Tensor:
        """``[num_rows]`` fp32 per receive row back to the source's slots: ``[T, K]`` fp32, 0 at ``-1``."""

    def worker_timeline(self) -> list[dict]:
        """Per-program stamps of the last profiled launches, for backends that take them inside their
        kernels (``ubep.backends.cuda.stamps``); none here."""
        return []

    def synchronize(self) -> None:
        """Wait for this rank's queued work; backends whose waits run on the device raise
        :class:`EPCommError` here when one of them timed out."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
