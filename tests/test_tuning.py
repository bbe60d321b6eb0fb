"""Dispatch cost model: hand-worked numbers, the paper's trends, calibration, the bucket cache, errors."""

import itertools
import json
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from ubep.topology import cm384, flat
from ubep.tuning import (
    CM384_AIVS,
    H200_SMS,
    CostParams,
    DispatchShape,
    Sample,
    SplitCache,
    best_count,
    best_split,
    bsp_time,
    calibrate,
    cm384_ascend,
    count_group_ns,
    h200,
    per_copy_ns,
    predict,
    reorder_tail_ns,
    token_group_ns,
    traffic,
)

ROW_BYTES = 7168 * 2  # one bf16 row of hidden 7168


def shape(tokens, experts, topk=8, row=ROW_BYTES):
    return DispatchShape(tokens=tokens, experts=experts, topk=topk, bytes_per_token=row)


# ---- parameters --------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", [cm384_ascend, h200])
def test_presets_round_trip_through_json(preset):
    params = preset()
    assert CostParams.from_json(params.to_json()) == params


def test_from_json_names_missing_and_unknown_keys():
    text = cm384_ascend().to_json().replace('"alpha_ns"', '"alfa_ns"')
    with pytest.raises(ValueError, match=r"missing \['alpha_ns'\], unknown \['alfa_ns'\]"):
        CostParams.from_json(text)
    with pytest.raises(TypeError, match="JSON object"):
        CostParams.from_json("[1, 2]")


@pytest.mark.parametrize(("field", "value", "error", "words"), [
    ("alpha_ns", -1.0, ValueError, "alpha_ns must be >= 0"),
    ("beta_ns", float("nan"), ValueError, "beta_ns must be finite"),
    ("b_token_ns", "1000", TypeError, "b_token_ns must be a number"),
    ("max_token_workers", 0, ValueError, "max_token_workers must be >= 1"),
    ("max_token_workers", 24.0, TypeError, "max_token_workers must be an int"),
    ("max_token_workers", True, TypeError, "max_token_workers must be a number"),
    ("link_efficiency", 0.0, ValueError, "link_efficiency must be > 0"),
    ("reorder_gbps", -30.0, ValueError, "reorder_gbps must be > 0"),
    ("name", 7, TypeError, "name must be a str"),
])
def test_bad_param_is_named(field, value, error, words):
    with pytest.raises(error, match=words):
        replace(cm384_ascend(), **{field: value})


# ---- hand-worked model numbers -----------------------------------------------------------------

def test_traffic_ep2_h200():
    # 128 of 256 experts per rank: a top-8 token misses a rank with prob C(128,8)/C(256,8).
    tr = traffic(shape(128, 256), flat(2))
    assert tr.copies_per_token == 2 * (1 - Fraction(math.comb(128, 8), math.comb(256, 8)))
    assert float(tr.copies_per_token) == pytest.approx(1.99302, abs=1e-5)
    assert tr.ns_per_byte == pytest.approx((1 / 4000 + 1 / 394) / 2)
    assert tr.latency_ns == 1000.0


def test_traffic_cm384_one_expert_per_die():
    tr = traffic(shape(64, 256), cm384(256))
    assert tr.copies_per_token == 8  # exactly K: every expert on its own die
    # From die 0: its sibling die (784 GB/s), 14 one-hop and 240 two-hop dies (392 GB/s), itself.
    assert tr.ns_per_byte == pytest.approx((2 / 784 + 254 / 392) / 256)
    assert tr.latency_ns == 1700.0
    alone = traffic(shape(8, 4, topk=2), flat(1))
    assert (alone.copies_per_token, alone.latency_ns) == (1, 0.0)


def test_group_times_worked_example():
    p, s = cm384_ascend(), shape(64, 256)
    tr = traffic(s, cm384(256))
    # 500 + 1700 + 175 * ceil(256/12) + 70 * 256 * ceil(1/12)
    assert count_group_ns(s, 12, tr, p) == 500 + 1700 + 175 * 22 + 70 * 256
    assert count_group_ns(s, 12, tr, p) == 23970
    one_pass = replace(p, beta_ns=0.0, cumsum_ns_per_source=0.0, pair_ns=27.0, chain_ns=100.0)
    big = shape(4096, 256)  # 32768 pairs over 4 workers, then 4 links of the chain
    assert count_group_ns(big, 4, tr, one_pass) == 500 + 1700 + 27 * 8192 + 100 * 4
    per_copy = per_copy_ns(s, tr, p)
    assert per_copy == pytest.approx(100 + 14336 * 24 * (2 / 784 + 254 / 392) / 256)
    assert per_copy == pytest.approx(974.2857, abs=1e-3)
    # 512 copies; 36 token workers act as 24 (saturated): 22 copies each.
    assert token_group_ns(s, 36, tr, p) == pytest.approx(1000 + 1700 + 22 * per_copy)
    assert token_group_ns(s, 12, tr, p) == pytest.approx(1000 + 1700 + 43 * per_copy)
    assert reorder_tail_ns(s, 48, p) == pytest.approx(11 * 14336 / 30)


def test_token_workers_past_saturation_do_not_help():
    p, s = cm384_ascend(), shape(128, 128)
    tr = traffic(s, cm384(128))
    at_24 = token_group_ns(s, 24, tr, p)
    assert token_group_ns(s, 47, tr, p) == at_24
    assert token_group_ns(s, 23, tr, p) > at_24
    assert token_group_ns(s, 12, tr, p) > token_group_ns(s, 23, tr, p)


def test_best_split_worked_example():
    p, s = cm384_ascend(), shape(64, 256)
    split = best_split(s, CM384_AIVS, cm384(256), p)
    tr = traffic(s, cm384(256))
    # T_count(11) = 24320 > T_token = 24134.3 >= T_count(12) = 23970.
    assert (split.n_count, split.n_token) == (12, 36)
    assert split.token_ns == pytest.approx(24134.29, abs=0.01)
    assert count_group_ns(s, 11, tr, p) == 24320 > split.token_ns
    assert split.total_ns == pytest.approx(24134.29 + 5256.53, abs=0.01)
    # Appendix 9's closed form, (beta / alpha) * n * E / (K * T) with alpha per top-k slot.
    assert split.closed_form_n_count == pytest.approx(175 / 974.2857 * 48 * 256 / (8 * 64), rel=1e-6)


def test_best_split_is_the_exact_minimum():
    p = cm384_ascend()
    for w, t in itertools.product((64, 256), (8, 32, 128)):
        s, topo = shape(t, w), cm384(w)
        split, tr = best_split(s, CM384_AIVS, topo, p), traffic(s, topo)
        totals = [max(count_group_ns(s, c, tr, p), token_group_ns(s, CM384_AIVS - c, tr, p))
                  for c in range(1, CM384_AIVS)]
        assert max(split.count_ns, split.token_ns) == min(totals)
        assert split.n_count == 1 + totals.index(min(totals))  # ties go to fewer count workers
        assert best_split(s, CM384_AIVS, tr, p) == split  # a hop mix works as well as a topology


def test_best_count_worked_example():
    """Without a budget to split, the count programs alone: ``pair_ns * ceil(T * K / n) +
    chain_ns * n`` is least at 99 programs of 4096 tokens (331 pairs each), 50 of 1024."""
    p, topo = h200(), flat(1)
    assert p.beta_ns == p.cumsum_ns_per_source == 0  # the pair and chain terms alone depend on n
    assert [best_count(shape(t, 256), 256, topo, p) for t in (1024, 4096)] == [50, 99]
    s, tr = shape(4096, 256), traffic(shape(4096, 256), topo)
    assert (count_group_ns(s, 99, tr, p) - count_group_ns(s, 1, tr, p)
            == pytest.approx(32.4 * 331 + 106 * 99 - (32.4 * 32768 + 106)))
    assert best_count(s, 64, topo, p) == 64  # the cap binds below the optimum
    for w, t in itertools.product((64, 256), (8, 128)):  # ties go to fewer, as in best_split
        s, topo = shape(t, w), cm384(w)
        times = [count_group_ns(s, c, traffic(s, topo), cm384_ascend()) for c in range(1, 49)]
        assert best_count(s, 48, topo, cm384_ascend()) == 1 + times.index(min(times))


def test_bsp_worked_example_and_decomposition_wins():
    p, s = cm384_ascend(), shape(64, 128)
    bsp = bsp_time(s, CM384_AIVS, cm384(128), p)
    per_copy = 100 + 14336 * 24 * (2 / 784 + 126 / 392) / 128
    assert bsp.send_ns == pytest.approx(1000 + 1700 + 22 * per_copy)
    assert bsp.count_ns == 500 + 1700 + 175 * 3 + 70 * 128
    assert bsp.barriers_ns == 7000
    assert bsp.total_ns == pytest.approx(48000.39, abs=0.01)
    assert bsp.barriers_ns / bsp.total_ns == pytest.approx(0.15, abs=0.01)  # the paper's SyncAll share
    for w, t in itertools.product((64, 128, 256), (8, 16, 32, 64, 128)):
        s = shape(t, w)
        assert best_split(s, CM384_AIVS, cm384(w), p).total_ns < bsp_time(s, CM384_AIVS, cm384(w), p).total_ns


def test_zero_tokens():
    split = best_split(shape(0, 256), CM384_AIVS, cm384(256), cm384_ascend())
    assert split.closed_form_n_count == math.inf
    assert split.tail_ns == 0 and split.total_ns == split.count_ns


# ---- the paper's reported allocations and trends (UBEP §5.2, appendix 11.3) --------------------

def test_reproduces_the_allocations_the_paper_reports():
    p = cm384_ascend()
    # 256 ranks, batch 64: "we must allocate 12 compute cores"; 128 ranks, batch 128: "a single core".
    assert best_split(shape(64, 256), CM384_AIVS, cm384(256), p).n_count == 12
    assert best_split(shape(128, 128), CM384_AIVS, cm384(128), p).n_count == 1


def test_trends_of_appendix_11_3():
    p, batches = cm384_ascend(), (8, 16, 32, 64, 128)
    best = {(w, t): best_split(shape(t, w), CM384_AIVS, cm384(w), p).n_count
            for w in (64, 128, 256) for t in batches}  # one expert per die
    for w in (64, 128, 256):
        by_batch = [best[w, t] for t in batches]
        assert by_batch == sorted(by_batch, reverse=True) and by_batch[0] > by_batch[-1]
    for t in batches:
        by_ranks = [best[w, t] for w in (64, 128, 256)]
        assert by_ranks == sorted(by_ranks)
    assert best[256, 64] > best[64, 64]
    for t in batches:  # more experts on the same 64 ranks: more count work, more count workers
        assert best_split(shape(t, 256), CM384_AIVS, cm384(64), p).n_count >= best[64, t]


def test_h200_ep2():
    p = h200()
    small = best_split(shape(128, 256), H200_SMS, flat(2), p)
    large = best_split(shape(4096, 256), H200_SMS, flat(2), p)
    # the cuda count group splits the pairs in one pass: a few programs, more with more tokens
    assert (small.n_count, large.n_count) == (3, 7)
    assert large.count_ns < large.token_ns < 1.2 * large.count_ns


# ---- calibration -------------------------------------------------------------------------------

def synthetic_samples(truth, topo, noise=None):
    cases = [("count", t, e, c, 48)
             for t, e, c in itertools.product((16, 64), (64, 128, 256), (1, 3, 8, 20))]
    cases += [("token", t, 64, 48 - n, 48) for t, n in itertools.product((8, 64, 256), (6, 16, 30, 40))]
    cases += [("reorder", t, 64, 8, 48) for t in (8, 64, 256)]
    out, gen = [], torch.Generator().manual_seed(0)
    for i, (group, t, e, n_count, n) in enumerate(cases):
        s = shape(t, e, row=(7168, 14336)[i % 2])
        probe = Sample(shape=s, n_workers=n, n_count=n_count, group=group, time_ns=0.0)
        time_ns = predict(probe, traffic(s, topo), truth)
        if noise is not None:
            time_ns *= 1 + noise * float(torch.randn((), generator=gen))
        out.append(replace(probe, time_ns=time_ns))
    return out


@pytest.mark.parametrize("pair_ns", [0.0, 1.5])
def test_calibration_recovers_known_parameters(pair_ns):
    truth, topo = replace(cm384_ascend(), pair_ns=pair_ns), cm384(64)
    fit = calibrate(synthetic_samples(truth, topo), topo, base=h200())
    assert fit.params.max_token_workers == truth.max_token_workers
    assert fit.params.pair_ns == pytest.approx(pair_ns, abs=1e-9)
    for name in ("alpha_ns", "beta_ns", "b_count_ns", "b_token_ns", "cumsum_ns_per_source",
                 "link_efficiency", "reorder_gbps"):
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fit.params.barrier_ns == h200().barrier_ns  # not sampled: kept from base
    assert fit.rms_error_ns < 1e-6 and fit.max_rel_error < 1e-9


def test_calibration_of_a_one_pass_count_group():
    truth = replace(h200(), beta_ns=0.0, cumsum_ns_per_source=0.0, pair_ns=30.0, chain_ns=90.0,
                    b_count_ns=400.0)
    topo = flat(2)
    samples = [Sample(shape=shape(t, 256), n_workers=132, n_count=c, group="count", time_ns=0.0)
               for t, c in itertools.product((128, 512, 4096), (2, 8, 32, 128))]
    samples = [replace(s, time_ns=predict(s, traffic(s.shape, topo), truth)) for s in samples]
    fit = calibrate(samples, topo, replace(truth, pair_ns=1.0, chain_ns=1.0, b_count_ns=1.0),
                    count_terms=("b_count_ns", "pair_ns", "chain_ns"))
    for name in ("b_count_ns", "pair_ns", "chain_ns"):
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fit.params.beta_ns == 0.0 and fit.params.cumsum_ns_per_source == 0.0  # kept
    with pytest.raises(ValueError, match="count_terms must be a non-empty subset"):
        calibrate(samples, topo, truth, count_terms=("pairs_ns",))


def test_calibration_with_one_percent_noise():
    truth, topo = cm384_ascend(), cm384(64)
    fit = calibrate(synthetic_samples(truth, topo, noise=0.01), topo, base=h200())
    assert fit.params.max_token_workers == truth.max_token_workers
    for name in ("beta_ns", "cumsum_ns_per_source", "link_efficiency", "reorder_gbps"):
        assert getattr(fit.params, name) == pytest.approx(getattr(truth, name), rel=0.1), name
    assert fit.max_rel_error < 0.05


def test_calibration_rejects_undetermined_samples():
    topo, p = cm384(64), cm384_ascend()
    same = [s for s in synthetic_samples(p, topo) if s.group == "count"][:1] * 5
    with pytest.raises(ValueError, match="do not determine b_count_ns, beta_ns"):
        calibrate(same, topo, p)
    with pytest.raises(ValueError, match="samples must not be empty"):
        calibrate([], topo, p)
    with pytest.raises(TypeError, match="base must be a CostParams"):
        calibrate(synthetic_samples(p, topo), topo, base={})


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"group": "total"}, ValueError, "group must be one of"),
    ({"n_count": 48}, ValueError, r"n_count must be < n_workers \(48\)"),
    ({"time_ns": -1.0}, ValueError, "time_ns must be a finite number"),
    ({"shape": (8, 64, 8, 14336)}, TypeError, "shape must be a DispatchShape"),
])
def test_bad_sample_is_named(kwargs, error, words):
    good = {"shape": shape(8, 64), "n_workers": 48, "n_count": 4, "group": "count", "time_ns": 1.0}
    with pytest.raises(error, match=words):
        Sample(**{**good, **kwargs})


# ---- bucket cache ------------------------------------------------------------------------------

def test_cache_consults_the_tuner_only_on_a_new_bucket():
    topo, p = flat(2), h200()
    cache = SplitCache(topo, p)
    for tokens in (100, 4096, 3000):  # bucket 1: one miss, tuned at 4096
        cache.split(shape(tokens, 256), H200_SMS)
    assert (cache.hits, cache.misses) == (2, 1)
    assert cache.split(shape(1, 256), H200_SMS) == best_split(shape(4096, 256), H200_SMS, topo, p)
    cache.split(shape(4097, 256), H200_SMS)  # bucket 2
    cache.split(shape(100, 256), 64)  # other worker count
    cache.split(shape(100, 256, row=7168), H200_SMS)  # other row size
    assert (cache.hits, cache.misses) == (3, 4)
    assert [cache.bucket(t) for t in (0, 1, 4096, 4097)] == [0, 1, 1, 2]
    assert cache.count(shape(1000, 256), 256) == best_count(shape(4096, 256), 256, topo, p)
    assert cache.count(shape(4096, 256), 256) == 99 and (cache.hits, cache.misses) == (4, 5)


def test_small_buckets_for_decode():
    cache = SplitCache(cm384(128), cm384_ascend(), bucket_tokens=8)
    got = [cache.split(shape(t, 128), CM384_AIVS).n_count for t in (8, 64, 60, 128)]
    assert got[1] == got[2] and (cache.hits, cache.misses) == (1, 3)
    assert got[0] > got[-1]


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: shape(-1, 8), ValueError, "tokens must be >= 0"),
    (lambda: shape(8, 8, topk=9), ValueError, r"topk must be <= experts \(8\), got 9"),
    (lambda: shape(8, 8.0), TypeError, "experts must be an int"),
    (lambda: shape(8, 8, row=0), ValueError, "bytes_per_token must be >= 1"),
    (lambda: traffic(shape(8, 100), cm384(64)), ValueError, r"shape.experts \(100\) must be a multiple"),
    (lambda: traffic(shape(8, 64), "cm384"), TypeError, "topology must be a Topology"),
    (lambda: best_split(shape(8, 64), 1, cm384(64), cm384_ascend()), ValueError, "n_workers must be >= 2"),
    (lambda: best_split(shape(8, 64), 48, None, cm384_ascend()), TypeError, "fabric must be a Topology"),
    (lambda: best_split(shape(8, 64), 48, traffic(shape(8, 128), cm384(64)), cm384_ascend()),
     ValueError, "fabric was built for experts=128"),
    (lambda: bsp_time((8, 64), 48, cm384(64), cm384_ascend()), TypeError, "shape must be a DispatchShape"),
    (lambda: bsp_time(shape(8, 64), 48, cm384(64), {}), TypeError, "params must be a CostParams"),
    (lambda: token_group_ns(shape(8, 64), 0, traffic(shape(8, 64), cm384(64)), cm384_ascend()),
     ValueError, "n_token must be >= 1"),
    (lambda: SplitCache(flat(2), h200(), bucket_tokens=0), ValueError, "bucket_tokens must be >= 1"),
    (lambda: SplitCache(flat(2), {}), TypeError, "params must be a CostParams"),
    (lambda: SplitCache(flat(2), h200()).split(shape(8, 64), 1), ValueError, "n_workers must be >= 2"),
    (lambda: SplitCache(flat(2), h200()).count(shape(8, 64), 0), ValueError, "n_max must be >= 1"),
    (lambda: best_count(shape(8, 64), 8, flat(2), None), TypeError, "params must be a CostParams"),
])
def test_bad_arguments_are_named(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_split_vectors_match_a_fresh_build():
    """tests/vectors/split.json (replayed by the C++ host tiling's ctest) is what best_split says now;
    rewrite it with ``python -m ubep.tuning.vectors --write tests/vectors/split.json``."""
    from ubep.tuning import vectors

    stored = Path(__file__).parent / "vectors" / "split.json"
    assert stored.read_text() == vectors.render()
    cases = json.loads(stored.read_text())["cases"]
    assert len(cases) >= 100 and {c["n_workers"] for c in cases} == set(vectors.WORKERS)
    paper = {(c["world"], c["tokens"]): c["n_count"] for c in cases[:2]}
    assert paper == {(256, 64): 12, (128, 128): 1}
