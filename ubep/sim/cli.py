"""``ubep simulate``: run named scenarios, print their tables, write tables and figures."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

from ubep.profiling import markdown_table, write_table
from ubep.sim.report import write_figure
from ubep.sim.scenarios import SCENARIOS, run_scenario


def scenario_list(width: int) -> str:
    """Each scenario's name and whole description, wrapped to ``width`` columns."""
    indent = max(map(len, SCENARIOS)) + 2
    return "\n".join(textwrap.fill(" ".join(fn.__doc__.split()), width, initial_indent=f"{name:<{indent}}",
                                   subsequent_indent=" " * indent, break_on_hyphens=False)
                     for name, fn in SCENARIOS.items())


def run_simulate(scenario: str, out: str, list_only: bool) -> int:
    if list_only:
        print(scenario_list(min(100, shutil.get_terminal_size().columns)))
        return 0
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"ubep simulate: unknown scenario {unknown[0]!r}; one of {sorted(SCENARIOS)} or 'all'",
              file=sys.stderr)
        return 2
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(f"running {name} ...", flush=True)
        rows, figures, seconds = run_scenario(name)
        write_table(rows, folder / name)
        title = f"{name}: {SCENARIOS[name].__doc__.split(',')[0]}"
        for filename, (kind, data, xlabel) in figures.items():
            write_figure(kind, data, xlabel, folder / filename, title)
        print(markdown_table(rows))
        print(f"{name}: {seconds:.1f} s; wrote {folder / name}.csv, .md and "
              f"{', '.join(str(folder / f) for f in figures)}\n", flush=True)
    return 0
