"""The oracle: dispatch and combine built from torch.distributed collectives.

Works on any process group that has ``all_gather`` and ``all_to_all_single`` with split sizes (gloo on
CPU, NCCL on CUDA, HCCL on Ascend). It is bulk-synchronous on purpose: count exchange, then route and
token sends, then reorder, each a collective the next one waits for. This is the baseline the fast
backends beat, and the definition they must equal bit for bit.

Every collective waits at most ``config.timeout_s`` and then raises :class:`EPCommError` naming the
rank and the phase, so a peer that failed before communicating never leaves this rank hanging. Every
operation opens with the same collective, an all-gather of ``HEADER`` words plus the dispatch's
count row (zeros in the others): each rank's call number and call code (``base.call_code``), so
ranks that called different operations, or combine different handles, all raise
:class:`EPCommError` before any exchange whose sizes depend on the call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep import layout
from ubep.backends import collectives
from ubep.backends.base import Backend, EPCommError, Handle, WireStats, call_code, describe_call
from ubep.backends.capture import graph_capturing
from ubep.reduce import ordered_sum

HEADER = 2  # words before the counts in every operation's first all-gather: call number, call code


@dataclass(frozen=True, eq=False)
class Routes:
    """Where the reference backend's rows went, kept in the :class:`Handle`.

    Source side: ``send_token_idx`` ``[S]`` int64, tokens in wire order (destination rank, then
    token), ``send_counts[r]`` of them to rank ``r``; ``return_slots`` ``[P]`` int64, the flat
    ``t * K + k`` slot of each pair that comes back in combine, ``return_counts[r]`` from rank ``r``.
    Destination side (``N`` received tokens, grouped by source rank, token order kept):
    ``recv_counts[s]`` tokens and ``recv_pair_counts[s]`` pairs from source ``s``; ``recv_rows``
    ``[N, K]`` int64, the receive row of each pair held here, else ``-1``; ``recv_pair_weights``
    ``[N, K]`` fp32, the matching gate weights.
    """

    send_token_idx: torch.Tensor
    send_counts: tuple[int, ...]
    return_slots: torch.Tensor
    return_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]
    recv_rows: torch.Tensor
    recv_pair_weights: torch.Tensor
    recv_pair_counts: tuple[int, ...]


class ReferenceBackend(Backend):
    name = "reference"

    # -- collectives with a deadline -------------------------------------------------------------

    def _all_gather(self, t: torch.Tensor, phase: str) -> torch.Tensor:
        return collectives.all_gather(t, self.group, phase=phase, rank=self.config.rank,
                                      timeout_s=self.config.timeout_s)

    def _open_call(self, code: int, phase: str, counts: torch.Tensor | None = None) -> torch.Tensor:
        """The operation's first collective: every rank's ``[call number, code, counts...]``
        (``counts``: the dispatch's ``E + W`` count row; zeros in the other operations). Raises
        :class:`EPCommError` on every rank if their calls differ; returns the ``[W, E + W]`` counts."""
        cfg = self.config
        self.calls += 1
        row = torch.zeros(HEADER + cfg.num_experts + cfg.world_size, dtype=torch.int64,
                          device=self.device)
        row[0], row[1] = self.calls, code
        if counts is not None:
            row[HEADER:] = counts
        gathered = self._all_gather(row, phase)
        calls = gathered[:, :HEADER].tolist()
        if any(c != calls[0] for c in calls):
            seen = "; ".join(f"rank {r}: call {n}, {describe_call(c)}" for r, (n, c) in enumerate(calls))
            raise EPCommError(f"ubep rank {cfg.rank}: the ranks called different operations ({seen}); "
                              f"every rank must run the same calls in the same order")
        return gathered[:, HEADER:]

    def _all_to_all(
        self, send: torch.Tensor, send_counts: tuple[int, ...], recv_counts: tuple[int, ...],
        phase: str,
    ) -> torch.Tensor:
        """Rows of ``send`` grouped by destination rank -> rows grouped by source rank."""
        recv = send.new_empty((sum(recv_counts), *send.shape[1:]))
        send = send.contiguous()
        collectives.run_with_deadline(
            lambda: dist.all_to_all_single(recv, send, list(recv_counts), list(send_counts),
                                           group=self.group, async_op=True),
            phase=phase, rank=self.config.rank, timeout_s=self.config.timeout_s, device=self.device)
        return recv

    # -- dispatch --------------------------------------------------------------------------------

    def __init__(self, config, group, device):
        super().__init__(config, group, device)
        self.calls = 0  # operations so far on this rank, every kind

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        if graph_capturing(x_TH):  # before any collective: a capture would record none of them
            raise RuntimeError("backend='reference' cannot be captured in a graph (its collectives "
                               "synchronize with the host); use backend='cuda' or 'ascend'")
        handle = self._plan(x_TH, topk_idx_TK, topk_weights_TK)
        recv_x = self._send_tokens(x_TH, handle)
        return recv_x, handle.row_weights.clone().view(handle.rows_shape()), handle

    def _plan(self, x_TH, topk_idx_TK, topk_weights_TK) -> Handle:
        cfg, timer = self.config, self.timer
        world, rank, top_k = cfg.world_size, cfg.rank, cfg.top_k
        with timer.phase("dispatch: count exchange"):
            counts_E = layout.expert_counts(topk_idx_TK, cfg.num_experts)
            mask_TW = layout.token_rank_mask(topk_idx_TK, cfg.num_local_experts, world)
            send_token_idx, send_rank_S, send_counts_W = layout.send_order(mask_TW)
            gathered = self._open_call(call_code("dispatch"), "dispatch: count exchange",
                                       torch.cat([counts_E, send_counts_W]))
            count_matrix_WE = gathered[:, : cfg.num_experts]
            tokens_WW = gathered[:, cfg.num_experts :]
            pairs_WW = layout.pairs_between_ranks(count_matrix_WE)
            tokens_per_expert = count_matrix_WE.sum(0)[cfg.local_experts.start :
                                                       cfg.local_experts.stop]
            # Every split size the calls below need, in one device-to-host copy.
            sizes = torch.cat([tokens_WW[rank], tokens_WW[:, rank], pairs_WW[rank],
                               pairs_WW[:, rank], tokens_per_expert.sum().view(1)]).tolist()
            send_counts, recv_counts, return_counts, recv_pair_counts = (
                tuple(sizes[i * world : (i + 1) * world]) for i in range(4))
        with timer.phase("dispatch: route send"):
            capacity = cfg.expert_capacity if cfg.layout == "padded" else None
            base_WE = layout.row_base(count_matrix_WE, cfg.num_local_experts, capacity)
            rows_TK = layout.pair_rows(topk_idx_TK, base_WE[rank], cfg.num_experts)
            ranks_TK = layout.dest_rank(topk_idx_TK, cfg.num_local_experts)
            rows_SK = layout.received_rows(
                rows_TK[send_token_idx], ranks_TK[send_token_idx], send_rank_S.unsqueeze(1)
            )
            weights_SK = topk_weights_TK.detach()[send_token_idx].float()
            route_SK2 = torch.cat([rows_SK.int(), weights_SK.view(torch.int32)], dim=1)
            route_NK2 = self._all_to_all(
                route_SK2, send_counts, recv_counts, "dispatch: route send"
            )
        with timer.phase("dispatch: reorder"):
            recv_rows = route_NK2[:, :top_k].long()
            recv_pair_weights = route_NK2[:, top_k:].contiguous().view(torch.float32)
            valid_NK = recv_rows >= 0
            num_rows = cfg.num_local_experts * cfg.expert_capacity if capacity else sizes[-1]
            row_weights = torch.zeros(num_rows, dtype=torch.float32, device=x_TH.device)
            row_weights[recv_rows[valid_NK]] = recv_pair_weights[valid_NK]
            return_slots = layout.return_slots(topk_idx_TK, cfg.num_local_experts, world)
        wire = WireStats.of(sum(send_counts) - send_counts[rank],
                            sum(return_counts) - return_counts[rank], hidden=cfg.hidden,
                            itemsize=x_TH.element_size(), top_k=top_k, world=world,
                            num_experts=cfg.num_experts)
        routes = Routes(send_token_idx, send_counts, return_slots, return_counts, recv_counts,
                        recv_rows, recv_pair_weights, recv_pair_counts)
        self.dispatches += 1
        return Handle(cfg, x_TH.shape[0], topk_weights_TK, row_weights, tokens_per_expert, num_rows,
                      wire, routes, self.dispatches)

    def dispatch_like(self, x_TH, handle):
        self._open_call(call_code("dispatch_like", handle.call), "dispatch: call check")
        return self._send_tokens(x_TH, handle)

    def _send_tokens(self, x_TH, handle):
        """The tokens along ``handle``'s routes, into their receive rows."""
        with self.timer.phase("dispatch: token send"):
            recv_NH = self._all_to_all(
                x_TH[handle.routes.send_token_idx], handle.routes.send_counts, handle.routes.recv_counts,
                "dispatch: token send",
            )
        with self.timer.phase("dispatch: reorder"):
            valid_NK = handle.routes.recv_rows >= 0
            token_of_pair = valid_NK.nonzero(as_tuple=True)[0]
            out = x_TH.new_zeros(handle.num_rows, x_TH.shape[1])
            out[handle.routes.recv_rows[valid_NK]] = recv_NH[token_of_pair]
        return out.view(handle.rows_shape(x_TH.shape[1]))

    # -- combine ---------------------------------------------------------------------------------

    def combine(self, expert_out, handle, reduce, weighted):
        self._open_call(call_code("combine", handle.call, reduce, weighted), "combine: call check")
        hidden = expert_out.shape[-1]
        rows_RH = expert_out.reshape(handle.num_rows, hidden)
        valid_NK = handle.routes.recv_rows >= 0
        if reduce == "source":
            with self.timer.phase("combine: send"):
                back_PH = self._all_to_all(
                    rows_RH[handle.routes.recv_rows[valid_NK]], handle.routes.recv_pair_counts,
                    handle.routes.return_counts, "combine: send",
                )
            with self.timer.phase("combine: reduce"):
                top_k = self.config.top_k
                contrib = rows_RH.new_zeros(handle.num_tokens * top_k, hidden)
                contrib[handle.routes.return_slots] = back_PH
                valid = torch.zeros(handle.num_tokens * top_k, dtype=torch.bool,
                                    device=rows_RH.device)
                valid[handle.routes.return_slots] = True
                weights = handle.topk_weights.detach().float() if weighted else None
                y = ordered_sum(
                    contrib.view(handle.num_tokens, top_k, hidden),
                    valid.view(handle.num_tokens, top_k), weights,
                )
            return y.to(expert_out.dtype)
        with self.timer.phase("combine: local reduce"):
            # One gather [N, K, H]; slots of pairs held elsewhere read row 0 and are masked out.
            contrib_NKH = (rows_RH[handle.routes.recv_rows.clamp(min=0)] if handle.num_rows
                           else rows_RH.new_zeros(*handle.routes.recv_rows.shape, hidden))
            weights = handle.routes.recv_pair_weights if weighted else None
            partial_NH = ordered_sum(contrib_NKH, valid_NK, weights).to(expert_out.dtype)
        with self.timer.phase("combine: send"):
            back_SH = self._all_to_all(
                partial_NH, handle.routes.recv_counts, handle.routes.send_counts, "combine: send"
            )
        with self.timer.phase("combine: reduce"):
            acc = torch.zeros(handle.num_tokens, hidden, dtype=torch.float32,
                              device=rows_RH.device)
            start = 0
            for count in handle.routes.send_counts:  # ascending source-of-partial rank
                idx = handle.routes.send_token_idx[start : start + count]
                acc[idx] = acc[idx] + back_SH[start : start + count].float()
                start += count
        return acc.to(expert_out.dtype)

    def return_pair_values(self, values_R, handle):
        self._open_call(call_code("return_pair_values", handle.call), "combine: call check")
        valid_NK = handle.routes.recv_rows >= 0
        with self.timer.phase("combine: send"):
            back_P = self._all_to_all(
                values_R.float()[handle.routes.recv_rows[valid_NK]], handle.routes.recv_pair_counts,
                handle.routes.return_counts, "combine: send",
            )
        out = torch.zeros(handle.num_tokens * self.config.top_k, dtype=torch.float32,
                          device=values_R.device)
        out[handle.routes.return_slots] = back_P
        return out.view(handle.num_tokens, self.config.top_k)
