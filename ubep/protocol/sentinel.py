"""SP sentinels: bit patterns no floating-point computation produces, and the init-time scan.

A candidate is a *signaling* NaN with the sign bit set, the quiet bit clear and a fixed payload byte
``c`` from :data:`PAYLOAD_BYTES`:

- bfloat16: ``0xFF00 | c``, candidates ``0xFFA5 0xFF96 0xFF8B 0xFFB3``;
- float16: ``0xFD00 | c``, candidates ``0xFDA5 0xFD96 0xFD8B 0xFDB3``;
- float32: ``0xFF000000 | c * 0x010101``, candidates ``0xFFA5A5A5 0xFF969696 0xFF8B8B8B 0xFFB3B3B3``.

Why computation never makes one: IEEE 754 arithmetic returns a *quiet* NaN whenever its result is NaN
(the default NaN for invalid operations, the quieted input for NaN operands), and format conversions
quiet NaNs too. Quiet NaNs have the quiet bit set (bf16 0x0040, fp16 0x0200, fp32 0x00400000); every
candidate has it clear. torch's own NaNs: bf16 ``0x7FC0``/``0xFFFF``, fp16 ``0x7E00``/``0xFE00``, fp32
``0x7FC00000``/``0xFFC00000``; NVIDIA's canonical NaN is all-ones in the exponent and mantissa. Only bit
copies (clone, view, cat, negation) carry a signaling NaN along, so one appears only if the bits came from
outside arithmetic (uninitialized memory, integers viewed as floats): :func:`sentinel_presence` scans for
that at init, and the per-row send check (``sp.row_collides``) catches whatever is left.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

PAYLOAD_BYTES = (0xA5, 0x96, 0x8B, 0xB3)

_BITS = {torch.bfloat16: (torch.int16, 16), torch.float16: (torch.int16, 16),
         torch.float32: (torch.int32, 32)}


def sentinel_candidates(dtype: torch.dtype) -> tuple[int, ...]:
    """Candidate element bit patterns for ``dtype``, in order of preference (see the module table)."""
    if dtype == torch.bfloat16:
        return tuple(0xFF00 | c for c in PAYLOAD_BYTES)
    if dtype == torch.float16:
        return tuple(0xFD00 | c for c in PAYLOAD_BYTES)
    if dtype == torch.float32:
        return tuple(0xFF000000 | c * 0x010101 for c in PAYLOAD_BYTES)
    raise TypeError(f"dtype must be one of {tuple(_BITS)}, got {dtype}")


def element_bytes(dtype: torch.dtype, pattern: int) -> bytes:
    """Little-endian bytes of one element with bit pattern ``pattern``: bf16 ``0xFFA5`` -> ``a5 ff``."""
    return pattern.to_bytes(_BITS[dtype][1] // 8, "little")


def _as_signed(pattern: int, bits: int) -> int:
    return pattern - (1 << bits) if pattern >> (bits - 1) else pattern


def sentinel_presence(dtype: torch.dtype, tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """bool ``[C]``: whether candidate ``i`` of ``dtype`` occurs as an element of any tensor.

    Run at init over the MoE weights and a few activations of this rank, all of dtype ``dtype``. Ranks
    must agree on one sentinel (the receiver fills, the sender checks): all-reduce the result with MAX,
    then :func:`choose_sentinel`. Example: a bf16 tensor holding ``0xFFA5`` gives
    ``[True, False, False, False]``.
    """
    candidates = sentinel_candidates(dtype)
    int_dtype, bits = _BITS[dtype]
    present = [False] * len(candidates)
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dtype != dtype:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"tensors must all be {dtype} tensors, got {got}")
        flat = t.detach().reshape(-1).view(int_dtype)
        present = [p or bool((flat == _as_signed(c, bits)).any())
                   for p, c in zip(present, candidates, strict=True)]
    return torch.tensor(present, dtype=torch.bool)


def choose_sentinel(presence_C: torch.Tensor) -> int:
    """Index of the first candidate no rank holds, for ``WireFormat.sentinel_index``.

    Example: presence ``[True, False, False, False]`` -> ``1``. Raises ValueError if every candidate
    occurs: the data then carries signaling NaNs on purpose and ``sp`` must not be used.
    """
    absent = (~presence_C.bool()).nonzero()
    if absent.numel() == 0:
        raise ValueError(f"presence_C: every sentinel candidate occurs in the data ({presence_C.tolist()}); "
                         "use another sync mode")
    return int(absent[0])
