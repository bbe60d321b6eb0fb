"""Integer-exact little-endian words, the 32-bit mixer, and the 16-byte batch record.

Everything is unsigned 32-bit arithmetic carried in int64 tensors (or Python ints, the same code runs on
both) holding values in ``[0, 2**32)``. A product is split into 16-bit halves so no intermediate exceeds
``2**48``: the results are exact without unsigned tensor types, and a C++, Triton or Ascend C kernel using
``uint32_t`` wrap-around arithmetic gets the same bits.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
RECORD_BYTES = 16

_BYTE_SHIFTS = (0, 8, 16, 24)


def mul32(x, c: int):
    """``x * c mod 2**32`` for ``x`` in ``[0, 2**32)``, an int or an int64 tensor.

    With ``x = lo + hi * 2**16``: ``x * c = lo * c + (hi * c mod 2**16) * 2**16 (mod 2**32)``.
    Example: ``mul32(0x10001, 3) == 0x30003``; ``mul32(0xFFFFFFFF, 0xFFFFFFFF) == 1``.
    """
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & MASK32


def fmix32(x):
    """MurmurHash3's 32-bit finalizer: a bijection of ``[0, 2**32)`` that spreads every input bit.

    ``x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16`` (mod 2**32). Each
    step is invertible (an xor-shift, or a product with an odd constant), so two different inputs never
    give the same output. Examples: ``fmix32(0) == 0``, ``fmix32(1) == 0x514E28B7``.
    """
    x = x ^ (x >> 16)
    x = mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def le_words(bytes_X4: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4 * W]`` -> int64 ``[..., W]``: little-endian u32 words, byte 0 lowest.

    Example: bytes ``[0x01, 0x02, 0x03, 0x04]`` -> ``[0x04030201]``.
    """
    b = bytes_X4.reshape(*bytes_X4.shape[:-1], bytes_X4.shape[-1] // 4, 4).long()
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def le_bytes(words_XW: torch.Tensor) -> torch.Tensor:
    """int64 ``[..., W]`` of u32 values -> uint8 ``[..., 4 * W]``, the inverse of :func:`le_words`."""
    shifts = torch.tensor(_BYTE_SHIFTS, device=words_XW.device)
    return ((words_XW.unsqueeze(-1) >> shifts) & 0xFF).to(torch.uint8).flatten(-2)


def u64_bytes(value: int, device: torch.device | str | None = None) -> torch.Tensor:
    """uint8 ``[8]``: ``value`` in ``[0, 2**64)`` as little-endian bytes. ``5`` -> ``05 00 .. 00``."""
    return torch.tensor(list(value.to_bytes(8, "little")), dtype=torch.uint8, device=device)


def make_record(epoch: int, value: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The 16-byte batch record, uint8 ``[16]``: bytes 0..7 ``epoch``, bytes 8..15 ``value`` (u64 LE).

    ``value`` is the row count (``sw``, ``sp`` fallback) or the checksum (``dc``). Example:
    ``make_record(5, 2)`` is ``05 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00``.
    """
    return torch.cat([u64_bytes(epoch, device), u64_bytes(value, device)])


def read_record(record_16: torch.Tensor) -> tuple[int, int]:
    """``(epoch, value)`` of a batch record, the inverse of :func:`make_record`."""
    raw = bytes(record_16.cpu().tolist())
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
