"""ubep as a vllm-ascend MoE comm method: thin subclasses of vllm-ascend's ABCs over
:class:`~ubep.integrations.vllm_ascend.core.UbepTokenDispatcherCore`.

Importing this module imports vllm-ascend (hence torch_npu, CANN and an NPU): ``plugin.py`` imports it
only when vllm-ascend builds its comm methods, with ubep requested. Written against vllm-ascend
0.23.0.post1 (``conformance.py`` checks the names used here against its source).

- :class:`UbepTokenDispatcher` (``MoETokenDispatcher``): the core's ``token_dispatch`` /
  ``token_combine``, its output as vllm-ascend's ``MoETokenDispatchOutput``.
- :class:`UbepPrepareAndFinalize` (``PrepareAndFinalize``): picks the layout of each forward and
  reuses vllm-ascend's own prepares for it: ``PrepareAndFinalizeWithMC2`` before a padded (decode)
  dispatch (it pads every rank to the forward's ``padded_num_tokens`` and gives the ``mc2_mask`` of
  the padding, which ubep then does not send) and ``PrepareAndFinalizeWithAll2All`` before a
  compact (prefill) one (it pads only to the TP size). Its ``finalize`` differs from theirs: for a
  comm type it does not know vllm-ascend all-reduces the MoE output over TP itself, so the routed
  output goes back as a TP partial sum (``core.finalize_rows``), not TP all-gathered.
- :class:`UbepCommImpl` (``MoECommMethod``): the pair, vllm-ascend's ``fused_experts`` unchanged
  (dispatch -> ``unified_apply_mlp`` on ``group_list`` -> combine); refuses dynamic EPLB.
"""

from __future__ import annotations

import logging

import torch
from vllm.config import get_current_vllm_config
from vllm.distributed.parallel_state import (
    get_ep_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from vllm_ascend.ascend_config import get_ascend_config
from vllm_ascend.ascend_forward_context import _EXTRA_CTX, get_mc2_tokens_capacity
from vllm_ascend.distributed.parallel_state import get_mc2_group
from vllm_ascend.ops.fused_moe.moe_comm_method import MoECommMethod
from vllm_ascend.ops.fused_moe.moe_runtime_args import MoETokenDispatchInput, MoETokenDispatchOutput
from vllm_ascend.ops.fused_moe.prepare_finalize import (
    PrepareAndFinalize,
    PrepareAndFinalizeWithAll2All,
    PrepareAndFinalizeWithMC2,
)
from vllm_ascend.ops.fused_moe.token_dispatcher import MoETokenDispatcher
from vllm_ascend.quantization.quant_type import QuantType

from ubep.integrations.vllm_ascend.core import (
    LayerShape,
    Settings,
    UbepCombineMetadata,
    UbepTokenDispatcherCore,
    finalize_rows,
    shared_core,
    tokens_per_rank,
)

LOG = logging.getLogger("vllm.ubep")


class UbepTokenDispatcher(MoETokenDispatcher[UbepCombineMetadata]):
    def __init__(self, core: UbepTokenDispatcherCore, **kwargs):
        super().__init__(**kwargs)
        self.core = core

    def token_dispatch(self, token_dispatch_input: MoETokenDispatchInput
                       ) -> MoETokenDispatchOutput[UbepCombineMetadata]:
        out = self.core.token_dispatch(token_dispatch_input)
        return MoETokenDispatchOutput(hidden_states=out.hidden_states, group_list=out.group_list,
                                      group_list_type=out.group_list_type,
                                      combine_metadata=out.combine_metadata)

    def token_combine(self, hidden_states: torch.Tensor, combine_metadata: UbepCombineMetadata,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.core.token_combine(hidden_states, combine_metadata, bias)


class UbepPrepareAndFinalize(PrepareAndFinalize):
    def __init__(self, moe_config, core: UbepTokenDispatcherCore):
        super().__init__(moe_config)
        self.core = core
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.by_layout = {"padded": PrepareAndFinalizeWithMC2(moe_config),
                          "compact": PrepareAndFinalizeWithAll2All(moe_config)}
        self.active: PrepareAndFinalizeWithAll2All = self.by_layout["compact"]
        self.split = True

    def prepare(self, hidden_states: torch.Tensor, router_logits: torch.Tensor,
                enable_shared_expert_dp: bool = False, replace_allreduce: bool = False,
                quant_type: QuantType = QuantType.NONE):
        bound = tokens_per_rank(_EXTRA_CTX.padded_num_tokens, self.tp_size, split=not enable_shared_expert_dp)
        self.active = self.by_layout[self.core.choose_layout(bound)]
        self.split = not (enable_shared_expert_dp or replace_allreduce)
        return self.active.prepare(hidden_states, router_logits, enable_shared_expert_dp, replace_allreduce,
                                   quant_type)

    def finalize(self, hidden_states: torch.Tensor, reduce_results: bool,
                 padded_hidden_states_shape: torch.Size | None = None) -> torch.Tensor:
        num_tokens = getattr(self.active, "num_tokens", hidden_states.shape[0])
        return finalize_rows(hidden_states, num_tokens=num_tokens, padded_shape=padded_hidden_states_shape,
                             tp_size=self.tp_size, tp_rank=self.tp_rank, split=self.split)

    def pad_and_split_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.active.pad_and_split_input_ids(input_ids)


class UbepCommImpl(MoECommMethod):
    def __init__(self, moe_config):
        self.core = core_for(moe_config)
        super().__init__(moe_config)

    def _get_token_dispatcher(self) -> UbepTokenDispatcher:
        return UbepTokenDispatcher(self.core, top_k=self.moe_config.experts_per_token,
                                   num_experts=self.moe_config.num_experts)

    def _get_prepare_finalize(self) -> UbepPrepareAndFinalize:
        return UbepPrepareAndFinalize(self.moe_config, self.core)

    def pad_and_split_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.prepare_finalize.pad_and_split_input_ids(input_ids)

    def fused_experts(self, fused_experts_input):
        if fused_experts_input.dynamic_eplb:
            raise ValueError("dynamic_eplb: ubep's expert placement is fixed (expert e on rank "
                             "e // E_local); dynamic EPLB moves experts between ranks")
        return super().fused_experts(fused_experts_input)


def core_for(moe_config) -> UbepTokenDispatcherCore:
    """The shared core for this layer's shape: its padded (decode) Buffer on vllm-ascend's MC2 group
    (the group vllm-ascend keeps for its own window-based dispatch: its HCCL window hosts no other
    collective), its compact (prefill) Buffer on vLLM's EP group, where vllm-ascend runs its own
    prefill all-to-all: each group's window keeps one layout, so no call prepares a window again and
    ACL graphs may capture decode. Logs the start-up line when it is made."""
    vllm_config = get_current_vllm_config()
    settings = Settings.from_additional_config(vllm_config.additional_config)
    _refuse_eplb()
    mc2 = get_mc2_group()
    if mc2.rank_in_group != moe_config.ep_rank:
        raise ValueError(f"ubep: rank {mc2.rank_in_group} in vllm-ascend's mc2 group is EP rank "
                         f"{moe_config.ep_rank}: the groups order their ranks differently")
    decode, prefill = _token_bounds(settings, vllm_config)
    shape = LayerShape(moe_config.hidden_dim, moe_config.num_experts, moe_config.experts_per_token,
                       moe_config.in_dtype)
    device = torch.device("npu", torch.npu.current_device()) if settings.backend == "ascend" else None
    core, made = shared_core(mc2.device_group, shape, settings, decode_tokens=decode, prefill_tokens=prefill,
                             device=device, prefill_group=get_ep_group().device_group)
    if made:
        LOG.info(core.describe())
    return core


def _token_bounds(settings: Settings, vllm_config) -> tuple[int, int]:
    """``(decode_tokens, prefill_tokens)``: the settings' or, by default, vllm-ascend's MC2 capacity per
    TP rank and ``max_num_batched_tokens`` per TP rank (whole with shared-expert DP, which does not
    split tokens across TP ranks)."""
    tp = get_tensor_model_parallel_world_size()
    split = not get_ascend_config().enable_shared_expert_dp
    decode = settings.decode_tokens
    if decode is None:
        capacity = get_mc2_tokens_capacity() or 0
        decode = capacity // tp if split else capacity
    prefill = settings.prefill_tokens
    if prefill is None:
        batched = vllm_config.scheduler_config.max_num_batched_tokens
        prefill = -(-batched // tp) if split else batched
    return decode, prefill


def _refuse_eplb() -> None:
    eplb = get_ascend_config().eplb_config
    if getattr(eplb, "dynamic_eplb", False):
        raise ValueError("eplb_config.dynamic_eplb: ubep's expert placement is fixed (expert e on rank "
                         "e // E_local); dynamic EPLB moves experts between ranks")
    if getattr(eplb, "expert_map_path", None):
        raise ValueError("eplb_config.expert_map_path: ubep's expert placement is fixed (expert e on rank "
                         "e // E_local); a placement file (and its redundant experts) is not supported")
