"""How a row travels in the CUDA backend's symmetric buffers: its wire image and arrival rule.

A row of ``HIDDEN`` elements of ``ES`` bytes is cut into ``NB`` blocks of ``BE`` elements
(``BE * ES`` bytes); block ``b`` holds ``FE`` flag elements, then payload elements
``b * PE .. b * PE + PE - 1`` (``PE = BE - FE``), zero-padded at the end of the row. Modes
(``ubep.protocol``):

- ``tff`` (``FE * ES = 8``): the flag is the call's u64 epoch, little-endian. A row has arrived
  when every block's flag equals the epoch. Each 128-byte block is aligned and lies inside one warp
  store instruction (16 bytes per thread): blocks of at most 128 B stored by one warp instruction
  were never seen torn over NVLink, 256 B ones were (``benchmarks/probe_store_atomicity.py``), and
  the GPU stress test (2000 calls per layout, random delays) saw no torn block in this layout.
  Blocks stored by another SM of the same GPU were never seen torn either, at any size measured.
  The reader checks the flags inside the values it loaded (``take_tile``), never a flag then the
  payload in a second load, which the GPU may serve from before the flag.
- ``sw`` (``FE = 0``): plain rows; a batch has arrived when its record does (``ubep.backends.cuda.sync``).

Example: 7168 bf16 elements, ``tff`` with 128-byte blocks: ``BE = 64``, ``FE = 4``, ``PE = 60``,
``NB = 120``, 15360 bytes per row on the wire; ``sw``: ``NB = 112``, 14336 bytes.

Rows move in chunks of ``CB`` blocks, as ``[CB, BE]`` tiles: the wire side of a tile is contiguous
(16-byte vector stores), the payload side is contiguous within each block.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda.sync import now_ns, report

MODE_CODES = {"sw": 0, "tff": 1}
TFF = tl.constexpr(MODE_CODES["tff"])
BLOCK_BYTES = 128
FLAG_BYTES = 8


def geometry(mode: str, hidden: int, elem_bytes: int) -> tuple[int, int, int]:
    """``(BE, FE, NB)`` of a row of ``hidden`` elements of ``elem_bytes`` bytes in ``mode``."""
    be = BLOCK_BYTES // elem_bytes
    fe = FLAG_BYTES // elem_bytes if mode == "tff" else 0
    return be, fe, triton.cdiv(hidden, be - fe)


@triton.jit
def tile(c, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
         CB: tl.constexpr):
    """Offsets of chunk ``c`` of a row: ``(wire [CB, BE], payload [CB, BE], is_payload, is_flag)``."""
    b = c * CB + tl.arange(0, CB)[:, None]
    o = tl.arange(0, BE)[None, :]
    payload = b * (BE - FE) + o - FE
    is_payload = (o >= FE) & (payload < HIDDEN) & (b < NB)
    is_flag = (o < FE) & (b < NB)
    return b * BE + o, payload, is_payload, is_flag


@triton.jit
def flag_bits(epoch, BE: tl.constexpr, FE: tl.constexpr, BITS: tl.constexpr):
    """``[1, BE]`` int64: the epoch's ``BITS``-bit pieces for flag elements ``o = 0 .. FE - 1`` (LE)."""
    o = tl.arange(0, BE)[None, :]
    shift = (tl.minimum(o, FE - 1) * BITS).to(tl.int64)
    return (epoch >> shift) & ((1 << BITS) - 1)


@triton.jit
def put_tile(wire_ptr, values, c, epoch, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
             NB: tl.constexpr, CB: tl.constexpr):
    """Store chunk ``c`` of a row whose payload elements are ``values`` (``[CB, BE]`` of the wire's
    integer type, at the tile's payload offsets) into the wire row at ``wire_ptr``, flags included."""
    w_off, _, is_payload, is_flag = tile(c, HIDDEN, BE, FE, NB, CB)
    dt: tl.constexpr = wire_ptr.dtype.element_ty
    if FE > 0:
        flags = flag_bits(epoch, BE, FE, dt.primitive_bitwidth).to(dt)
        values = tl.where(is_flag, flags, values)
    values = tl.where(is_payload | is_flag, values, 0)
    tl.store(wire_ptr + w_off, values, mask=w_off < NB * BE)


@triton.jit
def copy_row(src_ptr, wire_ptr, epoch, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
             NB: tl.constexpr, CB: tl.constexpr):
    """The wire image of the row at ``src_ptr`` (``HIDDEN`` elements, same integer type) at
    ``wire_ptr``."""
    for c in range(0, tl.cdiv(NB, CB)):
        _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB)
        values = tl.load(src_ptr + p_off, mask=is_payload, other=0)
        put_tile(wire_ptr, values, c, epoch, HIDDEN, BE, FE, NB, CB)


@triton.jit
def take_tile(wire_ptr, c, epoch, deadline, err_addr, code, peer, HIDDEN: tl.constexpr,
              BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr):
    """Chunk ``c`` of a row that has arrived or is arriving: ``(values [CB, BE], payload offsets,
    is_payload)``; flag lanes hold flags (store ``values`` under ``is_payload``).

    ``tff``: the chunk is loaded until every block's flag *in the loaded values* holds ``epoch``, so
    each block's flag and payload come from one load instruction (16 bytes per thread, a warp per
    128-byte block); a separate flag poll followed by a payload load would need an acquire
    between the two. A wait past ``deadline`` (``%globaltimer`` ns) is reported through the host
    error word, naming ``peer``. ``sw``: one load (the record said the rows have landed). The loads
    bypass L1, which may hold lines from before the peer wrote."""
    w_off, p_off, is_payload, is_flag = tile(c, HIDDEN, BE, FE, NB, CB)
    in_row = w_off < NB * BE
    if FE > 0:
        dt: tl.constexpr = wire_ptr.dtype.element_ty
        want = flag_bits(epoch, BE, FE, dt.primitive_bitwidth).to(dt)
        values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
        pending = tl.sum(tl.sum((is_flag & (values != want)).to(tl.int32), 1), 0) > 0
        while pending & (now_ns() < deadline):
            values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
            pending = tl.sum(tl.sum((is_flag & (values != want)).to(tl.int32), 1), 0) > 0
        if pending:
            report(err_addr, code, peer, epoch)
    else:
        values = tl.load(wire_ptr + w_off, mask=in_row, other=0, cache_modifier=".cg")
    return values, p_off, is_payload
