"""`ubep demo --balance redundant` end to end on small shapes: rows with and without balancing,
the plan, weight bytes, and a bit-exact check against the one-process layer."""

import re

import pytest

from ubep.cli import main

SMALL = ["--ranks", "3", "--tokens", "12", "--hidden", "16", "--experts", "6", "--top-k", "2",
         "--intermediate", "8", "--dtype", "fp32"]


def test_balanced_demo_passes(capsys):
    assert main(["demo", *SMALL, "--balance", "redundant", "--maxvio", "3"]) == 0
    out = capsys.readouterr().out
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
     "--balance redundant runs on the reference backend, compact layout, reduce=source; "
     "not with --reduce expert_rank"),
    (["--maxvio", "3"], "--maxvio needs --balance redundant"),
])
def test_balanced_demo_refuses(capsys, extra, message):
    with pytest.raises(SystemExit):
        main(["demo", *SMALL, *extra])
    assert message in capsys.readouterr().err
