"""The CUDA backend's cached launches (``launcher``): keyed on all Triton specializes on, and a
launch through the compiled kernel computes what Triton's own path does (GPU part)."""

import pytest
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from ubep.backends.cuda.launcher import Launcher, _arg_key  # noqa: E402


def test_key_tells_apart_what_triton_specializes_on():
    base = torch.zeros(64, dtype=torch.int16)
    assert _arg_key(base) == (torch.int16, True)
    assert _arg_key(base[1:]) == (torch.int16, False)  # 2 bytes in: not 16-byte aligned
    assert _arg_key(base[8:]) == (torch.int16, True)
    assert _arg_key(base.view(torch.bfloat16)) == (torch.bfloat16, True)
    assert _arg_key(True) is bool and _arg_key(0) != _arg_key(False)
    assert _arg_key(1) != _arg_key(3)  # Triton treats 1 apart
    assert _arg_key(32) != _arg_key(33)  # and multiples of 16
    assert _arg_key(33) == _arg_key(35)
    assert _arg_key(1 << 40)[0] is False and _arg_key(-(1 << 31))[0] is True  # width class


@triton.jit
def _shift_add(src_ptr, dst_ptr, n, ADD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n) + ADD, mask=offs < n)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_launches_compute_what_triton_does():
    launch = Launcher(_shift_add)
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    for offset, add in [(0, 1), (0, 1), (1, 1), (1, 1), (0, 5), (4, 5), (4, 5)]:
        n = src.numel() - offset
        dst = torch.zeros(n, dtype=torch.int32, device="cuda")
        launch(triton.cdiv(n, 128), src[offset:], dst, n, num_warps=4, ADD=add, BLOCK=128)
        torch.testing.assert_close(dst, src[offset:] + add, rtol=0, atol=0)
    # one compiled launch per (constant, source aligned or not); n stays in one class
    assert len(launch.compiled) == 3
    for _ in range(2):  # a register budget is one more build, launched like the others
        dst = torch.zeros(1000, dtype=torch.int32, device="cuda")
        launch(8, src, dst, 1000, num_warps=4, maxnreg=64, ADD=2, BLOCK=128)
        torch.testing.assert_close(dst, src + 2, rtol=0, atol=0)
    assert len(launch.compiled) == 4
