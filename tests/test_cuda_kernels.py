"""The CUDA backend's dispatch kernels, run by Triton's interpreter on the CPU (no GPU needed), with
W ranks emulated in one process: their outputs must equal ``ubep.layout`` and the oracle.

Rows are fp32 here: the interpreter's conversion to bf16 truncates where the GPU rounds to nearest,
so bf16 rounding is left to the GPU tests. Skipped where Triton is not installed (CI has no Triton;
GPU machines run tests/test_cuda.py).
"""

import os

import pytest
import torch

if torch.cuda.is_available():  # GPU machines run the real kernels (tests/test_cuda.py)
    pytest.skip("the interpreter check is for machines without CUDA", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # this process has no GPU work to disturb
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - Triton imported earlier
    pytest.skip("Triton was imported without its interpreter", allow_module_level=True)

from ubep import layout, oracle, workloads  # noqa: E402
from ubep.backends.cuda import combine_kernels as ck  # noqa: E402
from ubep.backends.cuda import dispatch_kernels as dk  # noqa: E402


def _ptrs(tensors):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


@pytest.mark.parametrize(("tokens", "experts", "top_k", "capacity", "drop"), [
    ((5, 3), 8, 2, 0, 0.25),
    ((4, 0, 6), 6, 3, 0, 0.0),
    ((7, 7), 8, 4, 14, 0.1),
])
def test_dispatch_kernels_match_layout_and_oracle(tokens, experts, top_k, capacity, drop):
    world, hidden, tm = len(tokens), 24, max(tokens)
    local = experts // world
    gen = torch.Generator().manual_seed(sum(tokens))
    idxs = [workloads.drop_slots(workloads.random_topk(t, experts, top_k, gen), drop, gen)
            for t in tokens]
    xs = [workloads.origin_tokens(s, t, hidden, torch.float32) for s, t in enumerate(tokens)]
    ws = [workloads.origin_weights(s, t, top_k) for s, t in enumerate(tokens)]
    meta = [torch.zeros(world, experts + 1, dtype=torch.int64) for _ in range(world)]
    stage_x = [torch.zeros(world * tm, hidden, dtype=torch.float32) for _ in range(world)]
    stage_route = [torch.zeros(world * tm, 2 * top_k, dtype=torch.int32) for _ in range(world)]
    orders, bases, sents = [], [], []
    for s in range(world):  # phase 1 on every rank, then (barrier) phase 2, ...
        order = torch.full((tokens[s] * top_k,), -7, dtype=torch.int64)
        dk.count_and_order[(experts,)](idxs[s].reshape(-1), tokens[s] * top_k, tokens[s], order,
                                       _ptrs(meta), s, WORLD=world, MAX_PAIRS=tm * top_k,
                                       num_experts=experts, BLOCK=16)
        valid = idxs[s].reshape(-1) >= 0
        assert torch.equal(order[valid], layout.local_order(idxs[s], experts).reshape(-1)[valid])
        orders.append(order)
    count_matrix = torch.stack([layout.expert_counts(i, experts) for i in idxs])
    for s in range(world):
        assert torch.equal(meta[s][:, :experts], count_matrix)
        assert meta[s][:, experts].tolist() == list(tokens)
        base = torch.empty(experts, dtype=torch.int64)
        dk.row_base[(experts,)](meta[s], base, s, capacity, WORLD=world, NUM_LOCAL=local,
                                LOCAL_BLOCK=triton.next_power_of_2(local), num_experts=experts)
        assert torch.equal(base, layout.row_base(count_matrix, local, capacity or None)[s])
        sent = torch.zeros(world, tokens[s], dtype=torch.int8)
        if tokens[s]:
            dk.send[(tokens[s], world)](xs[s], idxs[s].reshape(-1), ws[s].reshape(-1), orders[s],
                                        base, _ptrs(stage_x), _ptrs(stage_route), sent, s,
                                        tokens[s], tm, local, top_k=top_k,
                                        K_BLOCK=triton.next_power_of_2(top_k), hidden=hidden,
                                        BLOCK=16)
        ranks = layout.dest_rank(idxs[s], local)
        assert torch.equal(sent.bool(), torch.stack([(ranks == r).any(1) for r in range(world)]))
        bases.append(base)
        sents.append(sent)
    received = []
    for d in range(world):
        want_x, tpe, want_w = oracle.dispatch(xs, idxs, ws, d, world, experts)
        num_rows = local * capacity if capacity else int(tpe.sum())
        out = torch.zeros(num_rows, hidden, dtype=torch.float32)
        out_w = torch.zeros(num_rows)
        rows = torch.empty(world, tm, top_k, dtype=torch.int64)
        weights = torch.empty(world, tm, top_k)
        dk.replicate[(world, tm)](stage_x[d], stage_route[d], meta[d], out, out_w, rows, weights,
                                  tm, experts, top_k=top_k, K_BLOCK=triton.next_power_of_2(top_k),
                                  hidden=hidden, BLOCK=16)
        if capacity:
            want_x = oracle.to_padded(want_x, tpe, capacity).reshape(num_rows, hidden)
            want_w = oracle.to_padded(want_w, tpe, capacity).reshape(num_rows)
        assert torch.equal(out, want_x)
        assert torch.equal(out_w, want_w)
        for s in range(world):
            want_rows = layout.received_rows(layout.pair_rows(idxs[s], bases[s], experts),
                                             layout.dest_rank(idxs[s], local), d)
            assert torch.equal(rows[s, : tokens[s]], want_rows)
            assert (rows[s, tokens[s]:] == -1).all()
        received.append((out, rows, weights))
    _check_combine(received, idxs, xs, ws, sents, tokens, experts, top_k, hidden, tm)


def _check_combine(received, idxs, xs, ws, sents, tokens, experts, top_k, hidden, tm):
    """send_back + reduce kernels against oracle.combine, both reductions, weighted or not."""
    world = len(tokens)
    outs = oracle.expert_outputs(idxs,
                                 lambda s, t, k, e: workloads.scale_expert(xs[s][t : t + 1], e)[0])
    expert_out = []
    for out, rows, _ in received:
        per_row = torch.zeros_like(out)
        for s in range(world):
            for t in range(tokens[s]):
                for k in range(top_k):
                    if rows[s, t, k] >= 0:
                        e = int(idxs[s][t, k])
                        per_row[rows[s, t, k]] = workloads.scale_expert(out[rows[s, t, k]][None], e)[0]
        expert_out.append(per_row)
    for partial in (False, True):
        for weighted in (False, True):
            back = [torch.zeros(max(tm * top_k, world * tm), hidden, dtype=torch.float32)
                    for _ in range(world)]
            for d, (_, rows, weights) in enumerate(received):
                ck.send_back[(world, tm)](expert_out[d], rows, weights, _ptrs(back), d, tm,
                                          top_k=top_k, K_BLOCK=triton.next_power_of_2(top_k),
                                          hidden=hidden, BLOCK=16, PARTIAL=partial,
                                          WEIGHTED=weighted, EXACT=False)
            for s in range(world):
                if not tokens[s]:
                    continue
                y = torch.empty(tokens[s], hidden, dtype=torch.float32)
                if partial:
                    ck.reduce_slots[(tokens[s],)](back[s], 1, tm, sents[s].bool(), 1, tokens[s],
                                                  sents[s].bool(), y, NUM=world, hidden=hidden,
                                                  BLOCK=16, WEIGHTED=False, EXACT=False)
                else:
                    ck.reduce_slots[(tokens[s],)](back[s], top_k, 1, idxs[s] >= 0, top_k, 1, ws[s],
                                                  y, NUM=top_k, hidden=hidden, BLOCK=16,
                                                  WEIGHTED=weighted, EXACT=False)
                want = oracle.combine(outs, idxs, ws, s, world, experts,
                                      "expert_rank" if partial else "source", weighted, hidden,
                                      torch.float32)
                assert torch.equal(y, want), (s, partial, weighted)
