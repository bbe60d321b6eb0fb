"""ubep.balance: the docstrings' running examples, the planner's invariants on random and adversarial
counts and routings, agreement with a plain-Python restatement of the greedy rules (which pins the
tie rule), per-pair destinations against the oracle's row order, and no host reads (meta tensors)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ubep import balance
from ubep.layout import expert_counts
from ubep.oracle import rows_of_expert

FAST = settings(max_examples=300, deadline=None)
WORLD_SIZES = [1, 2, 3, 4, 8]
LOCAL_EXPERTS = [1, 2, 3, 4, 8]

# The running example of ubep/balance/plan.py: W = 3, E = 6, S = 4, K = 2.
C = torch.tensor([[4, 2, 0, 1, 1, 0], [3, 2, 1, 0, 1, 1], [2, 2, 0, 1, 1, 2]])
IDX2 = torch.tensor([[0, 1], [5, 0], [1, 3], [4, 5]])  # source 2's routing, counted by C[2]


def reference_plan(rows: list[int], world_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """``(moves, alloc)`` by the greedy rules of ubep/balance/plan.py, one step at a time."""
    local = len(rows) // world_size
    total = sum(rows)
    target = [total // world_size + (r < total % world_size) for r in range(world_size)]
    bal = [sum(rows[h * local:(h + 1) * local]) - target[h] for h in range(world_size)]
    moves = [[0] * world_size for _ in range(world_size)]
    ranks = range(world_size)
    while max(bal) > 0:
        donor = max(ranks, key=lambda r: (bal[r], -r))
        receiver = min(ranks, key=lambda r: (bal[r], r))
        move = -bal[receiver]
        moves[donor][receiver] += move
        bal[donor] -= move
        bal[receiver] = 0
    alloc = [[0] * len(rows) for _ in ranks]
    for h in ranks:
        left, quota = rows[h * local:(h + 1) * local], list(moves[h])
        while any(quota):
            d = max(ranks, key=lambda r: (quota[r], -r))
            j = max(range(local), key=lambda i: (left[i], -i))
            take = min(quota[d], left[j])
            assert take > 0, "a donor ran out of rows"
            alloc[d][h * local + j] += take
            quota[d] -= take
            left[j] -= take
        for j in range(local):
            alloc[h][h * local + j] += left[j]
    return moves, alloc


def check_plan(plan: balance.BalancePlan, rows_E: torch.Tensor, world_size: int) -> None:
    """Every invariant docs/BALANCE.md states for a plan."""
    alloc, moves = plan.alloc_WE, plan.moves_WW
    num_experts = rows_E.numel()
    local = num_experts // world_size
    total = int(rows_E.sum())
    home = torch.arange(num_experts) // local
    own = home[None, :] == torch.arange(world_size)[:, None]
    # conservation, non-negativity, exact per-rank rows within one of the mean
    assert (alloc >= 0).all() and torch.equal(alloc.sum(0), rows_E)
    assert torch.equal(alloc.sum(1), plan.targets_W) and int(plan.targets_W.sum()) == total
    assert int(plan.targets_W.max()) == -(-total // world_size)
    assert int(plan.targets_W.max() - plan.targets_W.min()) <= 1
    if total % world_size == 0:
        assert int(plan.targets_W.max()) * world_size == total  # max / mean == 1.00
    # at most one remote group per rank, hence at most L borrowed experts and 2L segments
    remote = (alloc > 0) & ~own
    assert (remote.view(world_size, world_size, local).any(2).sum(1) <= 1).all()
    assert (remote.sum(1) <= local).all()
    assert ((plan.tokens_per_segment_WG > 0).sum(1) <= 2 * local).all()
    # group moves agree with alloc; at most W - 1 of them
    per_group = alloc.view(world_size, world_size, local).sum(2)  # [rank, group]
    assert torch.equal(moves, per_group.t() * (1 - torch.eye(world_size, dtype=torch.int64)))
    assert int((moves > 0).sum()) <= max(world_size - 1, 0)
    # weight copies: one per piece, at most moves + (L - 1) per donor group
    donors = int((moves.sum(1) > 0).sum())
    assert int(remote.sum()) <= int((moves > 0).sum()) + donors * (local - 1)
    # home first: a rank whose own rows fit its target keeps them all and gives none away; only
    # donors give, and at most all donors but one also borrow (the last round ends exactly)
    groups = rows_E.view(world_size, local).sum(1)
    donor = groups > plan.targets_W
    gives = moves.sum(1) > 0
    assert not (gives & ~donor).any()
    assert int((gives & remote.any(1)).sum()) <= max(int(donor.sum()) - 1, 0)
    for h in range(world_size):
        kept = alloc[h, h * local:(h + 1) * local]
        if groups[h] <= plan.targets_W[h]:
            assert torch.equal(kept, rows_E[h * local:(h + 1) * local])
        elif int(kept.sum()) < int(plan.targets_W[h]):
            assert remote[h].any()  # an overshooting donor fills up from one other group
    # segment layout
    own_rows = alloc.view(world_size, world_size, local).diagonal(dim1=0, dim2=1).t()
    assert torch.equal(plan.tokens_per_segment_WG[:, :local], own_rows)
    for d in range(world_size):
        slots = plan.borrowed_WL[d]
        names = remote[d].nonzero().flatten()
        assert slots[: names.numel()].tolist() == names.tolist()  # ascending global id
        assert (slots[names.numel():] == -1).all()
        assert plan.tokens_per_segment_WG[d, local:].tolist() == (
            alloc[d, names].tolist() + [0] * (local - names.numel()))
        for e in range(num_experts):
            seg = int(plan.segment_WE[d, e])
            if own[d, e] or remote[d, e]:
                assert int(plan.tokens_per_segment_WG[d, seg]) == int(alloc[d, e])
            else:
                assert seg == -1
    # the same as the plain-Python restatement (pins the tie rule)
    ref_moves, ref_alloc = reference_plan(rows_E.tolist(), world_size)
    assert moves.tolist() == ref_moves and alloc.tolist() == ref_alloc


def routing(world_size: int, local: int, top_k: int, tokens: int, mode: str, masked: bool,
            seed: int) -> list[torch.Tensor]:
    """Per source rank ``[T_s, K]`` distinct experts, skewed as ``mode`` says; ``masked`` draws
    ``T_s`` in ``[0, tokens]`` (empty ranks included) and drops about a third of the slots."""
    num_experts = world_size * local
    gen = torch.Generator().manual_seed(seed)
    popularity = 2.0 * torch.randn(num_experts, generator=gen)  # log-normal skew
    hot_group = seed % world_size
    idxs = []
    for _ in range(world_size):
        count = int(torch.randint(0, tokens + 1, (1,), generator=gen)) if masked else tokens
        # Gumbel top-k: K distinct experts, drawn without replacement by popularity.
        score = -torch.log(-torch.log(torch.rand(count, num_experts, generator=gen).clamp(1e-9, 1 - 1e-9)))
        if mode == "skew":
            score = score + popularity
        elif mode == "hot_expert":
            score[:, seed % num_experts] += 1e3
        elif mode == "cold_group":
            score[:, hot_group * local:(hot_group + 1) * local] -= 1e3
        elif mode == "one_group":
            score[:, hot_group * local:(hot_group + 1) * local] += 1e3
        idx = score.topk(min(top_k, num_experts), dim=1).indices
        if masked:
            idx[torch.rand(idx.shape, generator=gen) < 0.3] = -1
        idxs.append(idx)
    return idxs


def check_destinations(plan: balance.BalancePlan, idxs: list[torch.Tensor], counts_WE: torch.Tensor,
                       rows_per_rank: int, align: int) -> None:
    """Every pair lands once, at the place the oracle's row order and the alloc split give it."""
    world_size, num_experts = counts_WE.shape
    offsets = balance.segment_offsets(plan.tokens_per_segment_WG, align)
    got = {}
    for s, idx in enumerate(idxs):
        dst = plan.destinations(idx, s, counts_WE)
        assert torch.equal(dst.rank == -1, idx == -1) and torch.equal(dst.row == -1, idx == -1)
        for t, k in (idx >= 0).nonzero().tolist():
            got[(s, t, k)] = (int(dst.rank[t, k]), int(dst.segment[t, k]), int(dst.row[t, k]))
    want = {}
    for e in range(num_experts):
        pairs = rows_of_expert(idxs, e)  # (source, token) order, as the oracle receives them
        runs = [d for d in range(world_size) for _ in range(int(plan.alloc_WE[d, e]))]
        assert len(pairs) == len(runs)
        for g, (pair, d) in enumerate(zip(pairs, runs, strict=True)):
            start = int(plan.alloc_WE[:d, e].sum())
            want[pair] = (d, int(plan.segment_WE[d, e]), g - start)
    assert got == want
    # rows inside a rank's buffer: each row once, inside the static bound
    placed = {(d, int(offsets[d, seg]) + row) for d, seg, row in got.values()}
    assert len(placed) == len(got)
    assert int(offsets[:, -1].max()) <= balance.max_rows_per_rank(rows_per_rank, num_experts // world_size,
                                                                  align)


def test_running_example():
    plan = balance.plan_balance(C)
    assert plan.targets_W.tolist() == [8, 8, 8]
    assert plan.moves_WW.tolist() == [[0, 5, 2], [0, 0, 0], [0, 0, 0]]
    assert plan.alloc_WE.tolist() == [[4, 4, 0, 0, 0, 0], [5, 0, 1, 2, 0, 0], [0, 2, 0, 0, 3, 3]]
    assert plan.borrowed_WL.tolist() == [[-1, -1], [0, -1], [1, -1]]
    assert plan.tokens_per_segment_WG.tolist() == [[4, 4, 0, 0], [1, 2, 5, 0], [3, 3, 2, 0]]
    assert plan.segment_WE.tolist() == [[0, 1, -1, -1, -1, -1], [2, -1, 0, 1, -1, -1],
                                         [-1, 2, -1, -1, 0, 1]]
    dst = plan.destinations(IDX2, 2, C)
    assert dst.rank.tolist() == [[1, 2], [2, 1], [2, 1], [2, 2]]
    assert dst.segment.tolist() == [[2, 2], [1, 2], [2, 1], [0, 1]]
    assert dst.row.tolist() == [[3, 0], [1, 4], [1, 1], [2, 2]]
    assert balance.segment_offsets(plan.tokens_per_segment_WG, 4)[1].tolist() == [0, 4, 8, 16, 16]
    assert balance.max_rows_per_rank(8, 2, 4) == 20
    # the [E] form with world_size gives the same plan
    assert torch.equal(balance.plan_balance(C.sum(0), 3).alloc_WE, plan.alloc_WE)


def test_rank_targets():
    assert balance.rank_targets(10, 4).tolist() == [3, 3, 2, 2]
    assert balance.rank_targets(24, 3).tolist() == [8, 8, 8]
    assert balance.rank_targets(torch.tensor(0), 2).tolist() == [0, 0]


def test_forced_overshoot():
    """Group rows [13, 13, 14, 0], targets 10: one remote group per rank forces a donor to send
    more than its surplus. Home first gives way, the other invariants hold."""
    moves = balance.group_moves(torch.tensor([13, 13, 14, 0]), balance.rank_targets(40, 4))
    assert moves.tolist() == [[0, 0, 6, 0], [3, 0, 0, 0], [0, 0, 0, 10], [0, 0, 0, 0]]
    rows = torch.tensor([7, 6, 7, 6, 7, 7, 0, 0])  # W = 4, L = 2
    plan = balance.plan_balance(rows, 4)
    check_plan(plan, rows, 4)
    assert plan.alloc_WE[2, 4:6].sum() == 4 and plan.alloc_WE[0, 0:2].sum() == 7


def test_all_rows_to_one_expert():
    """K = 1 and every token picks expert 0: each other rank borrows expert 0, one group each."""
    counts = torch.zeros(8, 16, dtype=torch.int64)
    counts[:, 0] = 5
    plan = balance.plan_balance(counts)
    check_plan(plan, counts.sum(0), 8)
    assert plan.alloc_WE[:, 0].tolist() == [5] * 8
    assert plan.borrowed_WL[1:, 0].tolist() == [0] * 7 and (plan.borrowed_WL[:, 1] == -1).all()
    idxs = [torch.zeros(5, 1, dtype=torch.int64)] * 8
    check_destinations(plan, idxs, counts, 5, 1)
    # rank order: every source's rows stay on its own rank
    assert all(plan.destinations(idx, s, counts).rank.tolist() == [[s]] * 5 for s, idx in enumerate(idxs))


def test_ties_go_to_the_lowest_id():
    # equal groups: rank 0 donates first; equal experts: the lowest id is lent first
    plan = balance.plan_balance(torch.tensor([8, 7, 7, 8, 0, 0]), 3)
    assert plan.moves_WW.tolist() == [[0, 0, 10], [5, 0, 0], [0, 0, 0]]
    plan = balance.plan_balance(torch.tensor([5, 5, 5, 5, 0, 0, 0, 0]), 2)
    assert plan.alloc_WE.tolist() == [[0, 0, 5, 5, 0, 0, 0, 0], [5, 5, 0, 0, 0, 0, 0, 0]]
    # an odd total: the extra row goes to rank 0, which borrows the larger expert whole
    plan = balance.plan_balance(torch.tensor([0, 0, 3, 4]), 2)
    assert plan.targets_W.tolist() == [4, 3] and plan.alloc_WE.tolist() == [[0, 0, 0, 4], [0, 0, 3, 0]]


@st.composite
def expert_rows(draw):
    world_size = draw(st.sampled_from(WORLD_SIZES))
    local = draw(st.sampled_from(LOCAL_EXPERTS))
    num_experts = world_size * local
    mode = draw(st.sampled_from(["ties", "wide", "one_expert", "one_group", "cold_group", "zeros"]))
    high = 4 if mode == "ties" else 1000
    rows = draw(st.lists(st.integers(0, high), min_size=num_experts, max_size=num_experts))
    hot = draw(st.integers(0, num_experts - 1))
    group = slice(hot // local * local, (hot // local + 1) * local)
    if mode == "one_expert":
        rows = [0] * num_experts
        rows[hot] = draw(st.integers(0, 5000))
    elif mode == "one_group":
        rows = [r if group.start <= e < group.stop else 0 for e, r in enumerate(rows)]
    elif mode == "cold_group":
        rows = [0 if group.start <= e < group.stop else r for e, r in enumerate(rows)]
    elif mode == "zeros":
        rows = [0] * num_experts
    return world_size, torch.tensor(rows, dtype=torch.int64)


@FAST
@given(expert_rows())
def test_plan_invariants(case):
    world_size, rows = case
    plan = balance.plan_balance(rows, world_size)
    check_plan(plan, rows, world_size)
    again = balance.plan_balance(rows.clone(), world_size, check=False)
    for name in ("targets_W", "moves_WW", "alloc_WE", "borrowed_WL", "tokens_per_segment_WG", "segment_WE"):
        assert torch.equal(getattr(plan, name), getattr(again, name))


@settings(max_examples=200, deadline=None)
@given(world_size=st.sampled_from(WORLD_SIZES), local=st.sampled_from(LOCAL_EXPERTS),
       top_k=st.integers(1, 8), tokens=st.integers(0, 12),
       mode=st.sampled_from(["uniform", "skew", "hot_expert", "cold_group", "one_group"]),
       masked=st.booleans(), align=st.sampled_from([1, 4]), seed=st.integers(0, 2**31 - 1))
def test_routing_invariants_and_destinations(world_size, local, top_k, tokens, mode, masked, align, seed):
    idxs = routing(world_size, local, top_k, tokens, mode, masked, seed)
    num_experts = world_size * local
    counts = torch.stack([expert_counts(idx, num_experts) for idx in idxs])
    plan = balance.plan_balance(counts)
    check_plan(plan, counts.sum(0), world_size)
    rows_per_rank = tokens * min(top_k, num_experts)
    if not masked:
        assert plan.alloc_WE.sum(1).tolist() == [rows_per_rank] * world_size  # exactly S * K
    assert int(plan.targets_W.max()) <= rows_per_rank
    check_destinations(plan, idxs, counts, rows_per_rank, align)


def test_no_host_reads():
    """Plan and destinations run on meta tensors, which refuse any read back to the host."""
    plan = balance.plan_balance(C.to("meta"), check=False)
    dst = plan.destinations(IDX2.to("meta"), 2, C.to("meta"))
    offsets = balance.segment_offsets(plan.tokens_per_segment_WG, 4)
    assert plan.alloc_WE.shape == (3, 6) and dst.row.shape == (4, 2) and offsets.shape == (3, 5)


def test_bad_input():
    with pytest.raises(TypeError, match="integer"):
        balance.plan_balance(C.float())
    with pytest.raises(ValueError, match="multiple of world_size"):
        balance.plan_balance(torch.ones(5, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="world_size"):
        balance.plan_balance(torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="world_size must be counts.shape"):
        balance.plan_balance(C, 2)
    with pytest.raises(ValueError, match=">= 0"):
        balance.plan_balance(torch.tensor([1, -1]), 1)
    with pytest.raises(ValueError, match="align"):
        balance.segment_offsets(torch.zeros(1, 2, dtype=torch.int64), 0)
    with pytest.raises(TypeError, match="align"):
        balance.max_rows_per_rank(8, 2, 1.5)
    with pytest.raises(ValueError, match="multiple of W"):
        balance.segment_layout(torch.zeros(2, 3, dtype=torch.int64))
    two_groups = torch.tensor([[1, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="rank 0 computes experts of 2 remote groups"):
        balance.segment_layout(two_groups)
