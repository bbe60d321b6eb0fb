"""The Ascend C kernels on their CPU twin (backend="ascend"), bit for bit against the oracle.

Each rank process is one emulated die; W = 2, 4, 8 and 16 dies on a CM384-like two-tier fabric
(the worker split comes from the cost model on ``cm384(W)``), all four sync modes, random and skewed
routing, -1 slots, uneven and zero token counts, both layouts, both reductions weighted or not, and
gradients. Needs the operator library that ``./build.sh test`` builds; skipped without it.
"""

import pytest
import torch

from tests.ascend_workers import (
    dirty_window_worker,
    interleaved_worker,
    late_die_worker,
    repeated_launch_worker,
    skip_prepare_worker,
    skip_worker,
    slow_aiv_worker,
    stress_worker,
)
from tests.workers import Case, run_cases
from ubep.backends.ascend import TWIN_AIVS, worker_split
from ubep.backends.ascend_library import library_path
from ubep.config import EPConfig
from ubep.launch import run_ranks
from ubep.topology import cm384
from ubep.tuning import DispatchShape, best_split, cm384_ascend

pytestmark = pytest.mark.skipif(library_path() is None,
                                reason="the ascend operator library is not built (./build.sh test builds it)")
MODES = ("sw", "tff", "dc", "sp")


def cases_for(world: int, modes: tuple[str, ...]) -> list[Case]:
    experts = max(8, 2 * world)
    tokens = tuple((3 * s + 5) % 9 if s != 1 else 0 for s in range(world))
    shapes = [
        {"tokens": tokens, "hidden": 40, "top_k": 1, "dtype": "bf16"},
        {"tokens": tokens, "hidden": 72, "top_k": 2, "dtype": "fp16", "layout": "padded", "drop": 0.25,
         "seed": 1},
        {"tokens": tuple(t + 2 for t in tokens), "hidden": 24, "top_k": 8, "dtype": "fp32", "maxvio": 3.0,
         "drop": 0.1, "seed": 2},
        {"tokens": tuple(t + 3 for t in tokens), "hidden": 200, "top_k": 4, "dtype": "bf16",
         "layout": "padded", "maxvio": 1.0, "seed": 3, "max_tokens": 12},
        {"tokens": (0,) * world, "hidden": 24, "top_k": 2, "seed": 4, "max_tokens": 3},
    ]
    return [Case(num_experts=experts, backend="ascend", sync=modes[i % len(modes)], **shape)
            for i, shape in enumerate(shapes)]


@pytest.mark.parametrize("world, rounds", [(2, 4), (4, 2), (8, 1), (16, 1)])
def test_matches_oracle(world, rounds):
    """Every case in ``rounds`` sync modes (each shape meets each mode over the rounds)."""
    cases = [c for r in range(rounds) for c in cases_for(world, MODES[r:] + MODES[:r])]
    if world == 16:
        cases = cases[:4]
    run_ranks(run_cases, world, cases, timeout_s=400)


def test_routing_longer_than_one_ub_window():
    """1032 pairs on rank 0 (129 tokens, top-8): more than the 1024 a UB window of the routing holds
    (``Routing::CHUNK``, ep_routing.h), so every scan of it reloads the window, at its end and from
    its start again; a reload waits for the scalar's reads of the previous window."""
    case = Case(tokens=(129, 5), hidden=16, num_experts=16, top_k=8, dtype="fp16", drop=0.1, seed=5,
                backend="ascend", sync="sp")
    run_ranks(run_cases, 2, [case], timeout_s=400)


def test_buffers_one_after_another_on_one_group():
    """Buffers made one after another on one group share its windows, as HCCL's window outlives them:
    sw, sp, tff, dc, sp in the first shape, then sw in the first shape again; dispatch, combine and
    gradients of each bit for bit. Nothing an earlier Buffer left (flags, records, count messages,
    sentinels of another geometry) may pass for a later Buffer's call."""
    tokens, first = (4, 0, 6), {"hidden": 40, "num_experts": 6, "top_k": 2, "backend": "ascend"}
    cases = [
        Case(tokens=tokens, sync="sw", seed=5, **first),
        Case(tokens=tokens, hidden=72, num_experts=6, top_k=3, dtype="fp16", layout="padded",
             backend="ascend", sync="sp", seed=6),
        Case(tokens=(5, 3, 2), hidden=24, num_experts=12, top_k=1, dtype="fp32", backend="ascend", sync="tff",
             seed=7),
        Case(tokens=(2, 6, 1), hidden=16, num_experts=3, top_k=2, backend="ascend", sync="dc", drop=0.2,
             seed=8),
        Case(tokens=tokens, sync="sp", seed=9, **first),
        Case(tokens=tokens, sync="sw", seed=10, **first),
    ]
    run_ranks(run_cases, 3, cases, timeout_s=400)


def test_live_buffers_interleaved_on_one_group():
    """Calls of three live Buffers on one group interleaved, two layouts among them."""
    assert run_ranks(interleaved_worker, 3, timeout_s=300) == [0, 0, 0]


# The window of W = 2 dies, H = 40 bf16, E = 4, K = 2, T_max = 4, in 512-byte blocks after the tokens
# (2 x 2 x 32 bytes in the first block of a 4096-byte header, whose other 7 blocks are not filled).
# A slot is 48 blocks: count area 2, dispatch rows 2 x 4, a record block, combine rows 2 x 8, a record
# block, pair-value rows 2 x 8 (fp32), a record block, 3 blocks of padding to 4096 bytes.
SP_SLOT = [["zero", 2], ["bf16", 8], ["zero", 1], ["bf16", 16], ["zero", 1], ["fp32", 16]]
PREPARED = {"sp": [["garbage", 7], *SP_SLOT, ["zero", 6], *SP_SLOT[1:], ["zero", 4]],
            "sw": [["garbage", 7], ["zero", 96]]}


@pytest.mark.parametrize("sync", ["sp", "sw"])
def test_preparation_over_garbage(sync):
    """HCCL's window holds whatever HCCL or an earlier process left: a Buffer's preparation zeroes both
    slots of its layer (sp: the sentinel in the marker bytes of every row block), leaves the rest
    alone, and meets every die through its ready token; a call then matches the oracle."""
    got = run_ranks(dirty_window_worker, 2, sync, timeout_s=120)
    nonce = got[0]["nonce"]
    for rank in got:
        assert rank["nonce"] == nonce and rank["ready"] == [[nonce, 2], [nonce, 2]]
        assert rank["runs"] == PREPARED[sync]
        assert rank["past_layer_kept"]


def test_missing_peer_at_buffer_creation_times_out():
    got = run_ranks(skip_prepare_worker, 2, timeout_s=120)
    assert got[1] == "skipped"
    elapsed, message = got[0].split("|", 1)
    assert "ubep rank 0: phase 'Buffer: configuration check' timed out after 2 s" in message, message
    assert 1.5 < float(elapsed) < 10


def test_preparation_waits_for_every_aiv_of_a_die():
    """One AIV of die 0 fills its share of the window 20 ms per copy behind the others: no ready token
    of die 0 may reach die 1 before that share is filled, or die 1's rows land under the fill."""
    assert run_ranks(slow_aiv_worker, 2, timeout_s=300) == [True, True]


def test_preparation_waits_for_a_late_die():
    """A preparation after a timeout, while the late rank's call still writes into this rank's
    window, fills only once every rank has arrived (prepare_kernel.cpp's first SyncAll)."""
    got = run_ranks(late_die_worker, 2, timeout_s=120)
    assert got[1] == "late"
    want = "ubep rank 0: phase 'dispatch: wait for counts from rank 1' did not complete within 2 s"
    assert want in got[0], got[0]


@pytest.mark.parametrize("sync", MODES)
def test_stress_random_delays(sync):
    assert run_ranks(stress_worker, 3, sync, 12, timeout_s=300) == [0, 0, 0]


@pytest.mark.parametrize("sync", ["tff", "sw"])
def test_missing_peer_times_out(sync):
    got = run_ranks(skip_worker, 2, sync, timeout_s=120)
    assert got[1] == "skipped"
    elapsed, message = got[0].split("|", 1)
    assert "ubep rank 0: phase 'dispatch: wait for counts from rank 1' did not complete within 2 s" in message
    assert 1.5 < float(elapsed) < 10


def test_worker_split_follows_the_cost_model():
    """The op's host tiling splits the AIVs as best_split says on cm384(W): the twin's 4 and an A3 die's 48,
    on the twin tests' shapes and the configurations of docs/ASCEND.md; the paper's (256 dies, T = 64,
    E = 256, K = 8, H = 7168 bf16) gives 12 count + 36 token AIVs."""
    paper = EPConfig(world_size=256, rank=0, hidden=7168, num_experts=256, top_k=8, max_tokens_per_rank=64,
                     dtype=torch.bfloat16)
    assert worker_split(paper, 48) == (12, 36)
    configs = [(world, 2 * world, 4, 12, 200, torch.bfloat16, TWIN_AIVS) for world in (2, 4, 8, 16)]
    configs += [(world, experts, 8, tokens, 7168, torch.bfloat16, 48)
                for world, experts, tokens in [(64, 64, 16), (128, 128, 16), (128, 128, 64), (64, 256, 64),
                                               (256, 256, 128)]]
    configs += [(4, 8, 2, 7, 24, torch.float32, 8), (16, 32, 1, 1, 72, torch.half, 3)]
    for world, experts, top_k, tokens, hidden, dtype, aivs in configs:
        cfg = EPConfig(world_size=world, rank=0, hidden=hidden, num_experts=experts, top_k=top_k,
                       max_tokens_per_rank=tokens, dtype=dtype)
        shape = DispatchShape(tokens=tokens, experts=experts, topk=top_k,
                              bytes_per_token=hidden * torch.finfo(dtype).bits // 8)
        split = best_split(shape, aivs, cm384(world), cm384_ascend())
        assert worker_split(cfg, aivs) == (split.n_count, split.n_token), cfg


def test_bad_hidden_is_rejected_before_communication(single_rank_group):
    import ubep

    with pytest.raises(ValueError, match="hidden must be <= 8192 for backend='ascend'"):
        ubep.Buffer(hidden=8200, num_experts=4, top_k=2, max_tokens_per_rank=4, backend="ascend")


def test_calls_in_an_npu_graph_capture_pin_the_windows(single_rank_group, monkeypatch):
    """A call inside an NPU graph capture runs (its number is taken on the device) and pins the group's
    windows to its layout: a Buffer of another layout refuses to prepare them under the graph's
    replays, and no preparation is captured; until release_graph_memory() says the graphs are gone."""
    import ubep
    from ubep.backends import ascend

    shape = {"hidden": 16, "num_experts": 4, "top_k": 2, "dtype": torch.float32, "backend": "ascend"}
    padded = ubep.Buffer(layout="padded", max_tokens_per_rank=4, **shape)  # decode
    compact = ubep.Buffer(layout="compact", max_tokens_per_rank=8, **shape)  # prefill: holds the windows
    x, idx, w = torch.randn(3, 16), torch.tensor([[0, 1], [2, 3], [1, 2]]), torch.rand(3, 2)
    monkeypatch.setattr(ascend, "npu_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="a window preparation .* cannot be captured"):
        padded.dispatch(x, idx, w)  # would prepare the windows for the padded layout
    res = compact.dispatch(x, idx, w)
    y = compact.combine(res.recv_x, res.handle)
    torch.testing.assert_close(y, x * w.sum(1, keepdim=True), rtol=0, atol=1e-6)
    monkeypatch.setattr(ascend, "npu_capturing", lambda: False)
    with pytest.raises(RuntimeError, match="an NPU graph captured calls of the layer"):
        padded.dispatch(x, idx, w)
    with pytest.raises(RuntimeError, match="an NPU graph captured calls of the layer"):
        ubep.Buffer(layout="padded", max_tokens_per_rank=4, **shape)
    compact.dispatch(x, idx, w)
    ubep.release_graph_memory()  # the graphs are gone: the windows may take another layout again
    padded.dispatch(x, idx, w)
    for buf in (padded, compact):
        buf.destroy()


def test_a_repeated_launch_takes_a_new_call_number():
    """Two dispatches whose ops get identical host arguments (as a graph replays one launch) while
    one rank comes late to the second: the other must wait for the second call's rows, not take the
    first call's flags, since the call number comes from the device."""
    assert run_ranks(repeated_launch_worker, 2, timeout_s=120) == [True, True]


def _meta_calls(x, idx, w, windows, padded=False):
    """dispatch, combine and pairs on the given (meta or fake) tensors, as the backend calls them."""
    ops = torch.ops.ubep_ascend
    out = ops.dispatch(x, idx, w, windows, "g", 2, 0, 8, 6, padded, "tff", 1, 4, 1.0)
    y = ops.combine(out[0], idx, w, *out[3:7], windows, "g", 2, 0, 8, 40, torch.bfloat16, "expert_rank", True,
                    "tff", 2, 4, 1.0)
    pairs = ops.combine(out[1], idx, w, *out[3:7], windows, "g", 2, 0, 8, 40, torch.bfloat16, "pairs", False,
                        "tff", 3, 4, 1.0)
    return out, y, pairs


def test_meta_shapes_for_torch_compile():
    """The fake implementations give the shapes the CPU ops return (worst-case rows for dispatch) and
    every op's status words last."""
    from ubep.backends.ascend import load_ops

    load_ops()
    meta = torch.device("meta")
    windows = [torch.empty(1 << 20, dtype=torch.uint8, device=meta) for _ in range(2)]
    x = torch.empty(5, 40, dtype=torch.bfloat16, device=meta)
    idx = torch.empty(5, 3, dtype=torch.int64, device=meta)
    w = torch.empty(5, 3, dtype=torch.float32, device=meta)
    out, y, pairs = _meta_calls(x, idx, w, windows)
    shapes = [(36, 40), (36,), (4,), (2, 6, 3), (2, 6, 3), (2, 6), (2, 2), (4,)]
    assert [tuple(t.shape) for t in out] == shapes
    assert out[-1].dtype == torch.int64
    padded = _meta_calls(x, idx, w, windows, padded=True)[0]
    assert tuple(padded[0].shape) == (48, 40)
    assert tuple(y[0].shape) == (5, 40) and y[0].dtype == torch.bfloat16 and tuple(y[1].shape) == (4,)
    assert tuple(pairs[0].shape) == (5, 3)
    token = torch.empty(2, dtype=torch.int64, device=meta)
    status = torch.ops.ubep_ascend.prepare(token, windows, "g", 2, 0, 40, 8, 3, 6, torch.bfloat16, "tff", 4,
                                           1.0)
    assert tuple(status.shape) == (4,)


def test_ops_trace_into_a_graph_without_running():
    """torch.compile (fullgraph, dynamic shapes) and make_fx in symbolic mode trace the ops through their
    fake implementations, never running a kernel: no windows exist here, a real call would fail."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ubep.backends.ascend import load_ops

    load_ops()
    want = ["ubep_ascend.dispatch", "ubep_ascend.combine", "ubep_ascend.combine"]

    def layer(x, idx, w, window0, window1):
        out, y, pairs = _meta_calls(x, idx, w, [window0, window1])
        return y[0], pairs[0], out[2], out[-1]

    def ops_in(graph):
        called = (str(n.target) for n in graph.nodes if n.op == "call_function")
        return [t for t in called if "ubep_ascend" in t]

    args = (torch.randn(5, 40).bfloat16(), torch.zeros(5, 3, dtype=torch.int64), torch.rand(5, 3),
            torch.zeros(16, dtype=torch.uint8), torch.zeros(16, dtype=torch.uint8))
    assert ops_in(make_fx(layer, tracing_mode="symbolic")(*args).graph) == [f"{op}.default" for op in want]

    traced = []

    def record(gm, inputs):  # keeps the graph and runs nothing
        traced.append(gm)
        outputs = len(gm.graph.output_node().args[0])
        return lambda *a: tuple(torch.empty(0) for _ in range(outputs))

    torch.compile(layer, backend=record, fullgraph=True, dynamic=True)(*args)
    assert ops_in(traced[0].graph) == want


def test_status_words_name_rank_phase_and_peer():
    """What the backend raises from a status copy: "" when the call completed; else the rank, the phase
    and the peer (phase 1 = dispatch's count wait, ep_tiling.h) and the timeout."""
    from ubep.backends.ascend import load_ops

    load_ops()
    message = torch.ops.ubep_ascend.status_message
    assert message(torch.zeros(4, dtype=torch.int64), 3, 2.0) == ""
    got = message(torch.tensor([1, 1, 5, 0]), 3, 2.5)
    assert got.startswith("ubep rank 3: phase 'dispatch: wait for counts from rank 5' did not complete "
                          "within 2.5 s"), got


class _Event:
    """An NPU event as the status path uses it: done once the test says so."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done


def test_npu_status_raises_at_the_next_call_once_final(monkeypatch):
    """On an NPU no call waits for its kernel: a timeout is raised by the first call after its status
    copy completed (no waiting), or by synchronize() (check(wait=True)), and again by every later call."""
    from types import SimpleNamespace

    from ubep import EPCommError
    from ubep.backends import ascend_status
    from ubep.backends.ascend import load_ops

    load_ops()
    events = []

    def copy(status):
        events.append(_Event())
        return status.clone(), events[-1]

    monkeypatch.setattr(ascend_status, "_copy_to_host", copy)
    timed_out = torch.tensor([1, 6, 1, 0])  # phase 6: combine, returned rows from rank 1

    watch = ascend_status.StatusWatch(SimpleNamespace(type="npu"), 0, 2.0)
    watch.watch(torch.zeros(4, dtype=torch.int64))
    watch.watch(timed_out)
    watch.check()  # neither copy has completed: nothing is known, nothing waits
    events[0].done = True
    watch.check()  # the first call completed; the second is still running
    assert len(watch.pending) == 1
    events[1].done = True
    with pytest.raises(EPCommError, match="ubep rank 0: phase 'combine: wait for returned rows from rank 1' "
                                          "did not complete within 2 s"):
        watch.check()
    with pytest.raises(EPCommError, match="an earlier call of this Buffer"):
        watch.check()

    synced = ascend_status.StatusWatch(SimpleNamespace(type="npu"), 0, 2.0)
    synced.watch(timed_out)
    synced.check()
    with pytest.raises(EPCommError, match="returned rows from rank 1"):
        synced.check(wait=True)  # after synchronize(): every copy is final
