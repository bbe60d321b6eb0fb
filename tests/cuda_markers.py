"""Checks of the CUDA backend's ``dc`` / ``sp`` marker helpers (``wire``, ``checksum``) against
``ubep.protocol`` byte for byte, run by Triton's interpreter on the CPU: wire images (masks,
padding), decoding, checksum lanes and the checksum, the sentinel test, the collision count and the
marker reset.

Each ``check_*`` runs a whole parameter matrix, as a rank function of ``ubep.launch.run_ranks``, in a
process whose environment had ``TRITON_INTERPRET=1`` before Triton was imported
(tests/test_cuda_markers.py); a failure names its parameters.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from ubep import protocol
from ubep.backends.cuda import checksum as ck
from ubep.backends.cuda import wire
from ubep.protocol.blocks import block_view
from ubep.protocol.words import MASK32, fmix32, le_words

VECTORS = json.loads((Path(__file__).parent / "vectors" / "protocol.json").read_text())
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
INT_VIEW = {2: torch.int16, 4: torch.int32}
MODES = wire.MODE_CODES
SHAPES = [(dtype, hidden) for dtype in DTYPES.values() for hidden in (8, 40, 200)]
EPOCHS = [1, 6, 2**32 + 6, 2**40 + 3, 2**63 - 1]


@triton.jit
def _encode(src_ptr, dst_ptr, lanes_ptr, epoch_ptr, HIDDEN: tl.constexpr, BE: tl.constexpr,
            NB: tl.constexpr, CB: tl.constexpr, MODE: tl.constexpr, SENTINEL: tl.constexpr):
    r = tl.program_id(0)
    a, b = wire.copy_row(src_ptr + r * HIDDEN, dst_ptr + r * (NB * BE), tl.load(epoch_ptr), r, HIDDEN,
                         BE, 0, NB, CB, MODE, SENTINEL)
    tl.store(lanes_ptr + r * 2, a.to(tl.int64))
    tl.store(lanes_ptr + r * 2 + 1, b.to(tl.int64))


@triton.jit
def _decode(wire_ptr, dst_ptr, epoch_ptr, HIDDEN: tl.constexpr, BE: tl.constexpr, NB: tl.constexpr,
            CB: tl.constexpr, MODE: tl.constexpr):
    r = tl.program_id(0)
    for c in range(0, tl.cdiv(NB, CB)):
        values, p_off, is_payload = wire.take_tiles(wire_ptr + r * (NB * BE), c, tl.load(epoch_ptr), 0,
                                                    0, 0, 0, r, epoch_ptr, True, HIDDEN, BE, 0, NB, CB, 1,
                                                    MODE, 0)
        tl.store(dst_ptr + r * HIDDEN + p_off, values, mask=is_payload)


@triton.jit
def _held(wire_ptr, rows_ptr, epoch_ptr, out_ptr, R: tl.constexpr, NB: tl.constexpr,
          NB_BLOCK: tl.constexpr):
    a, b, n = ck.wire_lanes(wire_ptr, tl.load(rows_ptr + tl.arange(0, R)), NB, NB_BLOCK)
    tl.store(out_ptr, ck.checksum(a, b, n, ck.digest(tl.load(epoch_ptr))))
    tl.store(out_ptr + 1, n.to(tl.int64))


@triton.jit
def _fmix(x_ptr, out_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(out_ptr + o, ck.fmix32(tl.load(x_ptr + o).to(tl.uint32)).to(tl.int64))


@triton.jit
def _sentinel(wire_ptr, pending_ptr, part, SENTINEL: tl.constexpr, BE: tl.constexpr,
              NB: tl.constexpr, NB_BLOCK: tl.constexpr, RESET: tl.constexpr, CB: tl.constexpr,
              PARTS: tl.constexpr):
    r = tl.program_id(0)
    row = wire_ptr + r * (NB * BE)
    tl.store(pending_ptr + r, ck.sentinel_pending(row, SENTINEL, NB, NB_BLOCK))
    if RESET:
        ck.reset_markers(row, part, SENTINEL, NB, NB_BLOCK, CB, PARTS)


def _each(params, check) -> None:
    """``check(*p)`` for every ``p`` of ``params``; a failure names its ``p``."""
    for p in params:
        try:
            check(*p)
        except AssertionError as err:
            raise AssertionError(f"{p}: {err}") from err


def _fmt(mode: str, dtype: torch.dtype, hidden: int) -> protocol.WireFormat:
    return protocol.WireFormat(mode=mode, dtype=dtype, hidden=hidden, block_bytes=wire.BLOCK_BYTES,
                               flag_bytes=ck.MARK_BYTES.value)


def _random_rows(dtype: torch.dtype, num_rows: int, hidden: int, seed: int) -> torch.Tensor:
    """Random bit patterns (NaNs, infinities and the sentinel's neighbours included)."""
    es = dtype.itemsize
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2 ** (8 * es - 1)), 2 ** (8 * es - 1), (num_rows, hidden), generator=gen,
                         dtype=torch.int64)
    return bits.to(INT_VIEW[es]).view(dtype)


def _sentinel_rows(dtype: torch.dtype, hidden: int) -> torch.Tensor:
    """Four rows: block 0's marker is the sentinel (collides), only 3 bytes short of it (does not),
    the last block's marker is (collides), random (does not)."""
    fmt = _fmt("sp", dtype, hidden)
    rows = _random_rows(dtype, 4, hidden, seed=hidden)
    bits = rows.view(INT_VIEW[dtype.itemsize])
    sentinel = torch.tensor(protocol.sentinel_candidates(dtype)[0]).to(bits.dtype)  # its bits
    marker = ck.MARK_BYTES.value // dtype.itemsize
    per_block = wire.BLOCK_BYTES // dtype.itemsize
    last = (fmt.blocks_per_row - 1) * per_block
    bits[0, :marker] = sentinel
    bits[1, :marker] = sentinel
    bits[1, marker - 1] = 0
    bits[2, last : last + marker] = sentinel
    return rows


def _run_encode(mode: str, rows: torch.Tensor, epoch: int):
    """``(wire_NS uint8, per-row lanes [N, 2] int64)`` written by ``wire.copy_row``."""
    dtype, (num_rows, hidden) = rows.dtype, rows.shape
    be, fe, nb = wire.geometry(mode, hidden, dtype.itemsize)
    assert fe == 0
    bits = rows.view(INT_VIEW[dtype.itemsize])
    out = torch.full((num_rows, nb * be), 0x55, dtype=bits.dtype)  # not zero: padding shows
    lanes = torch.zeros(num_rows, 2, dtype=torch.int64)
    sentinel = ck.sentinel_word(dtype) if mode == "sp" else 0
    _encode[(num_rows,)](bits, out, lanes, torch.tensor([epoch]), HIDDEN=hidden, BE=be, NB=nb, CB=2,
                         MODE=MODES[mode], SENTINEL=sentinel)
    return out.view(torch.uint8).view(num_rows, -1), lanes


def _check_encode(mode: str, rows: torch.Tensor, epoch: int) -> None:
    fmt = _fmt(mode, rows.dtype, rows.shape[1])
    got, lanes = _run_encode(mode, rows, epoch)
    want, record = protocol.encode(fmt, rows, epoch)
    assert torch.equal(got, want), "wire image"
    if mode == "dc":
        # the senders' lanes, summed over rows, give the protocol's checksum
        lane_a, lane_b = (int(v) & MASK32 for v in lanes.sum(0))
        d = protocol.epoch_digest(epoch)
        n = rows.shape[0] * fmt.blocks_per_row
        from_lanes = (fmix32(lane_b ^ fmix32(n)) << 32) | fmix32(lane_a ^ d)
        assert from_lanes == protocol.checksum(fmt, want, epoch) == protocol.read_record(record)[1]
        bits = rows.view(INT_VIEW[rows.dtype.itemsize])
        decoded = torch.zeros_like(bits)
        _decode[(rows.shape[0],)](got.view(decoded.dtype), decoded, torch.tensor([epoch]),
                                  HIDDEN=rows.shape[1], BE=wire.BLOCK_BYTES // rows.dtype.itemsize,
                                  NB=fmt.blocks_per_row, CB=4, MODE=MODES["dc"])
        assert torch.equal(decoded, bits), "decoded rows"
    else:
        per_block = ~protocol.arrived_blocks(fmt, want, epoch)  # blocks whose markers are the sentinel
        assert lanes[:, 0].tolist() == per_block.sum(1).tolist(), "sentinel blocks"
        assert (lanes[:, 0] > 0).tolist() == protocol.row_collides(fmt, rows).tolist()
        assert (record is None) == (not bool(per_block.any()))


def check_fmix32(_rank: int, _world: int) -> None:
    pairs = VECTORS["fmix32"]
    x = torch.tensor([p[0] for p in pairs], dtype=torch.int64).to(torch.int32)
    out = torch.zeros(len(pairs), dtype=torch.int64)
    _fmix[(1,)](x, out, N=len(pairs))
    assert out.tolist() == [p[1] for p in pairs]


def check_wire_images(_rank: int, _world: int, mode: str) -> None:
    """Random rows (and in ``sp`` rows holding the sentinel) of every shape, at every epoch."""
    def check(dtype, hidden, epoch):
        rows = _random_rows(dtype, 3, hidden, seed=hidden + epoch % 997)
        if mode == "sp":
            rows = torch.cat([rows, _sentinel_rows(dtype, hidden)])
        _check_encode(mode, rows, epoch)

    _each([(*shape, epoch) for shape, epoch in itertools.product(SHAPES, EPOCHS)], check)


def check_vector_rows(_rank: int, _world: int) -> None:
    """The rows and epochs of the stored dc / sp encode vectors (re-encoded here at 128 B)."""
    params = []
    for case in VECTORS["encode"]:
        fmt = case["format"]
        if fmt["mode"] in ("dc", "sp"):
            raw = torch.tensor([list(bytes.fromhex(r)) for r in case["rows"]], dtype=torch.uint8)
            params.append((fmt["mode"], raw.view(DTYPES[fmt["dtype"]]), case["epoch"] % 2**63))
    assert params
    _each(params, _check_encode)


def check_deepseek_row(_rank: int, _world: int) -> None:
    _check_encode("dc", _random_rows(torch.bfloat16, 2, 7168, seed=3), 2**32 + 5)


def _gpu_checksum(fmt: protocol.WireFormat, wire_NS: torch.Tensor, rows: list[int], epoch: int) -> int:
    """The checksum of the GPU batch made of the rows ``rows`` of a region (``checksum``'s doc): the
    protocol's formula with marker words numbered by the rows' indices in the region."""
    nb = fmt.blocks_per_row
    index = torch.tensor(rows, dtype=torch.int64)
    words = le_words(block_view(fmt, wire_NS)[index, :, :8])  # [R, nb, 2]
    k = (index[:, None, None] * nb + torch.arange(nb)[None, :, None]) * 2 + torch.arange(2)
    lane_a = int(fmix32(words ^ fmix32(2 * k)).sum()) & MASK32
    lane_b = int(fmix32(words ^ fmix32(2 * k + 1)).sum()) & MASK32
    return (fmix32(lane_b ^ fmix32(len(rows) * nb)) << 32) | fmix32(lane_a ^ protocol.epoch_digest(epoch))


def _held_checksum(fmt, region, held, epoch):
    out = torch.zeros(2, dtype=torch.int64)
    nb = fmt.blocks_per_row
    _held[(1,)](region, torch.tensor(held), torch.tensor([epoch]), out, R=len(held), NB=nb,
                NB_BLOCK=triton.next_power_of_2(nb))
    return int(out[0]) % 2**64, int(out[1])


def check_receiver_checksum(_rank: int, _world: int) -> None:
    """``wire_lanes`` over the rows a receiver expects (-1: none) of a 4-row region equals the GPU
    batch checksum, which is the protocol's when no row is missing; a stale row changes it."""
    def check(dtype, hidden, epoch, held):
        fmt = _fmt("dc", dtype, hidden)
        region, _ = _run_encode("dc", _random_rows(dtype, 4, hidden, seed=epoch), epoch)
        rows = [r for r in held if r >= 0]
        want = _gpu_checksum(fmt, region, rows, epoch)
        if rows == [0, 1, 2, 3]:
            assert want == protocol.checksum(fmt, region, epoch)
        assert _held_checksum(fmt, region, held, epoch) == (want, len(rows) * fmt.blocks_per_row)
        stale, _ = _run_encode("dc", _random_rows(dtype, 4, hidden, seed=epoch), epoch - 2)
        region[rows[-1]] = stale[rows[-1]]  # the same data, still masked for call epoch - 2
        assert _held_checksum(fmt, region, held, epoch)[0] != want, "a stale row passed"

    _each(itertools.product([(torch.bfloat16, 200), (torch.float32, 8)], [7, 2**32 + 7],
                            [[0, 1, 2, 3], [0, 2, 3, -1], [3, -1, -1, 1]]),
          lambda shape, epoch, held: check(*shape, epoch, held))


def _pending(fmt, region, reset, part=0, parts=1):
    """Blocks of each row of ``region`` still holding the sentinel; ``reset``: then part ``part``
    of ``parts`` (chunks of one block) writes the sentinel back."""
    pending = torch.zeros(region.shape[0], dtype=torch.int32)
    nb = fmt.blocks_per_row
    _sentinel[(region.shape[0],)](region, pending, part, SENTINEL=ck.sentinel_word(fmt.dtype),
                                  BE=wire.BLOCK_BYTES, NB=nb, NB_BLOCK=triton.next_power_of_2(nb),
                                  RESET=reset, CB=1, PARTS=parts)
    return pending.tolist()


def check_sentinel_wait_and_reset(_rank: int, _world: int) -> None:
    """An idle slot (the protocol's sentinel fill) has every block pending; arrived rows none, except
    the blocks that carry the sentinel; the reset gives back the idle markers and keeps the rest.
    Split between two parts (the receivers of halves of a row), each resets only its own blocks."""
    def check(dtype, hidden):
        fmt = _fmt("sp", dtype, hidden)
        rows = torch.cat([_random_rows(dtype, 2, hidden, seed=1), _sentinel_rows(dtype, hidden)])
        idle, _ = protocol.empty_receive(fmt, rows.shape[0])
        assert _pending(fmt, idle, reset=False) == [fmt.blocks_per_row] * rows.shape[0]
        got, _ = _run_encode("sp", rows, 5)
        still_sentinel = (~protocol.arrived_blocks(fmt, got, 5)).sum(1).tolist()
        assert _pending(fmt, got, reset=True) == still_sentinel  # resets got
        want, _ = protocol.encode(fmt, rows, 5)
        protocol.sentinel_fill(fmt, want)
        assert torch.equal(got, want), "markers after the reset"
        halves, _ = _run_encode("sp", rows, 5)
        before = halves.clone()
        _pending(fmt, halves, reset=True, part=1, parts=2)
        blocks = (rows.shape[0], fmt.blocks_per_row, -1)
        odd = torch.arange(fmt.blocks_per_row) % 2 == 1
        assert torch.equal(halves.view(blocks)[:, odd], want.view(blocks)[:, odd]), "part 1's blocks"
        assert torch.equal(halves.view(blocks)[:, ~odd], before.view(blocks)[:, ~odd]), "part 0's"
        _pending(fmt, halves, reset=True, part=0, parts=2)
        assert torch.equal(halves, want), "markers after both parts' resets"

    _each(SHAPES, check)
