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


def test_breakdown_title_fits_in_the_png(tmp_path, monkeypatch):
    """A long title (a run's options) is wrapped inside the figure, not clipped at its edges."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from ubep.breakdown import write_outputs

    saved = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (saved.append(fig), save(fig, *a, **kw)))
    title = ("2 ranks, 4096 tokens, hidden 7168, 256 experts, top-8, bfloat16, compact, "
             "reduce=expert_rank, num_sms=24, buffer of 8192 tokens")
    per_rank = [{"dispatch: count exchange": [5.0, 6.0], "combine: send": [7.0]}] * 2
    write_outputs(per_rank, 2, tmp_path, title)
    (fig,) = saved
    canvas = FigureCanvasAgg(fig)  # closing the figure took its own canvas away
    canvas.draw()
    renderer = canvas.get_renderer()
    (shown,) = [t for t in fig.findobj(Text) if " ".join(t.get_text().split()) == title]
    box, page = shown.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
