"""Phase times measured inside the CUDA backend's kernels (``Buffer(profile=True)``).

With profiling on, each program of a launch writes four ``%globaltimer`` stamps (ns): start, first
wait over (slot acks for writers, records for readers; for ``dc``'s verifiers, their first pass over
an arrived batch, so that rounds asked for after it show before their end), work done, finished;
off, the kernels are compiled without them. Program ids map to groups in launch order: dispatch
``count, token, verify, receive``; combine ``send, verify, reduce`` (``verify``: ``dc`` only). Per
group this gives two phases, ``"<op> <group>: wait"`` (the longest wait of one of its programs)
and ``"<op> <group>: done at"`` (when its last program finished its work, from the launch's first
stamp), and ``"<op>: kernel"`` (when the last program finished). The groups run at once, so these
are points on one timeline, not parts of a sum. An operation that launches twice (the compact
dispatch; any operation under an SM budget in the compact layout) names its first launch's phases
``"<op> (writers) ..."``, and the time between its launches ``"<op>: between launches"``
(:func:`between_launches`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUPS = {"dispatch": ("count", "token", "verify", "receive"),
          "combine": ("send", "verify", "reduce")}


@dataclass(frozen=True)
class LaunchStamps:
    """One launch's ``stamps [programs, 4]`` int64 (on its device) and programs per group;
    ``label`` names the launch in phases and timelines (an operation may launch twice)."""

    op: str
    sizes: tuple[int, ...]
    stamps: torch.Tensor
    label: str

    def _groups(self, host: torch.Tensor):
        first = 0
        for name, size in zip(GROUPS[self.op], self.sizes, strict=True):
            if size:
                yield name, first, host[first : first + size]
            first += size

    def phases(self) -> dict[str, float]:
        """Phase name -> µs (see the module doc)."""
        host = self.stamps.cpu()
        t0 = host[:, 0].min()
        out = {}
        for name, _, g in self._groups(host):
            out[f"{self.label} {name}: wait"] = float((g[:, 1] - g[:, 0]).max()) / 1e3
            out[f"{self.label} {name}: done at"] = float((g[:, 2] - t0).max()) / 1e3
        out[f"{self.label}: kernel"] = float((host[:, 3] - t0).max()) / 1e3
        return out

    def timeline(self) -> list[dict]:
        """One row per program: its launch (``op``: the label), its group and its four stamps in µs
        from the launch's first one."""
        host = self.stamps.cpu()
        t0 = host[:, 0].min()
        rows = []
        for name, first, g in self._groups(host):
            for i, s in enumerate(((g - t0).double() / 1e3).tolist()):
                rows.append({"op": self.label, "group": name, "program": first + i,
                             "start_us": round(s[0], 2), "wait_end_us": round(s[1], 2),
                             "work_end_us": round(s[2], 2), "end_us": round(s[3], 2)})
        return rows


def between_launches(first: LaunchStamps, second: LaunchStamps) -> dict[str, float]:
    """``"<op>: between launches"``: µs from the last program of ``first`` finishing to the first
    program of ``second`` starting, two launches of one call: the GPU idle while the host reads
    what it needs from the first (the compact dispatch's sizes) and queues the second."""
    gap = int(second.stamps[:, 0].min()) - int(first.stamps[:, 3].max())
    return {f"{second.op}: between launches": gap / 1e3}
