"""Test vectors for the device kernels and the C++ twin: ``tests/vectors/protocol.json``.

Regenerate with ``python -m ubep.protocol --write-vectors tests/vectors/protocol.json``; a test checks
the stored file equals a fresh :func:`build_vectors`. Byte strings are lowercase hex, one string per
row; epochs are JSON integers up to ``2**64 - 1`` (parse them as uint64) and checksums are ``"0x..."``
strings. Sections:

- ``fmix32``: ``[input, output]`` pairs of the mixer.
- ``sentinels``: the candidate element patterns per dtype.
- ``encode``: ``format``, ``epoch``, ``rows`` -> ``wire``, ``record`` (or null), and for ``dc`` the
  ``checksum``, for ``sp`` the per-row ``collides``.
- ``verify``: a receiver state (``wire``, ``record``) and ``epoch`` -> ``arrived_rows``,
  ``arrived_blocks`` (``tff``/``sp``, else null) and, when every row arrived, the ``decoded`` rows.
- ``efficiency``: ``format`` and ``rows_per_batch`` -> ``ratio``, useful / wire bytes in lowest terms.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ubep.protocol import codec, dc, sp
from ubep.protocol.efficiency import payload_efficiency
from ubep.protocol.sentinel import sentinel_candidates
from ubep.protocol.wire_format import DTYPES, WireFormat
from ubep.protocol.words import fmix32

# (block_bytes, flag_bytes) of the small, the padded and the Ascend kernels' geometry per mode (the
# last: 512-byte blocks, 32 flag bytes; its rows end in a partial block whose payload is not a
# whole number of 32-byte units, as the kernels' vector copies must handle).
GEOMETRIES = {"sw": ((16, 0), (32, 0), (512, 0)), "tff": ((16, 8), (64, 16), (512, 32)),
              "dc": ((16, 8), (32, 32), (512, 32)), "sp": ((16, 8), (32, 16), (512, 32))}
SMALL, PADDED, KERNEL = (8, 3, 5), (40, 2, 2**32 + 6), (264, 2, 2**33 + 7)  # (hidden, rows, epoch)


def _hex(t: torch.Tensor | None):
    if t is None:
        return None
    rows = t.reshape(t.shape[0], -1).view(torch.uint8) if t.dim() == 2 else t.reshape(1, -1)
    out = [bytes(r.tolist()).hex() for r in rows]
    return out if t.dim() == 2 else out[0]


def _format(fmt: WireFormat) -> dict:
    return {"mode": fmt.mode, "dtype": DTYPES[fmt.dtype], "hidden": fmt.hidden,
            "block_bytes": fmt.block_bytes, "flag_bytes": fmt.flag_bytes,
            "sentinel_index": fmt.sentinel_index}


def sample_rows(dtype: torch.dtype, num_rows: int, hidden: int) -> torch.Tensor:
    """Exact small multiples of 3/8 with a -0.0, +inf and torch's NaN in row 0: ``[num_rows, hidden]``."""
    i = torch.arange(num_rows * hidden)
    rows = ((i * 7 + 3) % 29 - 14).float().mul(0.375).view(num_rows, hidden)
    rows[0, 1:4] = torch.tensor([-0.0, float("inf"), float("nan")])
    return rows.to(dtype)


def sentinel_rows(fmt: WireFormat) -> torch.Tensor:
    """Three rows of an ``sp`` format whose rows span two blocks or more: row 1's block 0 and row 2's
    block 1 markers are the sentinel (both collide); row 0 has it in all but the last marker element."""
    rows = sample_rows(fmt.dtype, 3, fmt.hidden)
    per_block, per_marker = fmt.block_bytes // fmt.element_bytes, fmt.flag_bytes // fmt.element_bytes
    bits = rows.view(torch.int16 if fmt.element_bytes == 2 else torch.int32)
    value = sentinel_candidates(fmt.dtype)[fmt.sentinel_index]
    value -= 1 << (8 * fmt.element_bytes)  # as the signed integer of the same bits
    bits[0, : per_marker - 1] = value
    bits[1, :per_marker] = value
    bits[2, per_block : per_block + per_marker] = value
    return rows


def _encode_case(name: str, fmt: WireFormat, rows: torch.Tensor, epoch: int) -> dict:
    wire, record = codec.encode(fmt, rows, epoch)
    case = {"name": name, "format": _format(fmt), "epoch": epoch, "rows": _hex(rows),
            "wire": _hex(wire), "record": _hex(record)}
    if fmt.mode == "dc":
        case["checksum"] = f"0x{dc.checksum(fmt, wire, epoch):016x}"
    if fmt.mode == "sp":
        case["collides"] = sp.row_collides(fmt, rows).tolist()
    return case


def _encode_cases() -> list[dict]:
    cases = []
    for mode, geometries in GEOMETRIES.items():
        for (block, flag), (hidden, num_rows, epoch) in zip(geometries, (SMALL, PADDED, KERNEL), strict=True):
            for dtype, dname in DTYPES.items():
                fmt = WireFormat(mode=mode, dtype=dtype, hidden=hidden, block_bytes=block, flag_bytes=flag)
                name = f"{mode}_{dname}_h{hidden}_b{block}_f{flag}"
                cases.append(_encode_case(name, fmt, sample_rows(dtype, num_rows, hidden), epoch))
    for dtype, dname in DTYPES.items():
        fmt = WireFormat(mode="sp", dtype=dtype, hidden=16, block_bytes=16, flag_bytes=8, sentinel_index=1)
        cases.append(_encode_case(f"sp_{dname}_collisions", fmt, sentinel_rows(fmt), 9))
        fmt = WireFormat(mode="sp", dtype=dtype, hidden=KERNEL[0], block_bytes=512, flag_bytes=32)
        cases.append(_encode_case(f"sp_{dname}_collisions_b512", fmt, sentinel_rows(fmt), 9))
    fmt = WireFormat(mode="tff", dtype=torch.bfloat16, hidden=8, block_bytes=16, flag_bytes=8)
    cases.append(_encode_case("tff_bfloat16_max_epoch", fmt, sample_rows(torch.bfloat16, 1, 8), 2**64 - 1))
    return cases


def _verify_case(name: str, fmt: WireFormat, wire: torch.Tensor, record, epoch: int) -> dict:
    rows_ok = codec.arrived_rows(fmt, wire, record, epoch)
    blocks_ok = codec.arrived_blocks(fmt, wire, epoch).tolist() if fmt.mode in ("tff", "sp") else None
    decoded = _hex(codec.decode(fmt, wire, epoch)) if bool(rows_ok.all()) else None
    return {"name": name, "format": _format(fmt), "epoch": epoch, "wire": _hex(wire), "record": _hex(record),
            "arrived_rows": rows_ok.tolist(), "arrived_blocks": blocks_ok, "decoded": decoded}


def _verify_cases() -> list[dict]:
    """Receiver states for call 7: complete, initial, stale (call 5 = same slot), torn, and the
    mode-specific traps (epoch 2**32 apart, sp fallback, dc resend of identical rows)."""
    bf16, out = torch.bfloat16, []
    fmt = WireFormat(mode="tff", dtype=bf16, hidden=8, block_bytes=16, flag_bytes=8)
    rows = sample_rows(bf16, 2, 8)
    new, old = codec.encode(fmt, rows, 7)[0], codec.encode(fmt, rows, 5)[0]
    torn = old.clone()
    torn[0], torn[1, :16] = new[0], new[1, :16]
    for name, wire in (("complete", new), ("initial", codec.empty_receive(fmt, 2)[0]), ("stale", old),
                       ("torn", torn), ("epoch_2pow32_later", codec.encode(fmt, rows, 7 + 2**32)[0])):
        out.append(_verify_case(f"tff_{name}", fmt, wire, None, 7))

    fmt = WireFormat(mode="sp", dtype=bf16, hidden=16, block_bytes=16, flag_bytes=8)
    rows = sentinel_rows(fmt)
    new, record = codec.encode(fmt, rows, 7)
    initial, blank = codec.empty_receive(fmt, 3)
    torn = initial.clone()
    torn[0, :16] = new[0, :16]
    for name, wire, rec in (("initial", initial, blank), ("no_record", new, blank), ("fallback", new, record),
                            ("stale_record", new, codec.encode(fmt, rows, 5)[1]), ("torn", torn, blank)):
        out.append(_verify_case(f"sp_{name}", fmt, wire, rec, 7))

    fmt = WireFormat(mode="sw", dtype=bf16, hidden=8, block_bytes=16, flag_bytes=0)
    rows = sample_rows(bf16, 2, 8)
    new, record = codec.encode(fmt, rows, 7)
    wrong_count = codec.encode(fmt, sample_rows(bf16, 3, 8), 7)[1]
    for name, rec in (("complete", record), ("no_record", codec.empty_receive(fmt, 2)[1]),
                      ("stale_record", codec.encode(fmt, rows, 5)[1]), ("wrong_count", wrong_count)):
        out.append(_verify_case(f"sw_{name}", fmt, new, rec, 7))

    for block, flag in ((16, 8), (32, 32)):
        fmt = WireFormat(mode="dc", dtype=bf16, hidden=8, block_bytes=block, flag_bytes=flag)
        new, record = codec.encode(fmt, rows, 7)
        old, old_record = codec.encode(fmt, rows, 5)
        resent = new.clone()
        resent[1] = old[1]  # row 1 still holds call 5's copy of the very same data
        torn = codec.empty_receive(fmt, 2)[0]
        torn[0] = new[0]
        for name, wire, rec in (("complete", new, record), ("identical_stale_row", resent, record),
                                ("stale_record", old, old_record), ("torn", torn, record)):
            out.append(_verify_case(f"dc_b{block}_f{flag}_{name}", fmt, wire, rec, 7))
    return out


def build_vectors() -> dict:
    """Every vector, as the JSON-ready dict stored in ``tests/vectors/protocol.json``."""
    fmix_inputs = [0, 1, 2, 0xFF, 0x12345678, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF]
    efficiency = []
    for mode, block, flag in (("sw", 512, 0), ("tff", 512, 32), ("tff", 64, 8), ("dc", 512, 32),
                              ("sp", 4096, 32)):
        fmt = WireFormat(mode=mode, dtype=torch.bfloat16, hidden=7168, block_bytes=block, flag_bytes=flag)
        for rows_per_batch in (1, 128):
            ratio = payload_efficiency(fmt, rows_per_batch)
            efficiency.append({"format": _format(fmt), "rows_per_batch": rows_per_batch,
                               "ratio": [ratio.numerator, ratio.denominator]})
    return {
        "version": 1,
        "fmix32": [[x, fmix32(x)] for x in fmix_inputs],
        "sentinels": {name: [f"0x{c:0{2 * d.itemsize}x}" for c in sentinel_candidates(d)]
                      for d, name in DTYPES.items()},
        "encode": _encode_cases(),
        "verify": _verify_cases(),
        "efficiency": efficiency,
    }


def write_vectors(path: str | Path) -> None:
    """Write :func:`build_vectors` as indented JSON (one hex row per line) to ``path``."""
    Path(path).write_text(json.dumps(build_vectors(), indent=1) + "\n")
