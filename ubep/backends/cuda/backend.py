"""The CUDA backend, first version: one node of W GPUs over NVLink symmetric memory.

Per dispatch (all on the current stream, no host synchronization in the padded layout; the kernels
are in ``dispatch_kernels``):

1. barrier; ``count_and_order`` counts the pairs per expert, orders each expert's pairs, and writes
   this rank's row of the count matrix (``[E]`` counts and its token count) into every rank;
   barrier;
2. ``row_base`` turns the full count matrix into this source's first receive row per expert
   (``ubep.layout``: the deterministic mapping); ``send`` writes, for every token, its routing row
   (the rows of its pairs held by a rank, or -1, and its gate weights) into every rank's staging
   area, and the token itself once into each rank that holds one of its experts (relay); barrier;
3. ``replicate`` copies every staged token into the receive rows of its local experts.

Combine (``combine_kernels``) sends each pair's output (``reduce="source"``) or each rank's partial
sum (``reduce="expert_rank"``) straight into the source's symmetric buffer, and the source sums in
fp32 with round-to-nearest multiplies and adds that no compiler can fuse, in the contract's order, so
the results equal the reference backend's bit for bit.

This version synchronizes with full barriers (three per dispatch, two per combine) and has no
Data-as-Flag, worker groups or scheduler yet: it is the correct, graph-capturable baseline those will
speed up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton

from ubep.backends.base import Backend, Handle
from ubep.backends.cuda import combine_kernels as ck
from ubep.backends.cuda import dispatch_kernels as dk
from ubep.backends.cuda.kernels import copy_rows, put_rows, row_block
from ubep.backends.cuda.symm import SymmetricBuffer, enable_for
from ubep.config import EPConfig

# PTX rounding instructions in the combine sums; Triton's CPU interpreter cannot run PTX.
EXACT_ARITHMETIC = os.environ.get("TRITON_INTERPRET") != "1"


@dataclass(frozen=True, eq=False)
class Routes:
    """Where a dispatch's rows went, on both sides.

    Source side: ``valid_TK`` bool ``[T, K]`` (``topk_idx >= 0``); ``sent_WT`` bool ``[W, T]``,
    token ``t`` crossed to rank ``r``. Destination side: ``rows_WMK`` int64 ``[W, T_max, K]``, the
    receive row of pair ``k`` of source ``s``'s token ``t``, or -1; ``weights_WMK`` fp32, its weight.
    """

    valid_TK: torch.Tensor
    sent_WT: torch.Tensor
    rows_WMK: torch.Tensor
    weights_WMK: torch.Tensor


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, config: EPConfig, group: dist.ProcessGroup | None, device: torch.device):
        super().__init__(config, group, device)
        group = group or dist.group.WORLD
        enable_for(group)
        cfg = config
        w, tm, k, h = cfg.world_size, cfg.max_tokens_per_rank, cfg.top_k, cfg.hidden

        def buf(shape, dtype):
            return SymmetricBuffer(shape, dtype, group, device)

        self.meta = buf((w, cfg.num_experts + 1), torch.int64)
        self.stage_x = buf((w * tm, h), cfg.dtype)
        self.stage_route = buf((w * tm, 2 * k), torch.int32)
        self.back_x = buf((max(tm * k, w * tm), h), cfg.dtype)
        self.back_vals = buf((tm * k, 1), torch.float32)
        self.symmetric_bytes = sum(b.nbytes for b in (self.meta, self.stage_x, self.stage_route,
                                                      self.back_x, self.back_vals))
        self.timeout_ms = int(cfg.timeout_s * 1000)
        # Pair slots of the [W, T_max, K] grid of received pairs.
        self.slot_pairs = torch.arange(w * tm * k, device=device)

    def _barrier(self) -> None:
        self.meta.barrier(self.timeout_ms)

    # -- dispatch ---------------------------------------------------------------------------------

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        cfg, rank, w, k = self.config, self.config.rank, self.config.world_size, self.config.top_k
        e, tm, hidden = cfg.num_experts, cfg.max_tokens_per_rank, cfg.hidden
        num_tokens = x_TH.shape[0]
        idx = topk_idx_TK.long().contiguous().view(-1)
        weights = topk_weights_TK.detach().float().contiguous().view(-1)
        k_block, block = triton.next_power_of_2(k), row_block(x_TH)
        with self.timer.phase("dispatch: count exchange"):
            order = torch.empty(num_tokens * k, dtype=torch.int64, device=self.device)
            self._barrier()
            dk.count_and_order[(e,)](idx, num_tokens * k, num_tokens, order, self.meta.ptrs, rank,
                                     WORLD=w, MAX_PAIRS=tm * k, num_experts=e,
                                     BLOCK=min(1024, triton.next_power_of_2(tm * k)))
            self._barrier()
        with self.timer.phase("dispatch: token send"):
            capacity = cfg.expert_capacity if cfg.layout == "padded" else 0
            base = torch.empty(e, dtype=torch.int64, device=self.device)
            dk.row_base[(e,)](self.meta.local, base, rank, capacity, WORLD=w,
                              NUM_LOCAL=cfg.num_local_experts,
                              LOCAL_BLOCK=triton.next_power_of_2(cfg.num_local_experts),
                              num_experts=e)
            sent = torch.empty(w, num_tokens, dtype=torch.int8, device=self.device)
            if num_tokens:
                dk.send[(num_tokens, w)](x_TH.contiguous(), idx, weights, order, base,
                                         self.stage_x.ptrs, self.stage_route.ptrs, sent, rank,
                                         num_tokens, tm, cfg.num_local_experts, top_k=k,
                                         K_BLOCK=k_block, hidden=hidden, BLOCK=block)
            self._barrier()
        with self.timer.phase("dispatch: reorder"):
            tokens_per_expert = self.meta.local[:, cfg.local_experts.start : cfg.local_experts.stop]
            tokens_per_expert = tokens_per_expert.sum(0)
            num_rows = cfg.num_local_experts * capacity if capacity else int(tokens_per_expert.sum())
            out = x_TH.new_empty(num_rows, hidden)  # compact: every row written; padded: padding is not
            row_weights = torch.zeros(num_rows, dtype=torch.float32, device=self.device)
            rows = torch.empty(w, tm, k, dtype=torch.int64, device=self.device)
            pair_weights = torch.empty(w, tm, k, dtype=torch.float32, device=self.device)
            dk.replicate[(w, tm)](self.stage_x.local, self.stage_route.local, self.meta.local, out,
                                  row_weights, rows, pair_weights, tm, e, top_k=k, K_BLOCK=k_block,
                                  hidden=hidden, BLOCK=block)
        routes = Routes(topk_idx_TK >= 0, sent.bool(), rows, pair_weights)
        handle = Handle(cfg, num_tokens, topk_weights_TK, row_weights, tokens_per_expert, num_rows,
                        None, routes)
        recv_w = row_weights.clone().view(handle.rows_shape())
        return out.view(handle.rows_shape(hidden)), recv_w, handle

    def dispatch_like(self, x_TH, handle):
        """Tokens once to each rank holding one of their experts (as the handle's dispatch sent
        them), then into the receive rows the handle recorded."""
        cfg, tm, w = self.config, self.config.max_tokens_per_rank, self.config.world_size
        num_tokens, routes = x_TH.shape[0], handle.routes
        with self.timer.phase("dispatch: token send"):
            ranks = torch.arange(w, device=self.device).repeat_interleave(num_tokens)
            tokens = torch.arange(num_tokens, device=self.device).repeat(w)
            self._barrier()
            put_rows(x_TH.contiguous(), tokens, self.stage_x.ptrs,
                     torch.where(routes.sent_WT.reshape(-1), ranks, -1), cfg.rank * tm + tokens)
            self._barrier()
        with self.timer.phase("dispatch: reorder"):
            out = x_TH.new_zeros(handle.num_rows, x_TH.shape[1])
            copy_rows(self.stage_x.local, self.slot_pairs // cfg.top_k, out,
                      routes.rows_WMK.reshape(-1))
        return out.view(handle.rows_shape(x_TH.shape[1]))

    # -- combine ----------------------------------------------------------------------------------

    def _return_pairs(self, src_RF, target: SymmetricBuffer, handle: Handle) -> None:
        """Each received pair's row of ``src_RF`` goes to its source's ``target`` at ``t * K + k``."""
        tm, k = self.config.max_tokens_per_rank, self.config.top_k
        rows = handle.routes.rows_WMK.reshape(-1)
        source = self.slot_pairs // (tm * k)
        slot = self.slot_pairs % (tm * k)
        self._barrier()
        put_rows(src_RF, rows.clamp(min=0), target.ptrs, torch.where(rows >= 0, source, -1), slot)
        self._barrier()

    def combine(self, expert_out, handle, reduce, weighted):
        cfg, k, tm, w = self.config, self.config.top_k, self.config.max_tokens_per_rank, \
            self.config.world_size
        hidden, num_tokens, routes = expert_out.shape[-1], handle.num_tokens, handle.routes
        rows_RH = expert_out.reshape(handle.num_rows, hidden).contiguous()
        partial = reduce == "expert_rank"
        block = row_block(rows_RH)
        with self.timer.phase("combine: send"):
            self._barrier()
            ck.send_back[(w, tm)](rows_RH, routes.rows_WMK, routes.weights_WMK, self.back_x.ptrs,
                                  cfg.rank, tm, top_k=k, K_BLOCK=triton.next_power_of_2(k),
                                  hidden=hidden, BLOCK=block, PARTIAL=partial,
                                  WEIGHTED=weighted, EXACT=EXACT_ARITHMETIC)
            self._barrier()
        with self.timer.phase("combine: reduce"):
            y = expert_out.new_empty(num_tokens, hidden)
            if num_tokens and partial:
                ck.reduce_slots[(num_tokens,)](self.back_x.local, 1, tm, routes.sent_WT, 1,
                                               num_tokens, routes.sent_WT, y, NUM=w, hidden=hidden,
                                               BLOCK=block, WEIGHTED=False, EXACT=EXACT_ARITHMETIC)
            elif num_tokens:
                weights = handle.topk_weights.detach().float().contiguous()
                ck.reduce_slots[(num_tokens,)](self.back_x.local, k, 1, routes.valid_TK, k, 1,
                                               weights, y, NUM=k, hidden=hidden, BLOCK=block,
                                               WEIGHTED=weighted, EXACT=EXACT_ARITHMETIC)
            return y

    def return_pair_values(self, values_R, handle):
        k, num_tokens = self.config.top_k, handle.num_tokens
        self._return_pairs(values_R.float().reshape(-1, 1).contiguous(), self.back_vals, handle)
        vals = self.back_vals.local[: num_tokens * k, 0].view(num_tokens, k)
        return torch.where(handle.routes.valid_TK, vals, 0.0)
