"""Draw measurements of docs/bench/history.csv against their date, one line per configuration.

    python benchmarks/plot_history.py --figure "dispatch median" --config "tokens=128;" \
        --config "sync=sw;" --config "mode=graph-queued" --out history-plots

history.csv holds one row per figure: ``date,commit,hardware,command,configuration,figure,value,unit``
(``configuration`` a ``key=value;...`` string). ``--figure`` and each ``--config`` keep the rows whose
figure / configuration contain that text; the rows left must share one unit. Each line is one
(hardware, configuration, figure), the configuration without the keys that only tell repeats of one
measurement apart (DETAIL_KEYS: round, run, call, copy, and the launch's program count, which follows
the code), drawn through each day's median with every measurement as a dot; a legend entry names
only the keys in which the lines differ. Writes ``<out>/history-<figure>.png`` and prints its path.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections import defaultdict
from datetime import date
from pathlib import Path

COLUMNS = ("date", "commit", "hardware", "command", "configuration", "figure", "value", "unit")
DEFAULT_CSV = Path(__file__).resolve().parent.parent / "docs" / "bench" / "history.csv"
MAX_LEGEND = 24  # lines beyond this are drawn without a legend entry
DETAIL_KEYS = ("round", "run", "call", "copy", "programs")  # repeats of a measurement: one line


def read_rows(path: Path) -> list[dict[str, str]]:
    """Every row of ``path`` as a dict of the eight columns (ValueError on any other header)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        return list(reader)


def select(rows: list[dict[str, str]], figure: str = "",
           configs: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """Rows whose figure contains ``figure`` and whose configuration contains every one of ``configs``."""
    return [r for r in rows if figure in r["figure"] and all(c in r["configuration"] for c in configs)]


def config_dict(configuration: str) -> dict[str, str]:
    """``"W=1;tokens=128"`` -> ``{"W": "1", "tokens": "128"}``."""
    return dict(part.split("=", 1) for part in configuration.split(";") if part)


def line_key(configuration: str) -> str:
    """The configuration less DETAIL_KEYS: ``"W=1;tokens=16;round=2"`` -> ``"W=1;tokens=16"``."""
    return ";".join(f"{k}={v}" for k, v in config_dict(configuration).items() if k not in DETAIL_KEYS)


def series(rows: list[dict[str, str]]) -> dict[tuple[str, str, str], list[tuple[date, float]]]:
    """(hardware, configuration less DETAIL_KEYS, figure) -> its (date, value) points in date order."""
    lines: dict[tuple[str, str, str], list[tuple[date, float]]] = defaultdict(list)
    for r in rows:
        lines[(r["hardware"], line_key(r["configuration"]), r["figure"])].append(
            (date.fromisoformat(r["date"]), float(r["value"])))
    return {key: sorted(points, key=lambda p: p[0]) for key, points in lines.items()}


def labels(keys: list[tuple[str, str, str]]) -> list[str]:
    """A legend entry per line: the hardware, configuration keys and figure where lines differ."""
    items = [{"hardware": hw, **config_dict(cfg), "figure": fig} for hw, cfg, fig in keys]
    names = list(dict.fromkeys(name for item in items for name in item))
    differ = [n for n in names if len({item.get(n, "") for item in items}) > 1]
    return [";".join(f"{n}={item[n]}" for n in differ if n in item) or "no " + ", no ".join(differ)
            for item in items]


def plot(rows: list[dict[str, str]], out_dir: Path, title: str) -> Path:
    """Draw ``rows`` (one unit) to ``out_dir``/history-<title>.png; return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    units = sorted({r["unit"] for r in rows})
    if len(units) != 1:
        raise ValueError(f"the selected rows mix units {units}: narrow --figure or --config")
    lines = series(rows)
    keys = sorted(lines)
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for i, (key, label) in enumerate(zip(keys, labels(keys), strict=True)):
        when, values = zip(*lines[key], strict=True)
        days = sorted(set(when))
        middle = [statistics.median(v for d, v in lines[key] if d == day) for day in days]
        (drawn,) = ax.plot(days, middle, label=label if i < MAX_LEGEND else None)  # a day's median
        ax.scatter(when, values, s=12, color=drawn.get_color())  # every measurement
    ax.xaxis.set_major_locator(mdates.DayLocator())
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
    ax.set_xlabel("date")
    ax.set_ylabel(units[0])
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if keys:
        ax.legend(fontsize=7, loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-") or "all"
    path = out_dir / f"history-{slug}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV, help="the history file (default: %(default)s)")
    p.add_argument("--figure", default="", help="keep rows whose figure contains this text")
    p.add_argument("--config", action="append", default=[],
                   help="keep rows whose configuration contains this text (repeat to require several)")
    p.add_argument("--out", type=Path, required=True, help="folder for the PNG")
    args = p.parse_args(argv)
    rows = select(read_rows(args.csv), args.figure, tuple(args.config))
    if not rows:
        print(f"no row of {args.csv} matches --figure {args.figure!r} --config {args.config!r}",
              file=sys.stderr)
        return 1
    print(plot(rows, args.out, args.figure or "all figures"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
