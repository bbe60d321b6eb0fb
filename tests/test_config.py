"""EPConfig validation: each bad field fails with a message that names it."""

import pytest
import torch

from ubep import EPConfig

GOOD = {"world_size": 4, "rank": 1, "hidden": 1024, "num_experts": 64, "top_k": 8,
        "max_tokens_per_rank": 256, "dtype": torch.bfloat16}


def test_worked_example():
    cfg = EPConfig(**GOOD)
    assert cfg.num_local_experts == 16
    assert cfg.local_experts == range(16, 32)
    assert cfg.expert_capacity == 1024


@pytest.mark.parametrize(("field", "value", "error", "words"), [
    ("world_size", 0, ValueError, "world_size must be >= 1"),
    ("rank", 4, ValueError, "rank must be in"),
    ("rank", -1, ValueError, "rank must be in"),
    ("hidden", 0, ValueError, "hidden must be >= 1"),
    ("hidden", 1024.0, TypeError, "hidden must be an int"),
    ("num_experts", 63, ValueError, "num_experts must be a multiple of the group size 4"),
    ("top_k", 65, ValueError, "top_k must be <= num_experts"),
    ("top_k", True, TypeError, "top_k must be an int"),
    ("max_tokens_per_rank", -3, ValueError, "max_tokens_per_rank must be >= 1"),
    ("max_tokens_per_rank", 2**30, ValueError, "max_tokens_per_rank=1073741824"),
    ("dtype", torch.int8, TypeError, "dtype must be one of"),
    ("layout", "dense", ValueError, "layout must be one of"),
    ("sync", "flag", ValueError, "sync must be one of"),
    ("timeout_s", 0, ValueError, "timeout_s must be > 0"),
    ("num_sms", 0, ValueError, "num_sms must be >= 1"),
    ("num_sms", 2.5, TypeError, "num_sms must be an int"),
])
def test_bad_field_is_named(field, value, error, words):
    with pytest.raises(error, match=words):
        EPConfig(**{**GOOD, field: value})


def test_frozen():
    cfg = EPConfig(**GOOD)
    with pytest.raises(AttributeError):
        cfg.hidden = 7
