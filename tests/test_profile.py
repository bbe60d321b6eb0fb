"""`ubep profile`: per-phase breakdown per rank, CSV and stacked-bar PNG."""

import pytest

from ubep.cli import main

pytest.importorskip("matplotlib", reason="the breakdown plot needs matplotlib (the 'sim' extras)")


def test_profile_writes_breakdown(tmp_path, capsys):
    args = ["profile", "--ranks", "2", "--tokens", "16", "--hidden", "40", "--experts", "8",
            "--top-k", "2", "--iters", "3", "--reduce", "expert_rank", "--out", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "rank 1" in out and "combine: local reduce" in out
    rows = (tmp_path / "breakdown.csv").read_text().splitlines()
    assert rows[0] == "rank,phase,calls,median_us,min_us,max_us"
    assert any(r.startswith("1,dispatch: count exchange,3,") for r in rows)
    assert (tmp_path / "breakdown.png").stat().st_size > 5_000


def test_profile_passes_an_sm_budget(tmp_path, capsys):
    args = ["profile", "--ranks", "2", "--tokens", "8", "--hidden", "16", "--experts", "4",
            "--top-k", "2", "--iters", "1", "--num-sms", "6", "--out", str(tmp_path)]
    assert main(args) == 0
    assert "num_sms=6" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(args[:-4] + ["--num-sms", "0"])


def test_profile_calls_smaller_than_the_buffer(tmp_path, capsys):
    """A decode step in a buffer made for more tokens (the size the title gives is the buffer's own);
    a buffer smaller than the call is refused before any rank starts."""
    args = ["profile", "--ranks", "2", "--tokens", "4", "--hidden", "16", "--experts", "4",
            "--top-k", "2", "--iters", "1", "--layout", "padded", "--out", str(tmp_path)]
    assert main(args + ["--buffer-tokens", "32"]) == 0
    assert "4 tokens" in (out := capsys.readouterr().out) and "buffer of 32 tokens" in out
    with pytest.raises(SystemExit):
        main(args + ["--buffer-tokens", "3"])
