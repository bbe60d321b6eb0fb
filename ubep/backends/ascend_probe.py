"""The probe of the tear-free 512-byte write, for NPU users who opt into ``tff``, ``sp`` or ``dc``.

Those modes take a 512-byte block of a row once its head 32 bytes show the call's flag, which holds
only if a block one ``DataCopy`` wrote into a peer's window is seen whole by the peer's loads; no
CANN document states it (docs/ASCEND.md, "What each mode assumes"). :func:`probe_blocks` runs the
``probe`` op (``ascend_ops/op_kernel/probe_kernel.cpp``) on a process group: half the AIVs of every
die write rows of 512-byte blocks into the next die's window, round after round, every word of
round ``i`` holding ``i``; the other half load their own window's rows as a ``tff`` receiver does
and count, for each block whose head shows a new round, the words older than the head. Any older
word means ``tff`` and ``sp`` could take stale data on this hardware; ``sw``, the default, does not
rest on the assumption.

    ubep probe --device npu --ranks 2     # on an A3 with CANN and the operator package installed
    ubep probe --ranks 2                  # on the CPU twin (chunks whole by construction: 0 older)

A probe is a collective over the group's windows: it prepares them for its own layer, so the
group's next Buffer call prepares them again for its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ubep.backends import collectives
from ubep.backends.ascend import NPU_AIVS, TWIN_AIVS
from ubep.backends.ascend_library import load_ops
from ubep.backends.ascend_windows import group_windows
from ubep.backends.base import EPCommError
from ubep.config import EPConfig

BLOCK_ELEMENTS = 256  # bf16 elements of a 512-byte block
MAX_BLOCKS = 32  # PROBE_MAX_BLOCKS of ep_tiling.h: a row of the probe's layer fits an AIV's UB
PROBE_TOKENS = 64  # the probe layer's max_tokens: slot 0 holds a row for each of up to 64 writers


@dataclass(frozen=True)
class ProbeResult:
    """One die's tally: ``reads`` block loads that showed a new round, ``older`` words older than
    their block's head (``tff`` / ``sp`` would have taken stale data: must be 0), ``newer`` words
    newer than it (the load was not whole, harmless to a head flag); over ``readers`` reading AIVs,
    each polling a row of ``blocks`` blocks written ``rounds`` times by die ``source``."""

    rank: int
    source: int
    reads: int
    older: int
    newer: int
    readers: int
    blocks: int
    rounds: int

    @property
    def torn(self) -> bool:
        return self.older > 0

    def line(self) -> str:
        verdict = "TORN: tff and sp are unsafe here" if self.torn else "whole"
        return (f"rank {self.rank} <- rank {self.source}: {self.reads} new blocks read by {self.readers} "
                f"AIVs ({self.blocks} blocks x {self.rounds} rounds each), {self.older} words older than "
                f"their flag, {self.newer} newer: {verdict}")


def probe_layer(world_size: int, rank: int, blocks: int, timeout_s: float) -> EPConfig:
    """The layer whose window the probe prepares and writes into (slot 0, from its start): rows of
    ``blocks`` blocks, ``PROBE_TOKENS`` rows per source, ``sw``."""
    return EPConfig(world_size=world_size, rank=rank, hidden=blocks * BLOCK_ELEMENTS, num_experts=world_size,
                    top_k=1, max_tokens_per_rank=PROBE_TOKENS, dtype=torch.bfloat16, layout="compact",
                    sync="sw", timeout_s=timeout_s)


def probe_blocks(group: dist.ProcessGroup | None = None, *, rounds: int = 2000, blocks: int = 16,
                 timeout_s: float = 60.0, device: torch.device | str | None = None) -> ProbeResult:
    """Runs the probe on every die of ``group`` (a collective; every rank passes the same
    arguments) and returns this die's tally. ``device``: ``npu`` (HCCL's windows) or ``cpu`` (the
    twin); by default the group's. Raises :class:`EPCommError` if a die's wait timed out."""
    if not 1 <= blocks <= MAX_BLOCKS:
        raise ValueError(f"blocks must be in [1, {MAX_BLOCKS}], got {blocks}")
    if not 1 <= rounds < 2**31:
        raise ValueError(f"rounds must be in [1, 2^31), got {rounds}")
    load_ops()
    dev = torch.device(device) if device is not None else collectives.group_device(group)
    if dev is None or dev.type not in ("cpu", "npu"):
        raise ValueError(f"device: the probe runs on NPUs or on the CPU twin, not on {dev} (group backend "
                         f"{dist.get_backend(group)!r}); pass device=")
    cfg = probe_layer(dist.get_world_size(group), dist.get_rank(group), blocks, timeout_s)
    windows = group_windows(cfg, group, dev)
    n_workers = NPU_AIVS if dev.type == "npu" else TWIN_AIVS
    windows.layout = None  # the probe's rows stay in the window: the next Buffer call prepares it
    token = torch.tensor([windows.nonce, windows.next_preparation()], dtype=torch.int64, device=dev)
    counts, status = torch.ops.ubep_ascend.probe(
        token, windows.tensors, windows.name, cfg.world_size, cfg.rank, cfg.hidden, cfg.num_experts,
        cfg.top_k, cfg.max_tokens_per_rank, cfg.dtype, n_workers, timeout_s, rounds, blocks)
    message = torch.ops.ubep_ascend.status_message(status.cpu(), cfg.rank, timeout_s)
    if message:
        raise EPCommError(f"{message} (ubep probe)")
    reads, older, newer, _ = counts.cpu().sum(0).tolist()
    return ProbeResult(rank=cfg.rank, source=(cfg.rank - 1) % cfg.world_size, reads=reads, older=older,
                       newer=newer, readers=n_workers // 2, blocks=blocks, rounds=rounds)


def probe_rank(rank: int, world_size: int, rounds: int, blocks: int, timeout_s: float) -> ProbeResult:
    """``ubep probe``'s rank function (``ubep.launch.run_ranks``): the probe on the default group."""
    return probe_blocks(rounds=rounds, blocks=blocks, timeout_s=timeout_s)
