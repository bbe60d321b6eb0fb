"""Hardware and software costs the superpod simulator runs on.

Each field says where its number comes from: ``paper`` (the UBEP paper states it), or ``assumed``
(our estimate, to be replaced by calibration). ``docs/SIMULATOR.md`` lists them in one table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ubep.protocol import WireFormat

EXECUTIONS = ("bsp", "decomposed")


@dataclass(frozen=True, kw_only=True)
class SimParams:
    """Costs of one rank (an NPU die or a GPU) and of its workers (AIVs or thread blocks)."""

    workers_per_rank: int = 48          # paper: 48 AIVs per die
    link_gbps: float = 392.0            # paper: per-rank fabric bandwidth
    worker_gbps: float = 392.0 / 24     # paper: half the AIVs saturate the link
    outstanding_stores: int = 1         # assumed: a worker's remote copy completes before the next
    hidden: int = 7168                  # assumed: DeepSeek-V3 rows, bf16 on the wire
    block_bytes: int = 512              # paper: 512 B atomic DataBlock
    flag_bytes: int = 32                # paper: 32 B TFF flag / DC marker / SP sentinel
    init_ns: float = 2000.0             # assumed: kernel start and buffer set-up
    syncall_ns: float = 1500.0          # assumed: one SyncAll across a die's AIVs
    count_ns_per_pair: float = 2.0      # assumed: count one (token, expert) pair on one worker
    count_msg_ns: float = 50.0          # assumed: issue one count message to one rank
    cumsum_ns_per_entry: float = 3.0    # assumed: CalCumSum cost per (source, expert) entry
    poll_ns: float = 100.0              # assumed: one poll of a flag or sentinel (vector compare)
    verify_ns_per_block: float = 2.0    # assumed: check one block's flag or sentinel bytes
    checksum_gbps: float = 100.0        # assumed: DC checksum rate of one worker
    reorder_gbps: float = 1600.0        # assumed: local HBM copy rate of the whole die
    # Bytes of one (worker, destination) stream between two syncs; 0 = one sync per stream.
    sync_unit_bytes: int = 0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (value >= 0 if name == "sync_unit_bytes" else value > 0):
                raise ValueError(f"{name} must be > 0, got {value}")

    def sync_units(self, stream_bytes: int) -> int:
        """Syncs for a stream of ``stream_bytes``: ``ceil(bytes / sync_unit_bytes)``, at least 1."""
        if not self.sync_unit_bytes:
            return 1
        return max(1, -(-stream_bytes // self.sync_unit_bytes))

    @property
    def row_bytes(self) -> int:
        return self.hidden * 2

    def with_(self, **changes) -> SimParams:
        return replace(self, **changes)


def wire_bytes_per_row(params: SimParams, sync: str) -> int:
    """Bytes one bf16 row occupies on the wire in a sync mode (``ubep.protocol``'s row stride).

    TFF spends ``flag_bytes`` of every block on the flag: a 14336 B row needs ``ceil(14336 / 480)
    = 30`` blocks of 512 B, 15360 B; the other modes send 14336 B.
    """
    flag = 0 if sync == "sw" else params.flag_bytes
    fmt = WireFormat(mode=sync, dtype=torch.bfloat16, hidden=params.hidden,
                     block_bytes=params.block_bytes, flag_bytes=flag)
    return fmt.row_stride
