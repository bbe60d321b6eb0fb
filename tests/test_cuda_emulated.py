"""The CUDA backend's own kernels and host code on the CPU (no GPU): W ranks emulated in one process
through Triton's interpreter (tests/cuda_emulation.py), bit for bit against the oracle.

Rows are fp32 or fp16 here: the interpreter's conversion to bf16 truncates where the GPU rounds to
nearest, so bf16 sums are left to the GPU tests (dispatch moves bits and is checked in bf16 too).
Skipped where Triton is not installed (CI has none); GPU machines run tests/test_cuda.py.
"""

import os

import pytest

from tests.cuda_emulation import (
    compact_dispatch_alone_case,
    emulated_backends,
    emulated_case,
    emulated_destroy_case,
    emulated_disagreement_case,
    emulated_receivers_change_case,
    emulated_sentinel_case,
)
from tests.workers import DTYPES, Case
from ubep.launch import run_ranks

pytest.importorskip("triton")

CASES = [
    Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync="tff"),
    Case(tokens=(4, 0, 6), hidden=40, num_experts=6, top_k=3, dtype="fp32", sync="sw", drop=0.25,
         seed=1),
    Case(tokens=(7, 7), hidden=16, num_experts=8, top_k=4, dtype="fp16", layout="padded",
         maxvio=1.0, seed=2, sync="tff"),
    Case(tokens=(6, 2), hidden=136, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="sw", seed=3),
    Case(tokens=(4, 0, 6), hidden=40, num_experts=6, top_k=3, dtype="fp32", sync="dc", drop=0.25,
         seed=1),
    Case(tokens=(7, 7), hidden=16, num_experts=8, top_k=4, dtype="fp16", layout="padded",
         maxvio=1.0, seed=2, sync="dc"),
    Case(tokens=(6, 2), hidden=136, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="dc", drop=0.25, seed=3),
    # dc batches that take a verifier several steps (steps of 2 tokens: rank 1's 8 verifiers per
    # source check rank 0's 37 staged tokens)
    Case(tokens=(37, 20), hidden=16, num_experts=4, top_k=2, dtype="fp32", sync="dc", seed=8),
    Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync="sp", drop=0.25),
    Case(tokens=(4, 0, 6), hidden=136, num_experts=6, top_k=3, dtype="fp16", layout="padded",
         sync="sp", seed=1),
    # SM budgets: the fewest programs a launch may have (one per group), and a split from the model
    Case(tokens=(9, 5), hidden=40, num_experts=8, top_k=3, dtype="fp32", sync="tff", seed=6,
         num_sms=3),
    Case(tokens=(6, 0, 7), hidden=24, num_experts=6, top_k=2, dtype="fp16", layout="padded",
         sync="sp", seed=7, num_sms=8),
    # receivers with several groups of 8 items each (80 items, 3 or 2 receivers)
    Case(tokens=(40, 30), hidden=16, num_experts=4, top_k=2, dtype="fp32", sync="sw", seed=10,
         num_sms=3),
    Case(tokens=(40, 30), hidden=16, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="tff", seed=11, num_sms=4),
    # rows of two steps (65-70 blocks of 128 bytes): two receivers, and two reducers, per row
    Case(tokens=(3, 2), hidden=2080, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="sw", seed=12),
    Case(tokens=(3, 0, 2), hidden=2080, num_experts=6, top_k=2, dtype="fp32", sync="tff",
         drop=0.25, seed=13),
    Case(tokens=(2, 3), hidden=2080, num_experts=4, top_k=2, dtype="fp32", layout="padded",
         sync="sp", seed=14),
    Case(tokens=(3, 2), hidden=2080, num_experts=4, top_k=2, dtype="fp32", sync="dc", seed=15),
    # top-12 in tff: more pairs per token than a reducer takes at once (REDUCE_ROWS), in groups of
    # 8, the second partly empty; top-16 in sp: one tile of 16 rows, and their markers reset
    Case(tokens=(5, 3), hidden=24, num_experts=16, top_k=12, dtype="fp32", sync="tff", drop=0.25,
         seed=16),
    Case(tokens=(4, 5), hidden=40, num_experts=16, top_k=16, dtype="fp16", layout="padded",
         sync="sp", seed=17),
]
# sp rows holding the sentinel: fp32 rows of 2 blocks, fp16 rows of 3 (the last one padded)
SENTINEL_CASES = [
    Case(tokens=(7, 0, 5), hidden=40, num_experts=6, top_k=2, dtype="fp32", sync="sp", drop=0.25,
         seed=4),
    Case(tokens=(8, 6), hidden=136, num_experts=8, top_k=3, dtype="fp16", layout="padded",
         sync="sp", seed=5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"W{len(c.tokens)}-{c.layout}-{c.dtype}-{c.sync}"
                         + (f"-sms{c.num_sms}" if c.num_sms else ""))
def test_emulated_ranks_match_oracle(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the spawned process
    run_ranks(emulated_case, 1, case, timeout_s=600)
    assert os.environ["TRITON_INTERPRET"] == "1"


@pytest.mark.parametrize("case", SENTINEL_CASES, ids=lambda c: f"W{len(c.tokens)}-{c.layout}-{c.dtype}")
def test_emulated_sp_rows_holding_the_sentinel(case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_sentinel_case, 1, case, 3, timeout_s=600)


@pytest.mark.parametrize("sync", ["tff", "sp"])
def test_emulated_receivers_may_change_between_calls(sync, monkeypatch):
    """Six calls of each buffer set, reusing each slot three times, with 1, 3, 2, 5, 1, 4 receiving
    programs: a slot is freed once its call has been read, however many programs read it."""
    case = Case(tokens=(6, 0, 5), hidden=24, num_experts=6, top_k=2, dtype="fp32", sync=sync,
                seed=8)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_receivers_change_case, 1, case, [1, 3, 2, 5, 1, 4], timeout_s=600)


def test_emulated_dc_verifiers_may_change_between_calls(monkeypatch):
    """``dc`` calls of 37 and 20 tokens with 1 to 32 verifiers per source (tokens per verifier
    1, 16, 4, 64, 2 here), over the same state words: the last verifier adds only the shares of its
    own call, whatever an earlier call with more verifiers left."""
    case = Case(tokens=(37, 20), hidden=16, num_experts=4, top_k=2, dtype="fp32", sync="dc", seed=9)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_receivers_change_case, 1, case, [3, 1, 2, 4, 2], [1, 16, 4, 64, 2],
              timeout_s=600)


def test_padding_weights_are_zeroed_in_spans(monkeypatch):
    from tests.cuda_sync import padding_zeroed_in_spans

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(padding_zeroed_in_spans, 1, timeout_s=600)


def test_dc_shares_add_up(monkeypatch):
    """The last ``dc`` verifier's sum over the shares of its call and source, mod 2**32, and not
    ready while a share is of another call."""
    from tests.cuda_sync import shares_add_up

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(shares_add_up, 1, timeout_s=600)


def test_dc_verify_rounds(monkeypatch):
    """A wrong sum over a round's shares asks for the next round; the other verifiers pass over
    their share again only on such an ask."""
    from tests.cuda_sync import verify_rounds

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(verify_rounds, 1, timeout_s=600)


def test_dc_verifiers_follow_the_call_size():
    """One per 2 tokens in all, 16 to 64, a power of two per source; a budget caps them at a
    quarter of it; a buffer holds the shares of its largest call."""
    from ubep.backends.cuda.geometry import verify_split

    assert [verify_split(1, None, t) for t in (0, 32, 33, 64, 65, 128, 4096)] == \
        [16, 16, 32, 32, 64, 64, 64]
    assert [verify_split(w, None, 4096) for w in (2, 3, 8)] == [32, 16, 8]
    assert verify_split(8, None, 16) == 2 and verify_split(16, None, 16) == 1
    assert verify_split(1, 24, 4096) == 4 and verify_split(2, 24, 4096) == 2
    assert verify_split(4, 8, 4096) == 1
    planner = _planner(Case(tokens=(64, 64), hidden=64, num_experts=8, top_k=2, sync="dc",
                            max_tokens=4096))
    assert planner.most_verifiers == 64 and planner.verifiers(32) == 16
    assert planner.dispatch_workers(4096).split(2) == 32
    assert planner.combine_workers(20).split(2) == 8


def _planner(case: Case, **tuning):
    """The launch planner of rank 0 of ``case``'s buffer (``tuning``: changes to the default)."""
    from ubep.backends.cuda.plan import Planner
    from ubep.backends.cuda.tuning import Tuning
    from ubep.config import EPConfig

    cfg = EPConfig(world_size=len(case.tokens), rank=0, hidden=case.hidden,
                   num_experts=case.num_experts, top_k=case.top_k,
                   max_tokens_per_rank=case.max_tokens or max(max(case.tokens), 1),
                   dtype=DTYPES[case.dtype], layout=case.layout, sync=case.sync,
                   num_sms=case.num_sms)
    return Planner(cfg, Tuning(**tuning))


def test_dc_shares_give_every_verifier_rows():
    """A verifier's share moves in steps of the largest power of two (up to the most a step holds)
    that still leaves each of a source's verifiers a step: at 128 tokens and 64 verifiers, 2 tokens
    (steps of 16 would leave rows to 8 of the 64); a 4096-token call keeps whole steps."""
    from ubep.backends.cuda.geometry import verify_step

    assert [verify_step(t, 64, 16) for t in (0, 1, 63, 64, 128, 200, 1024, 4096)] == \
        [1, 1, 1, 1, 2, 2, 16, 16]
    assert verify_step(128, 64, 4) == 2 and verify_step(4096, 32, 4) == 4
    assert verify_step(100, 8, 32) == 8 and verify_step(3, 16, 32) == 1


@pytest.mark.parametrize("layout", ["compact", "padded"])
@pytest.mark.parametrize(("sync", "num_sms"), [("tff", 3), ("sw", 24), ("sp", 132), ("dc", 5)])
def test_sm_budget_bounds_every_launch(sync, num_sms, layout):
    """Every launch has at most ``num_sms`` programs, and the count / token split is the model's
    for the senders left. The compact layout gives its groups launches of their own (its writers'
    launch also holds the one program that sums the counts for the host); the padded layout runs
    every group in one launch, half of what the verifiers leave to the receivers."""
    from ubep.topology import flat
    from ubep.tuning import DispatchShape, best_split, h200

    case = Case(tokens=(64, 64), hidden=64, num_experts=256, top_k=8, sync=sync, num_sms=num_sms,
                max_tokens=4096, layout=layout)
    planner = _planner(case, pair_chunk=4)
    split = layout == "compact"
    assert planner.split_launches == split
    assert planner.receivers == (num_sms - planner.most_verifiers) // (1 if split else 2)
    senders = num_sms - 1 if split else num_sms - planner.most_verifiers - planner.receivers
    assert senders >= 2
    combine = planner.combine_workers(4096)
    assert combine.send == (num_sms if split else senders)
    assert planner.combine_programs(4096) <= num_sms
    for tokens in (0, 1, 16, 128, 4096):
        workers = planner.dispatch_workers(tokens)
        launches = ([workers.count + workers.send + 1, workers.recv + workers.verify] if split
                    else [workers.total])
        assert max(launches) <= num_sms and planner.programs(tokens) == max(launches)
        plan = planner.dispatch(tokens, profile=False)
        assert [launch.workers.total for launch in plan.start + plan.finish] == launches
        like = planner.like_workers(tokens)
        assert like.count == 0 and (like.send if split else like.total) <= num_sms
        shape = DispatchShape(tokens=-(-tokens // 128) * 128, experts=256, topk=8,
                              bytes_per_token=64 * 2)
        split_model = best_split(shape, senders, flat(2), h200())
        pair_steps = -(-tokens * 8 // 4)  # a count program orders whole steps
        assert workers.count == max(1, min(split_model.n_count, pair_steps))
        assert workers.send == max(1, min(tokens, split_model.n_token))


def test_decode_calls_have_a_count_program_per_step():
    """Calls of at most ``PREFIX_PAIRS`` pairs, whose count programs never wait for one another, get
    one count program per ``COUNT_STEP`` pairs; larger calls as many as the cost model's count term
    is least with at the upper edge of their token bucket (``best_count``), at most the cap; every
    call orders ``COUNT_STEP`` pairs a step."""
    from ubep.backends.cuda.tuning import Tuning
    from ubep.topology import flat
    from ubep.tuning import DispatchShape, best_count, h200

    default = Tuning()
    step, prefix_pairs = default.count_step, default.prefix_pairs
    case = Case(tokens=(64, 64), hidden=64, num_experts=256, top_k=8, max_tokens=4096)
    planner = _planner(case)
    decode = prefix_pairs // 8  # tokens of top-8
    counts = [planner.dispatch_workers(t).count for t in (0, 1, 16, 128, decode, decode + 1, 4096)]
    edge = -(-(decode + 1) // default.split_bucket_tokens) * default.split_bucket_tokens
    modelled = best_count(DispatchShape(tokens=edge, experts=256, topk=8, bytes_per_token=128),
                          256, flat(2), h200())
    assert counts == [1, 1, 4, 32, prefix_pairs // step, modelled, 99]  # best_count's example
    assert planner.count_step() == step
    capped = _planner(case, max_count=8)
    assert [capped.dispatch_workers(t).count for t in (32, 128, 4096)] == [8, 8, 8]
    # the pairs a count program loads to count those before it: what the call has, in powers of 2
    widths = [planner.prefix_width(t) for t in (0, 1, 5, 16, 128, decode, decode + 1, 4096)]
    assert widths == [step, step, 64, 128, 1024, prefix_pairs, prefix_pairs, prefix_pairs]


def test_receivers_share_rows_of_several_steps():
    """Two programs per item (each every other step of the row) where there are two per item and
    the row's steps divide between them; a buffer without an SM budget of at most ``PARTS_ITEMS``
    items has two receivers per item, but in ``dc``, whose combine still splits its tokens' rows
    where the receivers outnumber them twice (``sp``'s combine never does: the backend's launch)."""
    from ubep.backends.cuda.geometry import PARTS_ITEMS, recv_parts
    from ubep.backends.cuda.tuning import Tuning

    max_recv = Tuning().max_recv
    # W = 1, 128 tokens of 7168 bf16 (112 blocks, 64 a step); EP2's 256 items; 3 steps; 1 step
    assert recv_parts(max_recv, 128, 112, 64) == 2 and recv_parts(max_recv, 256, 112, 64) == 1
    assert recv_parts(max_recv, 64, 130, 64) == 1 and recv_parts(max_recv, 64, 64, 64) == 1
    for sync, receivers in (("sw", 12), ("sp", 12), ("dc", 6)):
        case = Case(tokens=(3, 2), hidden=2080, num_experts=4, top_k=2, dtype="fp32",
                    layout="padded", sync=sync)
        planner = _planner(case)
        assert planner.receivers == receivers
        assert recv_parts(planner.receivers, 3, 65, 64) == 2  # the combine of 3 tokens
    over = Case(tokens=(70, 66), hidden=2080, num_experts=4, top_k=2, dtype="fp32",
                layout="padded", sync="sw")
    assert _planner(over).receivers == 140 > PARTS_ITEMS  # one per item
    wide = Case(tokens=(200, 200), hidden=2080, num_experts=4, top_k=2, dtype="fp32", sync="sw")
    assert _planner(wide).receivers == max_recv


def test_two_count_programs_split_the_pairs(monkeypatch):
    """36 and 20 pairs, 4 per step, 2 count programs: each range spans several steps, and the
    second program adds the first one's counts."""
    case = Case(tokens=(9, 5), hidden=8, num_experts=8, top_k=4, dtype="fp32", maxvio=1.0,
                drop=0.1, seed=5, sync="sw")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(emulated_case, 1, case, 2, timeout_s=600)


def test_the_first_timeout_report_survives(monkeypatch):
    """Later timed-out waits (those of calls queued behind the first failure) leave the rank's
    error word as the first one wrote it, so the error names the cause."""
    from tests.cuda_sync import first_report_survives

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(first_report_survives, 1, timeout_s=600)


def test_a_wait_gives_up_once_its_rank_has_timed_out(monkeypatch):
    """A wait for words (records, acks, counts) of a call queued behind a failure gives up within
    a bounded number of polls, instead of waiting out a whole timeout (``sync.still_due``)."""
    from tests.cuda_sync import queued_wait_gives_up

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(queued_wait_gives_up, 1, timeout_s=120)


@pytest.mark.parametrize("sync", ["sw", "tff"])
def test_compact_dispatch_without_its_peer_raises(sync, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    run_ranks(compact_dispatch_alone_case, 1, sync, timeout_s=600)


@pytest.mark.parametrize(("sync", "per_token"), [("tff", 2), ("sp", 1)])
def test_combine_reducers_fit_the_calls_tokens(sync, per_token):
    """A combine launches reducers for its own call's tokens, not for the buffer's largest call: two
    per token (one in sp) up to the receivers the buffer has, and one for a call without tokens
    (it publishes the ack)."""
    # rows of two steps (2080 fp32 elements), so that two receivers share each of the 128 items
    case = Case(tokens=(64, 64), hidden=2080, num_experts=8, top_k=2, dtype="fp32", sync=sync,
                layout="padded")
    planner = _planner(case)
    assert planner.receivers == 256
    for tokens, reducers in ((64, 64 * per_token), (5, 5 * per_token), (0, 1)):
        assert planner.combine_workers(tokens).recv == reducers
    assert planner.combine_workers(64).send == planner.combine_workers(0).send


def test_the_wait_for_the_size_ends_like_a_synchronization():
    """The host's wait for the compact output's size (``_received_rows``) returns the word once the
    sizing launch writes it, however many polls that takes; a launch that ended without writing it
    is an error, not a hang."""
    backend = emulated_backends(Case(tokens=(4, 4), hidden=16, num_experts=4, top_k=2))[0].backend
    spin_polls = backend.tuning.spin_polls

    class Launch:  # stands in for the event after the sizing launch
        def __init__(self, writes_at: int | None, ends_at: int):
            self.polls, self.writes_at, self.ends_at = 0, writes_at, ends_at

        def query(self) -> bool:
            self.polls += 1
            if self.polls == self.writes_at:
                backend.host_rows.value = 9
            return self.polls >= self.ends_at

    for writes_at in (1, spin_polls + 5):  # past spin_polls each poll yields the GIL
        backend.host_rows.value, backend.sized = -1, Launch(writes_at, ends_at=10 * spin_polls)
        assert backend._received_rows() == 9
    backend.host_rows.value, backend.sized = -1, Launch(None, ends_at=3)
    with pytest.raises(RuntimeError, match="sizing launch ended without writing its output's rows"):
        backend._received_rows()


@pytest.mark.parametrize("sync", ["sw", "tff", "dc", "sp"])
@pytest.mark.parametrize("kind", ["reduce", "weighted", "like", "handle"])
def test_emulated_ranks_that_call_different_operations_fail(sync, kind, monkeypatch):
    """Ranks that disagree on a call (reduction, weighting, operation, handle) each end with an
    EPCommError that says so, in every sync mode, instead of taking each other's rows."""
    case = Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync=sync, seed=9)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    messages = run_ranks(emulated_disagreement_case, 1, case, kind, timeout_s=600)[0]
    for rank, message in enumerate(messages):
        assert f"ubep rank {rank}: phase" in message and "called another operation" in message, messages


def test_emulated_destroy_drops_the_device_memory(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    case = Case(tokens=(5, 3), hidden=24, num_experts=8, top_k=2, dtype="fp32", sync="tff")
    run_ranks(emulated_destroy_case, 1, case, timeout_s=600)
