"""ubep.scheduler: hand-worked examples (the docstrings' running examples), balance properties on
random and skewed counts and on routings of every topology preset, objective (1) against
load_balanced, quaternary against binary search, and the shared test vectors."""

import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import load_benchmark
from ubep import scheduler as sch
from ubep.scheduler import vectors
from ubep.topology import cm384, detect_nvidia, flat, nvl72

# The running example of ubep/scheduler/mapping.py: M = 7, V = [4, 2, 1], bound [2, 1, 1].
COUNTS = torch.tensor([3, 1, 2, 0, 1, 0])
HOPS = torch.tensor([0, 0, 1, 1, 2, 2])
FAST = settings(max_examples=60, deadline=None)


def t(values):
    return torch.tensor(values, dtype=torch.int64)


def pieces(a: sch.Assignment) -> list[list[tuple[int, int, int]]]:
    """Per worker, its ``(dest, start, length)`` pieces."""
    rows = list(zip(a.dest.tolist(), a.start.tolist(), a.length.tolist(), strict=True))
    ptr = a.worker_ptr.tolist()
    return [rows[ptr[j]:ptr[j + 1]] for j in range(a.num_workers)]


def assert_exact_cover(a: sch.Assignment, counts_D: torch.Tensor) -> None:
    """Every token of every destination is sent once: the pieces' global token ids (destination
    base + index) are a permutation of ``0..M-1``."""
    base = torch.cumsum(counts_D, 0) - counts_D
    piece = torch.repeat_interleave(torch.arange(a.dest.numel()), a.length)
    within = torch.arange(piece.numel()) - (torch.cumsum(a.length, 0) - a.length)[piece]
    ids = base[a.dest[piece]] + a.start[piece] + within
    assert (a.start + a.length <= counts_D[a.dest]).all()
    assert torch.equal(ids.sort().values, torch.arange(int(counts_D.sum())))


def log_steps(size: int, base: int) -> int:
    """Smallest ``s`` with ``base ** s >= size``."""
    s = 0
    while base**s < size:
        s += 1
    return s


# Search ------------------------------------------------------------------------------------------

def test_search_docstring_example():
    cumsum = t([2, 2, 5, 6])
    targets = t([0, 1, 2, 4, 5, 6])
    for search in (sch.quaternary_search, sch.binary_search):
        found = search(cumsum, targets)
        assert found.position.tolist() == [0, 0, 2, 2, 3, 4]
        assert found.offset.tolist() == [0, 1, 0, 2, 0, 0]
    assert sch.quaternary_search(cumsum, t([4, 6])).steps.tolist() == [1, 1]
    assert sch.binary_search(cumsum, t([4])).steps.tolist() == [2]


def test_search_edges():
    empty = sch.quaternary_search(t([]), t([0, 0]))
    assert empty.position.tolist() == [0, 0] and empty.steps.tolist() == [0, 0]
    zeros = sch.binary_search(t([0, 0, 0]), t([0]))
    assert zeros.position.tolist() == [3] and zeros.offset.tolist() == [0]
    assert sch.quaternary_search(t([5]), t([])).position.numel() == 0


def test_search_paper_step_count():
    """The paper's "4-5 steps for typical expert counts": 256 experts need at most 5."""
    counts = torch.arange(256) % 7
    cumsum = torch.cumsum(counts, 0)
    found = sch.quaternary_search(cumsum, torch.arange(int(cumsum[-1]) + 1))
    assert int(found.steps.max()) == 5 and int(sch.binary_search(cumsum, t([0])).steps) <= 9


@pytest.mark.parametrize("cumsum, targets, error", [
    (t([1, 3]).float(), t([0]), TypeError),
    (t([1, 3]), t([0]).int(), TypeError),
    (t([[1, 3]]), t([0]), ValueError),
    (t([3, 1]), t([0]), ValueError),
    (t([-1, 3]), t([0]), ValueError),
    (t([1, 3]), t([4]), ValueError),
    (t([1, 3]), t([-1]), ValueError),
])
def test_search_bad_arguments(cumsum, targets, error):
    with pytest.raises(error, match="cumsum_D|targets_Q"):
        sch.quaternary_search(cumsum, targets)


@FAST
@given(st.lists(st.integers(0, 6), max_size=70))
def test_quaternary_agrees_with_binary_and_searchsorted(counts):
    counts_D = t(counts)
    cumsum = torch.cumsum(counts_D, 0)
    targets = torch.arange(int(counts_D.sum()) + 1)
    q, b = sch.quaternary_search(cumsum, targets), sch.binary_search(cumsum, targets)
    assert torch.equal(q.position, b.position) and torch.equal(q.offset, b.offset)
    assert torch.equal(q.position, torch.searchsorted(cumsum, targets, right=True))
    inside = q.position < len(counts)
    assert (q.offset[inside] < counts_D[q.position[inside]]).all()
    assert (q.offset[~inside] == 0).all()
    assert int(q.steps.max()) <= log_steps(len(counts) + 1, 4)
    assert int(b.steps.max()) <= log_steps(len(counts) + 1, 2)


# Orders, slices, bound ---------------------------------------------------------------------------

def test_transpose_order_examples():
    assert sch.transpose_order(10, 4).tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]
    assert sch.transpose_order(6, 3).tolist() == [0, 3, 1, 4, 2, 5]
    assert sch.transpose_order(6, 2).tolist() == [0, 2, 4, 1, 3, 5]
    assert sch.transpose_order(3, 5).tolist() == [0, 1, 2]
    assert sch.transpose_order(0, 3).tolist() == []


def test_slice_bounds_and_bound_examples():
    assert sch.slice_bounds(10, 4).tolist() == [0, 3, 6, 8, 10]
    assert sch.slice_bounds(0, 3).tolist() == [0, 0, 0, 0]
    assert sch.slice_bounds(2, 4).tolist() == [0, 1, 2, 2, 2]
    assert sch.per_hop_bound(COUNTS, HOPS, 3, 2).tolist() == [2, 1, 1]


@FAST
@given(st.integers(0, 200), st.integers(1, 50))
def test_transpose_order_is_a_permutation_and_slices_differ_by_one(num, n):
    assert torch.equal(sch.transpose_order(num, n).sort().values, torch.arange(num))
    sizes = sch.slice_bounds(num, n).diff()
    assert int(sizes.sum()) == num and int(sizes.max() - sizes.min()) <= 1
    assert torch.equal(sizes, num // n + (torch.arange(n) < num % n).long())  # larger ones first


# Variants: the running example -------------------------------------------------------------------

def test_expert_contiguous_running_example():
    a = sch.expert_contiguous(COUNTS, 2)
    assert pieces(a) == [[(0, 0, 3), (1, 0, 1), (2, 0, 2)], [(4, 0, 1)]]
    assert a.worker_totals().tolist() == [6, 1]


def test_load_balanced_running_example():
    a = sch.load_balanced(COUNTS, 2)
    assert pieces(a) == [[(0, 0, 3), (1, 0, 1)], [(2, 0, 2), (4, 0, 1)]]
    assert a.worker_class_counts(HOPS, 3).tolist() == [[4, 0, 0], [0, 2, 1]]


def test_hop_aware_running_example():
    a = sch.hop_aware(COUNTS, 2)
    assert a.worker_ptr.tolist() == [0, 2, 5]
    assert pieces(a) == [[(0, 0, 3), (2, 0, 1)], [(2, 1, 1), (4, 0, 1), (1, 0, 1)]]
    assert a.piece_worker().tolist() == [0, 0, 1, 1, 1]
    assert a.worker_totals().tolist() == [4, 3]
    assert a.worker_class_counts(HOPS, 3).tolist() == [[3, 1, 0], [1, 1, 1]]
    starts = sch.quaternary_search(torch.cumsum(COUNTS[sch.transpose_order(6, 2)], 0), t([0, 4, 7]))
    assert starts.position.tolist() == [0, 1, 6] and starts.offset.tolist() == [0, 1, 0]


def test_hop_balanced_running_example():
    a = sch.hop_balanced(COUNTS, HOPS, 2)
    assert pieces(a) == [[(0, 0, 2), (2, 0, 1), (4, 0, 1)], [(0, 2, 1), (1, 0, 1), (2, 1, 1)]]
    assert a.worker_class_counts(HOPS, 3).tolist() == [[2, 1, 1], [2, 1, 0]]


def test_hop_balanced_deals_the_farthest_class_second():
    """mapping.hop_balanced's example: the spares wrap round, so workers 0 and 1 hold two; they get
    classes 0 and 1, and the one class-2 token goes to a worker with one token. Dealt 0, 1, 2,
    class 2 would land on worker 1 beside a class-0 token: worse than load_balanced on
    objective (1), where the order 0, 2, 1 ties with it."""
    counts, hops = t([2, 3, 1]), t([0, 1, 2])
    v = sch.hop_balanced(counts, hops, 4).worker_class_counts(hops, 3)
    assert v.tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0]]
    topo = cm384(4, dies_per_npu=1, npus_per_board=2)  # l = [2, 4, 4] ns at 392 B and n = 4
    objective = {name: float(sch.worker_latency_ns(m, topo, 392).max()) for name, m in [
        ("ours", v), ("ascending", t([[1, 1, 0], [1, 0, 1], [0, 1, 0], [0, 1, 0]])),
        ("load_balanced", sch.load_balanced(counts, 4).worker_class_counts(hops, 3))]}
    assert objective == {"ours": 1704.0, "ascending": 1706.0, "load_balanced": 1704.0}


def test_hop_aware_counterexample_hot_destination():
    """Documented in mapping.py: the transposition cannot split a hot destination by class."""
    counts, hops = t([1, 1, 1, 5]), t([0, 0, 1, 1])
    bound = sch.per_hop_bound(counts, hops, 2, 2).tolist()
    assert bound == [1, 3]
    assert sch.hop_aware(counts, 2).worker_class_counts(hops, 2).tolist() == [[2, 2], [0, 4]]
    assert sch.hop_balanced(counts, hops, 2).worker_class_counts(hops, 2).tolist() == [[1, 3], [1, 3]]


def test_transpose_strides_where_row_reading_would_not():
    """mapping.transpose_order's second example: one token per destination, D = 6, n = 3."""
    counts, hops = torch.ones(6, dtype=torch.int64), t([0, 0, 0, 1, 1, 1])
    assert sch.hop_aware(counts, 3).worker_class_counts(hops, 2).tolist() == [[1, 1]] * 3


def test_variants_by_name_and_empty_inputs():
    for variant in sch.VARIANTS:
        a = sch.schedule(variant, COUNTS, HOPS, 2)
        assert a.worker_totals().sum() == 7
        empty = sch.schedule(variant, t([]), t([]), 3)
        assert empty.worker_ptr.tolist() == [0, 0, 0, 0] and empty.worker_totals().tolist() == [0] * 3
        idle = sch.schedule(variant, t([0, 0]), t([0, 1]), 2)
        assert idle.dest.numel() == 0
    with pytest.raises(ValueError, match="variant"):
        sch.schedule("round_robin", COUNTS, HOPS, 2)


@pytest.mark.parametrize("call, error, name", [
    (lambda: sch.load_balanced(COUNTS, 0), ValueError, "num_workers"),
    (lambda: sch.hop_aware(COUNTS, True), ValueError, "num_workers"),
    (lambda: sch.expert_contiguous(COUNTS.float(), 2), TypeError, "counts_D"),
    (lambda: sch.load_balanced(t([1, -1]), 2), ValueError, "counts_D"),
    (lambda: sch.hop_balanced(COUNTS, HOPS[:3], 2), ValueError, "hop_D"),
    (lambda: sch.hop_balanced(COUNTS, -HOPS, 2), ValueError, "hop_D"),
    (lambda: sch.per_hop_bound(COUNTS, HOPS, 2, 2), ValueError, "hop_D"),
    (lambda: sch.transpose_order(-1, 2), ValueError, "num_dests"),
    (lambda: sch.slice_bounds(3.0, 2), ValueError, "total"),
    (lambda: sch.hop_aware(COUNTS, 2).worker_class_counts(HOPS, 2), ValueError, "hop_D"),
    (lambda: sch.hop_aware(COUNTS, 2).worker_class_counts(HOPS[:2], 3), ValueError, "hop_D"),
    (lambda: sch.Assignment(t([0, 2]), t([0]), t([0]), t([1])), ValueError, "worker_ptr"),
    (lambda: sch.Assignment(t([0, 1]), t([0]), t([0]), t([0])), ValueError, "length"),
    (lambda: sch.Assignment(t([0, 1]), t([0]), t([0, 1]), t([1])), ValueError, "start"),
    (lambda: sch.worker_latency_ns(t([[1, 2, 3]]), flat(2), 64), ValueError, "class_counts_NC"),
    (lambda: sch.worker_latency_ns(t([[1, 2]]), flat(2), 0), ValueError, "token_bytes"),
])
def test_bad_arguments_name_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


# Variants: properties ----------------------------------------------------------------------------

@st.composite
def skewed(draw):
    """Small counts with zeros, a few hot destinations, classes as contiguous runs or shuffled."""
    counts = draw(st.lists(st.integers(0, 4), max_size=40))
    for i in draw(st.lists(st.integers(0, 39), max_size=3)):
        if i < len(counts):
            counts[i] += draw(st.integers(10, 300))
    num_classes = draw(st.integers(1, 4))
    hops = draw(st.lists(st.integers(0, num_classes - 1), min_size=len(counts), max_size=len(counts)))
    if draw(st.booleans()):
        hops.sort()
    return t(counts), t(hops), num_classes, draw(st.integers(1, 12))


@FAST
@given(skewed())
def test_every_variant_covers_every_token_once(case):
    counts, hops, _, n = case
    for variant in sch.VARIANTS:
        a = sch.schedule(variant, counts, hops, n)
        assert a.num_workers == n
        assert_exact_cover(a, counts)


@FAST
@given(skewed())
def test_token_balanced_variants_match_slice_sizes(case):
    """load_balanced, hop_aware and hop_balanced all give worker j exactly M // n + (j < M % n)."""
    counts, hops, _, n = case
    sizes = sch.slice_bounds(int(counts.sum()), n).diff()
    for variant in ("load_balanced", "hop_aware", "hop_balanced"):
        assert torch.equal(sch.schedule(variant, counts, hops, n).worker_totals(), sizes)


@FAST
@given(skewed())
def test_hop_balanced_meets_the_per_hop_bound(case):
    counts, hops, num_classes, n = case
    v = sch.hop_balanced(counts, hops, n).worker_class_counts(hops, num_classes)
    assert (v <= sch.per_hop_bound(counts, hops, num_classes, n)).all()


@FAST
@given(skewed())
def test_expert_contiguous_sends_whole_destination_rows(case):
    counts, _, _, n = case
    a = sch.expert_contiguous(counts, n)
    k = -(-len(counts) // n)
    assert (a.start == 0).all() and torch.equal(a.length, counts[a.dest])
    assert torch.equal(torch.div(a.dest, max(k, 1), rounding_mode="floor"), a.piece_worker())


@FAST
@given(st.lists(st.integers(0, 30), min_size=1, max_size=4), st.permutations(range(4)),
       st.integers(1, 16))
def test_hop_aware_meets_bound_with_one_token_per_destination(runs, labels, n):
    """What the transposition does guarantee: with one token per destination and each class one
    contiguous run, worker j sends destinations j, j + n, ..., so a run of b gives it at most
    ceil(b / n) of that class."""
    hops = torch.repeat_interleave(t(labels[:len(runs)]), t(runs))
    counts = torch.ones_like(hops)
    v = sch.hop_aware(counts, n).worker_class_counts(hops, 4)
    assert (v <= sch.per_hop_bound(counts, hops, 4, n)).all()


def test_hop_aware_exceeds_bound_under_skew_and_hop_balanced_does_not():
    """Paper-like scenario (64 ranks, 256 experts, top-8, 8 hot experts, rank 0 of a cm384 with
    16 ranks per board, 48 workers): the transposition leaves some worker far above the bound."""
    gen = torch.Generator().manual_seed(0)
    weights = torch.ones(256)
    weights[torch.randperm(256, generator=gen)[:8]] = 10.0
    topk = torch.multinomial(weights.expand(128, 256), 8, replacement=False, generator=gen)
    counts = torch.bincount(topk.reshape(-1), minlength=256)
    topo = cm384(64, dies_per_npu=1, npus_per_board=16)
    hops = topo.hops[0][torch.arange(256) // 4]
    bound = sch.per_hop_bound(counts, hops, 3, 48)
    excess = {v: int((sch.schedule(v, counts, hops, 48).worker_class_counts(hops, 3) - bound).max())
              for v in sch.VARIANTS}
    assert excess["hop_balanced"] <= 0 < excess["hop_aware"] <= excess["load_balanced"]
    assert excess["load_balanced"] < excess["expert_contiguous"]


@st.composite
def preset_routing(draw):
    """A topology preset at a random size, a source rank, and its routing: ``T`` tokens to ``K``
    distinct experts each (``L`` per rank, a few hot ones drawn more often), counted per expert or,
    as the Ascend kernels send, per destination rank (a token once per rank)."""
    kind = draw(st.sampled_from(["flat", "nvl72", "cm384", "cm384-768", "detect_nvidia"]))
    if kind == "flat":
        topo = flat(draw(st.integers(1, 16)))
    elif kind == "nvl72":
        topo = nvl72(draw(st.integers(1, 72)))
    elif kind == "cm384":
        topo = cm384(draw(st.integers(1, 768)), dies_per_npu=draw(st.sampled_from([1, 2])),
                     npus_per_board=draw(st.sampled_from([2, 8, 16])))
    else:
        topo = cm384() if kind == "cm384-768" else detect_nvidia()
    world, local = topo.world_size, draw(st.integers(1, 4))
    experts, tokens = world * local, draw(st.integers(0, 128))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    weights = torch.ones(experts)
    weights[torch.randperm(experts, generator=gen)[:draw(st.integers(0, 8))]] = 4.0
    topk = torch.multinomial(weights.expand(tokens, experts), draw(st.integers(1, min(8, experts))),
                             replacement=False, generator=gen)
    src = draw(st.integers(0, world - 1))
    if draw(st.booleans()):
        counts = torch.bincount(topk.reshape(-1), minlength=experts)
        hops = topo.hops[src][torch.arange(experts) // local]
    else:
        to_rank = torch.zeros(tokens, world, dtype=torch.bool)
        to_rank[torch.arange(tokens).unsqueeze(1), topk // local] = True
        counts, hops = to_rank.sum(0), topo.hops[src]
    n = draw(st.one_of(st.sampled_from([1, 24, 47, 48]), st.integers(1, 64)))
    return counts, hops, topo.num_classes, n


@settings(max_examples=80, deadline=None)
@given(preset_routing())
def test_default_mapper_meets_the_per_hop_bound_on_every_preset(case):
    """UBEP's mapper on random routings of flat, NVL72, CM384 and the detected topology: every
    worker within ``ceil(V[h] / n)`` of each class, totals within one, every token sent once."""
    counts, hops, num_classes, n = case
    a = sch.schedule(sch.DEFAULT_VARIANT, counts, hops, n)
    v = a.worker_class_counts(hops, num_classes)
    assert (v <= sch.per_hop_bound(counts, hops, num_classes, n)).all()
    assert torch.equal(a.worker_totals(), sch.slice_bounds(int(counts.sum()), n).diff())
    assert_exact_cover(a, counts)


@pytest.mark.parametrize("token_bytes", [512, 14336])
def test_default_mapper_is_no_worse_than_load_balanced_on_objective_1(token_bytes):
    """Every preset of benchmarks/mapper_balance.py, paper-like routings onto 48 workers: objective
    (1) of the slowest source rank under UBEP's mapper is at most load_balanced's in every
    workload, and so is its sum over source ranks (the full table: run the script)."""
    bench = load_benchmark("mapper_balance")
    for preset in bench.presets():
        scores = bench.measure(preset, variants=(sch.DEFAULT_VARIANT, "load_balanced"),
                               tokens=(8, 64), sources=4, token_bytes=token_bytes)
        ours, lb = scores[sch.DEFAULT_VARIANT], scores["load_balanced"]
        assert (ours.over_bound == 0).all(), preset.name
        for mine, theirs in zip(bench.slowest_rank_ns(ours), bench.slowest_rank_ns(lb), strict=True):
            assert mine <= theirs + 1e-6, preset.name
        assert sum(bench.per_routing(ours)) <= sum(bench.per_routing(lb)) + 1e-6, preset.name


def test_the_bound_can_cost_objective_1_on_one_routing():
    """Why the comparison with load_balanced is per preset: counts ``[2, 1]``, classes ``[0, 2]``,
    two workers. load_balanced sends the two class-0 tokens from one worker and the class-2 token
    from the other; the bound (one token of each class per worker) makes some worker send a
    class-0 and the class-2 token, whatever the assignment."""
    counts, hops = t([2, 1]), t([0, 2])
    topo = cm384(4, dies_per_npu=1, npus_per_board=2)
    bound = sch.per_hop_bound(counts, hops, 3, 2)
    lb = float(sch.worker_latency_ns(sch.load_balanced(counts, 2).worker_class_counts(hops, 3),
                                     topo, 392).max())
    assert lb == 2 + 1700.0
    within = [torch.stack([t(row), t([2, 0, 1]) - t(row)])
              for row in itertools.product(range(3), range(1), range(2))]
    within = [v for v in within if (v >= 0).all() and (v <= bound).all()]
    assert len(within) == 2
    assert all(float(sch.worker_latency_ns(v, topo, 392).max()) == 1 + 2 + 1700.0 for v in within)
    ours = sch.hop_balanced(counts, hops, 2).worker_class_counts(hops, 3)
    assert float(sch.worker_latency_ns(ours, topo, 392).max()) == 1 + 2 + 1700.0


# Latency estimate --------------------------------------------------------------------------------

def test_worker_latency_docstring_example():
    est = sch.worker_latency_ns(t([[0, 5], [0, 0]]), flat(2), 197)
    assert est.dtype == torch.float64 and est.tolist() == [1005.0, 0.0]


def test_worker_latency_counts_slowest_class_once():
    topo = cm384(4, dies_per_npu=1, npus_per_board=2)  # 784, 392, 392 GB/s; 150, 600, 1700 ns
    est = sch.worker_latency_ns(t([[1, 0, 0], [0, 1, 1]]), topo, 392)
    assert est.tolist() == [2 * 392 / 784 + 150, 2 * 2 + 1700]


# Shared vectors ----------------------------------------------------------------------------------

VECTORS = Path(__file__).parent / "vectors" / "scheduler.json"


def test_vectors_file_matches_a_fresh_generation():
    assert VECTORS.read_text() == vectors.render(), (
        "regenerate: python -m ubep.scheduler.vectors --write tests/vectors/scheduler.json")


def test_vectors_cover_the_documented_cases():
    cases = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]}
    ex = cases["running_example"]
    assert ex["slice_starts"] == {"position": [0, 1], "offset": [0, 1]}
    assert ex["variants"]["hop_aware"]["class_counts"] == [[3, 1, 0], [1, 1, 1]]
    wrap = cases["spares_wrap_farthest_dealt_second"]["variants"]["hop_balanced"]
    assert wrap["class_counts"] == [[1, 1, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0]]
    assert len(cases) >= 30
