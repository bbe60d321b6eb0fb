"""ubep.scheduler: hand-worked examples (the docstrings' running examples), balance properties on
random and skewed counts, quaternary against binary search, and the shared test vectors."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ubep import scheduler as sch
from ubep.scheduler import vectors
from ubep.topology import cm384, flat

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
    assert len(cases) >= 30
