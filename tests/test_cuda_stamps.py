"""In-kernel stamps of the CUDA backend turned into phases and per-program timelines (``stamps``),
and the launches the backend keeps for the timeline (CPU: stamps written by hand)."""

import pytest
import torch

pytest.importorskip("triton")

from tests.cuda_emulation import emulated_backends  # noqa: E402
from tests.workers import Case  # noqa: E402
from ubep.backends.cuda.stamps import LaunchStamps  # noqa: E402


def _stamps(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64)


def test_phases_and_timeline_of_one_launch():
    # count: 1 program, token: 2, verify: none, receive: 1; stamps in ns from 1000
    launch = LaunchStamps("dispatch", (1, 2, 0, 1), _stamps([
        [1000, 1500, 4000, 4100], [1000, 1200, 3000, 3100], [1100, 1300, 5000, 5200],
        [1050, 6000, 9000, 9500]]), "dispatch (writers)")
    phases = launch.phases()  # named by the launch's label, apart from the final launch's
    assert phases["dispatch (writers) token: wait"] == pytest.approx(0.2)
    assert phases["dispatch (writers) token: done at"] == pytest.approx(4.0)
    assert phases["dispatch (writers) receive: done at"] == pytest.approx(8.0)
    assert phases["dispatch (writers): kernel"] == pytest.approx(8.5)
    assert len(phases) == 7  # no verify group: 3 groups x 2 phases and the kernel
    rows = launch.timeline()
    assert [(r["op"], r["group"], r["program"]) for r in rows] == [
        ("dispatch (writers)", "count", 0), ("dispatch (writers)", "token", 1),
        ("dispatch (writers)", "token", 2), ("dispatch (writers)", "receive", 3)]
    assert rows[2]["start_us"] == 0.1 and rows[3]["end_us"] == 8.5


def test_timeline_keeps_the_writers_launch_beside_the_final_one():
    backend = emulated_backends(Case(tokens=(8, 8), hidden=64, num_experts=8, top_k=2,
                                     layout="compact"))[0]
    backend.timer.enabled = True
    writers = backend._stamps("dispatch", (1, 1, 0, 1), final=False)
    receivers = backend._stamps("dispatch", (0, 0, 0, 2), final=True)
    writers[:] = _stamps([[0, 10, 20, 30]] * 3)
    receivers[:] = _stamps([[100, 110, 120, 130]] * 2)
    ops = [(r["op"], r["group"]) for r in backend.worker_timeline()]
    assert ops == [("dispatch (writers)", "count"), ("dispatch (writers)", "token"),
                   ("dispatch (writers)", "receive"), ("dispatch", "receive"),
                   ("dispatch", "receive")]
    backend._stamps("dispatch", (0, 0, 0, 1), final=True)  # the next call's: replaces the last one
    assert [r["op"] for r in backend.worker_timeline()].count("dispatch") == 1


def test_the_time_between_a_calls_launches_is_a_phase():
    """A call that launches twice (the compact dispatch) gets ``"<op>: between launches"``: from
    its first launch's last program finishing to its second launch's first program starting; a
    call of one launch (``dispatch_like`` here) none."""
    backend = emulated_backends(Case(tokens=(8, 8), hidden=64, num_experts=8, top_k=2,
                                     layout="compact"))[0]
    backend.timer.enabled = True
    writers = backend._stamps("dispatch", (1, 1, 0, 1), final=False)
    receivers = backend._stamps("dispatch", (0, 0, 0, 2), final=True)
    writers[:] = _stamps([[0, 10, 20, 30], [0, 10, 20, 45], [5, 10, 20, 30]])
    receivers[:] = _stamps([[1100, 1110, 1120, 1130], [1090, 1100, 1110, 1120]])
    like = backend._stamps("dispatch", (0, 1, 0, 1), final=True)
    like[:] = _stamps([[2000, 2010, 2020, 2030]] * 2)
    samples = backend.timer.samples()
    assert samples["dispatch: between launches"] == [pytest.approx(1.045)]
