"""SP: the sentinel marker, the per-row send check, and receiver fill / reset.

The receiver keeps the ``M = flag_bytes`` leading bytes of every block of an idle slot equal to the
sentinel element repeated ``M / element_bytes`` times, polls until they differ, and writes the sentinel
back into the blocks it consumed before it sends anything for the next call. Example, bf16 sentinel
``0xFFA5`` with ``M = 8``: marker bytes ``a5 ff a5 ff a5 ff a5 ff``.

A row *collides* when any of its blocks would arrive with marker bytes equal to the sentinel: the
receiver could not tell that block from an empty one. The sender checks each row before sending; if
any row of the batch collides, it sends every row as usual, then a release fence, then the 16-byte
batch record ``(epoch, N)``: the ``sw`` fallback. A row is complete when all its markers changed *or*
that record arrived, so colliding rows wait for the fenced record and the others do not wait at all.
"""

from __future__ import annotations

import torch

from ubep.protocol.blocks import block_view, check_rows, check_wire, rows_to_blocks
from ubep.protocol.sentinel import element_bytes, sentinel_candidates
from ubep.protocol.wire_format import WireFormat


def sentinel_bytes(fmt: WireFormat) -> torch.Tensor:
    """uint8 ``[flag_bytes]``: the sentinel element repeated over the marker, little-endian."""
    pattern = sentinel_candidates(fmt.dtype)[fmt.sentinel_index]
    one = element_bytes(fmt.dtype, pattern)
    return torch.tensor(list(one * (fmt.flag_bytes // len(one))), dtype=torch.uint8)


def _check_sp(fmt: WireFormat) -> None:
    if fmt.mode != "sp":
        raise ValueError(f"fmt.mode must be 'sp' for sentinel operations, got {fmt.mode!r}")


def block_collides(fmt: WireFormat, blocks_NnB: torch.Tensor) -> torch.Tensor:
    """bool ``[N]``: which rows of uint8 ``[N, blocks_per_row, block_bytes]`` hold a sentinel marker."""
    markers = blocks_NnB[:, :, : fmt.flag_bytes]
    return (markers == sentinel_bytes(fmt).to(blocks_NnB.device)).all(-1).any(-1)


def row_collides(fmt: WireFormat, rows_NH: torch.Tensor) -> torch.Tensor:
    """bool ``[N]``: the send-time check, rows that must take the ``sw`` fallback.

    Example, bf16 sentinel ``0xFFA5``, ``M = 8`` (4 elements), 16-byte blocks (8 elements): a row whose
    elements 8..11 are all ``0xFFA5`` collides (block 1's marker); one with only elements 0..2 does not.
    """
    _check_sp(fmt)
    check_rows(fmt, rows_NH)
    return block_collides(fmt, rows_to_blocks(fmt, rows_NH))


def sentinel_fill(fmt: WireFormat, wire_NS: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """Write the sentinel into the markers of ``rows`` (all rows if None) of ``wire_NS``, in place.

    Used at init on the whole receive region and after consuming, on the rows consumed (a bool ``[N]``
    mask or int64 row indices).
    """
    _check_sp(fmt)
    check_wire(fmt, wire_NS)
    blocks = block_view(fmt, wire_NS)
    pattern = sentinel_bytes(fmt).to(wire_NS.device)
    if rows is None:
        blocks[:, :, : fmt.flag_bytes] = pattern
    else:
        blocks[rows, :, : fmt.flag_bytes] = pattern
