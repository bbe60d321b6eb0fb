"""Payload efficiency: useful row bytes over bytes put on the wire, per mode and geometry.

Bytes on the wire for a batch of ``R`` rows: ``R * row_stride`` (flags and padding included), plus the
16-byte record for ``sw`` and ``dc``. ``sp`` writes its record only in the rare fallback call, so it is
not counted. Fences and polling cost time, not bytes, and are not part of this number.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ubep.protocol.wire_format import WireFormat
from ubep.protocol.words import RECORD_BYTES

TABLE_BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)
TABLE_TFF_FLAGS = (8, 16, 32)


def payload_efficiency(fmt: WireFormat, rows_per_batch: int = 1) -> Fraction:
    """Exact ``useful / wire`` bytes for a batch of ``rows_per_batch`` rows.

    Examples with 14336-byte rows (7168 bf16): ``tff`` 512 / 32 -> ``14336 / 15360 = 14/15`` (93.33 %);
    ``sp`` 512 -> ``1``; ``sw`` or ``dc`` 512 with one row per batch -> ``14336 / 14352 = 896/897``
    (99.89 %); ``sp`` 4096 -> ``14336 / 16384 = 7/8`` (four blocks, the last half padding).
    """
    if isinstance(rows_per_batch, bool) or not isinstance(rows_per_batch, int) or rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be an int >= 1, got {rows_per_batch!r}")
    record = RECORD_BYTES if fmt.mode in ("sw", "dc") else 0
    return Fraction(rows_per_batch * fmt.row_bytes, rows_per_batch * fmt.row_stride + record)


def efficiency_table(dtype: torch.dtype, hidden: int, rows_per_batch: int = 1) -> str:
    """Markdown table of :func:`payload_efficiency` in percent for block sizes 64..4096 B.

    ``dc`` and ``sp`` use ``min(32, block)`` marker bytes; their efficiency does not depend on it.
    """
    header = ["block B", "sw"] + [f"tff F={f}" for f in TABLE_TFF_FLAGS] + ["dc", "sp"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for block in TABLE_BLOCKS:
        fmts = [WireFormat(mode="sw", dtype=dtype, hidden=hidden, block_bytes=block, flag_bytes=0)]
        fmts += [WireFormat(mode="tff", dtype=dtype, hidden=hidden, block_bytes=block, flag_bytes=f)
                 for f in TABLE_TFF_FLAGS]
        fmts += [WireFormat(mode=m, dtype=dtype, hidden=hidden, block_bytes=block, flag_bytes=min(32, block))
                 for m in ("dc", "sp")]
        cells = [f"{float(payload_efficiency(f, rows_per_batch)) * 100:.2f} %" for f in fmts]
        lines.append(f"| {block} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
