"""PNG figures of simulator scenarios (their tables: ``ubep.profiling.write_table``).

A figure is ``(kind, data, x-axis label)``. Kinds: ``gantt`` (label -> phase -> (start, end) µs:
one row of phase bars per label, like the paper's latency breakdowns), ``workers`` (variant -> µs per
worker), ``curves`` (panel -> series -> [(x, y µs)]).
"""

from __future__ import annotations

from pathlib import Path

from ubep.sim.model import PHASES


def _gantt(ax, spans: dict, xlabel: str) -> None:
    colors = dict(zip(PHASES, ("#999999", "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd"),
                      strict=True))
    labels = list(spans)
    for y, label in enumerate(labels):
        for k, phase in enumerate(PHASES):
            if phase in spans[label]:
                start, end = spans[label][phase]
                # Overlapping phases (decomposition) share a row: thin bars, offset by phase.
                ax.barh(y - 0.35 + 0.7 * k / len(PHASES), end - start, left=start,
                        height=0.7 / len(PHASES), color=colors[phase],
                        label=phase if y == 0 or phase not in spans[labels[0]] else None)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _workers(ax, lines: dict, xlabel: str) -> None:
    for name, values in lines.items():
        ax.plot(range(len(values)), values, marker=".", label=f"{name} (max {max(values):.1f})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("token-send latency (µs)")
    ax.legend(fontsize=8)


def write_figure(kind: str, data: dict, xlabel: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(data) if kind == "curves" else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if kind == "gantt":
            _gantt(ax, data, xlabel)
        elif kind == "workers":
            _workers(ax, data, xlabel)
        else:
            ax.set_xlabel(xlabel)
            for series, points in data[panel].items():
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=series)
            ax.set_title(panel, fontsize=9)
            ax.set_ylabel("dispatch latency (µs)")
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
