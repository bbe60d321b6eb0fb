"""The reference backend with a balanced plan (``ubep.balanced.BalancedBuffer``).

Dispatch all-gathers the count matrix (the call check's collective, as in the reference), and every
rank plans the same batch from it (``ubep.balance.plan_balance``), so no plan is broadcast. Each pair
then goes to the rank and segment row the plan gives it; tokens still travel once per destination
rank with their routing rows. The handle holds the same :class:`Routes` as the reference, so
combine, ``dispatch_like`` and ``return_pair_values`` (hence both backwards) are the reference's own.

Two more collectives move weights: :meth:`prefetch` copies the borrowed experts' weights from their
homes, and :meth:`carry` hands weight-gradient accumulators along the chains of
:mod:`ubep.balance.chain`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ubep import layout
from ubep.backends.base import Handle, WireStats, call_code
from ubep.backends.reference import ReferenceBackend, Routes
from ubep.balance import BalancePlan, plan_balance, segment_offsets
from ubep.balance.chain import chain_steps


@dataclass(frozen=True, eq=False)
class BalancedHandle(Handle):
    """A :class:`Handle` whose receive rows are segments: ``plan`` (every rank's, identical) and
    ``tokens_per_segment [2L]`` int64 (own experts, then borrowed slots). ``tokens_per_expert`` holds
    the own experts' segments, the first ``L``."""

    plan: BalancePlan = field(kw_only=True)
    tokens_per_segment: torch.Tensor = field(kw_only=True)
    rows: Handle | None = field(default=None, kw_only=True)  # the row Buffer's handle (other backends)


def _return_slots(rank_TK: torch.Tensor, world_size: int) -> torch.Tensor:
    """Flat ``t * K + k`` slots of the pairs in the order the ranks return them: by computing rank,
    then ``(t, k)`` (``layout.return_slots`` with the plan's ranks instead of the homes)."""
    ranks = rank_TK.reshape(-1)
    order = torch.argsort(torch.where(ranks >= 0, ranks, world_size), stable=True)
    return order[: int((ranks >= 0).sum())]


class BalancedReferenceBackend(ReferenceBackend):
    name = "reference"

    def dispatch(self, x_TH, topk_idx_TK, topk_weights_TK):
        handle = self._plan_balanced(x_TH, topk_idx_TK, topk_weights_TK)
        return self._send_tokens(x_TH, handle), handle.row_weights.clone(), handle

    def plan_batch(self, topk_idx_TK) -> tuple[BalancePlan, torch.Tensor]:
        """``(plan, counts_WE)``: the batch's plan, from the count matrix every rank all-gathers (the
        dispatch's call check), the same on every rank."""
        cfg, timer = self.config, self.timer
        with timer.phase("dispatch: count exchange"):
            counts_E = layout.expert_counts(topk_idx_TK, cfg.num_experts)
            gathered = self._open_call(call_code("dispatch"), "dispatch: count exchange",
                                       torch.cat([counts_E, counts_E.new_zeros(cfg.world_size)]))
            counts_WE = gathered[:, : cfg.num_experts]
        with timer.phase("dispatch: plan"):
            return plan_balance(counts_WE, check=False), counts_WE

    def _plan_balanced(self, x_TH, topk_idx_TK, topk_weights_TK) -> BalancedHandle:
        cfg, timer = self.config, self.timer
        world, rank, top_k = cfg.world_size, cfg.rank, cfg.top_k
        plan, counts_WE = self.plan_batch(topk_idx_TK)
        with timer.phase("dispatch: plan"):
            dest = plan.destinations(topk_idx_TK, rank, counts_WE)
            offsets_WG = segment_offsets(plan.tokens_per_segment_WG)
            valid_TK = dest.rank >= 0
            rows_TK = torch.where(valid_TK, offsets_WG[dest.rank.clamp(min=0),
                                                      dest.segment.clamp(min=0)] + dest.row, -1)
            mask_TW = torch.zeros(rows_TK.shape[0], world + 1, dtype=torch.bool, device=x_TH.device)
            mask_TW.scatter_(1, torch.where(valid_TK, dest.rank, world), True)
            send_token_idx, send_rank_S, send_counts_W = layout.send_order(mask_TW[:, :world])
            pairs_W = torch.bincount(dest.rank[valid_TK], minlength=world)
            # Which tokens cross depends on each source's rows, not on the counts: one more
            # all-gather of every rank's token and pair counts to every rank.
            sizes_WW2 = self._all_gather(torch.cat([send_counts_W, pairs_W]), "dispatch: sizes")
            num_rows = plan.tokens_per_segment_WG[rank].sum().view(1)
            sizes = torch.cat([sizes_WW2[rank, :world], sizes_WW2[:, rank],
                               sizes_WW2[rank, world:], sizes_WW2[:, world + rank],
                               num_rows]).tolist()
            send_counts, recv_counts, return_counts, recv_pair_counts = (
                tuple(sizes[i * world : (i + 1) * world]) for i in range(4))
        with timer.phase("dispatch: route send"):
            rows_SK = layout.received_rows(rows_TK[send_token_idx], dest.rank[send_token_idx],
                                           send_rank_S.unsqueeze(1))
            weights_SK = topk_weights_TK.detach()[send_token_idx].float()
            route_NK2 = self._all_to_all(torch.cat([rows_SK.int(), weights_SK.view(torch.int32)], 1),
                                         send_counts, recv_counts, "dispatch: route send")
        with timer.phase("dispatch: reorder"):
            recv_rows = route_NK2[:, :top_k].long()
            recv_pair_weights = route_NK2[:, top_k:].contiguous().view(torch.float32)
            valid_NK = recv_rows >= 0
            row_weights = torch.zeros(sizes[-1], dtype=torch.float32, device=x_TH.device)
            row_weights[recv_rows[valid_NK]] = recv_pair_weights[valid_NK]
        wire = WireStats.of(sum(send_counts) - send_counts[rank],
                            sum(return_counts) - return_counts[rank], hidden=cfg.hidden,
                            itemsize=x_TH.element_size(), top_k=top_k, world=world,
                            num_experts=cfg.num_experts)
        routes = Routes(send_token_idx, send_counts, _return_slots(dest.rank, world), return_counts,
                        recv_counts, recv_rows, recv_pair_weights, recv_pair_counts)
        self.dispatches += 1
        segments = plan.tokens_per_segment_WG[rank]
        return BalancedHandle(cfg, x_TH.shape[0], topk_weights_TK, row_weights,
                              segments[: cfg.num_local_experts], sizes[-1], wire, routes,
                              self.dispatches, plan=plan, tokens_per_segment=segments)

    # -- weights ---------------------------------------------------------------------------------

    def prefetch(self, handle: BalancedHandle, flat_LP: torch.Tensor) -> torch.Tensor:
        """Borrowed experts' flattened weights ``[L, P]`` (a slot's row is unspecified when idle),
        from the flattened weights ``flat_LP [L, P]`` of this rank's own experts.

        Home ``h`` sends, for each rank ``d`` ascending, the weights of ``d``'s slots holding
        experts of ``h``, in slot order; a rank borrows from one group only, so it receives from at
        most one home.
        """
        self._open_call(call_code("prefetch_weights", handle.call), "prefetch: call check")
        cfg = self.config
        local, rank = cfg.num_local_experts, cfg.rank
        borrowed = handle.plan.borrowed_WL.cpu()
        home_WL = torch.where(borrowed >= 0, borrowed // local, -1)
        with self.timer.phase("prefetch: send"):
            mine = (home_WL == rank).nonzero(as_tuple=True)  # (rank d, slot), d ascending
            send = flat_LP[borrowed[mine] - rank * local]
            send_counts = tuple(torch.bincount(mine[0], minlength=cfg.world_size).tolist())
            recv_counts = tuple(torch.bincount(home_WL[rank][home_WL[rank] >= 0],
                                               minlength=cfg.world_size).tolist())
            got = self._all_to_all(send, send_counts, recv_counts, "prefetch: send")
        slots_LP = flat_LP.new_zeros(flat_LP.shape)
        slots_LP[: got.shape[0]] = got  # slots fill from the first, in ascending expert id
        return slots_LP

    def carry(self, handle: BalancedHandle, zeros_P: torch.Tensor,
              accumulate: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Gradients ``[L, P]`` of this rank's own experts: each chain's accumulator starts at
        ``zeros_P``, ``accumulate(segment, acc_P)`` adds this rank's rows of a segment to it, and
        the accumulators travel as :func:`ubep.balance.chain.chain_steps` orders (one all-to-all a
        round, messages by expert id)."""
        self._open_call(call_code("reduce_weight_grads", handle.call), "weight grads: call check")
        cfg = self.config
        local, rank, world = cfg.num_local_experts, cfg.rank, cfg.world_size
        segment_WE = handle.plan.segment_WE.cpu()
        steps = chain_steps(handle.plan.alloc_WE)
        last_round = {s.expert: s.round for s in steps}  # steps are sorted by round
        held: dict[int, torch.Tensor] = {}  # expert -> accumulator handed to this rank
        own = zeros_P.new_zeros(local, zeros_P.numel())
        for p in range(max((s.round for s in steps), default=-1) + 1):
            now = [s for s in steps if s.round == p]
            out: list[list[torch.Tensor]] = [[] for _ in range(world)]
            with self.timer.phase("weight grads: accumulate"):
                for s in (s for s in now if s.rank == rank):
                    acc = accumulate(int(segment_WE[rank, s.expert]), held.pop(s.expert, zeros_P))
                    if s.to == rank:
                        own[s.expert - rank * local] = acc
                    else:
                        out[s.to].append(acc)
            with self.timer.phase("weight grads: send"):
                send_counts = tuple(len(o) for o in out)
                recv_from = [[s.expert for s in now if s.rank == r != rank and s.to == rank]
                             for r in range(world)]
                send = (torch.stack([a for o in out for a in o]) if sum(send_counts)
                        else zeros_P.new_zeros(0, zeros_P.numel()))
                got = self._all_to_all(send, send_counts, tuple(map(len, recv_from)),
                                       "weight grads: send")
            for expert, acc in zip((e for r in recv_from for e in r), got, strict=True):
                if last_round[expert] == p:  # the chain's end: the home's gradient
                    own[expert - rank * local] = acc
                else:
                    held[expert] = acc
        return own
