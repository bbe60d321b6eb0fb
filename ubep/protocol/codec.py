"""Encode, decode and the receiver's "arrived?" predicates of one batch, for every mode.

What the sender writes for call ``epoch`` (``N`` rows, all of one (source, destination) pair):

- ``sw``: payload blocks, a release fence, then the record ``(epoch, N)``.
- ``tff``: blocks ``[flag | payload]``, flag = ``epoch`` as u64 LE repeated ``flag_bytes / 8`` times.
  Each block is written in one store the fabric delivers whole (CM384: 512 B); no fence, no record.
- ``dc``: payload blocks with masked markers, then the record ``(epoch, checksum)``; no fence, since
  the receiver recomputes the checksum over what it holds.
- ``sp``: raw payload blocks; only if some row collides with the sentinel, a fence and ``(epoch, N)``.

When has row ``r`` arrived on the receiver (``record`` = its ``(epoch, value)`` for this batch)?

- ``sw``: ``record == (epoch, N)``; every row at once.
- ``tff``: every flag byte of each of the row's blocks equals the expected flag.
- ``dc``: ``record == (epoch, checksum(wire, epoch))``; every row at once.
- ``sp``: every block's marker differs from the sentinel, or ``record == (epoch, N)``.
"""

from __future__ import annotations

import torch

from ubep.protocol import dc, sp
from ubep.protocol.blocks import block_view, blocks_to_rows, check_rows, check_wire, rows_to_blocks
from ubep.protocol.wire_format import WireFormat, check_epoch
from ubep.protocol.words import RECORD_BYTES, make_record, read_record, u64_bytes


def tff_flag(fmt: WireFormat, epoch: int) -> torch.Tensor:
    """uint8 ``[flag_bytes]``: ``epoch`` u64 LE repeated. Epoch 5, 16-byte flag: ``05 00*7 05 00*7``.

    The whole flag is compared, so a flag torn at word granularity never matches either call.
    """
    return u64_bytes(epoch).repeat(fmt.flag_bytes // 8)


def encode(fmt: WireFormat, rows_NH: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Wire image of a batch for call ``epoch``: ``(wire_NS, record)``.

    ``wire_NS`` is uint8 ``[N, row_stride]``; ``record`` is the uint8 ``[16]`` batch record the sender
    writes after the blocks, or None where the mode writes none (``tff`` always, ``sp`` without
    collisions).
    """
    check_rows(fmt, rows_NH)
    check_epoch(epoch)
    num_rows, device = rows_NH.shape[0], rows_NH.device
    blocks = rows_to_blocks(fmt, rows_NH)
    if fmt.mode == "tff":
        blocks[:, :, : fmt.flag_bytes] = tff_flag(fmt, epoch).to(device)
    elif fmt.mode == "dc":
        blocks = dc.xor_mask(fmt, blocks, epoch)
    wire_NS = blocks.view(num_rows, fmt.row_stride)
    record = None
    if fmt.mode == "sw" or (fmt.mode == "sp" and bool(sp.block_collides(fmt, blocks).any())):
        record = make_record(epoch, num_rows, device)
    elif fmt.mode == "dc":
        record = make_record(epoch, dc.checksum(fmt, wire_NS, epoch), device)
    return wire_NS, record


def decode(fmt: WireFormat, wire_NS: torch.Tensor, epoch: int) -> torch.Tensor:
    """``[N, hidden]`` rows of ``fmt.dtype`` from a batch that has arrived for call ``epoch``."""
    check_wire(fmt, wire_NS)
    check_epoch(epoch)
    blocks = block_view(fmt, wire_NS)
    if fmt.mode == "dc":
        blocks = dc.xor_mask(fmt, blocks, epoch)
    return blocks_to_rows(fmt, blocks)


def empty_receive(
    fmt: WireFormat, num_rows: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Initial receiver state of one batch slot: ``(wire_NS, record)``.

    Zeros (epoch 0 is never used), except ``sp`` markers, which hold the sentinel; ``record`` is None
    for ``tff``, else a zero uint8 ``[16]``.
    """
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
        raise ValueError(f"num_rows must be an int >= 0, got {num_rows!r}")
    wire_NS = torch.zeros(num_rows, fmt.row_stride, dtype=torch.uint8, device=device)
    if fmt.mode == "sp":
        sp.sentinel_fill(fmt, wire_NS)
    record = None if fmt.mode == "tff" else torch.zeros(RECORD_BYTES, dtype=torch.uint8, device=device)
    return wire_NS, record


def arrived_blocks(fmt: WireFormat, wire_NS: torch.Tensor, epoch: int) -> torch.Tensor:
    """bool ``[N, blocks_per_row]``: the per-block predicate of ``tff`` and ``sp`` (no other mode has one)."""
    check_wire(fmt, wire_NS)
    check_epoch(epoch)
    markers = block_view(fmt, wire_NS)[:, :, : fmt.flag_bytes]
    if fmt.mode == "tff":
        return (markers == tff_flag(fmt, epoch).to(wire_NS.device)).all(-1)
    if fmt.mode == "sp":
        return (markers != sp.sentinel_bytes(fmt).to(wire_NS.device)).any(-1)
    raise ValueError(f"fmt.mode {fmt.mode!r} has no per-block predicate; use arrived_rows")


def _check_record(fmt: WireFormat, record: torch.Tensor | None) -> None:
    if fmt.mode == "tff":
        if record is not None:
            raise ValueError("record must be None for mode 'tff' (it has no batch record)")
    elif not (isinstance(record, torch.Tensor) and record.dtype == torch.uint8
              and record.shape == (RECORD_BYTES,)):
        raise TypeError(f"record must be a uint8 [{RECORD_BYTES}] tensor for mode {fmt.mode!r}")


def arrived_rows(
    fmt: WireFormat, wire_NS: torch.Tensor, record: torch.Tensor | None, epoch: int
) -> torch.Tensor:
    """bool ``[N]``: which rows of the batch are complete for call ``epoch`` (see the module docstring)."""
    check_wire(fmt, wire_NS)
    check_epoch(epoch)
    _check_record(fmt, record)
    num_rows = wire_NS.shape[0]
    if fmt.mode == "tff":
        return arrived_blocks(fmt, wire_NS, epoch).all(-1)
    if fmt.mode == "dc":
        complete = read_record(record) == (epoch, dc.checksum(fmt, wire_NS, epoch))
    else:
        complete = read_record(record) == (epoch, num_rows)
    all_rows = torch.full((num_rows,), complete, dtype=torch.bool, device=wire_NS.device)
    if fmt.mode == "sp":
        return all_rows | arrived_blocks(fmt, wire_NS, epoch).all(-1)
    return all_rows
