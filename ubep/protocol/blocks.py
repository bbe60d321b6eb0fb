"""Rows <-> blocks for every mode, and the argument checks shared by the codec.

Byte ``i`` of a row (its in-memory bytes; every supported host and device is little-endian, so byte 0
of a bf16 element is its low byte) goes to block ``i // payload_bytes`` at offset
``payload_offset + i % payload_bytes``. Example, ``tff`` with 16-byte blocks and an 8-byte flag, a
16-byte row: bytes 0..7 go to block 0 offsets 8..15, bytes 8..15 to block 1 offsets 8..15; offsets
0..7 of each block are the flag.
"""

from __future__ import annotations

import torch

from ubep.protocol.wire_format import WireFormat


def check_rows(fmt: WireFormat, rows_NH: torch.Tensor) -> None:
    """TypeError / ValueError naming ``rows_NH`` unless it is ``[N, fmt.hidden]`` of ``fmt.dtype``."""
    if not isinstance(rows_NH, torch.Tensor) or rows_NH.dtype != fmt.dtype:
        got = rows_NH.dtype if isinstance(rows_NH, torch.Tensor) else type(rows_NH).__name__
        raise TypeError(f"rows_NH must be a {fmt.dtype} tensor, got {got}")
    if rows_NH.dim() != 2 or rows_NH.shape[1] != fmt.hidden:
        raise ValueError(f"rows_NH must have shape [N, {fmt.hidden}], got {list(rows_NH.shape)}")


def check_wire(fmt: WireFormat, wire_NS: torch.Tensor) -> None:
    """TypeError / ValueError naming ``wire_NS`` unless it is contiguous uint8 ``[N, fmt.row_stride]``."""
    if not isinstance(wire_NS, torch.Tensor) or wire_NS.dtype != torch.uint8:
        got = wire_NS.dtype if isinstance(wire_NS, torch.Tensor) else type(wire_NS).__name__
        raise TypeError(f"wire_NS must be a torch.uint8 tensor, got {got}")
    if wire_NS.dim() != 2 or wire_NS.shape[1] != fmt.row_stride or not wire_NS.is_contiguous():
        raise ValueError(f"wire_NS must be a contiguous [N, {fmt.row_stride}] tensor, "
                         f"got {list(wire_NS.shape)}")


def block_view(fmt: WireFormat, wire_NS: torch.Tensor) -> torch.Tensor:
    """``wire_NS`` seen as uint8 ``[N, blocks_per_row, block_bytes]`` (a view: writes go through)."""
    return wire_NS.view(wire_NS.shape[0], fmt.blocks_per_row, fmt.block_bytes)


def rows_to_blocks(fmt: WireFormat, rows_NH: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, blocks_per_row, block_bytes]``: payload placed, padding and flag bytes zero."""
    n = rows_NH.shape[0]
    payload = torch.zeros(n, fmt.blocks_per_row * fmt.payload_bytes, dtype=torch.uint8, device=rows_NH.device)
    payload[:, : fmt.row_bytes] = rows_NH.contiguous().view(torch.uint8)
    blocks = torch.zeros(n, fmt.blocks_per_row, fmt.block_bytes, dtype=torch.uint8, device=rows_NH.device)
    blocks[:, :, fmt.payload_offset :] = payload.view(n, fmt.blocks_per_row, fmt.payload_bytes)
    return blocks


def blocks_to_rows(fmt: WireFormat, blocks_NnB: torch.Tensor) -> torch.Tensor:
    """``[N, hidden]`` of ``fmt.dtype`` from uint8 ``[N, blocks_per_row, block_bytes]``, flags dropped."""
    n = blocks_NnB.shape[0]
    payload = blocks_NnB[:, :, fmt.payload_offset :].reshape(n, fmt.blocks_per_row * fmt.payload_bytes)
    return payload[:, : fmt.row_bytes].contiguous().view(fmt.dtype)
