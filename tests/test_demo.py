"""`ubep demo` end to end on small shapes: forward and gradients against the single-process layer."""

import pytest

from ubep.backends.ascend_library import library_path
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
    assert "(once per destination rank) vs" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS")


@pytest.mark.skipif(library_path() is None,
                    reason="the ascend operator library is not built (./build.sh test builds it)")
def test_demo_on_the_ascend_backend_reports_without_wire_bytes(capsys):
    """The ascend backend's handles carry no wire counts: the report says so and goes on."""
    assert main(["demo", *SMALL, "--ranks", "2", "--backend", "ascend"]) == 0
    out = capsys.readouterr().out
    assert "backend ascend" in out
    assert "dispatch bytes to other ranks: not reported by this backend" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS")


def test_demo_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--ranks", "3", "--experts", "8"])
    assert "--experts 8 must be a multiple of --ranks 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--tokens", "0"])
