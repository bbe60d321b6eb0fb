"""Rank functions for tests/test_integration_vllm.py: vLLM's modular-kernel flow over
:class:`ubep.integrations.vllm.core.UbepPrepareFinalizeCore` on every rank, checked bit for bit
against ``ubep.oracle``.

The flow is vLLM's ``FusedMoEKernelModularImpl.apply`` (0.23.0) with its batched experts played by
a gated MLP per expert: ``prepare`` (ubep dispatch, padded) -> the MLP on each local expert's first
``expert_num_tokens[e]`` rows of ``[E_local, W * T_max, H]`` (the padding rows set to NaN, which
must not reach the output) -> ``finalize`` into a preallocated ``output [T, H]``. The MLP runs one
row at a time, so that its bits do not depend on how many rows a matrix product holds and the
oracle, which calls it once per pair, gets the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.workers import DTYPES, Case, _check_equal, _zero_padding, case_inputs
from ubep import oracle
from ubep.integrations.vllm.core import (
    BufferSpec,
    UbepPrepareFinalizeCore,
    release_shared_buffers,
    shared_buffer,
)


@dataclass(frozen=True)
class FlowCase:
    """A ``tests.workers.Case`` (tokens, routing, dtype, backend) and what vLLM's flow adds."""

    case: Case
    reduce: str = "source"
    weights_on_input: bool = False  # vLLM's apply_router_weight_on_input (top-1 routing)
    inter: int = 8  # the MLP's intermediate size


class GatedMLP:
    """``silu(x @ w1.T) * (x @ w3.T) @ w2.T`` per expert, in fp32, cast to the dtype: vLLM's
    experts' arithmetic on the same rows, up to the rounding of their kernels."""

    def __init__(self, num_experts: int, hidden: int, inter: int, dtype: torch.dtype, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.w13_EIH = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype)
        self.w2_EHI = (torch.randn(num_experts, hidden, inter, generator=gen) / inter**0.5).to(dtype)
        self.inter, self.dtype = inter, dtype

    def row(self, x_H: torch.Tensor, expert: int) -> torch.Tensor:
        h_2I = self.w13_EIH[expert].float() @ x_H.float()
        act_I = torch.nn.functional.silu(h_2I[: self.inter]) * h_2I[self.inter :]
        return (self.w2_EHI[expert].float() @ act_I).to(self.dtype)

    def batched(self, recv_ECH: torch.Tensor, counts_E: torch.Tensor, first_expert: int) -> torch.Tensor:
        """The batched experts: valid rows computed, padding rows NaN."""
        out_ECH = torch.full_like(recv_ECH, float("nan"))
        for j, n in enumerate(counts_E.tolist()):
            for i in range(n):
                out_ECH[j, i] = self.row(recv_ECH[j, i].cpu(), first_expert + j).to(out_ECH.device)
        return out_ECH


def _flow_inputs(flow: FlowCase, world_size: int):
    """Every rank's ``(x, idx, w)``; and the rows the experts see (scaled by the top-1 weight where
    the weights go in with the input, as vLLM's prepare/finalizes scale them)."""
    inputs = [case_inputs(flow.case, s) for s in range(world_size)]
    xs, idxs, ws = (list(v) for v in zip(*inputs, strict=True))
    seen = [x * w.to(x.dtype) for x, w in zip(xs, ws, strict=True)] if flow.weights_on_input else xs
    return xs, idxs, ws, seen


def prepare_finalize_flow(rank: int, world_size: int, flows: list[FlowCase]) -> list[int]:
    """Each flow on this rank; returns the rows each flow's experts received here."""
    rows = [_one_flow(rank, world_size, flow) for flow in flows]
    release_shared_buffers()
    return rows


def _one_flow(rank: int, world_size: int, flow: FlowCase) -> int:
    case, dtype = flow.case, DTYPES[flow.case.dtype]
    device = torch.device("cuda", torch.cuda.current_device()) if case.backend == "cuda" else None
    spec = BufferSpec(hidden=case.hidden, num_experts=case.num_experts, top_k=case.top_k,
                      max_tokens_per_rank=case.max_tokens or max(case.tokens), dtype=dtype,
                      backend=case.backend, sync=case.sync, timeout_s=60, device=device)
    core = UbepPrepareFinalizeCore(shared_buffer(None, spec), reduce=flow.reduce)
    buf = core.buffer
    xs, idxs, ws, seen = _flow_inputs(flow, world_size)
    x, idx, w = (t.to(buf.device) for t in (xs[rank], idxs[rank], ws[rank]))
    x_before = x.clone()

    recv_ECH, counts_E = core.prepare(x, w, idx, flow.weights_on_input)
    _check_dispatch(recv_ECH, counts_E, seen, idxs, ws, rank, world_size, buf.config)
    mlp = GatedMLP(case.num_experts, case.hidden, flow.inter, dtype, seed=case.seed + 7)
    out_ECH = mlp.batched(recv_ECH, counts_E, rank * buf.config.num_local_experts)
    output_TH = torch.empty_like(x)
    core.finalize(output_TH, out_ECH, w, flow.weights_on_input)

    outs = oracle.expert_outputs(idxs, lambda s, t, k, e: mlp.row(seen[s][t], e))
    want = oracle.combine(outs, idxs, ws, rank, world_size, case.num_experts, flow.reduce,
                          not flow.weights_on_input, case.hidden, dtype)
    _check_equal("finalize output", output_TH, want)
    _check_equal("a1 after prepare", x, x_before)
    return int(counts_E.sum())


def _check_dispatch(recv_ECH, counts_E, seen, idxs, ws, rank, world_size, cfg) -> None:
    if counts_E.dtype != torch.int32 or tuple(recv_ECH.shape) != (cfg.num_local_experts,
                                                                    cfg.expert_capacity, cfg.hidden):
        raise AssertionError(f"prepare returned {tuple(recv_ECH.shape)} / {counts_E.dtype}")
    want_x, want_counts, _ = oracle.dispatch(seen, idxs, ws, rank, world_size, cfg.num_experts)
    _check_equal("expert_num_tokens", counts_E.long(), want_counts)
    _check_equal("prepare rows", _zero_padding(recv_ECH, counts_E),
                 oracle.to_padded(want_x, want_counts, cfg.expert_capacity))


# -- vLLM's own modular kernel, where vLLM imports ------------------------------------------------


def _cpu_shims() -> None:
    """vLLM's kernel on CPU tensors, in this process only: without an accelerator,
    ``torch.accelerator.empty_cache`` (vLLM's workspace calls it when growing) does nothing and
    ``torch.cuda.is_current_stream_capturing`` (NaiveBatchedExperts asks) is False; and
    ``torch.ops._C.silu_and_mul`` (a compiled vLLM op with no CPU kernel, absent where vLLM's ``_C``
    did not load) gets one: ``silu(x[:d]) * x[d:]`` in fp32, cast. Expected and actual runs use it
    alike."""
    if torch.accelerator.current_accelerator() is None:
        torch.accelerator.empty_cache = lambda: None
        torch.cuda.is_current_stream_capturing = lambda: False
    defined = hasattr(torch.ops, "_C") and hasattr(torch.ops._C, "silu_and_mul")
    if defined and torch._C._dispatch_has_kernel_for_dispatch_key("_C::silu_and_mul", "CPU"):
        return
    lib = torch.library.Library("_C", "IMPL" if defined else "FRAGMENT")  # kept alive below
    if not defined:
        lib.define("silu_and_mul(Tensor(a!) out, Tensor input) -> ()")

    def silu_and_mul(out: torch.Tensor, input: torch.Tensor) -> None:
        d = input.shape[-1] // 2
        out.copy_((torch.nn.functional.silu(input[..., :d].float()) * input[..., d:].float()).to(out.dtype))

    lib.impl("silu_and_mul", silu_and_mul, "CPU")
    _cpu_shims.lib = lib


def _moe_config(case: Case, rank: int, world_size: int, inter: int, max_tokens: int):
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )

    parallel = FusedMoEParallelConfig(tp_size=1, pcp_size=1, dp_size=world_size, ep_size=world_size,
                                      tp_rank=0, pcp_rank=0, dp_rank=rank, ep_rank=rank, sp_size=1,
                                      use_ep=True, all2all_backend="allgather_reducescatter",
                                      enable_eplb=False)
    return FusedMoEConfig(num_experts=case.num_experts, experts_per_token=case.top_k, hidden_dim=case.hidden,
                          intermediate_size_per_partition=inter,
                          num_local_experts=case.num_experts // world_size,
                          num_logical_experts=case.num_experts, activation=MoEActivation.SILU,
                          device="cpu", routing_method=RoutingMethodType.Renormalize,
                          moe_parallel_config=parallel, in_dtype=DTYPES[case.dtype],
                          max_num_tokens=max_tokens)


def vllm_kernel_flow(rank: int, world_size: int, flow: FlowCase) -> str:
    """vLLM's ``FusedMoEKernel`` (its modular implementation: workspaces, prepare, experts, finalize)
    with ``UbepPrepareAndFinalize`` over the reference backend and vLLM's ``NaiveBatchedExperts``.
    Expected: the oracle's dispatch of every rank, the same experts on each rank's padded rows
    (the same matrix shapes, so the same bits), the oracle's combine. Returns vLLM's version."""
    import vllm
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG
    from vllm.model_executor.layers.fused_moe.experts.fused_batched_moe import NaiveBatchedExperts
    from vllm.v1.worker.workspace import init_workspace_manager

    from ubep.integrations.vllm.modular import UbepPrepareAndFinalize

    _cpu_shims()
    init_workspace_manager(torch.device("cpu"))
    case, dtype = flow.case, DTYPES[flow.case.dtype]
    max_tokens = case.max_tokens or max(case.tokens)
    moe = _moe_config(case, rank, world_size, flow.inter, max_tokens)
    spec = BufferSpec(case.hidden, case.num_experts, case.top_k, max_tokens, dtype, case.backend,
                      timeout_s=60)
    pf = UbepPrepareAndFinalize(UbepPrepareFinalizeCore(shared_buffer(None, spec), reduce=flow.reduce))

    def experts() -> NaiveBatchedExperts:
        return NaiveBatchedExperts(moe, FUSED_MOE_UNQUANTIZED_CONFIG, max_num_tokens=max_tokens,
                                   num_dispatchers=world_size)

    mlp = GatedMLP(case.num_experts, case.hidden, flow.inter, dtype, seed=case.seed + 7)
    local = case.num_experts // world_size
    xs, idxs, ws, seen = _flow_inputs(flow, world_size)
    kernel = mk.FusedMoEKernel(pf, experts())
    got = kernel.apply(xs[rank], mlp.w13_EIH[rank * local : (rank + 1) * local],
                       mlp.w2_EHI[rank * local : (rank + 1) * local], ws[rank], idxs[rank],
                       MoEActivation.SILU, case.num_experts, None, flow.weights_on_input)

    outs = _naive_outputs(experts(), mlp, seen, idxs, ws, world_size, spec, local)
    want = oracle.combine(outs, idxs, ws, rank, world_size, case.num_experts, flow.reduce,
                          not flow.weights_on_input, case.hidden, dtype)
    _check_equal("vLLM FusedMoEKernel output", got, want)
    release_shared_buffers()
    return vllm.__version__


def _naive_outputs(naive, mlp: GatedMLP, seen, idxs, ws, world_size: int, spec: BufferSpec, local: int):
    """Per pair, the output vLLM's experts give it on the rank of its expert, from the oracle's
    padded rows of that rank."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    capacity = world_size * spec.max_tokens_per_rank
    by_expert: dict[int, torch.Tensor] = {}
    for d in range(world_size):
        rows, counts, _ = oracle.dispatch(seen, idxs, ws, d, world_size, spec.num_experts)
        padded = oracle.to_padded(rows, counts, capacity)
        out = torch.zeros_like(padded)
        meta = mk.ExpertTokensMetadata(expert_num_tokens=counts.to(torch.int32), expert_num_tokens_cpu=None)
        work13 = torch.empty(local, capacity, max(spec.hidden, 2 * mlp.inter), dtype=spec.dtype)
        work2 = torch.empty(capacity, 2 * mlp.inter, dtype=spec.dtype)
        naive.apply(out, padded, mlp.w13_EIH[d * local : (d + 1) * local],
                    mlp.w2_EHI[d * local : (d + 1) * local], None, None, MoEActivation.SILU,
                    spec.num_experts, None, None, None, work13, work2, meta, False)
        for j in range(local):
            by_expert[d * local + j] = out[j]
    position = {(s, t, k): i for e in by_expert for i, (s, t, k) in
                enumerate(oracle.rows_of_expert(idxs, e))}
    return oracle.expert_outputs(idxs, lambda s, t, k, e: by_expert[e][position[(s, t, k)]])


def vllm_plugin_patches(rank: int, world_size: int) -> list[str]:
    """The plugin on vLLM's own modules, in a fresh process: installed before they are imported,
    the factory (also as the kernel oracles import it), the batched-format property and the
    batched-DP default are patched; a layer without data parallelism still gets vLLM's factory."""
    from ubep.integrations.vllm import plugin
    from ubep.integrations.vllm.core import Settings

    assert plugin.FACTORY_MODULE not in __import__("sys").modules
    built = []
    plugin.install(Settings(backend="cuda"), lambda *args: built.append(args) or "ubep's")
    from vllm.config.parallel import ParallelConfig
    from vllm.model_executor.layers.fused_moe import all2all_utils
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    case = Case(tokens=(4,) * 2, hidden=16, num_experts=4, top_k=2)
    dp2, dp1 = _moe_config(case, 0, 2, 8, 4), _moe_config(case, 0, 1, 8, 4)
    assert unquantized.maybe_make_prepare_finalize is all2all_utils.maybe_make_prepare_finalize
    assert all2all_utils.maybe_make_prepare_finalize(dp2, FUSED_MOE_UNQUANTIZED_CONFIG) == "ubep's"
    assert all2all_utils.maybe_make_prepare_finalize(dp1, FUSED_MOE_UNQUANTIZED_CONFIG) is None  # vLLM's
    assert dp2.moe_parallel_config.use_batched_activation_format
    assert not dp1.moe_parallel_config.use_batched_activation_format
    batched_dp = ParallelConfig(data_parallel_size=2, enable_expert_parallel=True).use_batched_dp_moe
    return [type(built[0][0]).__name__, str(batched_dp)]
