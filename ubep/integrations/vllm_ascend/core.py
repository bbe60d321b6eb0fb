"""vllm-ascend's MoE token dispatcher over ubep, in torch and ubep alone (vllm-ascend need not import).

vllm-ascend 0.23.0.post1 runs a MoE layer as ``prepare`` -> ``token_dispatch`` -> grouped expert MLP ->
``token_combine`` -> ``finalize`` (``MoECommMethod.fused_experts``). :class:`UbepTokenDispatcherCore`
does the two middle calls with the signatures vllm-ascend's ``MoETokenDispatcher`` declares, reading
the input as vllm-ascend's dataclasses hold it (``MoETokenDispatchInput``: ``hidden_states``,
``topk_weights``, ``topk_ids``, ``routing``, ``quant``), over two ``ubep.Buffer``:

- ``padded`` (decode, ``T <= decode_tokens`` on every rank): no host synchronization; ubep's receive
  rows ``[E_local, W * T_max, H]`` are gathered into ``[R, H]`` rows sorted by local expert
  (``R = W * T_max * min(K, E_local)``, every shape static) so that vllm-ascend's grouped matmul,
  which reads ``sum(group_list)`` contiguous rows, runs on the real rows only; combine gathers its
  output back into the padded layout. Two copies of the padded size per layer: the price of static
  shapes when the MLP cannot skip padding.
- ``compact`` (prefill): ``[N, H]`` rows, ``N = group_list.sum()``; one host synchronization for
  ``N`` (inside ubep's dispatch).

The two Buffers may sit on two groups of the same ranks in the same order (``prefill_group``): on the
ascend backend each group's window then holds one layout for good, so no call re-prepares a window,
and an ACL graph may capture the padded calls (inside a capture the Buffer refuses a compact dispatch,
which reads its size on the host, and the reference backend any dispatch: it synchronizes with the
host).

``group_list`` is the per-local-expert count (``group_list_type=1``) and ``token_combine`` returns
``[T, H]`` weighted by the gate weights (fp32 sums in ascending k, docs/SEMANTICS.md). The layout of a
call is chosen by the comm method (``choose_layout``) from a token bound every rank shares, never from
this rank's own count: ranks that chose differently would wait on each other's Buffers.

Placement: ubep holds expert ``e`` on rank ``e // E_local``, one copy. ``expert_map`` must be that
placement, ``log2phy`` the identity and ``global_redundant_expert_num`` 0; anything else raises
``ValueError`` naming the argument (checked on the host once per tensor version).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist

import ubep.ops
from ubep.buffer import DEFAULT_SYNC, Buffer
from ubep.config import DTYPES, REDUCTIONS, SYNC_MODES
from ubep.integrations.vllm.core import weighted_input

ENV = "UBEP_VLLM_MOE_COMM"  # "ubep": on, when additional_config names no moe_comm
SETTING = "moe_comm"  # additional_config={"moe_comm": "ubep"}
VALUE = "ubep"
OPTIONS = "ubep"  # additional_config={"ubep": {...}}: Settings' fields
BACKENDS = ("ascend", "reference")
GROUP_LIST_COUNT = 1  # vllm-ascend's group_list_type for per-expert counts (0: cumulative sums)


def requested(additional_config: object, env: Mapping[str, str] = os.environ) -> bool:
    """Whether ubep should carry vllm-ascend's MoE communication: ``additional_config["moe_comm"]``
    when it names one, else ``$UBEP_VLLM_MOE_COMM``; on when the value is ``"ubep"``."""
    value = additional_config.get(SETTING) if isinstance(additional_config, Mapping) else None
    if value is None:
        value = env.get(ENV)
    return str(value).strip().lower() == VALUE if value is not None else False


@dataclass(frozen=True)
class Settings:
    """The options in ``additional_config["ubep"]``.

    - ``backend``: ``"ascend"`` (the Ascend C kernels) or ``"reference"`` (HCCL collectives);
    - ``sync``: the ascend backend's sync mode (``None``: its default, ``sw``);
    - ``reduce``: combine's reduction (``"source"`` or ``"expert_rank"``);
    - ``decode_tokens``: the padded Buffer's ``max_tokens_per_rank`` (``None``: vllm-ascend's MC2
      capacity per TP rank; 0: no padded layout, every call compact);
    - ``prefill_tokens``: the compact Buffer's (``None``: ``max_num_batched_tokens`` per TP rank);
    - ``check_inputs``: ubep's host check of ``topk_ids`` on every dispatch (one synchronization);
    - ``timeout_s``: how long a ubep call waits for its peers before ``EPCommError``.
    """

    backend: str = "ascend"
    sync: str | None = None
    reduce: str = "source"
    decode_tokens: int | None = None
    prefill_tokens: int | None = None
    check_inputs: bool = False
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        where = f"additional_config[{OPTIONS!r}]"
        if self.backend not in BACKENDS:
            raise ValueError(f"{where}['backend'] must be one of {BACKENDS}, got {self.backend!r}")
        if self.sync is not None and self.sync not in SYNC_MODES:
            raise ValueError(f"{where}['sync'] must be one of {SYNC_MODES} or None, got {self.sync!r}")
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"{where}['reduce'] must be one of {REDUCTIONS}, got {self.reduce!r}")
        for name in ("decode_tokens", "prefill_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{where}[{name!r}] must be an int >= 0 or None, got {value!r}")
        if self.prefill_tokens == 0:
            raise ValueError(f"{where}['prefill_tokens'] must be > 0: prefill needs the compact Buffer")

    @classmethod
    def from_additional_config(cls, additional_config: object) -> Settings:
        """``additional_config["ubep"]`` (absent: the defaults); ``ValueError`` naming an unknown key."""
        options = additional_config.get(OPTIONS, {}) if isinstance(additional_config, Mapping) else {}
        if not isinstance(options, Mapping):
            raise ValueError(f"additional_config[{OPTIONS!r}] must be a dict, got {type(options).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"additional_config[{OPTIONS!r}] has unknown keys {unknown}; "
                             f"known: {sorted(known)}")
        return cls(**options)

    @property
    def effective_sync(self) -> str:
        return self.sync or DEFAULT_SYNC[self.backend]


@dataclass(frozen=True)
class LayerShape:
    """What a MoE layer's Buffers are sized for: ``hidden`` ``H``, ``num_experts`` ``E`` (physical, all
    ranks), ``top_k`` ``K``, the rows' ``dtype``."""

    hidden: int
    num_experts: int
    top_k: int
    dtype: torch.dtype


@dataclass(frozen=True, eq=False)
class UbepCombineMetadata:
    """What ``token_dispatch`` leaves for ``token_combine`` (vllm-ascend's ``combine_metadata``).

    ``buffer``: the Buffer of the call's layout; ``dispatched``: ubep's dispatch (the handle as
    tensors, ``ubep.ops.Dispatched``); ``back_rows``: padded layout only, ``[E_local * W * T_max]``
    int64, the grouped row each padded row comes from; ``weighted``: combine applies the gate weights
    (false when ``apply_router_weight_on_input`` applied them before dispatch)."""

    buffer: Buffer
    dispatched: ubep.ops.Dispatched
    back_rows: torch.Tensor | None
    weighted: bool


@dataclass(frozen=True, eq=False)
class TokenDispatchOutput:
    """The fields of vllm-ascend's ``MoETokenDispatchOutput``, in its order."""

    hidden_states: torch.Tensor
    group_list: torch.Tensor
    group_list_type: int
    combine_metadata: UbepCombineMetadata
    dynamic_scale: torch.Tensor | None = None
    topk_scales: torch.Tensor | None = None


def identity_expert_map(num_experts: int, world: int, rank: int) -> torch.Tensor:
    """``[E]`` int64: vllm-ascend's ``expert_map`` of ubep's placement on ``rank`` (local index of each
    expert this rank holds, ``-1`` elsewhere), what vLLM's ``determine_expert_map`` gives for
    ``"linear"`` placement when ``E % W == 0``."""
    local = num_experts // world
    expert_map = torch.full((num_experts,), -1, dtype=torch.int64)
    expert_map[rank * local : (rank + 1) * local] = torch.arange(local)
    return expert_map


def grouped_rows(tokens_per_expert_E: torch.Tensor, capacity: int, num_rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The padded layout's rows in expert order, with static shapes and no host synchronization.

    Returns ``(rows_R, back_P)``: ``rows_R [num_rows]``, the padded row (``j * capacity + offset``)
    that grouped row ``r`` holds (rows past ``sum(counts)`` repeat a valid row: unused); ``back_P
    [E_local * capacity]``, the grouped row each padded row's output comes from (padding rows: 0,
    unused)."""
    counts_E = tokens_per_expert_E.long()
    num_experts, device = counts_E.shape[0], counts_E.device
    ends_E = counts_E.cumsum(0)
    starts_E = ends_E - counts_E
    r = torch.arange(num_rows, device=device)
    expert_R = (r.unsqueeze(1) >= ends_E.unsqueeze(0)).sum(1).clamp(max=num_experts - 1)
    rows_R = (expert_R * capacity + r - starts_E[expert_R]).clamp(0, num_experts * capacity - 1)
    p = torch.arange(num_experts * capacity, device=device)
    expert_P, offset_P = p // capacity, p % capacity
    back_P = torch.where(offset_P < counts_E[expert_P], starts_E[expert_P] + offset_P, 0)
    return rows_R, back_P


def tokens_per_rank(padded_num_tokens: int | None, tp_size: int, split: bool) -> int | None:
    """The most tokens any rank dispatches after vllm-ascend's MC2 prepare: the forward's
    ``padded_num_tokens`` (a multiple of the TP size, the same on every rank), split across TP ranks
    unless the prepare keeps them whole (``enable_shared_expert_dp``); ``None`` when unknown."""
    if padded_num_tokens is None:
        return None
    return padded_num_tokens // tp_size if split else padded_num_tokens


def finalize_rows(hidden_TH: torch.Tensor, *, num_tokens: int, padded_shape: tuple | None, tp_size: int,
                  tp_rank: int, split: bool) -> torch.Tensor:
    """The routed output as vllm-ascend expects it back from ``finalize`` for a comm type it does not
    know: a TP partial sum, which its TP all-reduce completes (it all-reduces every comm type but
    ALLTOALL, MC2 and FUSED_MC2, together with the shared experts' partial output).

    ``split`` (prepare padded the tokens and gave each TP rank a slice): this rank's rows go to its
    slice of a zero ``padded_shape`` tensor, cut to the first ``num_tokens``; otherwise (sequence
    parallel, shared-expert DP) the rows are returned as they are, as vllm-ascend's own finalize
    does."""
    if not split:
        return hidden_TH
    if tp_size > 1:
        if padded_shape is None:
            raise ValueError("padded_hidden_states_shape is needed to place this TP rank's rows")
        full_TH = hidden_TH.new_zeros(padded_shape)
        torch.tensor_split(full_TH, tp_size, dim=0)[tp_rank].copy_(hidden_TH)
        hidden_TH = full_TH
    return hidden_TH[:num_tokens]


class UbepTokenDispatcherCore:
    """vllm-ascend's ``MoETokenDispatcher`` over ubep: ``token_dispatch`` / ``token_combine`` with its
    signatures, over a padded (decode) ``ubep.Buffer`` of ``group`` and a compact (prefill) one of
    ``prefill_group`` (``None``: ``group`` too).

    Creating it is a collective on both groups (every rank creates the same one, in the same order:
    the Buffers check that they agree). ``decode_tokens=0`` makes no padded Buffer.
    """

    def __init__(self, group: dist.ProcessGroup | None, shape: LayerShape, settings: Settings, *,
                 decode_tokens: int, prefill_tokens: int, device: torch.device | str | None = None,
                 prefill_group: dist.ProcessGroup | None = None):
        self.shape, self.settings = shape, settings
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        prefill_group = group if prefill_group is None else prefill_group
        seen = (dist.get_world_size(prefill_group), dist.get_rank(prefill_group))
        if seen != (self.world, self.rank):
            raise ValueError(f"prefill_group: rank {seen[1]} of {seen[0]} there, rank {self.rank} of "
                             f"{self.world} in the decode group; the two groups must hold the same ranks in "
                             "the same order")
        self.buffers: dict[str, Buffer] = {}
        if decode_tokens > 0:
            self.buffers["padded"] = self._buffer(group, "padded", decode_tokens, device)
        self.buffers["compact"] = self._buffer(prefill_group, "compact", prefill_tokens, device)
        self.layout = "compact"
        self._identity = {"expert_map": identity_expert_map(shape.num_experts, self.world, self.rank),
                          "log2phy": torch.arange(shape.num_experts)}
        self._checked: set[tuple] = set()

    def _buffer(self, group, layout: str, max_tokens: int, device) -> Buffer:
        s, cfg = self.shape, self.settings
        return Buffer(group, hidden=s.hidden, num_experts=s.num_experts, top_k=s.top_k,
                      max_tokens_per_rank=max_tokens, dtype=s.dtype, backend=cfg.backend, layout=layout,
                      sync=cfg.sync, device=device, timeout_s=cfg.timeout_s, check_inputs=cfg.check_inputs)

    # -- the layout of the next calls --------------------------------------------------------------

    @property
    def decode_tokens(self) -> int:
        padded = self.buffers.get("padded")
        return padded.config.max_tokens_per_rank if padded is not None else 0

    @property
    def prefill_tokens(self) -> int:
        return self.buffers["compact"].config.max_tokens_per_rank

    def choose_layout(self, tokens_per_rank: int | None) -> str:
        """Sets and returns the next calls' layout: ``padded`` when no rank passes more than
        ``decode_tokens`` (``tokens_per_rank``: a bound every rank computes alike), else ``compact``."""
        fits = tokens_per_rank is not None and tokens_per_rank <= self.decode_tokens
        self.layout = "padded" if "padded" in self.buffers and fits else "compact"
        return self.layout

    def describe(self) -> str:
        """The start-up line: ubep, its backend, layouts and sync mode."""
        s = self.settings
        layouts = f"compact (prefill, <= {self.prefill_tokens} tokens/rank)"
        if "padded" in self.buffers:
            layouts = f"padded (decode, <= {self.decode_tokens} tokens/rank) + {layouts}"
        else:
            layouts += " only"
        sync = s.effective_sync if s.backend == "ascend" else "none (collectives)"
        return (f"ubep: vllm-ascend MoE communication by ubep (backend={s.backend}, sync={sync}, "
                f"reduce={s.reduce}; layouts: {layouts}; {self.world} EP ranks, hidden={self.shape.hidden}, "
                f"experts={self.shape.num_experts}, top_k={self.shape.top_k}, dtype={self.shape.dtype})")

    # -- vllm-ascend's MoETokenDispatcher ------------------------------------------------------------

    def token_dispatch(self, token_dispatch_input: Any) -> TokenDispatchOutput:
        """vllm-ascend's ``token_dispatch(MoETokenDispatchInput)``: this rank's rows sorted by local
        expert, their per-expert counts (``group_list_type=1``) and the handle for combine."""
        inp = token_dispatch_input
        routing = inp.routing
        self._check_input(inp.hidden_states, routing)
        self.check_placement(routing.expert_map, routing.log2phy, routing.global_redundant_expert_num)
        x_TH, weighted = inp.hidden_states, True
        if routing.apply_router_weight_on_input:
            x_TH, weighted = weighted_input(x_TH, inp.topk_weights), False
        topk_ids_TK = _masked(inp.topk_ids, routing.mc2_mask)
        return self.dispatch(x_TH, topk_ids_TK, inp.topk_weights.float(), weighted=weighted)

    def token_combine(self, hidden_states: torch.Tensor, combine_metadata: UbepCombineMetadata,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        """vllm-ascend's ``token_combine``: the expert outputs (``[R, H]``, rows as ``token_dispatch``
        returned them) back to their tokens, ``[T, H]`` weighted by the gate weights."""
        if bias is not None:
            raise ValueError("bias: ubep's combine adds no bias (the expert MLP applies w2_bias); pass None")
        meta = combine_metadata
        cfg = meta.buffer.config
        expert_out = hidden_states
        if meta.back_rows is not None:
            expert_out = hidden_states.index_select(0, meta.back_rows).view(
                cfg.num_local_experts, cfg.expert_capacity, cfg.hidden)
        return ubep.ops.combine(meta.buffer, expert_out, meta.dispatched, reduce=self.settings.reduce,
                                weighted=meta.weighted)

    # -- the work --------------------------------------------------------------------------------------

    def dispatch(self, x_TH: torch.Tensor, topk_ids_TK: torch.Tensor, topk_weights_TK: torch.Tensor, *,
                 weighted: bool = True) -> TokenDispatchOutput:
        """ubep's dispatch in the current layout, its rows grouped by local expert."""
        buf = self.buffers[self.layout]
        dispatched = ubep.ops.dispatch(buf, x_TH.contiguous(), topk_ids_TK, topk_weights_TK)
        back_rows = None
        hidden_RH, counts_E = dispatched.recv_x, dispatched.tokens_per_expert
        if self.layout == "padded":
            cfg = buf.config
            rows_R, back_rows = grouped_rows(counts_E, cfg.expert_capacity, ubep.ops.most_rows(cfg))
            hidden_RH = hidden_RH.reshape(-1, cfg.hidden).index_select(0, rows_R)
        meta = UbepCombineMetadata(buf, dispatched, back_rows, weighted)
        return TokenDispatchOutput(hidden_RH, counts_E, GROUP_LIST_COUNT, meta)

    # -- checks ------------------------------------------------------------------------------------------

    def check_placement(self, expert_map: torch.Tensor | None, log2phy: torch.Tensor | None,
                        global_redundant_expert_num: int) -> None:
        """``ValueError`` naming the argument unless the placement is ubep's: expert ``e`` on rank
        ``e // E_local``, one copy. Values are read on the host once per tensor (and version)."""
        if global_redundant_expert_num:
            raise ValueError(f"global_redundant_expert_num={global_redundant_expert_num}: ubep holds one "
                             "copy of each expert (expert e on rank e // E_local); redundant experts (EPLB) "
                             "are not supported")
        for name, t in (("expert_map", expert_map), ("log2phy", log2phy)):
            if t is not None:
                self._check_identity(name, t)

    def _check_identity(self, name: str, t: torch.Tensor) -> None:
        key = (name, t.data_ptr(), t._version, tuple(t.shape), str(t.device))
        if key in self._checked:
            return
        want = self._identity[name]
        got = t.detach().to("cpu", torch.int64)
        if got.shape != want.shape or not torch.equal(got, want):
            what = ("expert e on rank e // E_local, local index e % E_local, -1 elsewhere"
                    if name == "expert_map" else "the identity (no logical-to-physical remapping)")
            raise ValueError(f"{name}: ubep places experts in one fixed way ({what}; "
                             f"E={self.shape.num_experts}, W={self.world}, rank {self.rank}); got "
                             f"{_summary(got)}, expected {_summary(want)}. Expert placement strategies "
                             "other than 'linear' and EPLB are not supported")
        self._checked.add(key)

    def _check_input(self, hidden_states: torch.Tensor, routing: Any) -> None:
        """Unquantized rows of this layer's shape. A quantized model is fine: ubep brings bf16 rows and
        no ``dynamic_scale``, and vllm-ascend's quantized MLP then quantizes them itself."""
        s = self.shape
        if hidden_states.dtype not in DTYPES:
            raise ValueError(f"hidden_states: ubep moves bf16, fp16 or fp32 rows, got {hidden_states.dtype} "
                             "(quantize in the expert MLP, not before dispatch)")
        if getattr(routing, "pertoken_scale", None) is not None:
            raise ValueError("routing.pertoken_scale: ubep dispatches unquantized rows; activations "
                             "quantized before dispatch are not supported")
        if hidden_states.dim() != 2 or hidden_states.shape[1] != s.hidden or hidden_states.dtype != s.dtype:
            raise ValueError(f"hidden_states: this layer's Buffers take [T, {s.hidden}] {s.dtype}, got "
                             f"{list(hidden_states.shape)} {hidden_states.dtype}")

    def destroy(self) -> None:
        for buf in self.buffers.values():
            buf.destroy()


def _masked(topk_ids_TK: torch.Tensor, mask_T: torch.Tensor | None) -> torch.Tensor:
    """``topk_ids`` with the rows of inactive tokens (vllm-ascend's ``mc2_mask``: padding added by its
    prepare) set to -1, so that they are not dispatched and combine to zeros."""
    if mask_T is None:
        return topk_ids_TK
    if mask_T.shape != topk_ids_TK.shape[:1]:
        raise ValueError(f"routing.mc2_mask: [{topk_ids_TK.shape[0]}] bool expected (one per token), got "
                         f"{list(mask_T.shape)}")
    return topk_ids_TK.masked_fill(~mask_T.bool().unsqueeze(1), -1)


def _summary(t: torch.Tensor) -> str:
    values = t.flatten().tolist()
    shown = values if len(values) <= 12 else [*values[:12], "..."]
    return f"shape {list(t.shape)} {shown}"


_CORES: dict[tuple, UbepTokenDispatcherCore] = {}


def shared_core(group: dist.ProcessGroup | None, shape: LayerShape, settings: Settings, *, decode_tokens: int,
                prefill_tokens: int, device: torch.device | str | None = None,
                prefill_group: dist.ProcessGroup | None = None) -> tuple[UbepTokenDispatcherCore, bool]:
    """One core per groups and configuration for the process, made on first use (a collective), and
    whether this call made it. vllm-ascend builds its comm methods once per MoE layer, and every
    layer of a model shares a shape: its layers share two Buffers rather than making two each."""
    key = (id(group), id(prefill_group), shape, settings, decode_tokens, prefill_tokens, str(device))
    core = _CORES.get(key)
    if core is not None:
        return core, False
    core = UbepTokenDispatcherCore(group, shape, settings, decode_tokens=decode_tokens,
                                   prefill_tokens=prefill_tokens, device=device, prefill_group=prefill_group)
    _CORES[key] = core
    return core, True
