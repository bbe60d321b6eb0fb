"""``ubep profile`` from inside a serving engine or a training job: ``UBEP_PROFILE=<dir>`` in the
environment turns on per-phase timing in every Buffer the process makes (``Buffer(profile=None)``,
the default), and the process writes the breakdown of everything its Buffers timed when it exits:
``<dir>/rank<R>-pid<P>/breakdown.csv``, ``.md`` and ``.png`` (``R``: the process's rank in the
default group when its first Buffer was made).

The engine's worker processes end in different ways: a plain interpreter exit runs ``atexit``, a
``multiprocessing`` child runs only its own finalizers, so both are registered (the report is written
once); :func:`write_report` writes it on demand. Each Buffer's phases appear under its own label
(backend, layout, ``W``, ``T_max``), since an engine's decode and prefill Buffers time different
calls.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from ubep.profiling import PhaseTimer

ENV = "UBEP_PROFILE"


def requested() -> bool:
    """Whether ``UBEP_PROFILE`` names a directory to write reports into."""
    return bool(os.environ.get(ENV, "").strip())


@dataclass
class _Report:
    out: Path
    rank: int
    timers: list[tuple[str, PhaseTimer]] = field(default_factory=list)
    written: bool = False


_REPORT: _Report | None = None


def register(label: str, timer: PhaseTimer) -> None:
    """Report ``timer``'s phases under ``label`` when the process exits (the first registration
    arranges the writing)."""
    global _REPORT
    if _REPORT is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        out = Path(os.environ[ENV]).expanduser() / f"rank{rank}-pid{os.getpid()}"
        _REPORT = _Report(out, rank)
        atexit.register(write_report)
        multiprocessing.util.Finalize(None, write_report, exitpriority=100)
    _REPORT.timers.append((label, timer))


def write_report() -> list[Path]:
    """Write this process's breakdown now (once; later calls return ``[]``): every registered
    Buffer's phases, each name prefixed by its Buffer's label."""
    from ubep.breakdown import write_outputs  # matplotlib: only when a report is written

    report = _REPORT
    if report is None or report.written:
        return []
    report.written = True
    samples: dict[str, list[float]] = {}
    for label, timer in report.timers:
        for phase, values in timer.samples().items():
            samples.setdefault(f"{label}: {phase}", []).extend(values)
    if not samples:
        return []
    report.out.mkdir(parents=True, exist_ok=True)
    title = f"ubep phases in process {os.getpid()} (rank {report.rank}), whole run"
    return write_outputs([samples], 1, report.out, title, ranks=[report.rank],
                         ylabel="µs over the run (median x calls, per phase)")
