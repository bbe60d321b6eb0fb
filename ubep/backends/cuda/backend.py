"""The CUDA backend, first version: one node of W GPUs over NVLink symmetric memory.

Per dispatch (all on the current stream, no host synchronization in the padded layout):

1. barrier; every rank writes its row of the count matrix (``[E]`` counts and its token count) into
   every rank's ``meta`` buffer; barrier;
2. every rank computes, from the full count matrix, the receive row of each of its pairs
   (``ubep.layout``: the deterministic mapping), then writes, for every token, its routing row
   (the rows of its pairs held by that rank, or -1, and its gate weights) into every rank's staging
   area, and the token itself once into each rank that holds one of its experts (relay);
   barrier;
3. each rank copies every staged token into the receive rows of its local experts.

Combine sends each pair's output (``reduce="source"``) or each rank's partial sum
(``reduce="expert_rank"``) straight into the source's symmetric buffer, and the source reduces with
the same torch ops as the reference backend, so the results are equal bit for bit.

This version synchronizes with full barriers (two per call) and no Data-as-Flag, worker groups or
scheduler yet: it is the correct, graph-capturable baseline those will speed up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep import layout
from ubep.backends.base import Backend, Handle
from ubep.backends.cuda.kernels import copy_rows, put_rows
from ubep.backends.cuda.symm import SymmetricBuffer, enable_for
from ubep.config import EPConfig
from ubep.reduce import ordered_sum


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
        # Item indices of the [W, T_max] and [W, T_max, K] grids the kernels walk.
        item = torch.arange(w * tm, device=device)
        self.item_rank, self.item_token = item // tm, item % tm
        self.slot_pairs = torch.arange(w * tm * k, device=device)

    def _barrier(self) -> None:
        self.meta.barrier(self.timeout_ms)

    # -- dispatch ---------------------------------------------------------------------------------

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        cfg, rank, w = self.config, self.config.rank, self.config.world_size
        num_tokens = x_TH.shape[0]
        with self.timer.phase("dispatch: count exchange"):
            row = torch.cat([layout.expert_counts(topk_idx_TK, cfg.num_experts),
                             torch.full((1,), num_tokens, dtype=torch.int64, device=self.device)])
            self._barrier()
            for r in range(w):
                self.meta.peer(r)[rank].copy_(row)
            self._barrier()
            count_matrix_WE = self.meta.local[:, : cfg.num_experts]
            tokens_W = self.meta.local[:, cfg.num_experts]
        with self.timer.phase("dispatch: route send"):
            capacity = cfg.expert_capacity if cfg.layout == "padded" else None
            base_WE = layout.row_base(count_matrix_WE, cfg.num_local_experts, capacity)
            rows_TK = layout.pair_rows(topk_idx_TK, base_WE[rank], cfg.num_experts)
            ranks_TK = layout.dest_rank(topk_idx_TK, cfg.num_local_experts)
            ranks_W11 = torch.arange(w, device=self.device).view(w, 1, 1)
            rows_WTK = layout.received_rows(rows_TK.unsqueeze(0), ranks_TK.unsqueeze(0), ranks_W11)
            weights_WTK = topk_weights_TK.detach().float().unsqueeze(0).expand(w, -1, -1)
            route = torch.cat([rows_WTK.int(), weights_WTK.view(torch.int32)], dim=2)
            sent_WT = (rows_WTK >= 0).any(dim=2)
            self._put_token_grid(route.reshape(w * num_tokens, 2 * cfg.top_k), self.stage_route,
                                 num_tokens, sent_WT=None)
        tokens_per_expert = count_matrix_WE.sum(0)[cfg.local_experts.start : cfg.local_experts.stop]
        num_rows = (cfg.num_local_experts * cfg.expert_capacity if capacity
                    else int(tokens_per_expert.sum()))
        routes = self._routes(topk_idx_TK, sent_WT, tokens_W)
        recv_x = self._send_and_replicate(x_TH, routes, num_rows)
        with self.timer.phase("dispatch: reorder"):
            row_weights = torch.zeros(num_rows, 1, dtype=torch.float32, device=self.device)
            self._replicate(routes.weights_WMK.reshape(-1, 1).contiguous(), row_weights, routes,
                            per_pair=True)
        handle = Handle(cfg, num_tokens, topk_weights_TK, row_weights[:, 0],
                        tokens_per_expert.clone(), num_rows, None, routes)
        recv_w = handle.row_weights.clone().view(handle.rows_shape())
        return recv_x.view(handle.rows_shape(x_TH.shape[1])), recv_w, handle

    def _routes(self, topk_idx_TK, sent_WT, tokens_W) -> Routes:
        """Read the staged routing rows (after the barrier that follows their send)."""
        cfg, tm, k = self.config, self.config.max_tokens_per_rank, self.config.top_k
        self._barrier()
        route = self.stage_route.local.view(cfg.world_size, tm, 2 * k)
        arrived_WM = torch.arange(tm, device=self.device).unsqueeze(0) < tokens_W.unsqueeze(1)
        rows = torch.where(arrived_WM.unsqueeze(2), route[..., :k].long(), -1)
        weights = route[..., k:].contiguous().view(torch.float32)
        return Routes(topk_idx_TK >= 0, sent_WT, rows, weights.clone())

    def _put_token_grid(self, src_IF, target: SymmetricBuffer, num_tokens: int, sent_WT) -> None:
        """Write row ``r * T + t`` of ``src_IF`` (or row ``t`` when ``sent_WT`` is given, only where
        it is true) into rank ``r``'s ``target`` at row ``rank * T_max + t``."""
        cfg, tm, w = self.config, self.config.max_tokens_per_rank, self.config.world_size
        ranks = torch.arange(w, device=self.device).repeat_interleave(num_tokens)
        tokens = torch.arange(num_tokens, device=self.device).repeat(w)
        src_rows = tokens if sent_WT is not None else torch.arange(w * num_tokens, device=self.device)
        dst_rank = ranks if sent_WT is None else torch.where(sent_WT.reshape(-1), ranks, -1)
        put_rows(src_IF.contiguous(), src_rows, target.ptrs, dst_rank, cfg.rank * tm + tokens)

    def _replicate(self, src_RF, out_RF, routes: Routes, per_pair: bool) -> None:
        """Copy each staged token (or, ``per_pair``, each pair's own row of ``src_RF``) into the
        receive rows of the local ``out_RF``."""
        src_rows = self.slot_pairs if per_pair else self.slot_pairs // self.config.top_k
        copy_rows(src_RF, src_rows, out_RF, routes.rows_WMK.reshape(-1))

    def _send_and_replicate(self, x_TH, routes: Routes, num_rows: int) -> torch.Tensor:
        """Tokens once to each rank holding one of their experts, then into the receive rows:
        ``[num_rows, H]``."""
        with self.timer.phase("dispatch: token send"):
            self._barrier()
            self._put_token_grid(x_TH, self.stage_x, x_TH.shape[0], routes.sent_WT)
            self._barrier()
        with self.timer.phase("dispatch: reorder"):
            out = x_TH.new_zeros(num_rows, x_TH.shape[1])
            self._replicate(self.stage_x.local, out, routes, per_pair=False)
        return out

    def dispatch_like(self, x_TH, handle):
        recv = self._send_and_replicate(x_TH.contiguous(), handle.routes, handle.num_rows)
        return recv.view(handle.rows_shape(x_TH.shape[1]))

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
        hidden, num_tokens = expert_out.shape[-1], handle.num_tokens
        rows_RH = expert_out.reshape(handle.num_rows, hidden)
        routes = handle.routes
        if reduce == "source":
            with self.timer.phase("combine: send"):
                self._return_pairs(rows_RH.contiguous(), self.back_x, handle)
            with self.timer.phase("combine: reduce"):
                contrib = self.back_x.local[: num_tokens * k].view(num_tokens, k, hidden)
                weights = handle.topk_weights.detach().float() if weighted else None
                return ordered_sum(contrib, routes.valid_TK, weights).to(expert_out.dtype)
        with self.timer.phase("combine: local reduce"):
            valid_WMK = routes.rows_WMK >= 0
            contrib = (rows_RH[routes.rows_WMK.clamp(min=0)] if handle.num_rows
                       else rows_RH.new_zeros(*routes.rows_WMK.shape, hidden))
            weights = routes.weights_WMK.reshape(w * tm, k) if weighted else None
            partial = ordered_sum(contrib.view(w * tm, k, hidden), valid_WMK.view(w * tm, k),
                                  weights).to(expert_out.dtype)
        with self.timer.phase("combine: send"):
            self._barrier()
            put_rows(partial, self.slot_pairs[: w * tm], self.back_x.ptrs,
                     torch.where(valid_WMK.any(2).reshape(-1), self.item_rank, -1),
                     cfg.rank * tm + self.item_token)
            self._barrier()
        with self.timer.phase("combine: reduce"):
            acc = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=self.device)
            back = self.back_x.local[: w * tm].view(w, tm, hidden)
            for d in range(w):  # ascending rank of the partial's sender
                acc = torch.where(routes.sent_WT[d].unsqueeze(1), acc + back[d, :num_tokens].float(),
                                  acc)
            return acc.to(expert_out.dtype)

    def return_pair_values(self, values_R, handle):
        k, num_tokens = self.config.top_k, handle.num_tokens
        self._return_pairs(values_R.float().reshape(-1, 1).contiguous(), self.back_vals, handle)
        vals = self.back_vals.local[: num_tokens * k, 0].view(num_tokens, k)
        return torch.where(handle.routes.valid_TK, vals, 0.0)
