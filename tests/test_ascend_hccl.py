"""The NPU side of backend="ascend" that a CPU can check: whether ``HCCL_BUFFSIZE`` holds the layer's window
(the check the ops' host tiling makes too, asked here before any communication) and how the backend finds
the HCCL group's name. The NPU ops themselves need torch_npu and CANN and are not run here."""

import re

import pytest
import torch

from ubep.backends.ascend_library import library_path
from ubep.backends.ascend_windows import check_hccl_buffsize, group_windows, hccl_windows
from ubep.config import EPConfig

pytestmark = pytest.mark.skipif(library_path() is None,
                                reason="the ascend operator library is not built (./build.sh test builds it)")

SMALL = EPConfig(world_size=8, rank=3, hidden=1024, num_experts=16, top_k=2, max_tokens_per_rank=16,
                 dtype=torch.bfloat16)
# 64 dies, 256 tokens of 7168 bf16, top-8: far more than HCCL's default 200 MB.
LARGE = EPConfig(world_size=64, rank=0, hidden=7168, num_experts=256, top_k=8, max_tokens_per_rank=256,
                 dtype=torch.bfloat16, sync="dc")
NEEDED = re.compile(r"needs (\d+) bytes per rank, but HCCL_BUFFSIZE is (\d+) MB.* gives (\d+) bytes: "
                    r"set HCCL_BUFFSIZE=(\d+) \(MB\)")


def needed_mb(cfg: EPConfig) -> int:
    """The HCCL_BUFFSIZE the error asks for, after checking the message's arithmetic."""
    with pytest.raises(ValueError, match="HCCL_BUFFSIZE") as err:
        check_hccl_buffsize(cfg)
    need_bytes, have_mb, have_bytes, ask_mb = (int(v) for v in NEEDED.search(str(err.value)).groups())
    assert have_bytes == have_mb << 20 < need_bytes <= ask_mb << 20 and (ask_mb - 1) << 20 < need_bytes
    return ask_mb


def test_default_holds_a_small_layer(monkeypatch):
    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    check_hccl_buffsize(SMALL)


def test_too_small_names_the_variable_and_the_bytes(monkeypatch):
    monkeypatch.delenv("HCCL_BUFFSIZE", raising=False)
    with pytest.raises(ValueError, match=r"HCCL_BUFFSIZE is 200 MB \(unset: HCCL's default\)"):
        check_hccl_buffsize(LARGE)
    ask = needed_mb(LARGE)
    monkeypatch.setenv("HCCL_BUFFSIZE", str(ask - 1))
    assert needed_mb(LARGE) == ask
    monkeypatch.setenv("HCCL_BUFFSIZE", str(ask))
    check_hccl_buffsize(LARGE)


@pytest.mark.parametrize("value", ["", "abc", "0", "-4", "12.5", "99999999999999999999"])
def test_a_value_that_is_not_whole_megabytes_is_rejected(monkeypatch, value):
    monkeypatch.setenv("HCCL_BUFFSIZE", value)
    with pytest.raises(ValueError, match=f"HCCL_BUFFSIZE must be a whole number of MB >= 1, got '{value}'"):
        check_hccl_buffsize(SMALL)


class FakeNpuGroup:
    """A process group's HCCL side as torch_npu exposes it:
    ``_get_backend(device).get_hccl_comm_name(rank)``."""

    def __init__(self):
        self.asked = []

    def _get_backend(self, device):
        self.asked.append(device)
        return self

    def get_hccl_comm_name(self, rank):
        self.asked.append(rank)
        return f"hccl-comm-{rank}"


def test_npu_windows_are_the_hccl_groups(monkeypatch):
    monkeypatch.setenv("HCCL_BUFFSIZE", "200")
    group, device = FakeNpuGroup(), "the buffer's npu device"
    windows = hccl_windows(group, device, SMALL.rank, 1234)
    assert (windows.name, windows.tensors, windows.nonce) == ("hccl-comm-3", [], 1234)
    assert group.asked == [device, 3]


def test_npu_windows_check_hccl_buffsize_before_asking_hccl(monkeypatch):
    monkeypatch.setenv("HCCL_BUFFSIZE", "1")
    group = FakeNpuGroup()
    with pytest.raises(ValueError, match="set HCCL_BUFFSIZE="):
        group_windows(LARGE, group, torch.device("privateuseone"))  # torch_npu's "npu"
    assert group.asked == []
