"""Bad input raises a clear error that names the argument, before any communication."""

import pytest
import torch

import ubep
import ubep.buffer
from tests.workers import bad_rank_worker
from ubep.launch import run_ranks

H, E, K, T = 24, 8, 2, 5


@pytest.fixture
def buf(single_rank_group):
    return ubep.Buffer(single_rank_group, hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T,
                       dtype=torch.bfloat16)


def _inputs(num_tokens=T):
    x = torch.zeros(num_tokens, H, dtype=torch.bfloat16)
    idx = torch.stack([torch.arange(num_tokens) % E, (torch.arange(num_tokens) + 1) % E], 1)
    return x, idx, torch.full((num_tokens, K), 0.5)


def test_good_input_passes(buf):
    assert buf.symmetric_memory_bytes == 0  # the reference backend allocates none
    res = buf.dispatch(*_inputs())
    assert res.recv_x.shape == (T * K, H)
    assert buf.combine(res.recv_x, res.handle).shape == (T, H)


def _bad_x():
    x, idx, w = _inputs()
    return [
        ((x.float(), idx, w), TypeError, "x must have dtype torch.bfloat16"),
        ((x[:, :-1], idx, w), ValueError, r"x must have shape \[5, 24\]"),
        ((x.unsqueeze(0), idx, w), ValueError, "x must be a 2-D tensor"),
        (("x", idx, w), ValueError, "x must be a 2-D tensor"),
        ((torch.zeros(T + 1, H, dtype=torch.bfloat16), *_inputs(T + 1)[1:]), ValueError,
         "more than max_tokens_per_rank=5"),
        ((x.to("meta"), idx, w), ValueError, "x must be on cpu"),
        ((x, idx.float(), w), TypeError, "topk_idx must have dtype"),
        ((x, idx[:, :1], w), ValueError, r"topk_idx must have shape \[5, 2\]"),
        ((x, torch.where(idx == 3, E, idx), w), ValueError, r"topk_idx values must be in \[-1, 8\)"),
        ((x, torch.where(idx == 3, -2, idx), w), ValueError, "topk_idx values must be in"),
        ((x, torch.stack([idx[:, 0], idx[:, 0]], 1), w), ValueError,
         "topk_idx row 0 names an expert twice"),
        ((x, idx, w.to(torch.bfloat16)), TypeError, "topk_weights must have dtype torch.float32"),
        ((x, idx, w[:-1]), ValueError, r"topk_weights must have shape \[5, 2\]"),
    ]


@pytest.mark.parametrize(("args", "error", "words"), _bad_x())
def test_dispatch_rejects(buf, args, error, words):
    with pytest.raises(error, match=words):
        buf.dispatch(*args)


def test_value_checks_are_skipped_while_a_graph_is_captured(single_rank_group, monkeypatch):
    padded = ubep.Buffer(single_rank_group, hidden=H, num_experts=E, top_k=K,
                         max_tokens_per_rank=T, dtype=torch.bfloat16, layout="padded")
    x, idx, w = _inputs()
    out_of_range = torch.where(idx == 3, E, idx)
    monkeypatch.setattr(ubep.buffer, "graph_capturing", lambda t: True)
    padded._check_dispatch(x, out_of_range, w)  # a capture cannot read the values back
    with pytest.raises(TypeError, match="topk_idx must have dtype"):  # the rest is still checked
        padded._check_dispatch(x, out_of_range.float(), w)
    monkeypatch.setattr(ubep.buffer, "graph_capturing", lambda t: False)
    with pytest.raises(ValueError, match="topk_idx values must be in"):
        padded._check_dispatch(x, out_of_range, w)


def test_a_compact_dispatch_refuses_a_graph_capture(buf, monkeypatch):
    """Its host reads the output's size: inside a capture it raises before any communication."""
    monkeypatch.setattr(ubep.buffer, "graph_capturing", lambda t: True)
    with pytest.raises(RuntimeError, match="layout='compact' cannot be captured"):
        buf.dispatch(*_inputs())


def test_repeated_empty_slots_are_fine(buf):
    x, idx, w = _inputs()
    idx[:, :] = -1
    res = buf.dispatch(x, idx, w)
    assert res.recv_x.shape == (0, H)
    assert torch.equal(buf.combine(res.recv_x, res.handle), torch.zeros(T, H, dtype=x.dtype))


def test_combine_rejects(buf, single_rank_group):
    res = buf.dispatch(*_inputs())
    other = ubep.Buffer(single_rank_group, hidden=H, num_experts=E, top_k=K, max_tokens_per_rank=T,
                        dtype=torch.bfloat16)
    cases = [
        (lambda: buf.combine(res.recv_x.float(), res.handle), TypeError, "expert_out must have dtype"),
        (lambda: buf.combine(res.recv_x[1:], res.handle), ValueError, r"expert_out must have shape"),
        (lambda: other.combine(res.recv_x, res.handle), ValueError, "handle must come from"),
        (lambda: buf.combine(res.recv_x, "handle"), ValueError, "handle must come from"),
        (lambda: buf.combine(res.recv_x, res.handle, reduce="mean"), ValueError, "reduce must be"),
        (lambda: buf.combine(res.recv_x, res.handle, weighted=1), TypeError, "weighted must be"),
    ]
    for call, error, words in cases:
        with pytest.raises(error, match=words):
            call()


def test_cuda_backend_limits_are_checked_first(single_rank_group):
    common = {"num_experts": E, "top_k": K, "max_tokens_per_rank": T}
    with pytest.raises(ValueError, match="hidden must be a multiple of 8 for backend='cuda', got 20"):
        ubep.Buffer(single_rank_group, hidden=20, backend="cuda", **common)
    with pytest.raises(ValueError, match="top_k must be <= 16"):
        ubep.Buffer(single_rank_group, hidden=H, backend="cuda", num_experts=32, top_k=17,
                    max_tokens_per_rank=T)
    with pytest.raises(ValueError, match="num_experts must be <= 1024"):
        ubep.Buffer(single_rank_group, hidden=H, backend="cuda", num_experts=2048, top_k=K,
                    max_tokens_per_rank=T)
    with pytest.raises(ValueError, match="sync must be one of"):
        ubep.Buffer(single_rank_group, hidden=H, backend="cuda", sync="flag", **common)
    with pytest.raises(ValueError, match="num_sms must be >= 4 for backend='cuda' with sync='dc'"):
        ubep.Buffer(single_rank_group, hidden=H, backend="cuda", sync="dc", num_sms=3, **common)
    with pytest.raises(ValueError, match="num_sms must be >= 3 for backend='cuda' with sync='sp'"):
        ubep.Buffer(single_rank_group, hidden=H, backend="cuda", sync="sp", num_sms=2, **common)
    for sync in ("sw", "tff", "sp", "dc"):  # every mode passes the sync check, up to the device one
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            ubep.Buffer(single_rank_group, hidden=H, backend="cuda", sync=sync, num_sms=4, **common)


def test_buffer_rejects(single_rank_group):
    common = {"hidden": H, "num_experts": E, "top_k": K, "max_tokens_per_rank": T}
    with pytest.raises(ValueError, match="backend must be one of"):
        ubep.Buffer(single_rank_group, backend="mpi", **common)
    with pytest.raises(TypeError, match="dtype must be one of"):
        ubep.Buffer(single_rank_group, dtype=torch.int32, **common)
    with pytest.raises(ValueError, match="layout must be one of"):
        ubep.Buffer(single_rank_group, layout="ragged", **common)


def test_group_of_wrong_size_and_one_bad_rank_do_not_hang():
    """W = 3: 8 experts do not split over 3 ranks on any rank; then rank 1 alone passes an expert id
    out of range: it raises ValueError at once, the others end with EPCommError naming their rank
    and phase within their timeout."""
    results = run_ranks(bad_rank_worker, 3, return_failures=True, timeout_s=120)
    kinds = [(r.kind, r.message) for r in results]
    assert kinds[1][0] == "ValueError" and "topk_idx values must be in" in kinds[1][1], kinds
    for rank in (0, 2):
        kind, message = kinds[rank]
        assert kind == "EPCommError", kinds
        assert f"ubep rank {rank}: phase 'dispatch: count exchange'" in message, message


def test_each_backend_has_its_default_sync_mode(single_rank_group):
    """No `sync`: tff where it is measured safe (cuda; the reference ignores it), sw on ascend, whose
    other modes assume a tear-free 512-byte write (an explicit `sync=` opts in)."""
    from ubep.backends.ascend_library import library_path

    common = {"hidden": H, "num_experts": E, "top_k": K, "max_tokens_per_rank": T}
    assert ubep.Buffer(single_rank_group, **common).config.sync == "tff"
    assert ubep.Buffer(single_rank_group, sync="sp", **common).config.sync == "sp"
    if library_path() is not None:
        assert ubep.Buffer(single_rank_group, backend="ascend", dtype=torch.float32,
                           **common).config.sync == "sw"
