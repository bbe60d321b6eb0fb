"""The CUDA backend's cached launches (``launcher``): keyed on all Triton specializes on, arguments
bound once in their place, and a launch through the compiled kernel computes what Triton's own path
does (GPU part)."""

import pytest
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402

from ubep.backends.cuda.launcher import Constants, Launcher, _arg_key, runtime_names  # noqa: E402


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


def test_bound_arguments_take_their_place_among_the_runtime_ones():
    assert runtime_names(_shift_add) == ["src_ptr", "dst_ptr", "n"]
    launch = Launcher(_shift_add, dst_ptr="bound")
    assert launch.template == [None, "bound", None] and launch.slots == [0, 2]
    with pytest.raises(TypeError, match="ADD"):  # a constant is not a runtime argument
        Launcher(_shift_add, ADD=1)


def test_constants_compare_by_value_and_keep_their_order():
    a, b = Constants(4, ADD=1, BLOCK=128), Constants(4, ADD=1, BLOCK=128)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Constants(4, 64, ADD=1, BLOCK=128) and a != Constants(8, ADD=1, BLOCK=128)
    assert list(a.values) == ["ADD", "BLOCK"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cached_launches_compute_what_triton_does():
    launch = Launcher(_shift_add)
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    for offset, add in [(0, 1), (0, 1), (1, 1), (1, 1), (0, 5), (4, 5), (4, 5)]:
        n = src.numel() - offset
        dst = torch.zeros(n, dtype=torch.int32, device="cuda")
        launch(triton.cdiv(n, 128), src[offset:], dst, n, constants=Constants(4, ADD=add, BLOCK=128))
        torch.testing.assert_close(dst, src[offset:] + add, rtol=0, atol=0)
    # one compiled launch per (constant, source aligned or not); n stays in one class
    assert len(launch.compiled) == 3
    for _ in range(2):  # a register budget is one more build, launched like the others
        dst = torch.zeros(1000, dtype=torch.int32, device="cuda")
        launch(8, src, dst, 1000, constants=Constants(4, 64, ADD=2, BLOCK=128))
        torch.testing.assert_close(dst, src + 2, rtol=0, atol=0)
    assert len(launch.compiled) == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bound_arguments_reach_the_compiled_kernel():
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    dst = torch.zeros(1000, dtype=torch.int32, device="cuda")
    launch = Launcher(_shift_add, src_ptr=src, n=1000)
    for add in (3, 3, 7):  # the second launch of a key goes through the compiled kernel
        launch(8, dst, constants=Constants(4, ADD=add, BLOCK=128))
        torch.testing.assert_close(dst, src + add, rtol=0, atol=0)
    assert len(launch.compiled) == 2
