"""Per-phase timers, breakdown tables, and the CSV / Markdown table writer of reports.

A backend wraps each phase of a call in ``timer.phase(name)``. On CPU tensors the phase is timed with
``time.perf_counter``; on CUDA and NPU tensors with a pair of device events, read only when a report is
asked for, so timing adds no host synchronization to the hot path. Timing is off unless ``enabled``.
"""

from __future__ import annotations

import csv
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class PhaseTimer:
    """Collects durations, in microseconds, per phase name over many calls."""

    enabled: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    _cpu_us: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    _pending: list[tuple[str, object, object]] = field(default_factory=list)
    _deferred: list = field(default_factory=list)

    @contextmanager
    def phase(self, name: str):
        """Times the block as phase ``name``; also a ``ubep::<name>`` range of torch's profiler (and of
        torch_npu's, which records the same ranges), so an engine's own traces show ubep's phases."""
        if not self.enabled:
            yield
            return
        with torch.profiler.record_function(f"ubep::{name}"):
            if self.device.type in ("cuda", "npu"):  # device events, read when a report is asked for
                start, end = (getattr(torch, self.device.type).Event(enable_timing=True) for _ in range(2))
                start.record()
                yield
                end.record()
                self._pending.append((name, start, end))
            else:
                t0 = time.perf_counter()
                yield
                self._cpu_us[name].append((time.perf_counter() - t0) * 1e6)

    def defer(self, phases) -> None:
        """Add the samples ``phases()`` returns (a dict name -> µs) when they are next read: a backend
        whose times sit in device memory reads them only then, so profiling adds no host sync."""
        if self.enabled:
            self._deferred.append(phases)

    def samples(self) -> dict[str, list[float]]:
        """Durations in µs per phase, in call order; resolves pending CUDA events and deferred
        device-side times."""
        for phases in self._deferred:
            for name, us in phases().items():
                self._cpu_us[name].append(us)
        self._deferred.clear()
        if self._pending:
            self._pending[-1][2].synchronize()
            for name, start, end in self._pending:
                self._cpu_us[name].append(start.elapsed_time(end) * 1e3)
            self._pending.clear()
        return dict(self._cpu_us)

    def reset(self) -> None:
        self._cpu_us.clear()
        self._pending.clear()
        self._deferred.clear()


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def breakdown_table(samples: dict[str, list[float]], title: str = "phase") -> str:
    """A fixed-width table: phase, calls, median µs, min µs, max µs, share of the summed medians."""
    rows = [(name, len(v), median(v), min(v), max(v)) for name, v in samples.items() if v]
    total = sum(r[2] for r in rows) or 1.0
    width = max([len(title)] + [len(r[0]) for r in rows])
    lines = [f"{title:<{width}}  calls  median µs     min µs     max µs   share"]
    for name, calls, med, lo, hi in rows:
        lines.append(
            f"{name:<{width}}  {calls:>5}  {med:>9.1f}  {lo:>9.1f}  {hi:>9.1f}  {med / total:>6.1%}"
        )
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """A Markdown table of ``rows`` (dicts with the same keys, in column order)."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write_table(rows: list[dict], path_stem: Path, title: str = "") -> str:
    """``<stem>.csv`` and ``<stem>.md`` (``title``, then the table) of ``rows``; returns the Markdown."""
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    with open(path_stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = (f"{title}\n\n" if title else "") + markdown_table(rows) + "\n"
    path_stem.with_suffix(".md").write_text(text)
    return text
