"""``ubep.BalancedBuffer``: dispatch and combine with per-batch redundant experts (MoonEP's idea).

Every dispatch plans its batch from the all-gathered counts (:mod:`ubep.balance`): under-loaded
ranks compute some rows of hot experts with borrowed copies of their weights, so every rank
computes the same number of rows (``S * K`` when every rank sends ``S`` tokens with top-``K``).

A class of its own rather than a ``Buffer`` option: its receive rows are segments (own experts,
then borrowed slots) rather than local experts, it owns a weight pool and two more calls
(:meth:`BalancedBuffer.prefetch_weights`, :meth:`BalancedBuffer.reduce_weight_grads`). It inherits
the Buffer's input checks, configuration agreement, autograd and lifetime. docs/BALANCE.md has the
walk-through.

On the reference backend the plan drives the collectives themselves. On the others (``cuda``,
``ascend``) the rows go through a plain Buffer of ``W * 2L`` virtual experts, ``2L`` per rank, one
per segment: each pair's expert id becomes ``rank * 2L + segment`` of the rank and segment the plan
gives it, so the row Buffer delivers each segment's rows in (source rank, source token) order, as
the plan lays them out, and its combine sums each token's rows in ``k`` order: the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends import collectives
from ubep.backends.base import Backend
from ubep.backends.reference_balanced import BalancedHandle, BalancedReferenceBackend
from ubep.balance import BalancePlan
from ubep.buffer import Buffer, DispatchResult
from ubep.checks import check_int

ROW_BACKENDS = ("reference", "cuda", "ascend")  # what may move a BalancedBuffer's rows
MAX_WEIGHTS, MAX_DIMS = 8, 4  # the pool's shapes travel as a fixed-size row in the agreement
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class BalancedDispatchResult(DispatchResult):
    """:class:`ubep.DispatchResult` whose rows are grouped by segment: ``recv_x [N, H]`` holds
    this rank's own experts ``0..L-1`` first, then its borrowed slots (global expert ids ascending,
    ``plan.borrowed_WL[rank]``), each segment's rows ordered by (source rank, source token).
    ``tokens_per_segment [2L]`` int64; ``tokens_per_expert`` is its first ``L`` entries."""

    tokens_per_segment: torch.Tensor

    @property
    def plan(self) -> BalancePlan:
        return self.handle.plan


def _check_shapes(weight_shapes: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(weight_shapes, Sequence) or not 1 <= len(weight_shapes) <= MAX_WEIGHTS:
        raise ValueError(f"weight_shapes must be a sequence of 1 to {MAX_WEIGHTS} shapes (one per "
                         f"weight of an expert), got {weight_shapes!r}")
    for i, shape in enumerate(weight_shapes):
        if not isinstance(shape, Sequence) or not 1 <= len(shape) <= MAX_DIMS:
            raise ValueError(f"weight_shapes[{i}] must have 1 to {MAX_DIMS} dimensions, got {shape!r}")
        for size in shape:
            check_int(f"weight_shapes[{i}]", size, 1)
    return tuple(tuple(shape) for shape in weight_shapes)


def _pool_row(shapes: tuple[tuple[int, ...], ...], dtype: torch.dtype, backend: str) -> torch.Tensor:
    """``[2 + MAX_WEIGHTS * (1 + MAX_DIMS)]`` int64: the rows' backend, the dtype, then each shape's
    rank and sizes."""
    row = [ROW_BACKENDS.index(backend), WEIGHT_DTYPES.index(dtype)]
    for i in range(MAX_WEIGHTS):
        shape = shapes[i] if i < len(shapes) else ()
        row += [len(shape), *shape, *[0] * (MAX_DIMS - len(shape))]
    return torch.tensor(row, dtype=torch.int64)


def _pool_of_row(row: list[int]) -> str:
    backend, dtype, rest = ROW_BACKENDS[row[0]], WEIGHT_DTYPES[row[1]], row[2:]
    shapes = []
    for i in range(MAX_WEIGHTS):
        ndim, *sizes = rest[i * (1 + MAX_DIMS) : (i + 1) * (1 + MAX_DIMS)]
        if ndim:
            shapes.append(tuple(sizes[:ndim]))
    return f"{shapes} {str(dtype).removeprefix('torch.')}, rows on {backend}"


class BalancedBuffer(Buffer):
    """Balanced expert-parallel dispatch and combine (compact rows).

    Args (beyond :class:`ubep.Buffer`'s ``group, hidden, num_experts, top_k, max_tokens_per_rank,
    dtype, device, timeout_s, check_inputs, profile``):
        weight_shapes: the shape of each weight of one expert, e.g. ``[(H, I), (I, H)]``.
        weight_dtype: the experts' weight dtype (fp32, bf16 or fp16).
        backend: ``"reference"`` (default), ``"cuda"`` or ``"ascend"``: the backend that moves the
            rows (compact layout); the plan and the weights always go through the group's
            collectives. ``sync``, ``num_sms``: that backend's, as for :class:`ubep.Buffer`.

    The Buffer owns one weight pool of ``L = E / W`` slots, each holding one expert's weights: a
    plan borrows at most ``L`` experts per rank, so the pool is bounded, and every layer using this
    Buffer shares it (a layer's borrowed weights are valid until the next
    :meth:`prefetch_weights`; fetch them again before a backward that needs them).
    """

    balance = "redundant"

    def __init__(self, group: dist.ProcessGroup | None = None, *, hidden: int, num_experts: int,
                 top_k: int, max_tokens_per_rank: int, weight_shapes: Sequence[Sequence[int]],
                 dtype: torch.dtype = torch.bfloat16, weight_dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, timeout_s: float = 60.0,
                 check_inputs: bool = True, profile: bool | None = None, backend: str = "reference",
                 sync: str | None = None, num_sms: int | None = None):
        if backend not in ROW_BACKENDS:
            raise ValueError(f"backend must be one of {ROW_BACKENDS} for a BalancedBuffer, got {backend!r}")
        self.weight_shapes = _check_shapes(weight_shapes)
        if weight_dtype not in WEIGHT_DTYPES:
            raise TypeError(f"weight_dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype}")
        self.weight_dtype = weight_dtype
        super().__init__(group, hidden=hidden, num_experts=num_experts, top_k=top_k,
                         max_tokens_per_rank=max_tokens_per_rank, dtype=dtype, backend="reference",
                         device=device, timeout_s=timeout_s, check_inputs=check_inputs,
                         profile=profile)
        self._agree_pool(group, backend)
        local = self.config.num_local_experts
        self.weight_numel = sum(torch.Size(s).numel() for s in self.weight_shapes)
        self._pool = [[torch.empty(s, dtype=weight_dtype, device=self.device)
                       for s in self.weight_shapes] for _ in range(local)]
        self._rows: Buffer | None = None
        if backend != "reference":
            self._rows = Buffer(group, hidden=hidden, num_experts=self.config.world_size * 2 * local,
                                top_k=top_k, max_tokens_per_rank=max_tokens_per_rank, dtype=dtype,
                                backend=backend, layout="compact", sync=sync, device=self.device,
                                timeout_s=timeout_s, check_inputs=False, profile=profile, num_sms=num_sms)

    def _make_backend(self, name: str, group: dist.ProcessGroup | None) -> Backend:
        return BalancedReferenceBackend(self.config, group, self.device)

    def _agree_pool(self, group: dist.ProcessGroup | None, backend: str) -> None:
        """Every rank shows its pool's shapes and dtype and its rows' backend (the Buffer's own
        agreement has already shown that every rank made a BalancedBuffer); ``ValueError`` on every
        rank if they differ, before the row Buffer's own collectives."""
        cfg = self.config
        table = collectives.all_gather(
            _pool_row(self.weight_shapes, self.weight_dtype, backend).to(self.device), group,
            phase="BalancedBuffer: weight pool check", rank=cfg.rank, timeout_s=cfg.timeout_s).cpu()
        ranks_of: dict[str, list[int]] = {}
        for rank, row in enumerate(table.tolist()):
            ranks_of.setdefault(_pool_of_row(row), []).append(rank)
        if len(ranks_of) > 1:
            seen = ", ".join(f"{pool} on ranks {ranks}" for pool, ranks in ranks_of.items())
            raise ValueError(f"ubep rank {cfg.rank}: the ranks' BalancedBuffers disagree: "
                             f"weight_shapes, weight_dtype and backend are {seen} (every rank of the group "
                             f"must create the same BalancedBuffer)")

    @property
    def rows_backend(self) -> str:
        """The backend that moves the rows: ``reference``, ``cuda`` or ``ascend``."""
        return self._rows.backend_name if self._rows is not None else self.backend_name

    @property
    def pool_bytes(self) -> int:
        """Bytes of the weight pool on this rank: ``L`` slots of one expert's weights."""
        return self.config.num_local_experts * self.weight_numel * self.weight_dtype.itemsize

    # -- calls -----------------------------------------------------------------------------------

    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor,
                 topk_weights: torch.Tensor) -> BalancedDispatchResult:
        """:meth:`ubep.Buffer.dispatch` under this batch's plan; see :class:`BalancedDispatchResult`."""
        if self._rows is None:
            res = super().dispatch(x, topk_idx, topk_weights)
            return BalancedDispatchResult(res.recv_x, res.tokens_per_expert, res.recv_weights,
                                          res.handle, res.handle.tokens_per_segment)
        self._check_open()
        self._check_dispatch(x, topk_idx, topk_weights)
        cfg = self.config
        plan, counts_WE = self._backend.plan_batch(topk_idx)
        dest = plan.destinations(topk_idx, cfg.rank, counts_WE)
        virtual = torch.where(dest.rank >= 0, dest.rank * 2 * cfg.num_local_experts + dest.segment, -1)
        res = self._rows.dispatch(x, virtual, topk_weights)
        rows = res.handle
        segments = rows.tokens_per_expert
        handle = BalancedHandle(cfg, rows.num_tokens, rows.topk_weights, rows.row_weights,
                                segments[: cfg.num_local_experts], rows.num_rows, rows.wire, rows.routes,
                                rows.call, plan=plan, tokens_per_segment=segments, rows=rows)
        return BalancedDispatchResult(res.recv_x, handle.tokens_per_expert, res.recv_weights, handle,
                                      segments)

    def combine(self, expert_out: torch.Tensor, handle: BalancedHandle, *, reduce: str = "source",
                weighted: bool = True) -> torch.Tensor:
        """:meth:`ubep.Buffer.combine` of segment rows; ``reduce="source"`` only, because
        ``"expert_rank"`` sums by computing rank, which the plan changes from batch to batch: its
        bits would depend on the plan."""
        if reduce != "source":
            raise ValueError(f"reduce must be 'source' on a BalancedBuffer (an 'expert_rank' partial "
                             f"sum would depend on the batch's plan), got {reduce!r}")
        if self._rows is None:
            return super().combine(expert_out, handle, reduce=reduce, weighted=weighted)
        self._check_open()
        self._check_handle(handle)
        return self._rows.combine(expert_out, handle.rows, reduce=reduce, weighted=weighted)

    def synchronize(self) -> None:
        super().synchronize()
        if self._rows is not None:
            self._rows.synchronize()

    def destroy(self) -> None:
        if self._rows is not None:
            self._rows.destroy()
        super().destroy()

    def prefetch_weights(self, handle: BalancedHandle, weights: Sequence[Sequence[torch.Tensor]]
                         ) -> list[list[torch.Tensor] | None]:
        """Copy the borrowed experts' weights from their homes into this rank's pool slots.

        ``weights[j]``: this rank's own expert ``j`` (``0..L-1``), one tensor per ``weight_shapes``
        entry in ``weight_dtype``. A collective. Returns the weights of each of the ``2L`` segments
        of ``handle``'s dispatch: ``weights[j]`` itself for ``j < L``, then the pool slots of the
        borrowed experts (detached copies: their gradients return home through
        :meth:`reduce_weight_grads`, not autograd), ``None`` for idle slots.
        """
        self._check_open()
        self._check_handle(handle)
        local = self.config.num_local_experts
        self._check_weights(weights)
        flat_LP = torch.stack([torch.cat([w.detach().reshape(-1) for w in expert])
                               for expert in weights])
        slots_LP = self._backend.prefetch(handle, flat_LP)
        borrowed = handle.plan.borrowed_WL[self.config.rank].tolist()
        segments: list[list[torch.Tensor] | None] = [list(expert) for expert in weights]
        for slot, expert in enumerate(borrowed):
            if expert < 0:
                segments.append(None)
                continue
            for into, part in zip(self._pool[slot], self._unflatten(slots_LP[slot]), strict=True):
                into.copy_(part)
            segments.append(self._pool[slot])
        assert len(segments) == 2 * local
        return segments

    def reduce_weight_grads(
        self, handle: BalancedHandle,
        accumulate: Callable[[int, list[torch.Tensor]], list[torch.Tensor]],
    ) -> list[list[torch.Tensor]]:
        """Weight gradients of this rank's own experts, each summed over all its rows, wherever
        they were computed, in the rows' global order (source rank, then the source's ``(t, k)``
        order). A collective; call it after the backward that fills what ``accumulate`` reads.

        ``accumulate(segment, acc)`` must return ``acc`` (``weight_dtype`` tensors of
        ``weight_shapes``) plus the contributions of this rank's rows of ``segment`` (``0..2L-1``
        of ``handle``'s dispatch) taken in row order. The accumulator starts at zeros on the
        first rank computing the expert and travels, rank by ascending rank, to the home
        (:mod:`ubep.balance.chain`): for a row-by-row sum this gives the unbalanced layer's bits.
        Returns ``[L]`` lists of ``weight_dtype`` tensors, in ``weight_shapes`` order. A result of
        ``accumulate`` of the wrong shape or dtype raises ``ValueError`` on its rank, between
        rounds; the peers then end in ``EPCommError`` at their next exchange.
        """
        self._check_open()
        self._check_handle(handle)
        if not callable(accumulate):
            raise TypeError(f"accumulate must be callable, got {type(accumulate).__name__}")

        def flat(segment: int, acc_P: torch.Tensor) -> torch.Tensor:
            acc = accumulate(segment, self._unflatten(acc_P))
            self._check_weight_list(f"accumulate(segment={segment}, ...)", acc)
            return torch.cat([a.reshape(-1) for a in acc])

        zeros_P = torch.zeros(self.weight_numel, dtype=self.weight_dtype, device=self.device)
        own_LP = self._backend.carry(handle, zeros_P, flat)
        return [self._unflatten(row) for row in own_LP]

    # -- helpers ---------------------------------------------------------------------------------

    def _unflatten(self, flat_P: torch.Tensor) -> list[torch.Tensor]:
        sizes = [torch.Size(s).numel() for s in self.weight_shapes]
        return [part.view(s) for part, s in zip(flat_P.split(sizes), self.weight_shapes, strict=True)]

    def _check_handle(self, handle: object) -> None:
        if not isinstance(handle, BalancedHandle) or handle.config is not self.config:
            raise ValueError("handle must come from a dispatch of this BalancedBuffer")

    def _check_weight_list(self, name: str, tensors: object) -> None:
        if not isinstance(tensors, Sequence) or len(tensors) != len(self.weight_shapes):
            raise ValueError(f"{name} must be a list of {len(self.weight_shapes)} tensors "
                             f"(weight_shapes {list(self.weight_shapes)}), got {type(tensors).__name__}"
                             f"{f' of {len(tensors)}' if isinstance(tensors, Sequence) else ''}")
        for i, (t, shape) in enumerate(zip(tensors, self.weight_shapes, strict=True)):
            self._check_tensor(f"{name}[{i}]", t, (self.weight_dtype,), shape)

    def _check_weights(self, weights: object) -> None:
        local = self.config.num_local_experts
        if not isinstance(weights, Sequence) or len(weights) != local:
            got = len(weights) if isinstance(weights, Sequence) else type(weights).__name__
            raise ValueError(f"weights must hold this rank's {local} experts, got {got}")
        for j, expert in enumerate(weights):
            self._check_weight_list(f"weights[{j}]", expert)
