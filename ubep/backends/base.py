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
    """A collective did not complete: a peer failed, raised early, or did not arrive in time."""


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
    - ``routes``: the backend's own record of where rows came from and go back to.
    """

    config: EPConfig
    num_tokens: int
    topk_weights: torch.Tensor
    row_weights: torch.Tensor
    tokens_per_expert: torch.Tensor
    num_rows: int
    wire: WireStats | None
    routes: object

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
