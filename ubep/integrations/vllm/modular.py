"""The vLLM face of :class:`~ubep.integrations.vllm.core.UbepPrepareFinalizeCore`: a
``FusedMoEPrepareAndFinalizeModular`` in vLLM's BatchedExperts format, and the factory that the
plugin puts in place of vLLM's ``maybe_make_prepare_finalize`` for all2all layers.

Importing this module imports vLLM (0.23.0, the release vllm-ascend 0.23.0.post1 pins); nothing else
in ``ubep.integrations.vllm`` does. ``conformance.py`` checks the names and parameter orders used
here against vLLM's source.
"""

from __future__ import annotations

import logging

import torch
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.distributed import get_ep_group
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig, FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceDelegate

from ubep.integrations.vllm.core import (
    BufferSpec,
    Settings,
    UbepPrepareFinalizeCore,
    refuse_quantized_activations,
    shared_buffer,
)

LOG = logging.getLogger("vllm.ubep")
_LOGGED: set[int] = set()


class UbepPrepareAndFinalize(mk.FusedMoEPrepareAndFinalizeModular):
    """ubep dispatch in ``prepare``, ubep combine (weights and the sum over k) in ``finalize``."""

    def __init__(self, core: UbepPrepareFinalizeCore):
        super().__init__()
        self.core = core

    def post_init_setup(self, fused_experts: mk.FusedMoEExperts) -> None:
        refuse_quantized_activations(fused_experts.quant_config.quant_dtype,
                                     fused_experts.expects_unquantized_inputs)

    @property
    def activation_format(self) -> mk.FusedMoEActivationFormat:
        return mk.FusedMoEActivationFormat.BatchedExperts

    def topk_indices_dtype(self) -> torch.dtype | None:
        return torch.int64  # what the cuda backend routes with (int32 ids would be converted)

    def max_num_tokens_per_rank(self) -> int | None:
        return self.core.max_tokens_per_rank

    def num_dispatchers(self) -> int:
        return self.core.num_dispatchers

    def output_is_reduced(self) -> bool:
        return True  # finalize's output is each token's whole sum over its experts, on every rank

    def supports_async(self) -> bool:
        return False  # one synchronous call each way: no hook/receiver split, so no DBO

    def prepare(
        self,
        a1: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        num_experts: int,
        expert_map: torch.Tensor | None,
        apply_router_weight_on_input: bool,
        quant_config: FusedMoEQuantConfig,
        defer_input_quant: bool = False,
    ) -> mk.PrepareResultType:
        refuse_quantized_activations(quant_config.quant_dtype, defer_input_quant)
        if num_experts != self.core.num_experts:
            raise ValueError(f"prepare got num_experts={num_experts}, the ubep Buffer has "
                             f"{self.core.num_experts}")
        recv_x, expert_num_tokens = self.core.prepare(a1, topk_weights, topk_ids,
                                                      apply_router_weight_on_input)
        meta = mk.ExpertTokensMetadata(expert_num_tokens=expert_num_tokens, expert_num_tokens_cpu=None)
        return recv_x, None, meta, None, None

    def finalize(
        self,
        output: torch.Tensor,
        fused_expert_output: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        apply_router_weight_on_input: bool,
        weight_and_reduce_impl: mk.TopKWeightAndReduce,
    ) -> None:
        if not isinstance(weight_and_reduce_impl, TopKWeightAndReduceDelegate):
            raise ValueError(f"ubep's combine weights and sums the expert rows itself; the experts asked "
                             f"for {type(weight_and_reduce_impl).__name__} (batched experts pass "
                             f"TopKWeightAndReduceDelegate)")
        self.core.finalize(output, fused_expert_output, topk_weights, apply_router_weight_on_input)


def buffer_spec(moe: FusedMoEConfig, settings: Settings) -> BufferSpec:
    """The Buffer of one MoE layer: its shape, and a capacity of vLLM's per-rank token cap."""
    return BufferSpec(hidden=moe.hidden_dim, num_experts=moe.num_experts, top_k=moe.experts_per_token,
                      max_tokens_per_rank=moe.max_num_tokens, dtype=moe.in_dtype,
                      backend=settings.backend or "cuda", sync=settings.sync,
                      timeout_s=settings.timeout_s)


def make_prepare_finalize(moe: FusedMoEConfig, routing_tables: object | None,
                          settings: Settings) -> UbepPrepareAndFinalize:
    """The prepare/finalize of one all2all MoE layer: a core over the EP group's shared Buffer
    (activation quantization is refused in ``post_init_setup``, once the experts are known)."""
    if routing_tables is not None:
        raise ValueError("ubep places expert e on EP rank e // E_local: round-robin expert placement "
                         "(--expert-placement-strategy round_robin) is not supported")
    group = get_ep_group().device_group
    buffer = shared_buffer(group, buffer_spec(moe, settings))
    if moe.num_local_experts != buffer.config.num_local_experts:
        raise ValueError(f"vLLM gives this rank {moe.num_local_experts} experts, ubep's linear placement "
                         f"{buffer.config.num_local_experts}")
    if id(buffer) not in _LOGGED:  # one line per Buffer, not per layer
        _LOGGED.add(id(buffer))
        LOG.info("ubep: %s over ubep.Buffer(%s, W=%d, hidden=%d, experts=%d, top_k=%d, max_tokens=%d, %s)",
                 UbepPrepareAndFinalize.__name__, settings.describe(), buffer.config.world_size,
                 moe.hidden_dim, moe.num_experts, moe.experts_per_token, moe.max_num_tokens,
                 moe.in_dtype)
    return UbepPrepareAndFinalize(UbepPrepareFinalizeCore(buffer, reduce=settings.reduce))
