"""DC: epoch-masked marker words and the 64-bit batch checksum (u32 arithmetic only).

The ``M = flag_bytes`` leading bytes of every block are its *marker*: ``M / 4`` u32 LE words. Number
them over the whole batch, ``k = (row * blocks_per_row + block) * (M / 4) + j``. For call ``e``
(``e_lo, e_hi`` its low and high 32 bits):

- epoch digest ``d = fmix32(e_lo ^ fmix32(e_hi))``;
- on the wire, marker word ``k`` is ``payload_k ^ fmix32(k ^ d)`` (the receiver xors again to decode);
- lanes over the wire words ``w_k``: ``A = sum fmix32(w_k ^ fmix32(2k))``,
  ``B = sum fmix32(w_k ^ fmix32(2k + 1))``, both mod 2**32;
- ``checksum = fmix32(B ^ fmix32(n)) * 2**32 + fmix32(A ^ d)``, ``n`` = blocks in the batch.

Why stale data cannot pass: a stale *record* carries an older epoch in its first word and is rejected
outright. A stale *block* left from call ``e' = e - 2, e - 4, ...`` holds ``p' ^ mask(e')`` where call
``e`` expects ``p ^ mask(e)``. Without the mask, resending the same row (a repeated input, a zero row)
would leave identical markers and the receiver would accept a block whose tail has not arrived. With it,
``mask(e, k) != mask(e', k)`` for every ``k`` whenever ``e`` and ``e'`` share their high word (``d`` is a
bijection of ``e_lo``, ``fmix32`` is a bijection), so every stale word differs from the expected one.
Each checksum term is a bijection of its word, so one differing word always changes both lanes; several
must cancel in two independent 32-bit lanes at once, about ``2**-64`` for data that is not built against
the mask. Swapped or shifted blocks change ``k`` and so change the terms; ``n`` binds the batch size.
"""

from __future__ import annotations

import torch

from ubep.protocol.blocks import block_view, check_wire
from ubep.protocol.wire_format import WireFormat, check_epoch
from ubep.protocol.words import MASK32, fmix32, le_bytes, le_words

MAX_MARKER_WORDS = 2**31 - 1  # keeps 2k + 1 a u32, and each int64 lane sum below 2**63 before the mod


def epoch_digest(epoch: int) -> int:
    """``fmix32(e_lo ^ fmix32(e_hi))``. Example: ``epoch_digest(1) == fmix32(1) == 0x514E28B7``."""
    check_epoch(epoch)
    return fmix32((epoch & MASK32) ^ fmix32(epoch >> 32))


def mask_words(epoch: int, num_words: int, device: torch.device | str | None = None) -> torch.Tensor:
    """int64 ``[num_words]``: ``fmix32(k ^ d)`` for ``k = 0 .. num_words - 1``."""
    return fmix32(torch.arange(num_words, device=device) ^ epoch_digest(epoch))


def xor_mask(fmt: WireFormat, blocks_NnB: torch.Tensor, epoch: int) -> torch.Tensor:
    """A copy of ``blocks_NnB`` with every marker word xored with its mask: encodes and decodes."""
    out = blocks_NnB.clone()
    words = le_words(out[:, :, : fmt.flag_bytes]).reshape(-1)
    masked = words ^ mask_words(epoch, words.numel(), out.device)
    out[:, :, : fmt.flag_bytes] = le_bytes(masked.view(*out.shape[:2], fmt.flag_bytes // 4))
    return out


def checksum(fmt: WireFormat, wire_NS: torch.Tensor, epoch: int) -> int:
    """u64 checksum of a ``dc`` batch as it sits on the wire (markers already masked)."""
    if fmt.mode != "dc":
        raise ValueError(f"fmt.mode must be 'dc' for a checksum, got {fmt.mode!r}")
    check_wire(fmt, wire_NS)
    blocks = block_view(fmt, wire_NS)
    words = le_words(blocks[:, :, : fmt.flag_bytes]).reshape(-1)
    if words.numel() > MAX_MARKER_WORDS:
        raise ValueError(f"wire_NS holds {words.numel()} marker words, more than {MAX_MARKER_WORDS}")
    k2 = 2 * torch.arange(words.numel(), device=words.device)
    lane_a = int(fmix32(words ^ fmix32(k2)).sum()) & MASK32
    lane_b = int(fmix32(words ^ fmix32(k2 + 1)).sum()) & MASK32
    num_blocks = blocks.shape[0] * blocks.shape[1]
    return (fmix32(lane_b ^ fmix32(num_blocks)) << 32) | fmix32(lane_a ^ epoch_digest(epoch))
