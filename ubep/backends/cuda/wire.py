"""How a row travels in the CUDA backend's symmetric buffers: its wire image and arrival rule.

A row of ``HIDDEN`` elements of ``ES`` bytes is cut into ``NB`` blocks of ``BE`` elements
(``BE * ES`` bytes); block ``b`` holds ``FE`` flag elements, then payload elements
``b * PE .. b * PE + PE - 1`` (``PE = BE - FE``), zero-padded at the end of the row. Modes
(``ubep.protocol``):

- ``tff`` (``FE * ES = 8``): the flag is the call's u64 epoch, little-endian. A row has arrived
  when every block's flag equals the epoch. Each 128-byte block is aligned and lies inside one warp
  store instruction (16 bytes per thread): on H200s, blocks of at most 128 B stored by one warp
  instruction have not been seen torn over NVLink, 256 B ones have, and within one GPU none has
  (``benchmarks/probe_store_atomicity.py``; evidence, not a guarantee: docs/PROTOCOL.md). The
  reader checks the flags inside the values it loaded (``take_tiles``), never a flag then the
  payload in a second load, which the GPU may serve from before the flag.
- ``sw`` (``FE = 0``): plain rows; a batch has arrived when its record does (``ubep.backends.cuda.sync``).
- ``dc`` (``FE = 0``): the first 8 bytes of each block are masked marker words, checked against the
  batch checksum (``checksum``, ``records``); ``row`` numbers the row for the masks.
- ``sp`` (``FE = 0``): raw rows; a block has arrived when its first 8 bytes are not the sentinel
  (``checksum``, ``records``); the sender counts the blocks that would carry it.

Example: 7168 bf16 elements, ``tff`` with 128-byte blocks: ``BE = 64``, ``FE = 4``, ``PE = 60``,
``NB = 120``, 15360 bytes per row on the wire; ``sw``, ``dc``, ``sp``: ``NB = 112``, 14336 bytes.

Rows move in chunks of ``CB`` blocks, as ``[CB, BE]`` tiles, or ``U`` rows' chunks at once as one
``[U * CB, BE]`` tile (the senders: more bytes in flight per program): the wire side of a row's
chunk is contiguous (16-byte vector stores), the payload side is contiguous within each block.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda.kernels import any_true
from ubep.backends.cuda.sync import now_ns, read_once, report

MODE_CODES = {"sw": 0, "tff": 1, "dc": 2, "sp": 3}
SW, TFF, DC, SP = (tl.constexpr(MODE_CODES[m]) for m in ("sw", "tff", "dc", "sp"))
BLOCK_BYTES = 128
FLAG_BYTES = 8


def geometry(mode: str, hidden: int, elem_bytes: int) -> tuple[int, int, int]:
    """``(BE, FE, NB)`` of a row of ``hidden`` elements of ``elem_bytes`` bytes in ``mode``."""
    be = BLOCK_BYTES // elem_bytes
    fe = FLAG_BYTES // elem_bytes if mode == "tff" else 0
    return be, fe, -(-hidden // (be - fe))  # host integers: triton.cdiv is a slow JIT call here


@triton.jit
def tile(c, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
         CB: tl.constexpr, U: tl.constexpr):
    """Offsets of chunk ``c`` of ``U`` rows as one ``[U * CB, BE]`` tile, block-row ``r`` holding
    block ``c * CB + r % CB`` of row ``r // CB`` (:func:`tile_rows`): ``(wire, payload, is_payload,
    is_flag)``, offsets within each row."""
    b = _blocks(c, CB, U)
    o = tl.arange(0, BE)[None, :]
    payload = b * (BE - FE) + o - FE
    is_payload = (o >= FE) & (payload < HIDDEN) & (b < NB)
    is_flag = (o < FE) & (b < NB)
    return b * BE + o, payload, is_payload, is_flag


@triton.jit
def _blocks(c, CB: tl.constexpr, U: tl.constexpr):
    """``[U * CB, 1]``: the block of its row each block-row of chunk ``c`` holds."""
    return c * CB + (tl.arange(0, U * CB) % CB)[:, None]


@triton.jit
def tile_rows(CB: tl.constexpr, U: tl.constexpr):
    """``[U * CB, 1]``: the row ``u < U`` of each block-row of a :func:`tile`."""
    return (tl.arange(0, U * CB) // CB)[:, None]


@triton.jit
def per_block_row(per_row, CB: tl.constexpr, U: tl.constexpr):
    """A ``[U]`` vector spread over a tile's block-rows: ``[U * CB, 1]``."""
    return tl.reshape(tl.broadcast_to(per_row[:, None], (U, CB)), (U * CB, 1))


@triton.jit
def flag_bits(epoch, BE: tl.constexpr, FE: tl.constexpr, BITS: tl.constexpr):
    """``[1, BE]`` int64: the epoch's ``BITS``-bit pieces for flag elements ``o = 0 .. FE - 1`` (LE)."""
    o = tl.arange(0, BE)[None, :]
    shift = (tl.minimum(o, FE - 1) * BITS).to(tl.int64)
    return (epoch >> shift) & ((1 << BITS) - 1)


@triton.jit
def _first_word(row, c, NB: tl.constexpr, CB: tl.constexpr, U: tl.constexpr):
    """``dc``: number ``k`` (u32, ``[U * CB, 1]``) of word 0 of each block of chunk ``c`` of the
    tile's rows, numbered ``row`` (a scalar, or ``[U * CB, 1]``)."""
    return ((row.to(tl.int64) * NB + _blocks(c, CB, U)) * 2).to(tl.uint32)


@triton.jit
def wire_tile(values, c, epoch, row, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
              NB: tl.constexpr, CB: tl.constexpr, U: tl.constexpr, MODE: tl.constexpr,
              SENTINEL: tl.constexpr):
    """Chunk ``c`` of ``U`` rows numbered ``row`` in their batch (a scalar or ``[U * CB, 1]``),
    whose payload elements are ``values`` (a ``[U * CB, BE]`` :func:`tile` of the wire's integer
    type), as the wire holds it, flags and masks included; and what each block-row adds to its
    batch record, ``[U * CB, 1]`` u32 each: ``dc`` its checksum lanes ``(A, B)``, ``sp`` (as ``A``)
    1 where it carries the sentinel, 0 otherwise and past the row. The same for every rank the
    rows go to: a sender builds it once and stores it to each (:func:`store_tile`)."""
    _, _, is_payload, is_flag = tile(c, HIDDEN, BE, FE, NB, CB, U)
    bits: tl.constexpr = values.dtype.primitive_bitwidth
    if FE > 0:
        flags = flag_bits(epoch, BE, FE, bits).to(values.dtype)
        values = tl.where(is_flag, flags, values)
    values = tl.where(is_payload | is_flag, values, 0)
    block_a = tl.zeros([U * CB, 1], dtype=tl.uint32)
    block_b = tl.zeros([U * CB, 1], dtype=tl.uint32)
    real = _blocks(c, CB, U) < NB
    if MODE == DC:
        first = _first_word(row, c, NB, CB, U)
        values = ck.mask_tile(values, first, ck.digest(epoch), bits)
        w0, w1 = ck.marker_words(values, bits)
        a, b = ck.block_lanes(w0, w1, tl.reshape(first, [U * CB]))
        block_a = tl.where(real, tl.reshape(a, [U * CB, 1]), 0)
        block_b = tl.where(real, tl.reshape(b, [U * CB, 1]), 0)
    if MODE == SP:
        hit = tl.reshape(ck.collides(values, SENTINEL, bits), [U * CB, 1])
        block_a = (hit & real).to(tl.uint32)
    return values, block_a, block_b


@triton.jit
def store_tile(wire_ptr, wired, c, live, HIDDEN: tl.constexpr, BE: tl.constexpr,
               FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, U: tl.constexpr):
    """Store the wire tile ``wired`` of chunk ``c`` (:func:`wire_tile`) into the wire rows starting at
    ``wire_ptr``, only where ``live`` (``wire_ptr`` and ``live`` scalars or ``[U * CB, 1]``)."""
    w_off, _, _, _ = tile(c, HIDDEN, BE, FE, NB, CB, U)
    tl.store(wire_ptr + w_off, wired, mask=(w_off < NB * BE) & live)


@triton.jit
def put_tile(wire_ptr, values, c, epoch, row, live, HIDDEN: tl.constexpr, BE: tl.constexpr,
             FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, U: tl.constexpr,
             MODE: tl.constexpr, SENTINEL: tl.constexpr):
    """:func:`wire_tile`, then :func:`store_tile` (rows of one destination). Returns what the batch
    record needs: the sums over the stored block-rows (``dc`` the lanes ``(A, B)``, ``sp`` as ``A``
    the blocks that carry the sentinel); zeros otherwise."""
    wired, block_a, block_b = wire_tile(values, c, epoch, row, HIDDEN, BE, FE, NB, CB, U, MODE,
                                        SENTINEL)
    store_tile(wire_ptr, wired, c, live, HIDDEN, BE, FE, NB, CB, U)
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    if MODE >= DC:  # dc and sp
        lane_a = tl.sum(tl.sum(tl.where(live, block_a, 0), 1), 0)
    if MODE == DC:
        lane_b = tl.sum(tl.sum(tl.where(live, block_b, 0), 1), 0)
    return lane_a, lane_b


@triton.jit
def copy_row(src_ptr, wire_ptr, epoch, row, HIDDEN: tl.constexpr, BE: tl.constexpr,
             FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, MODE: tl.constexpr,
             SENTINEL: tl.constexpr):
    """The wire image of the row at ``src_ptr`` (``HIDDEN`` elements, same integer type) at
    ``wire_ptr``, as row ``row`` of its batch; returns the sums of :func:`put_tile`'s results."""
    lane_a = tl.zeros([], dtype=tl.uint32)
    lane_b = tl.zeros([], dtype=tl.uint32)
    for c in range(0, tl.cdiv(NB, CB)):
        _, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB, 1)
        values = tl.load(src_ptr + p_off, mask=is_payload, other=0)
        a, b = put_tile(wire_ptr, values, c, epoch, row, True, HIDDEN, BE, FE, NB, CB, 1, MODE,
                        SENTINEL)
        lane_a += a
        lane_b += b
    return lane_a, lane_b


@triton.jit
def _per_row(per_block_row, CB: tl.constexpr, U: tl.constexpr):
    """``[U]``: the sums over each row's ``CB`` entries of a ``[U * CB]`` vector."""
    return tl.sum(tl.reshape(per_block_row, (U, CB)), 1)


@triton.jit
def _sentinel_rows(values, SENTINEL: tl.constexpr, BITS: tl.constexpr, CB: tl.constexpr,
                   U: tl.constexpr):
    """``sp``: ``[U]``, how many blocks of each row of a loaded ``[U * CB, BE]`` tile hold the
    sentinel in both marker words (blocks past the row, or of rows not loaded, load as zeros, which
    never do)."""
    w0, w1 = ck.marker_words(values, BITS)
    s = tl.full([], SENTINEL, tl.uint32)
    return _per_row(((w0 == s) & (w1 == s)).to(tl.int32), CB, U)


@triton.jit
def take_tiles(wire_ptr, c, epoch, deadline, err_addr, code, peer, row, rec_ptr, live,
               HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr, NB: tl.constexpr,
               CB: tl.constexpr, U: tl.constexpr, MODE: tl.constexpr, SENTINEL: tl.constexpr):
    """Chunk ``c`` of ``U`` rows that have arrived or are arriving, as one ``[U * CB, BE]``
    :func:`tile`: ``(values, payload offsets, is_payload)``; flag lanes hold flags (store ``values``
    under ``is_payload``). ``wire_ptr``, ``row`` (the rows' numbers in their batches) and ``live``
    (which rows to take; the others load as zeros and are not waited for) are scalars or
    ``[U * CB, 1]``; ``peer`` (the rows' sources, for error reports) and ``rec_ptr`` are scalars
    or ``[U]``.

    ``tff``: the chunk is loaded until every block's flag *in the loaded values* holds ``epoch``, so
    each block's flag and payload come from one load instruction (16 bytes per thread, a warp per
    128-byte block; Triton lays the tile out so only when ``CB`` is at least the backend's
    ``MIN_TILE_BLOCKS``, see ``geometry.row_meta``); a separate flag poll followed by a payload load
    would need an acquire between the two. ``sp``: likewise, until no block's first 8 bytes *in the
    loaded values* are the sentinel ``SENTINEL`` twice, or the row source's fallback record at
    ``rec_ptr`` reads ``epoch`` (an acquire, then one more load). A wait past ``deadline``
    (``%globaltimer`` ns) is reported through the host error word, naming a source still awaited.
    ``sw``: one load (the record said the rows have landed); ``dc``: the same, then the markers
    decoded (the verify group matched the source's checksum).
    The loads bypass L1, which may hold lines from before the peer wrote."""
    w_off, p_off, is_payload, _ = tile(c, HIDDEN, BE, FE, NB, CB, U)
    in_row = (w_off < NB * BE) & live
    dt: tl.constexpr = wire_ptr.dtype.element_ty
    bits: tl.constexpr = dt.primitive_bitwidth
    if FE > 0:
        # any stale flag, as one reduction over the tile, with the flag columns and the live
        # block-rows as a [1, BE] and a [U * CB, 1] mask: ptxas then fits the combine in its
        # 128-register budget with 16 bytes of stack (per-row sums or whole-tile masks need more)
        o = tl.arange(0, BE)[None, :]
        want = tl.where(o < FE, flag_bits(epoch, BE, FE, bits), 0).to(dt)  # [1, BE]
        check = (o < FE) & (_blocks(c, CB, U) < NB) & live
        values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
        while (tl.max(((values != want) & check).to(tl.int32)) > 0) & (now_ns() < deadline):
            values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
        stale = (values != want) & check
        if tl.max(stale.to(tl.int32)) > 0:
            peers = per_block_row(tl.zeros([U], dtype=tl.int32) + peer, CB, U)
            report(err_addr, code, tl.max(tl.max(tl.where(stale, peers, 0), 1), 0), epoch)
    elif MODE == SP:
        values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
        stale = _sentinel_rows(values, SENTINEL, bits, CB, U) > 0
        if any_true(stale):  # checked at least once more, after the record (the interpreter checks once)
            # the fallback record orders the loads; read once per program (sync.read_once): the
            # poll's sentinel sums reduce over warps, so every warp must leave it at one pass
            unreleased = read_once(rec_ptr, "acquire") != epoch
            values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
            stale = (_sentinel_rows(values, SENTINEL, bits, CB, U) > 0) & unreleased
            while any_true(stale) & (now_ns() < deadline):
                unreleased = read_once(rec_ptr, "acquire") != epoch
                values = tl.load(wire_ptr + w_off, mask=in_row, other=0, volatile=True)
                stale = (_sentinel_rows(values, SENTINEL, bits, CB, U) > 0) & unreleased
        if any_true(stale):
            report(err_addr, code, tl.max(tl.where(stale, peer, 0), 0), epoch)
    else:
        values = tl.load(wire_ptr + w_off, mask=in_row, other=0, cache_modifier=".cg")
        if MODE == DC:
            values = ck.mask_tile(values, _first_word(row, c, NB, CB, U), ck.digest(epoch), bits)
    return values, p_off, is_payload
