"""The prepare/finalize of vLLM's modular MoE kernel over a ``ubep.Buffer``, in torch and ubep alone.

vLLM's ``FusedMoEPrepareAndFinalizeModular`` (``modular.py`` subclasses it where vLLM imports)
calls ``prepare`` before the experts and ``finalize`` after them. Here ``prepare`` is a ubep
dispatch in the padded layout and ``finalize`` a ubep combine:

- ``prepare(a1 [T, H], topk_weights [T, K], topk_ids [T, K])`` -> ``recv_x [E_local, W * T_max, H]``
  and ``expert_num_tokens [E_local]`` int32: vLLM's BatchedExperts activation format, each local
  expert's rows first in (source rank, source token) order, the rest padding that the batched experts
  skip (they read ``expert_num_tokens``) and that ubep leaves unwritten.
- ``finalize(output [T, H], expert_out [E_local, W * T_max, H])``: the combine's weighted fp32 sum in
  ascending k (docs/SEMANTICS.md), cast once to the dtype, written into ``output``.

Weights follow vLLM's ``apply_router_weight_on_input``: when set, ``prepare`` scales ``a1`` by its
(top-1) weight before dispatch as vLLM's own prepare/finalizes do (``a1 * w.to(a1.dtype)``) and
``finalize`` sums unweighted; otherwise ``finalize`` applies the weights that ``prepare`` dispatched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends.base import Handle
from ubep.buffer import DEFAULT_SYNC, Buffer
from ubep.config import REDUCTIONS, SYNC_MODES

ENV = "UBEP_VLLM"  # the one setting: unset (off), "1"/"cuda" (the cuda backend) or "reference"
ENV_SYNC, ENV_REDUCE, ENV_TIMEOUT = "UBEP_VLLM_SYNC", "UBEP_VLLM_REDUCE", "UBEP_VLLM_TIMEOUT_S"
OFF = ("", "0", "false", "off", "no")
ON = {"1": "cuda", "true": "cuda", "on": "cuda", "yes": "cuda", "cuda": "cuda", "reference": "reference"}
LAYOUT = "padded"  # vLLM's BatchedExperts format; the only one offered (docs/INTEGRATIONS.md says why)


@dataclass(frozen=True)
class Settings:
    """What the environment asks of the vLLM integration. ``backend=None``: ubep is off."""

    backend: str | None = None
    sync: str | None = None
    reduce: str = "source"
    timeout_s: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Read ``UBEP_VLLM`` and its optional knobs; ``ValueError`` naming the variable on a bad
        value."""
        raw = env.get(ENV, "").strip().lower()
        if raw not in OFF and raw not in ON:
            raise ValueError(f"{ENV} must be unset, one of {sorted(ON)} or one of {list(OFF[1:])}, "
                             f"got {env[ENV]!r}")
        sync = env.get(ENV_SYNC) or None
        if sync is not None and sync not in SYNC_MODES:
            raise ValueError(f"{ENV_SYNC} must be one of {SYNC_MODES}, got {sync!r}")
        reduce = env.get(ENV_REDUCE) or "source"
        if reduce not in REDUCTIONS:
            raise ValueError(f"{ENV_REDUCE} must be one of {REDUCTIONS}, got {reduce!r}")
        return cls(ON.get(raw), sync, reduce, _positive_float(env, ENV_TIMEOUT, cls.timeout_s))

    @property
    def enabled(self) -> bool:
        return self.backend is not None

    @property
    def effective_sync(self) -> str:
        """The sync mode the Buffers get: the asked one, else the backend's default."""
        return self.sync or DEFAULT_SYNC[self.backend or "cuda"]

    def describe(self) -> str:
        return (f"backend={self.backend}, layout={LAYOUT} (vLLM BatchedExperts), "
                f"sync={self.effective_sync}, reduce={self.reduce}")


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {raw!r}")
    return value


@dataclass(frozen=True)
class BufferSpec:
    """One ubep Buffer's configuration; MoE layers of one shape share a Buffer."""

    hidden: int
    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    dtype: torch.dtype
    backend: str = "cuda"
    sync: str | None = None
    timeout_s: float = 300.0
    device: torch.device | None = None  # None: the group's (NCCL: the current CUDA device)

    def make(self, group: dist.ProcessGroup | None) -> Buffer:
        """A padded Buffer over ``group`` (a collective: every rank makes it in the same order).
        Index checks are off: they cost a host synchronization per dispatch, and vLLM's router
        gives valid ids."""
        return Buffer(group, hidden=self.hidden, num_experts=self.num_experts, top_k=self.top_k,
                      max_tokens_per_rank=self.max_tokens_per_rank, dtype=self.dtype,
                      backend=self.backend, layout=LAYOUT, sync=self.sync, device=self.device,
                      timeout_s=self.timeout_s, check_inputs=False)


_SHARED: dict[tuple[object, BufferSpec], Buffer] = {}


def shared_buffer(group: dist.ProcessGroup | None, spec: BufferSpec) -> Buffer:
    """The process's Buffer for ``(group, spec)``, made on first use. Every rank's layers ask in the
    same order, so the ranks make their Buffers together."""
    key = (group, spec)
    if key not in _SHARED or _SHARED[key]._backend.destroyed:
        _SHARED[key] = spec.make(group)
    return _SHARED[key]


def release_shared_buffers() -> None:
    """Destroy every Buffer :func:`shared_buffer` made (each rank should call it, after its last
    MoE step)."""
    while _SHARED:
        _SHARED.popitem()[1].destroy()


def refuse_quantized_activations(quant_dtype: object, defer_input_quant: bool) -> None:
    """``ValueError`` where vLLM would hand ``prepare`` activations to quantize before dispatch:
    ubep moves bf16, fp16 or fp32 rows, not fp8 / int8 / fp4 ones with scales."""
    if quant_dtype is None or defer_input_quant:
        return
    raise ValueError(
        f"ubep dispatches bf16/fp16/fp32 rows, but this MoE layer quantizes its activations to "
        f"{quant_dtype} before dispatch (set by the model's quantization: the checkpoint's "
        f"quantization_config or --quantization). Serve a model whose MoE activations are not "
        f"quantized, or unset {ENV} to use vLLM's own all2all backends.")


@dataclass
class _Pending:
    """What ``finalize`` needs of the ``prepare`` before it."""

    handle: Handle
    topk_weights_TK: torch.Tensor  # the caller's tensor, as given to prepare
    weighted: bool


class UbepPrepareFinalizeCore:
    """Dispatch in ``prepare``, combine in ``finalize``, over one padded ``ubep.Buffer`` (any
    backend). One object per MoE layer; layers may share the Buffer. Calls alternate: each
    ``finalize`` combines the rows of the ``prepare`` before it."""

    def __init__(self, buffer: Buffer, *, reduce: str = "source"):
        if buffer.config.layout != LAYOUT:
            raise ValueError(f"buffer must have layout={LAYOUT!r} (vLLM's BatchedExperts format), "
                             f"got {buffer.config.layout!r}")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
        self.buffer, self.reduce = buffer, reduce
        self._pending: _Pending | None = None

    @property
    def num_dispatchers(self) -> int:
        """``W``: the EP ranks whose tokens a rank receives."""
        return self.buffer.config.world_size

    @property
    def max_tokens_per_rank(self) -> int:
        return self.buffer.config.max_tokens_per_rank

    @property
    def num_experts(self) -> int:
        return self.buffer.config.num_experts

    @property
    def top_k(self) -> int:
        return self.buffer.config.top_k

    def prepare(self, a1_TH: torch.Tensor, topk_weights_TK: torch.Tensor, topk_ids_TK: torch.Tensor,
                apply_router_weight_on_input: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Dispatch: ``(recv_x [E_local, W * T_max, H], expert_num_tokens [E_local] int32)``.
        ``a1_TH`` is not written."""
        if self._pending is not None:
            raise RuntimeError("prepare called twice without a finalize between them")
        x_TH = weighted_input(a1_TH, topk_weights_TK) if apply_router_weight_on_input else a1_TH
        weights_TK = topk_weights_TK.to(torch.float32)  # ubep's gate weights are fp32
        res = self.buffer.dispatch(x_TH, topk_ids_TK, weights_TK)
        self._pending = _Pending(res.handle, topk_weights_TK, not apply_router_weight_on_input)
        return res.recv_x, res.tokens_per_expert.to(torch.int32)

    def finalize(self, output_TH: torch.Tensor, expert_out_ECH: torch.Tensor,
                 topk_weights_TK: torch.Tensor | None, apply_router_weight_on_input: bool) -> None:
        """Combine ``expert_out_ECH`` (unweighted, unreduced expert rows in the dispatch's layout)
        into ``output_TH``, weighted unless the weights went in with the input."""
        pending = self._take(topk_weights_TK, apply_router_weight_on_input)
        y_TH = self.buffer.combine(expert_out_ECH, pending.handle, reduce=self.reduce,
                                   weighted=pending.weighted)
        output_TH.copy_(y_TH)

    def _take(self, topk_weights_TK: torch.Tensor | None, apply_router_weight_on_input: bool) -> _Pending:
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("finalize called without a prepare before it")
        if apply_router_weight_on_input == pending.weighted:
            raise ValueError("apply_router_weight_on_input differs between prepare and finalize")
        if topk_weights_TK is not None and topk_weights_TK is not pending.topk_weights_TK:
            raise ValueError("finalize got other topk_weights than prepare: ubep's combine applies the "
                             "weights that travelled with the rows")
        return pending


def weighted_input(a1_TH: torch.Tensor, topk_weights_TK: torch.Tensor) -> torch.Tensor:
    """``a1 * w`` for top-1 routing, in ``a1``'s dtype, as vLLM's (and vllm-ascend's) own
    prepare/finalizes scale it before dispatch."""
    if topk_weights_TK.shape[1] != 1:
        raise ValueError(f"apply_router_weight_on_input needs top_k == 1 (as in vLLM's own "
                         f"prepare/finalizes), got top_k={topk_weights_TK.shape[1]}")
    return a1_TH * topk_weights_TK.to(a1_TH.dtype)
