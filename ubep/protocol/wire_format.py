"""``WireFormat``: how one batch of rows is laid out in blocks, and the epoch / slot rule.

A *batch* is every row one source sends to one destination in one call. A row of ``H`` elements
(``row_bytes = H * element size``) is cut into ``blocks_per_row`` blocks of ``block_bytes``; each block
carries ``payload_bytes`` of the row, the unused tail of the last block is zero padding, and row ``r`` of
the batch starts at byte ``r * row_stride`` of the receive region, ``row_stride = blocks_per_row *
block_bytes``. ``flag_bytes`` are the leading bytes of every block that synchronization reads:

- ``sw``: 0. Blocks are pure payload; the separate 16-byte batch record is the flag.
- ``tff``: the flag, the epoch repeated; ``payload_bytes = block_bytes - flag_bytes``, payload follows it.
- ``dc``: marker bytes, payload xor an epoch mask, summed into the batch checksum.
- ``sp``: the bytes compared with the sentinel.

Only ``tff`` takes bytes from the payload. Worked example, DeepSeek-V3 rows (``H = 7168`` bf16,
``row_bytes = 14336``): ``tff`` 512 / 32 has 480 payload bytes per block, ``ceil(14336 / 480) = 30``
blocks, stride 15360, and the last block carries ``14336 - 29 * 480 = 416`` bytes then 64 bytes of
padding; ``sp`` 512 / 32 has 28 blocks of 512 payload bytes, stride 14336, no padding.

Epochs: call ``e = 1, 2, 3, ...`` of a buffer (the same sequence on every rank) uses receive slot
``e & 1``, so call ``e`` only ever finds data of calls ``e - 2, e - 4, ...`` in its slot. Epochs are
u64 and 0 is never used, so zero-filled memory never looks like a call; a buffer reaching ``2**64 - 1``
(584 years at one call per nanosecond) must be zero-filled again on every rank and restart at 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ubep.checks import check_int
from ubep.protocol.sentinel import sentinel_candidates

MODES = ("sw", "tff", "dc", "sp")
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
MAX_EPOCH = 2**64 - 1
MIN_BLOCK, MAX_BLOCK = 8, 4096


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_epoch(epoch: int) -> int:
    """``epoch`` if it is an int in ``[1, 2**64 - 1]``, else TypeError / ValueError naming it."""
    check_int("epoch", epoch)
    if not 1 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch must be in [1, 2**64 - 1], got {epoch}")
    return epoch


def slot(epoch: int) -> int:
    """Receive slot of call ``epoch``: ``epoch & 1``. Calls 1, 3, 5 use slot 1; calls 2, 4, 6 slot 0."""
    return check_epoch(epoch) & 1


@dataclass(frozen=True, kw_only=True)
class WireFormat:
    """Mode and geometry of one batch on the wire, identical on sender and receiver.

    ``block_bytes``: power of two in ``[8, 4096]``. ``flag_bytes``: ``sw`` 0; ``tff`` a power of two in
    ``[8, block_bytes / 2]`` (the flag holds a whole u64 epoch, and payload keeps at least half the
    block); ``dc`` and ``sp`` a power of two in ``[4, block_bytes]``. ``sentinel_index`` picks the
    ``sp`` sentinel among ``sentinel_candidates(dtype)`` and is 0 for other modes.

    Example: ``WireFormat(mode="tff", dtype=torch.bfloat16, hidden=7168, block_bytes=512,
    flag_bytes=32)`` gives ``payload_bytes == 480``, ``blocks_per_row == 30``, ``row_stride == 15360``,
    ``padding_bytes == 64``.
    """

    mode: str
    dtype: torch.dtype
    hidden: int
    block_bytes: int
    flag_bytes: int
    sentinel_index: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise TypeError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype}")
        for name in ("hidden", "block_bytes", "flag_bytes", "sentinel_index"):
            check_int(name, getattr(self, name))
        if self.hidden <= 0 or self.hidden % 8:
            raise ValueError(f"hidden must be a positive multiple of 8, got {self.hidden}")
        if not (_is_pow2(self.block_bytes) and MIN_BLOCK <= self.block_bytes <= MAX_BLOCK):
            raise ValueError(f"block_bytes must be a power of two in [{MIN_BLOCK}, {MAX_BLOCK}], "
                             f"got {self.block_bytes}")
        self._check_flag_bytes()
        limit = len(sentinel_candidates(self.dtype)) if self.mode == "sp" else 1
        if not 0 <= self.sentinel_index < limit:
            raise ValueError(f"sentinel_index must be in [0, {limit}) for mode {self.mode!r}, "
                             f"got {self.sentinel_index}")

    def _check_flag_bytes(self) -> None:
        flag, block = self.flag_bytes, self.block_bytes
        if self.mode == "sw":
            ok, want = flag == 0, "0"
        elif self.mode == "tff":
            ok, want = _is_pow2(flag) and 8 <= flag <= block // 2, f"a power of two in [8, {block // 2}]"
        else:
            ok, want = _is_pow2(flag) and 4 <= flag <= block, f"a power of two in [4, {block}]"
        if not ok:
            raise ValueError(f"flag_bytes must be {want} for mode {self.mode!r}, got {flag}")

    @property
    def element_bytes(self) -> int:
        return self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        """Bytes of one row: ``hidden * element_bytes`` (7168 bf16 -> 14336)."""
        return self.hidden * self.element_bytes

    @property
    def payload_bytes(self) -> int:
        """Row bytes one block carries: ``block_bytes - flag_bytes`` for ``tff``, else ``block_bytes``."""
        return self.block_bytes - self.flag_bytes if self.mode == "tff" else self.block_bytes

    @property
    def payload_offset(self) -> int:
        """Where the payload starts inside a block: after the flag for ``tff``, else 0."""
        return self.block_bytes - self.payload_bytes

    @property
    def blocks_per_row(self) -> int:
        """``ceil(row_bytes / payload_bytes)``: 14336 B rows in 480 B payloads -> 30."""
        return -(-self.row_bytes // self.payload_bytes)

    @property
    def row_stride(self) -> int:
        """Bytes one row occupies on the wire and in the receive region: ``blocks_per_row * block_bytes``."""
        return self.blocks_per_row * self.block_bytes

    @property
    def padding_bytes(self) -> int:
        """Zero bytes after the row's last payload byte: ``blocks_per_row * payload_bytes - row_bytes``."""
        return self.blocks_per_row * self.payload_bytes - self.row_bytes
