"""``ubep.Buffer``: the public API. Checks inputs, picks a backend, owns handles, wires autograd.

Every check here runs before any communication, so a rank with bad input raises at once and its
peers end with a clear timeout (``EPCommError``) instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ubep import engine_profile, op_ids
from ubep.backends import collectives
from ubep.backends.base import Backend, Handle
from ubep.backends.capture import graph_capturing
from ubep.backends.reference import ReferenceBackend
from ubep.config import DTYPES, LAYOUTS, REDUCTIONS, SYNC_MODES, EPConfig, least_cuda_sms

BACKENDS = ("auto", "reference", "cuda", "ascend")
BALANCES = ("none", "redundant")  # "redundant": ubep.balanced.BalancedBuffer
# Each backend's sync mode when none is asked for. On an NPU only `sw` rests on documented
# guarantees alone (a flag written after a barrier); `tff` and `sp` also need a tear-free 512-byte
# write and `dc` wrapping int32 atomic adds, neither of which a CANN document states (docs/ASCEND.md,
# "What each mode assumes"). On NVLink the 128-byte blocks `tff` needs were measured whole
# (docs/PROTOCOL.md).
DEFAULT_SYNC = {"reference": "tff", "cuda": "tff", "ascend": "sw"}


@dataclass(frozen=True)
class DispatchResult:
    """What :meth:`Buffer.dispatch` returns on each rank.

    - ``recv_x``: compact ``[N, H]`` (``N = tokens_per_expert.sum()``) or padded
      ``[E_local, W * max_tokens_per_rank, H]``, in ``x``'s dtype; rows ordered by (local expert,
      source rank, source token); padding rows (past each expert's count) are unspecified: a
      backend need not write them (zero-filling ``[E_local, W * T_max, H]`` would cost more than the
      dispatch).
    - ``tokens_per_expert``: ``[E_local]`` int64, rows received per local expert.
    - ``recv_weights``: ``[N]`` or ``[E_local, W * max_tokens_per_rank]`` fp32, the gate weight of each
      row (0 on padding rows).
    - ``handle``: pass to :meth:`Buffer.combine`; backward reuses it too.
    """

    recv_x: torch.Tensor
    tokens_per_expert: torch.Tensor
    recv_weights: torch.Tensor
    handle: Handle


def _device_of(group: dist.ProcessGroup | None) -> torch.device:
    device = collectives.group_device(group)
    if device is None:
        raise ValueError(f"group uses process-group backend {dist.get_backend(group)!r}; pass device= "
                         f"explicitly (known: gloo, nccl, hccl)")
    return device


def _check_backend(name: str, config: EPConfig, device: torch.device) -> None:
    """What a backend needs of the layer and the device, checked on this rank alone before any
    communication."""
    if name == "cuda":
        # The kernels' limits: rows moved in 16-byte pieces, routing rows of 2K int32 words,
        # expert counts that one program holds.
        if config.hidden % 8:
            raise ValueError(f"hidden must be a multiple of 8 for backend='cuda', got {config.hidden}")
        if config.top_k > 16:
            raise ValueError(f"top_k must be <= 16 for backend='cuda', got {config.top_k}")
        if config.num_experts > 1024:
            raise ValueError(f"num_experts must be <= 1024 for backend='cuda', got "
                             f"{config.num_experts}")
        least = least_cuda_sms(config.world_size, config.sync)
        if config.num_sms is not None and config.num_sms < least:
            raise ValueError(f"num_sms must be >= {least} for backend='cuda' with sync="
                             f"{config.sync!r} (one count, one token and one receive program"
                             f"{', one verifier per rank' if least > 3 else ''}), got {config.num_sms}")
        if device.type != "cuda":
            raise ValueError(f"backend='cuda' needs CUDA tensors, but the buffer's device is {device}")


def _make_backend(name: str, config: EPConfig, group, device: torch.device) -> Backend:
    if name == "cuda":
        try:
            from ubep.backends.cuda import CudaBackend
        except ImportError as err:
            raise ValueError(f"backend='cuda' needs Triton and torch symmetric memory: {err}") from err
        return CudaBackend(config, group, device)
    if name == "ascend":
        from ubep.backends.ascend import AscendBackend

        return AscendBackend(config, group, device)
    return ReferenceBackend(config, group, device)


_NAMED = {"backend": BACKENDS, "dtype": DTYPES, "layout": LAYOUTS, "sync": SYNC_MODES,
          "balance": BALANCES}


def _agreed_fields(config: EPConfig, backend: str, balance: str = "none") -> dict[str, int]:
    """What every rank's Buffer must agree on, each field as an integer (a named value by its index
    in ``_NAMED``; ``num_sms=None`` as -1)."""
    return {"backend": BACKENDS.index(backend), "hidden": config.hidden,
            "num_experts": config.num_experts, "top_k": config.top_k,
            "max_tokens_per_rank": config.max_tokens_per_rank, "dtype": DTYPES.index(config.dtype),
            "layout": LAYOUTS.index(config.layout), "sync": SYNC_MODES.index(config.sync),
            "num_sms": -1 if config.num_sms is None else config.num_sms,
            "balance": BALANCES.index(balance)}


def _field_value(name: str, code: int) -> object:
    """The value a field of :func:`_agreed_fields` stands for."""
    if name == "num_sms" and code == -1:
        return None
    return _NAMED[name][code] if name in _NAMED else code


def _agree(config: EPConfig, backend: str, group: dist.ProcessGroup | None,
           device: torch.device, balance: str = "none") -> None:
    """Every rank of ``group`` shows the others its Buffer's configuration (one all-gather of a few
    integers) and raises ``ValueError`` naming each field that differs and the ranks on each side,
    on every rank alike, before the backend allocates or exchanges anything."""
    fields = _agreed_fields(config, backend, balance)
    mine = torch.tensor(list(fields.values()), dtype=torch.int64)
    table = collectives.all_gather(mine.to(collectives.group_device(group) or device), group,
                                   phase="Buffer: configuration check", rank=config.rank,
                                   timeout_s=config.timeout_s).cpu()
    differ = []
    for column, name in enumerate(fields):
        ranks_of: dict[int, list[int]] = {}
        for rank, code in enumerate(table[:, column].tolist()):
            ranks_of.setdefault(code, []).append(rank)
        if len(ranks_of) > 1:
            differ.append(f"{name} is " + ", ".join(f"{_field_value(name, code)!r} on ranks {ranks}"
                                                    for code, ranks in ranks_of.items()))
    if differ:
        raise ValueError(f"ubep rank {config.rank}: the ranks' Buffers disagree: {'; '.join(differ)} "
                         f"(every rank of the group must create the same Buffer)")


class Buffer:
    """Expert-parallel dispatch and combine over the ranks of ``group``.

    Args:
        group: the process group of the EP ranks (``None``: the default group).
        hidden: ``H``, elements per token row.
        num_experts: ``E``; rank ``r`` holds experts ``[r * E / W, (r + 1) * E / W)``.
        top_k: ``K``, experts per token.
        max_tokens_per_rank: most tokens any rank passes to one dispatch.
        dtype: dtype of ``x`` (bf16, fp16 or fp32).
        backend: ``"reference"`` (torch.distributed collectives), ``"cuda"`` (NVLink symmetric
            memory, one node), ``"ascend"`` (the Ascend C kernels; on CPU through their twin) or
            ``"auto"`` (the reference, for now).
        layout: ``"compact"`` (prefill, training) or ``"padded"`` (decode, fixed shapes).
        sync: how a receiver learns that rows arrived (``ubep.protocol``): ``"sw"``
            (stop-and-wait), ``"tff"`` (token-flag fusion), ``"dc"`` (data checksum) or ``"sp"``
            (sentinel polling). Results are identical in every mode; the reference ignores it.
            ``None``: the backend's default (``DEFAULT_SYNC``: ``tff`` on cuda, ``sw`` on ascend,
            where the other modes rest on behaviour no CANN document states: ask for them to opt in).
        device: where tensors live; by default derived from the group (gloo: CPU, NCCL: CUDA).
        timeout_s: how long any collective may wait for peers before raising ``EPCommError``.
        check_inputs: also check index values (range, duplicates); costs one host
            synchronization per dispatch. Skipped while a CUDA graph is being captured: a capture
            cannot synchronize, and the values it sees are not those of its replays.
        profile: record per-phase times (see :meth:`phase_times`); ``None``: when ``UBEP_PROFILE``
            names a directory, which also writes the process's breakdown there at exit
            (``ubep.engine_profile``: profiling inside a serving engine).
        num_sms: the cuda backend's SM budget: each launch has at most this many thread blocks (at
            least 3, plus ``W`` in ``dc``); the compact layout then gives its sending and receiving
            groups launches of their own, the padded layout shares one launch between them (the
            count / token split from ``ubep.tuning``); ``None``: the backend's fixed group caps.
            Other backends ignore it.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        hidden: int,
        num_experts: int,
        top_k: int,
        max_tokens_per_rank: int,
        dtype: torch.dtype = torch.bfloat16,
        backend: str = "auto",
        layout: str = "compact",
        sync: str | None = None,
        device: torch.device | str | None = None,
        timeout_s: float = 60.0,
        check_inputs: bool = True,
        profile: bool | None = None,
        num_sms: int | None = None,
    ):
        if not dist.is_initialized():
            raise ValueError("group: torch.distributed is not initialized; call "
                             "torch.distributed.init_process_group first")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        name = "reference" if backend == "auto" else backend
        self.config = EPConfig(
            world_size=dist.get_world_size(group),
            rank=dist.get_rank(group),
            hidden=hidden,
            num_experts=num_experts,
            top_k=top_k,
            max_tokens_per_rank=max_tokens_per_rank,
            dtype=dtype,
            layout=layout,
            sync=DEFAULT_SYNC[name] if sync is None else sync,
            timeout_s=timeout_s,
            check_inputs=check_inputs,
            num_sms=num_sms,
        )
        self.device = torch.device(device) if device is not None else _device_of(group)
        _check_backend(name, self.config, self.device)
        _agree(self.config, name, group, self.device, self.balance)
        self._backend: Backend = self._make_backend(name, group)
        from_env = profile is None and engine_profile.requested()
        self._backend.timer.enabled = bool(profile) or from_env
        self.op_id = op_ids.register(self)  # torch.ops.ubep finds this Buffer by it (ubep.ops)
        if from_env:
            cfg = self.config
            engine_profile.register(f"{name} {cfg.layout} W={cfg.world_size} T_max={cfg.max_tokens_per_rank}",
                                    self._backend.timer)

    balance = "none"  # ubep.balanced.BalancedBuffer: "redundant"

    def _make_backend(self, name: str, group: dist.ProcessGroup | None) -> Backend:
        return _make_backend(name, self.config, group, self.device)

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def symmetric_memory_bytes(self) -> int:
        """Symmetric (peer-writable) memory this rank's backend allocated; 0 for the reference."""
        return getattr(self._backend, "symmetric_bytes", 0)

    def phase_times(self) -> dict[str, list[float]]:
        """Recorded per-phase durations in µs (empty unless ``profile=True``)."""
        return self._backend.timer.samples()

    def reset_phase_times(self) -> None:
        self._backend.timer.reset()

    def worker_timeline(self) -> list[dict]:
        """With ``profile=True`` on the cuda backend: one row per program (thread block) of the last
        dispatch and combine launches (``op``; an operation's launch of its writing groups before
        its final one, where it has one, as ``"<op> (writers)"``), with its group and in-kernel time
        stamps in µs (waits over, work done, finished); empty for backends without in-kernel
        stamps."""
        return self._backend.worker_timeline()

    def synchronize(self) -> None:
        """Wait for this rank's queued dispatch and combine work. Raises ``EPCommError`` (naming the
        rank, the phase and the peer) if a wait on the device timed out; the cuda backend also raises
        it at the next call."""
        self._check_open()
        self._backend.synchronize()

    def destroy(self) -> None:
        """Wait for this rank's queued work, then give back the device memory the Buffer holds (the
        cuda backend's symmetric buffers, state words and pinned host words; the reference backend
        holds none; the ascend backend's windows belong to the process group). Every later call of
        this Buffer, and a combine or backward of one of its handles, raises ``RuntimeError``.
        Idempotent; not a collective, but every rank should destroy its Buffer after its last
        call. Deleting the last reference to a Buffer frees the same memory, at Python's pace.

        A cuda Buffer whose calls a CUDA graph captured keeps its device memory when destroyed,
        because the graph's kernels address it: such a graph still replays correctly (on every
        rank that replays it), and a wait of a replay that times out raises ``EPCommError`` from
        the next call of any live cuda Buffer. ``ubep.release_graph_memory()`` frees that memory
        once the graphs are deleted (docs/CUDA.md, "Lifetime")."""
        if not self._backend.destroyed:
            self._backend.destroy()

    def _check_open(self) -> None:
        if self._backend.destroyed:
            raise RuntimeError("this ubep.Buffer was destroyed (Buffer.destroy()); create a new one")

    # -- public calls ----------------------------------------------------------------------------

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor
    ) -> DispatchResult:
        """Send each token to the ranks of its experts, once per rank, and replicate per expert.

        Args:
            x: ``[T, H]`` in ``dtype``, ``T <= max_tokens_per_rank`` (``T`` may be 0 and may differ
                between ranks).
            topk_idx: ``[T, K]`` int32 or int64, global expert ids, ``-1`` = no expert; no expert
                twice in one row.
            topk_weights: ``[T, K]`` fp32 gate weights.
        """
        self._check_open()
        self._check_dispatch(x, topk_idx, topk_weights)
        if _records_grad(x, topk_weights):
            handles: list[Handle] = []
            recv_x, recv_weights = _Dispatch.apply(x, topk_weights, topk_idx, self._backend, handles)
            handle = handles[0]
        else:  # nothing to record: the backend itself (an autograd Function costs host time)
            recv_x, recv_weights, handle = self._backend.dispatch(x, topk_idx, topk_weights)
        return DispatchResult(recv_x, handle.tokens_per_expert, recv_weights, handle)

    def combine(
        self,
        expert_out: torch.Tensor,
        handle: Handle,
        *,
        reduce: str = "source",
        weighted: bool = True,
    ) -> torch.Tensor:
        """Bring expert outputs back to their source rank and reduce them per token.

        Args:
            expert_out: in the layout of the dispatch output (``[N, H]`` or ``[E_local, W * T_max,
                H]``) and ``dtype``.
            handle: from the :meth:`dispatch` whose rows ``expert_out`` holds.
            reduce: ``"source"`` (all K rows travel; the source sums in fp32 in ascending k) or
                ``"expert_rank"`` (each rank sums its own rows first, sends one row per token in
                ``dtype``; the source adds those in ascending rank order).
            weighted: multiply by the gate weights; ``False`` if the caller applied them.

        Returns: ``y``, ``[T, H]`` in ``dtype``.
        """
        self._check_open()
        self._check_combine(expert_out, handle, reduce, weighted)
        if _records_grad(expert_out, handle.topk_weights):
            return _Combine.apply(expert_out, handle.topk_weights, handle, self._backend, reduce,
                                  weighted)
        return self._backend.combine(expert_out, handle, reduce, weighted)

    # -- input checks (before any communication) -------------------------------------------------

    def _check_tensor(self, name: str, t: object, dtypes: tuple, shape: tuple) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
        if t.device != self.device:
            raise ValueError(f"{name} must be on {self.device}, got {t.device}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")

    def _check_dispatch(self, x, topk_idx, topk_weights) -> None:
        cfg = self.config
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a 2-D tensor [T, {cfg.hidden}], got {got}")
        num_tokens = x.shape[0]
        if num_tokens > cfg.max_tokens_per_rank:
            raise ValueError(f"x has {num_tokens} tokens, more than max_tokens_per_rank="
                             f"{cfg.max_tokens_per_rank} the buffer was sized for")
        self._check_tensor("x", x, (cfg.dtype,), (num_tokens, cfg.hidden))
        self._check_tensor("topk_idx", topk_idx, (torch.int32, torch.int64),
                           (num_tokens, cfg.top_k))
        self._check_tensor("topk_weights", topk_weights, (torch.float32,),
                           (num_tokens, cfg.top_k))
        capturing = graph_capturing(x)
        if capturing and cfg.layout == "compact":
            raise RuntimeError("a dispatch with layout='compact' cannot be captured in a CUDA or NPU graph "
                               "(its host reads the output's size); use layout='padded'")
        if not cfg.check_inputs or num_tokens == 0 or capturing:
            return
        ordered = topk_idx.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
        # the range and the repeats read back to the host together: one synchronization
        lo, hi, twice = torch.stack([ordered[:, 0].min().long(), ordered[:, -1].max().long(),
                                     repeated.any().long()]).tolist()
        if lo < -1 or hi >= cfg.num_experts:
            raise ValueError(f"topk_idx values must be in [-1, {cfg.num_experts}), "
                             f"got min {lo}, max {hi}")
        if twice:
            row = int(repeated.any(dim=1).nonzero()[0])
            raise ValueError(f"topk_idx row {row} names an expert twice: "
                             f"{topk_idx[row].tolist()}")

    def _check_combine(self, expert_out, handle, reduce, weighted) -> None:
        if not isinstance(handle, Handle) or handle.config is not self.config:
            raise ValueError("handle must come from a dispatch of this Buffer")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
        if not isinstance(weighted, bool):
            raise TypeError(f"weighted must be a bool, got {type(weighted).__name__}")
        self._check_tensor("expert_out", expert_out, (self.config.dtype,),
                           handle.rows_shape(self.config.hidden))


def _check_backward(backend: Backend) -> None:
    if backend.destroyed:
        raise RuntimeError("backward of a ubep dispatch or combine whose Buffer was destroyed "
                           "(Buffer.destroy()); destroy a Buffer after the backward of its calls")


def _records_grad(*inputs: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``inputs`` (else the autograd Function is skipped:
    its outputs would not require grad either)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in inputs)


class _Dispatch(torch.autograd.Function):
    """Forward: dispatch. Backward: the gradient rows go home and are summed like an unweighted
    ``reduce="source"`` combine; the gate-weight gradients return to their ``(t, k)`` slots."""

    @staticmethod
    def forward(ctx, x, topk_weights, topk_idx, backend, handles):
        recv_x, recv_weights, handle = backend.dispatch(x, topk_idx, topk_weights)
        handles.append(handle)
        ctx.backend, ctx.handle = backend, handle
        return recv_x, recv_weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_recv_x, grad_recv_weights):
        backend, handle = ctx.backend, ctx.handle
        _check_backward(backend)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = backend.combine(grad_recv_x.contiguous(), handle, "source", False)
        if ctx.needs_input_grad[1]:
            grad_w = backend.return_pair_values(grad_recv_weights.reshape(-1), handle)
        return grad_x, grad_w, None, None, None


class _Combine(torch.autograd.Function):
    """Forward: combine. Backward: ``grad_y`` travels like the dispatch did; each receive row gets
    ``w * grad_y`` (fp32 product, cast to the dtype), and the gate-weight gradient of a row is the
    fp32 dot product of ``grad_y`` with that row's expert output, sent home to its ``(t, k)`` slot."""

    @staticmethod
    def forward(ctx, expert_out, topk_weights, handle, backend, reduce, weighted):
        ctx.backend, ctx.handle, ctx.weighted = backend, handle, weighted
        if weighted and ctx.needs_input_grad[1]:
            ctx.save_for_backward(expert_out)
        return backend.combine(expert_out, handle, reduce, weighted)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        backend, handle = ctx.backend, ctx.handle
        _check_backward(backend)
        recv_grad = backend.dispatch_like(grad_y.contiguous(), handle)
        rows_w = handle.row_weights.view(handle.rows_shape(1))
        grad_out = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_out = (recv_grad.float() * rows_w).to(grad_y.dtype) if ctx.weighted else recv_grad
        if ctx.weighted and ctx.needs_input_grad[1]:
            (expert_out,) = ctx.saved_tensors
            dots = (recv_grad.float() * expert_out.float()).sum(-1)
            grad_w = backend.return_pair_values(dots.reshape(-1), handle)
        return grad_out, grad_w, None, None, None, None
