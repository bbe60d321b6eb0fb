"""Rank functions for tests/test_integration_vllm_ascend.py: ubep's vllm-ascend token dispatcher driven
through the calls vllm-ascend makes, on gloo ranks, against ``ubep.oracle``.

vllm-ascend's ``MoECommMethod.fused_experts`` runs ``token_dispatch(MoETokenDispatchInput)`` -> a grouped
expert MLP over ``group_list`` (``npu_grouped_matmul`` on the rows, groups contiguous from row 0) ->
``token_combine(hidden_states=..., combine_metadata=...)``. Here the inputs are stand-ins with the fields
of vllm-ascend's dataclasses (conformance.py checks those fields against its source) and the MLP is a
per-expert matmul loop. Every rank rebuilds every rank's inputs from the step's seed and computes the
expected rows, counts and outputs with the oracle: dispatch, the same MLP on the oracle's rows, combine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep import oracle
from ubep.integrations.vllm_ascend.core import (
    GROUP_LIST_COUNT,
    LayerShape,
    Settings,
    UbepTokenDispatcherCore,
    identity_expert_map,
)
from ubep.ops import most_rows

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT_VIEW = {2: torch.int16, 4: torch.int32}


@dataclass(frozen=True)
class RoutingParams:  # vllm-ascend's MoERoutingParams (ops/fused_moe/moe_stage_params.py)
    expert_map: torch.Tensor | None
    global_redundant_expert_num: int
    mc2_mask: torch.Tensor | None
    apply_router_weight_on_input: bool
    log2phy: torch.Tensor | None = None
    pertoken_scale: torch.Tensor | None = None


@dataclass(frozen=True)
class QuantParams:  # the part of vllm-ascend's MoEQuantParams read here
    dispatch_with_quant: bool = False


@dataclass(frozen=True)
class TokenDispatchInput:  # vllm-ascend's MoETokenDispatchInput (ops/fused_moe/moe_stage_contracts.py)
    hidden_states: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    routing: RoutingParams
    quant: QuantParams


@dataclass(frozen=True)
class Step:
    """One forward of a MoE layer: ``tokens`` per rank, the layout the comm method chose for it, and in
    the padded layout the last ``masked`` tokens of each rank marked padding in ``mc2_mask``."""

    layout: str
    tokens: tuple[int, ...]
    seed: int
    masked: int = 0
    log2phy: bool = False


@dataclass(frozen=True)
class Scenario:
    hidden: int
    num_experts: int
    top_k: int
    steps: tuple[Step, ...]
    dtype: str = "bf16"
    backend: str = "reference"
    sync: str | None = None
    reduce: str = "source"
    decode_tokens: int = 6
    prefill_tokens: int = 24
    weight_on_input: bool = False
    prefill_group: bool = False  # the compact Buffer on a second group of the same ranks

    @property
    def shape(self) -> LayerShape:
        return LayerShape(self.hidden, self.num_experts, self.top_k, DTYPES[self.dtype])


def step_inputs(sc: Scenario, step: Step, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                              torch.Tensor | None]:
    """``(x [T, H], topk_ids [T, K] int32, topk_weights [T, K] in x's dtype, mc2_mask [T] or None)`` as
    vllm-ascend hands them to the dispatcher (it casts the gate weights to the activations' dtype)."""
    num_tokens = step.tokens[rank]
    gen = torch.Generator().manual_seed(step.seed * 7919 + rank)
    x = torch.randn(num_tokens, sc.hidden, generator=gen).to(DTYPES[sc.dtype])
    ids = [torch.randperm(sc.num_experts, generator=gen)[: sc.top_k] for _ in range(num_tokens)]
    topk_ids = torch.stack(ids).int() if ids else torch.empty(0, sc.top_k, dtype=torch.int32)
    weights = torch.rand(num_tokens, sc.top_k, generator=gen).to(DTYPES[sc.dtype])
    mask = None
    if step.layout == "padded":
        mask = torch.arange(num_tokens) < num_tokens - step.masked
    return x, topk_ids, weights, mask


def expert_weights(sc: Scenario) -> torch.Tensor:
    """``[E, H, H]`` fp32: expert ``e``'s matrix, the same on every rank."""
    gen = torch.Generator().manual_seed(4242)
    return torch.randn(sc.num_experts, sc.hidden, sc.hidden, generator=gen) / sc.hidden**0.5


def grouped_mlp(rows_RH: torch.Tensor, group_list_E: torch.Tensor, first_expert: int,
                weights_EHH: torch.Tensor) -> torch.Tensor:
    """What vllm-ascend's grouped matmul does with ``group_list_type=1``: expert ``first_expert + j`` on
    the ``group_list[j]`` rows after those of the earlier groups; rows past the groups are not
    computed (zero here, unspecified there)."""
    out_RH = torch.zeros_like(rows_RH)
    start = 0
    for j, count in enumerate(group_list_E.tolist()):
        block = rows_RH[start : start + count].float()
        out_RH[start : start + count] = torch.nn.functional.silu(block @ weights_EHH[first_expert + j]).to(
            rows_RH.dtype)
        start += count
    return out_RH


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = INT_VIEW[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


def _routing(sc: Scenario, step: Step, rank: int, world: int, mask: torch.Tensor | None) -> RoutingParams:
    expert_map = identity_expert_map(sc.num_experts, world, rank).int()  # vllm builds it in int32
    log2phy = torch.arange(sc.num_experts, dtype=torch.int32) if step.log2phy else None
    return RoutingParams(expert_map, 0, mask, sc.weight_on_input, log2phy)


class Expected:
    """The oracle's view of one step: every rank's (masked) routing, receive rows, counts and expert
    outputs, and each source's combined output."""

    def __init__(self, sc: Scenario, step: Step, world: int, weights_EHH: torch.Tensor):
        self.sc, self.world = sc, world
        self.xs, self.idxs, self.ws = [], [], []
        for s in range(world):
            x, ids, w, mask = step_inputs(sc, step, s)
            ids = ids.long() if mask is None else ids.long().masked_fill(~mask.unsqueeze(1), -1)
            if sc.weight_on_input:  # scaled before dispatch, combined unweighted (vllm-ascend's rule)
                x = x * w.to(x.dtype)
            self.xs.append(x)
            self.idxs.append(ids)
            self.ws.append(w.float())
        local = sc.num_experts // world
        self.recv, self.counts, self.outs = [], [], [[[None] * sc.top_k for _ in ids] for ids in self.idxs]
        for d in range(world):
            recv_NH, counts_E, _ = oracle.dispatch(self.xs, self.idxs, self.ws, d, world, sc.num_experts)
            out_NH = grouped_mlp(recv_NH, counts_E, d * local, weights_EHH)
            self._place(out_NH, d, local)
            self.recv.append(recv_NH)
            self.counts.append(counts_E)

    def _place(self, out_NH: torch.Tensor, rank: int, local: int) -> None:
        row = 0
        for e in range(rank * local, (rank + 1) * local):
            for s, t, k in oracle.rows_of_expert(self.idxs, e):
                self.outs[s][t][k] = out_NH[row]
                row += 1

    def combined(self, rank: int) -> torch.Tensor:
        sc = self.sc
        return oracle.combine(self.outs, self.idxs, self.ws, rank, self.world, sc.num_experts, sc.reduce,
                              not sc.weight_on_input, sc.hidden, DTYPES[sc.dtype])


def run_step(core: UbepTokenDispatcherCore, sc: Scenario, step: Step, rank: int, world: int,
             weights_EHH: torch.Tensor) -> list[str]:
    """One forward through the core as vllm-ascend calls it; what differs from the oracle."""
    x, topk_ids, topk_weights, mask = step_inputs(sc, step, rank)
    bound = max(step.tokens)  # what every rank knows of the forward (vllm-ascend: padded_num_tokens)
    chosen = core.choose_layout(bound)
    problems = [] if chosen == step.layout else [f"chose {chosen} for {bound} tokens/rank"]
    inp = TokenDispatchInput(x, topk_weights, topk_ids, _routing(sc, step, rank, world, mask), QuantParams())
    out = core.token_dispatch(token_dispatch_input=inp)
    local = sc.num_experts // world
    mlp_RH = grouped_mlp(out.hidden_states, out.group_list, rank * local, weights_EHH)
    y_TH = core.token_combine(hidden_states=mlp_RH, combine_metadata=out.combine_metadata)
    want = Expected(sc, step, world, weights_EHH)
    problems += _compare(out, y_TH, want, core, rank)
    return [f"rank {rank} step {step}: {p}" for p in problems]


def _compare(out, y_TH: torch.Tensor, want: Expected, core: UbepTokenDispatcherCore, rank: int) -> list[str]:
    problems = []
    num_rows = int(want.counts[rank].sum())
    if out.group_list_type != GROUP_LIST_COUNT or not torch.equal(out.group_list, want.counts[rank]):
        problems.append(f"group_list {out.group_list.tolist()} type {out.group_list_type}, expected "
                        f"{want.counts[rank].tolist()} type 1")
    if core.layout == "padded":
        rows = most_rows(core.buffers["padded"].config)
        if tuple(out.hidden_states.shape) != (rows, want.sc.hidden):
            problems.append(f"padded rows {list(out.hidden_states.shape)}, expected the static [{rows}, H]")
    elif out.hidden_states.shape[0] != num_rows:
        problems.append(f"compact rows {out.hidden_states.shape[0]}, expected {num_rows}")
    if not _same_bits(out.hidden_states[:num_rows], want.recv[rank]):
        problems.append("hidden_states differ from the oracle's receive rows")
    if not _same_bits(y_TH, want.combined(rank)):
        problems.append("token_combine differs from the oracle")
    return problems


def flow(rank: int, world: int, sc: Scenario) -> list[str]:
    """Every step of ``sc`` on one core (both Buffers live, used in turn); mismatches, empty if none."""
    settings = Settings(backend=sc.backend, sync=sc.sync, reduce=sc.reduce, timeout_s=60.0)
    prefill_group = dist.new_group(list(range(world))) if sc.prefill_group else None
    core = UbepTokenDispatcherCore(None, sc.shape, settings, decode_tokens=sc.decode_tokens,
                                   prefill_tokens=sc.prefill_tokens, prefill_group=prefill_group)
    weights_EHH = expert_weights(sc)
    problems = []
    for step in sc.steps:
        problems += run_step(core, sc, step, rank, world, weights_EHH)
    core.destroy()
    return problems
