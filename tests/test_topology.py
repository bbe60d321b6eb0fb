"""Topology: hop classes of the presets, worked examples, validation."""

import pytest
import torch

from ubep import topology
from ubep.topology import Topology


def test_hierarchical_worked_example():
    t = topology.hierarchical("x", 32, (2, 16), ("a", "b", "c"), (1.0, 2.0, 3.0), (1.0, 1.0, 1.0))
    assert (t.hop(0, 1), t.hop(0, 5), t.hop(0, 20), t.hop(17, 16)) == (0, 1, 2, 0)
    assert torch.equal(t.hops, t.hops.t())


def test_flat():
    t = topology.flat(4)
    assert t.hops.tolist() == [[0, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]]
    assert t.num_classes == 2 and t.world_size == 4


def test_cm384_classes():
    t = topology.cm384(64, npus_per_board=16)
    # dies 0,1: one NPU; dies 0..31: one board of 16 NPUs; dies 32..63: the next board.
    assert (t.hop(0, 1), t.hop(0, 2), t.hop(0, 31), t.hop(0, 32)) == (0, 1, 1, 2)
    counts = t.class_counts(0, torch.arange(64))
    assert counts.tolist() == [2, 30, 32]
    assert t.latency_ns[2] / t.latency_ns[0] <= 11.5
    assert topology.cm384().world_size == 768
    with pytest.raises(ValueError, match="num_dies must be in"):
        topology.cm384(769)


def test_class_counts_ignores_empty_slots():
    t = topology.flat(3)
    assert t.class_counts(1, torch.tensor([[0, 1], [-1, 2]])).tolist() == [1, 2]


def test_transfer_time():
    t = topology.flat(2, latency_ns=500.0, bandwidth_gbps=400.0)
    assert t.transfer_ns(0, 1, 14336) == pytest.approx(500.0 + 14336 / 400.0)


def test_nvl72_and_detection_fallback():
    assert topology.nvl72().world_size == 72
    with pytest.raises(ValueError, match="<= 72"):
        topology.nvl72(80)
    detected = topology.detect_nvidia(2) if torch.cuda.is_available() else topology.detect_nvidia()
    assert detected.hops.diagonal().eq(0).all()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"hops": torch.zeros(2, 3, dtype=torch.int64)}, "square"),
    ({"hops": torch.zeros(2, 2, dtype=torch.int32)}, "int64"),
    ({"hops": torch.tensor([[0, 2], [1, 0]])}, r"hops values must be in \[0, 2\)"),
    ({"hops": torch.tensor([[1, 1], [1, 0]])}, "0 on the diagonal"),
    ({"latency_ns": (5.0, 1.0)}, "must not decrease"),
    ({"bandwidth_gbps": (1.0,)}, "one entry per class"),
    ({"bandwidth_gbps": (1.0, 0.0)}, "must be > 0"),
])
def test_validation(kwargs, words):
    good = {"name": "t", "hops": torch.tensor([[0, 1], [1, 0]]), "class_names": ("self", "far"),
            "latency_ns": (0.0, 1.0), "bandwidth_gbps": (1.0, 1.0)}
    with pytest.raises((ValueError, TypeError), match=words):
        Topology(**{**good, **kwargs})


def test_tiers_must_nest():
    with pytest.raises(ValueError, match="tiers must grow"):
        topology.hierarchical("x", 8, (2, 3), ("a", "b", "c"), (0, 1, 2), (1, 1, 1))
