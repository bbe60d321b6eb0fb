"""`ubep demo` end to end on small shapes: forward and gradients against the single-process layer."""

import pytest

from ubep.cli import main

SMALL = ["--tokens", "24", "--hidden", "72", "--experts", "12", "--top-k", "3",
         "--intermediate", "40", "--iters", "2"]


@pytest.mark.parametrize("extra", [
    ["--ranks", "2", "--dtype", "fp32"],
    ["--ranks", "3", "--layout", "padded", "--reduce", "expert_rank", "--dtype", "bf16"],
])
def test_demo_passes(capsys, extra):
    assert main(["demo", *SMALL, *extra]) == 0
    out = capsys.readouterr().out
    assert "forward y       bit-exact" in out
    assert "dispatch: count exchange" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS")


def test_demo_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--ranks", "3", "--experts", "8"])
    assert "--experts 8 must be a multiple of --ranks 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--tokens", "0"])
