"""Ranks that disagree never get a silent wrong result: a Buffer whose configuration differs between
ranks raises ``ValueError`` on every rank at creation, naming the field and the ranks; a call that
differs (operation, reduction, weighting, handle) raises ``EPCommError`` on every rank; a peer that
exits is reported as a failure after so many seconds, not as a timeout. Reference backend on gloo;
the ascend backend on its CPU twin where the operator library is built.
"""

import pytest

from tests import agreement_workers as aw
from ubep.backends.ascend_library import library_path
from ubep.launch import run_ranks

ascend = pytest.param("ascend", marks=pytest.mark.skipif(
    library_path() is None, reason="the ascend operator library is not built (./build.sh test builds it)"))
BACKENDS = ["reference", ascend]


def _raised(fn, *args) -> list[tuple[str, str]]:
    return [(r.kind, r.message) for r in run_ranks(fn, 2, *args, return_failures=True, timeout_s=120)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("override", "words"), [
    ({"hidden": 128}, "hidden is 64 on ranks [0], 128 on ranks [1]"),
    ({"layout": "padded"}, "layout is 'compact' on ranks [0], 'padded' on ranks [1]"),
    ({"max_tokens_per_rank": 9}, "max_tokens_per_rank is 6 on ranks [0], 9 on ranks [1]"),
    ({"sync": "sp"}, "sync is 'tff' on ranks [0], 'sp' on ranks [1]"),
], ids=["hidden", "layout", "max_tokens", "sync"])
def test_buffers_that_differ_raise_on_every_rank(backend, override, words):
    for rank, (kind, message) in enumerate(_raised(aw.buffers_differ, backend, override)):
        assert kind == "ValueError", (rank, kind, message)
        assert f"ubep rank {rank}: the ranks' Buffers disagree: {words}" in message, message


@pytest.mark.skipif(library_path() is None, reason="the ascend operator library is not built")
def test_backends_that_differ_raise_on_every_rank():
    for rank, (kind, message) in enumerate(_raised(aw.buffers_differ, "reference",
                                                   {"backend": "ascend"})):
        assert kind == "ValueError", (rank, kind, message)
        assert "backend is 'reference' on ranks [0], 'ascend' on ranks [1]" in message, message


def test_auto_agrees_with_the_reference_backend():
    assert run_ranks(aw.buffers_differ, 2, "reference", {"backend": "auto"}, timeout_s=120) == [None, None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [aw.reductions_differ, aw.weighting_differs, aw.operations_differ,
                                aw.handles_differ],
                         ids=["reduce", "weighted", "operation", "handle"])
def test_calls_that_differ_raise_on_every_rank(backend, fn):
    raised = _raised(fn, backend)
    for rank, (kind, message) in enumerate(raised):
        assert kind == "EPCommError", (rank, kind, message)
        assert f"ubep rank {rank}" in message, message
        if backend == "reference":
            assert "the ranks called different operations" in message, message
        else:
            assert "called another operation" in message, message


def test_a_peer_that_exits_is_reported_as_a_failure_not_a_timeout():
    results = run_ranks(aw.peer_exits, 2, return_failures=True, timeout_s=120)
    message = results[0]
    assert "ubep rank 0: phase 'dispatch: count exchange' failed after" in message, message
    assert "timed out" not in message and "may have exited" in message, message
    seconds = float(message.split("failed after ")[1].split(" s")[0])
    assert seconds < 2.5, message  # the Buffer's timeout is 3 s
