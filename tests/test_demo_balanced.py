"""`ubep demo --balance redundant` end to end on small shapes: rows with and without balancing,
the plan, weight bytes, and a bit-exact check against the one-process layer."""

import re

import pytest

from ubep.backends.ascend_library import library_path
from ubep.cli import main

SMALL = ["--ranks", "3", "--tokens", "12", "--hidden", "16", "--experts", "6", "--top-k", "2",
         "--intermediate", "8", "--dtype", "fp32"]


@pytest.mark.parametrize("backend", ["reference", "ascend"])
def test_balanced_demo_passes(capsys, backend):
    if backend == "ascend" and library_path() is None:
        pytest.skip("the ascend operator library is not built (./build.sh test)")
    assert main(["demo", *SMALL, "--balance", "redundant", "--maxvio", "3", "--backend", backend]) == 0
    out = capsys.readouterr().out
    assert f"rows through backend {backend}," in out
    table = re.findall(r"^\s+(\d)\s+(\d+)\s+(\d+)\s+\[([\d, ]*)\]", out, re.MULTILINE)
    assert [int(rank) for rank, *_ in table] == [0, 1, 2]
    assert [int(balanced) for _, _, balanced, _ in table] == [24, 24, 24]  # S * K everywhere
    assert int(table[0][1]) > 24  # expert 0 is hot: its home was overloaded
    assert any(borrowed for *_, borrowed in table)
    assert "1.00 balanced" in out
    for name in ("y", "grad_x", "grad_gate", "grad_weights"):
        assert re.search(rf"^  {name}\s+bit-exact\s+PASS$", out, re.MULTILINE), name
    assert out.rstrip().splitlines()[-1].startswith("PASS")


@pytest.mark.parametrize("extra, message", [
    (["--balance", "redundant", "--reduce", "expert_rank"],
     "--balance redundant runs on the reference or ascend backend, compact layout, reduce=source; "
     "not with --reduce expert_rank"),
    (["--balance", "redundant", "--backend", "cuda"],
     "--balance redundant runs on the reference or ascend backend, compact layout, reduce=source; "
     "not with --backend cuda"),
    (["--maxvio", "3"], "--maxvio needs --balance redundant"),
])
def test_balanced_demo_refuses(capsys, extra, message):
    with pytest.raises(SystemExit):
        main(["demo", *SMALL, *extra])
    assert message in capsys.readouterr().err
