"""ubep.protocol: hand-worked wire bytes, round trips, stale and torn data, SP fallback, vectors."""

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from ubep import protocol as P
from ubep.protocol.vectors import sample_rows, sentinel_rows

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DTYPE_BY_NAME = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# (mode, block_bytes, flag_bytes): small blocks so rows span several, one tail-padded geometry each.
GEOMETRIES = [("sw", 16, 0), ("sw", 64, 0), ("tff", 16, 8), ("tff", 64, 16), ("dc", 16, 8),
              ("dc", 32, 32), ("sp", 16, 8), ("sp", 32, 16)]


def fmt_of(mode, block, flag, dtype=torch.bfloat16, hidden=24, sentinel_index=0):
    return P.WireFormat(mode=mode, dtype=dtype, hidden=hidden, block_bytes=block, flag_bytes=flag,
                        sentinel_index=sentinel_index)


def bits(t):
    return t.contiguous().view(torch.uint8)


def view_shape(fmt, wire):
    return (wire.shape[0], fmt.blocks_per_row, fmt.block_bytes)


# --- Hand-worked examples -------------------------------------------------------------------------

def test_geometry_worked_example():
    tff = fmt_of("tff", 512, 32, hidden=7168)
    assert (tff.row_bytes, tff.payload_bytes, tff.blocks_per_row) == (14336, 480, 30)
    assert (tff.row_stride, tff.padding_bytes, tff.payload_offset) == (15360, 64, 32)
    sp = fmt_of("sp", 512, 32, hidden=7168)
    assert (sp.payload_bytes, sp.blocks_per_row, sp.row_stride, sp.padding_bytes) == (512, 28, 14336, 0)
    big = fmt_of("sw", 4096, 0, hidden=7168)
    assert (big.blocks_per_row, big.padding_bytes) == (4, 2048)
    assert fmt_of("dc", 16, 8, dtype=torch.float32, hidden=40).row_stride == 160


def test_slot_parity_and_epoch_range():
    assert [P.slot(e) for e in (1, 2, 3, 4, 2**64 - 1)] == [1, 0, 1, 0, 1]
    for bad in (0, -1, 2**64):
        with pytest.raises(ValueError, match="epoch must be in"):
            P.check_epoch(bad)
    with pytest.raises(TypeError, match="epoch must be an int"):
        P.slot(True)


def test_tff_bytes_by_hand():
    # 8 bf16 ones (0x3F80 -> bytes 80 3f), 16-byte blocks with an 8-byte flag, call 5:
    # block 0 = flag 05 00*7 + elements 0..3, block 1 = flag + elements 4..7.
    fmt = fmt_of("tff", 16, 8, hidden=8)
    wire, record = P.encode(fmt, torch.ones(1, 8, dtype=torch.bfloat16), 5)
    half = "0500000000000000" + "803f" * 4
    assert bytes(wire[0].tolist()).hex() == half * 2 and record is None
    assert P.tff_flag(fmt_of("tff", 64, 16), 5).tolist() == [5] + [0] * 7 + [5] + [0] * 7


def test_tff_tail_padding_by_hand():
    # 24 fp16 = 48 bytes in 48-byte payloads (64-byte blocks, 16-byte flag): exactly one block; with
    # hidden 40 (80 bytes) two blocks, the second holding 32 bytes then 16 zero bytes.
    fmt = fmt_of("tff", 64, 16, dtype=torch.float16, hidden=40)
    rows = torch.full((1, 40), 2.0, dtype=torch.float16)  # 0x4000 -> bytes 00 40
    wire, _ = P.encode(fmt, rows, 3)
    block1 = bytes(wire[0, 64:].tolist())
    assert block1[:16] == (3).to_bytes(8, "little") * 2
    assert block1[16:48] == bytes.fromhex("0040") * 16 and block1[48:] == bytes(16)


def test_record_and_sentinel_bytes_by_hand():
    assert P.make_record(5, 2).tolist() == [5] + [0] * 7 + [2] + [0] * 7
    assert P.read_record(P.make_record(2**64 - 1, 2**63)) == (2**64 - 1, 2**63)
    assert bytes(P.sentinel_bytes(fmt_of("sp", 16, 8, hidden=8)).tolist()).hex() == "a5ffa5ffa5ffa5ff"
    fp32 = fmt_of("sp", 16, 8, dtype=torch.float32, hidden=8, sentinel_index=1)
    assert bytes(P.sentinel_bytes(fp32).tolist()).hex() == "969696ff969696ff"
    wire, record = P.empty_receive(fmt_of("sp", 16, 8, dtype=torch.float16, hidden=8), 1)
    assert bytes(wire[0].tolist()).hex() == "a5fd" * 4 + "00" * 8 and record.tolist() == [0] * 16


def test_sw_bytes_by_hand():
    fmt = fmt_of("sw", 32, 0, hidden=8)  # 16-byte rows in one 32-byte block: 16 bytes of padding
    wire, record = P.encode(fmt, torch.ones(2, 8, dtype=torch.bfloat16), 7)
    assert bytes(wire[1].tolist()).hex() == "803f" * 8 + "00" * 16
    assert P.read_record(record) == (7, 2)


def _fmix32_reference(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & m
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & m
    return x ^ (x >> 16)


def test_fmix32_matches_plain_integer_arithmetic():
    assert P.fmix32(0) == 0 and P.fmix32(1) == 0x514E28B7
    xs = torch.randint(0, 2**32, (4096,), generator=torch.Generator().manual_seed(0))
    xs[:3] = torch.tensor([0, 2**32 - 1, 2**31])
    assert P.fmix32(xs).tolist() == [_fmix32_reference(x) for x in xs.tolist()]


def _dc_reference(block, flag, wire_rows, rows_plain, epoch):
    """DC from the spec text with Python ints only: the model a C++ twin follows."""
    wire = b"".join(wire_rows)
    plain = b"".join(rows_plain)
    words_per_block = flag // 4
    d = _fmix32_reference((epoch & 0xFFFFFFFF) ^ _fmix32_reference(epoch >> 32))
    lane_a = lane_b = 0
    k = 0
    for start in range(0, len(wire), block):
        for j in range(words_per_block):
            at = start + 4 * j
            w = int.from_bytes(wire[at : at + 4], "little")
            assert w == int.from_bytes(plain[at : at + 4], "little") ^ _fmix32_reference(k ^ d)
            lane_a += _fmix32_reference(w ^ _fmix32_reference(2 * k))
            lane_b += _fmix32_reference(w ^ _fmix32_reference(2 * k + 1))
            k += 1
    n = len(wire) // block
    hi = _fmix32_reference((lane_b & 0xFFFFFFFF) ^ _fmix32_reference(n))
    return (hi << 32) | _fmix32_reference((lane_a & 0xFFFFFFFF) ^ d)


@pytest.mark.parametrize(("block", "flag", "epoch"), [(16, 8, 7), (32, 32, 2**32 + 6), (64, 4, 2**64 - 1)])
def test_dc_checksum_and_mask_match_integer_reference(block, flag, epoch):
    fmt = fmt_of("dc", block, flag, dtype=torch.float16, hidden=40)
    rows = sample_rows(torch.float16, 3, 40)
    wire, record = P.encode(fmt, rows, epoch)
    plain = P.encode(fmt_of("sw", block, 0, dtype=torch.float16, hidden=40), rows, epoch)[0]
    expected = _dc_reference(block, flag, [bytes(r.tolist()) for r in wire],
                             [bytes(r.tolist()) for r in plain], epoch)
    assert P.checksum(fmt, wire, epoch) == expected
    assert P.read_record(record) == (epoch, expected)
    # Only the marker bytes are masked; the rest of each block is the plain payload.
    blocks_w, blocks_p = wire.view(3, -1, block), plain.view(3, -1, block)
    assert torch.equal(blocks_w[:, :, flag:], blocks_p[:, :, flag:])


# --- Round trips -----------------------------------------------------------------------------------

def _special_rows(dtype, num_rows, hidden, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(num_rows, hidden, generator=g) * 100
    if num_rows:
        rows[0, :6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40])
    return rows.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mode", "block", "flag"), GEOMETRIES)
def test_round_trip(mode, block, flag, dtype):
    for hidden, num_rows in ((8, 1), (56, 5), (24, 0)):
        fmt = fmt_of(mode, block, flag, dtype=dtype, hidden=hidden)
        rows = _special_rows(dtype, num_rows, hidden, seed=hidden)
        wire, record = P.encode(fmt, rows, 11)
        assert wire.shape == (num_rows, fmt.row_stride)
        if mode == "sp":
            record = record if record is not None else P.empty_receive(fmt, 0)[1]
        assert P.arrived_rows(fmt, wire, record, 11).all()
        assert torch.equal(bits(P.decode(fmt, wire, 11)), bits(rows))


# --- Stale and torn data never verify ---------------------------------------------------------------

def _install(fmt, wire_new, record_new, row_blocks, with_record, base_wire, base_record):
    """Receiver state after only the blocks in ``row_blocks`` (and the record if asked) arrived."""
    wire = base_wire.clone()
    view, new_view = wire.view(view_shape(fmt, wire)), wire_new.view(view_shape(fmt, wire_new))
    for r, b in row_blocks:
        view[r, b] = new_view[r, b]
    return wire, record_new.clone() if with_record and record_new is not None else base_record


def _stale_state(fmt, rows, epoch):
    """Receive slot after call ``epoch - 2`` sent ``rows`` and was consumed (SP markers reset)."""
    wire, record = P.encode(fmt, rows, epoch - 2)
    if fmt.mode == "sp":
        P.sentinel_fill(fmt, wire)
        record = P.empty_receive(fmt, 0)[1] if record is None else record
    return wire, record


@pytest.mark.parametrize(("mode", "block", "flag"), GEOMETRIES)
def test_stale_epoch_never_verifies(mode, block, flag):
    fmt = fmt_of(mode, block, flag, hidden=40)
    rows = sample_rows(torch.bfloat16, 3, 40)
    for epoch in (9, 2**32 + 9):
        for old_rows in (rows, sample_rows(torch.bfloat16, 3, 40).flip(0)):  # same data resent, and other
            stale_wire, stale_record = _stale_state(fmt, old_rows, epoch)
            assert not P.arrived_rows(fmt, stale_wire, stale_record, epoch).any()
        initial_wire, initial_record = P.empty_receive(fmt, 3)
        assert not P.arrived_rows(fmt, initial_wire, initial_record, epoch).any()
    if mode == "tff":  # flags are full u64: an epoch 2**32 calls away is a different flag
        wire = P.encode(fmt, rows, 5 + 2**32)[0]
        assert not P.arrived_rows(fmt, wire, None, 5).any()


@pytest.mark.parametrize(("mode", "block", "flag"), GEOMETRIES)
def test_torn_writes_never_verify_complete(mode, block, flag):
    fmt = fmt_of(mode, block, flag, hidden=40)
    rows = sample_rows(torch.bfloat16, 3, 40)
    rng = random.Random(f"{mode}{block}")
    all_blocks = [(r, b) for r in range(3) for b in range(fmt.blocks_per_row)]
    new_wire, new_record = P.encode(fmt, rows, 9)
    for trial in range(40):
        missing = set(rng.sample(all_blocks, rng.randint(1, len(all_blocks))))
        present = [rb for rb in all_blocks if rb not in missing]
        # Worst case: the slot holds call 7's copy of the very same rows.
        base_wire, base_record = _stale_state(fmt, rows, 9) if trial % 2 else P.empty_receive(fmt, 3)
        for with_record in (False, True):
            if mode == "sw" and with_record:
                continue  # sw writes its record only after a fence, when every block is visible
            wire, record = _install(fmt, new_wire, new_record, present, with_record, base_wire, base_record)
            arrived = P.arrived_rows(fmt, wire, record, 9)
            torn_rows = {r for r, _ in missing}
            if mode in ("sw", "dc"):
                assert not arrived.any()
            else:
                assert not any(arrived[r] for r in torn_rows)


# --- SP sentinel fallback -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_sp_collision_takes_fallback_and_completes(dtype):
    fmt = fmt_of("sp", 16, 8, dtype=dtype, hidden=16, sentinel_index=2)
    rows = sentinel_rows(fmt)
    assert P.row_collides(fmt, rows).tolist() == [False, True, True]
    wire_new, record = P.encode(fmt, rows, 9)
    assert P.read_record(record) == (9, 3)
    wire, blank = P.empty_receive(fmt, 3)
    wire.copy_(wire_new)  # every block landed, the fenced record not yet
    assert P.arrived_rows(fmt, wire, blank, 9).tolist() == [True, False, False]
    assert P.arrived_rows(fmt, wire, P.make_record(7, 3), 9).tolist() == [True, False, False]
    assert P.arrived_rows(fmt, wire, record, 9).all()
    assert torch.equal(bits(P.decode(fmt, wire, 9)), bits(rows))
    P.sentinel_fill(fmt, wire, torch.tensor([0, 2]))  # consume rows 0 and 2, reset their markers
    nb = fmt.blocks_per_row  # row 1 keeps its blocks; its block 0 still reads as the sentinel
    expected = [[False] * nb, [False] + [True] * (nb - 1), [False] * nb]
    assert P.arrived_blocks(fmt, wire, 9).tolist() == expected


def test_sp_no_collision_sends_no_record():
    fmt = fmt_of("sp", 32, 16, hidden=40)
    wire, record = P.encode(fmt, sample_rows(torch.bfloat16, 4, 40), 3)
    assert record is None and not P.row_collides(fmt, sample_rows(torch.bfloat16, 4, 40)).any()


# --- Sentinel safety -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_sentinel_candidates_are_signaling_nans(dtype):
    width = 8 * dtype.itemsize
    mantissa = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    for c in P.sentinel_candidates(dtype):
        exponent = (c >> mantissa) & ((1 << (width - 1 - mantissa)) - 1)
        assert c >> (width - 1) == 1 and exponent == (1 << (width - 1 - mantissa)) - 1
        assert c & (1 << (mantissa - 1)) == 0 and c & ((1 << mantissa) - 1) != 0  # quiet bit clear


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_nan_producing_ops_never_make_a_sentinel(dtype):
    outputs = []
    for size in (5, 1000):  # scalar and vectorized kernels
        x = torch.tensor([0.0, float("inf"), -float("inf"), -1.0, float("nan")] * (size // 5)).to(dtype)
        nan = float("nan")
        outputs += [x / x, x - x, torch.sqrt(x), torch.log(x), x * 0, torch.fmod(x, 0.0), torch.acos(x * 3),
                    torch.full((size,), nan, dtype=dtype), torch.full((size,), nan).to(dtype),
                    x.float().mul(0).div(0).to(dtype), torch.nan_to_num(x, nan=0.0) / 0]
        for c in P.sentinel_candidates(dtype):  # arithmetic on a sentinel quiets it
            int_dtype = torch.int32 if dtype.itemsize == 4 else torch.int16
            s = torch.full((size,), c - (1 << (8 * dtype.itemsize)), dtype=int_dtype).view(dtype)
            outputs += [s + 1, s * 2, torch.exp(s), s.float().mul(1).to(dtype)]
    assert not P.sentinel_presence(dtype, outputs).any()


def test_sentinel_presence_and_choice():
    x = torch.randn(64).to(torch.bfloat16)
    assert P.sentinel_presence(torch.bfloat16, [x]).tolist() == [False] * 4
    x.view(torch.int16)[5] = 0xFFA5 - 0x10000
    y = torch.zeros(3, dtype=torch.bfloat16)
    y.view(torch.int16)[0] = 0xFF96 - 0x10000
    presence = P.sentinel_presence(torch.bfloat16, [x, y])
    assert presence.tolist() == [True, True, False, False]
    assert P.choose_sentinel(presence) == 2 and P.choose_sentinel(torch.zeros(4, dtype=torch.bool)) == 0
    with pytest.raises(ValueError, match="presence_C"):
        P.choose_sentinel(torch.ones(4, dtype=torch.bool))
    with pytest.raises(TypeError, match="tensors must all be"):
        P.sentinel_presence(torch.bfloat16, [x, torch.zeros(2)])


# --- Many calls, blocks landing in random order ---------------------------------------------------

@pytest.mark.parametrize(("mode", "block", "flag"), GEOMETRIES)
def test_calls_with_random_arrival_order(mode, block, flag):
    """Two parity slots over calls 1..8; blocks land one at a time in random order. Whenever a row
    verifies it must decode to this call's data. Rows repeat call ``e - 2``'s data half the time."""
    fmt = fmt_of(mode, block, flag, hidden=24)
    rng = random.Random(mode + str(block))
    slots = [P.empty_receive(fmt, 3) for _ in range(2)]
    sent = {}
    for epoch in range(1, 9):
        wire, record = slots[P.slot(epoch)]
        rows = _special_rows(torch.bfloat16, 3, 24, seed=epoch)
        if epoch - 2 in sent and rng.random() < 0.5:
            rows = sent[epoch - 2].clone()
        if mode == "sp" and epoch % 3 == 0:
            rows = sentinel_rows(fmt_of("sp", block, flag, hidden=24))
        sent[epoch] = rows
        new_wire, new_record = P.encode(fmt, rows, epoch)
        writes = [(r, b) for r in range(3) for b in range(fmt.blocks_per_row)]
        rng.shuffle(writes)
        if new_record is not None:  # sw / sp fallback: after a fence; dc: anywhere
            writes.insert(rng.randint(0, len(writes)) if mode == "dc" else len(writes), "record")
        view, new_view = wire.view(view_shape(fmt, wire)), new_wire.view(view_shape(fmt, new_wire))
        for step in writes:
            if step == "record":
                record.copy_(new_record)
            else:
                view[step] = new_view[step]
            arrived = P.arrived_rows(fmt, wire, record, epoch)
            decoded = P.decode(fmt, wire, epoch)
            for r in arrived.nonzero().flatten().tolist():
                assert torch.equal(bits(decoded[r]), bits(rows[r])), (epoch, step, r)
        assert P.arrived_rows(fmt, wire, record, epoch).all()
        if mode == "sp":
            P.sentinel_fill(fmt, wire)


# --- Efficiency -----------------------------------------------------------------------------------

def test_payload_efficiency_by_hand():
    def eff(mode, block, flag, rows_per_batch=1):
        return P.payload_efficiency(fmt_of(mode, block, flag, hidden=7168), rows_per_batch)

    assert eff("tff", 512, 32) == Fraction(14336, 15360) == Fraction(14, 15)
    assert eff("tff", 64, 8) == Fraction(14336, 256 * 64)  # 56 payload bytes: 256 blocks
    assert eff("tff", 2048, 32) == Fraction(14336, 8 * 2048)  # 2016 payload bytes: 8 blocks
    assert eff("sp", 512, 32) == 1 and eff("sp", 4096, 32) == Fraction(7, 8)
    assert eff("sw", 512, 0) == eff("dc", 512, 32) == Fraction(14336, 14352)
    assert eff("dc", 512, 32, 128) == Fraction(128 * 14336, 128 * 14336 + 16)
    with pytest.raises(ValueError, match="rows_per_batch"):
        eff("sw", 512, 0, 0)


def test_docs_hold_the_generated_tables():
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    assert P.efficiency_table(torch.bfloat16, 7168) in text
    assert P.efficiency_table(torch.bfloat16, 2048) in text


# --- Vectors --------------------------------------------------------------------------------------

VECTORS = ROOT / "tests" / "vectors" / "protocol.json"


def test_stored_vectors_equal_fresh_generation():
    assert json.loads(VECTORS.read_text()) == P.build_vectors()


def _load_format(spec):
    return P.WireFormat(**{**spec, "dtype": DTYPE_BY_NAME[spec["dtype"]]})


def _tensor(hex_rows, width):
    data = b"".join(bytes.fromhex(h) for h in hex_rows)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(len(hex_rows), width)


def test_vectors_replay_through_the_public_api():
    """What a C++ or device test does with the file: decode the inputs, run, compare the bytes."""
    vectors = json.loads(VECTORS.read_text())
    assert [[x, P.fmix32(x)] for x, _ in vectors["fmix32"]] == vectors["fmix32"]
    for case in vectors["encode"]:
        fmt = _load_format(case["format"])
        rows = _tensor(case["rows"], fmt.row_bytes).view(fmt.dtype)
        wire, record = P.encode(fmt, rows, case["epoch"])
        assert [bytes(r.tolist()).hex() for r in wire] == case["wire"], case["name"]
        assert (None if record is None else bytes(record.tolist()).hex()) == case["record"], case["name"]
    for case in vectors["verify"]:
        fmt = _load_format(case["format"])
        wire = _tensor(case["wire"], fmt.row_stride)
        record = None if case["record"] is None else _tensor([case["record"]], 16)[0]
        assert P.arrived_rows(fmt, wire, record, case["epoch"]).tolist() == case["arrived_rows"], case["name"]
    names = {c["name"]: c["arrived_rows"] for c in vectors["verify"]}
    assert names["sp_fallback"] == [True] * 3 and names["sp_no_record"] == [True, False, False]
    assert not any(names["dc_b16_f8_identical_stale_row"]) and names["tff_torn"] == [True, False]


# --- Bad arguments --------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"mode": "ll"}, ValueError, "mode must be one of"),
    ({"dtype": torch.int8}, TypeError, "dtype must be one of"),
    ({"hidden": 12}, ValueError, "hidden must be a positive multiple of 8"),
    ({"hidden": 8.0}, TypeError, "hidden must be an int"),
    ({"block_bytes": 48}, ValueError, "block_bytes must be a power of two"),
    ({"block_bytes": 8192}, ValueError, "block_bytes must be a power of two"),
    ({"flag_bytes": 4}, ValueError, r"flag_bytes must be a power of two in \[8, 256\]"),
    ({"flag_bytes": 512}, ValueError, "flag_bytes must be a power of two"),
    ({"mode": "sw"}, ValueError, "flag_bytes must be 0 for mode 'sw'"),
    ({"mode": "dc", "flag_bytes": 2}, ValueError, r"flag_bytes must be a power of two in \[4, 512\]"),
    ({"sentinel_index": 1}, ValueError, r"sentinel_index must be in \[0, 1\)"),
    ({"mode": "sp", "sentinel_index": 4}, ValueError, r"sentinel_index must be in \[0, 4\)"),
])
def test_bad_format_field_is_named(kwargs, error, words):
    good = {"mode": "tff", "dtype": torch.bfloat16, "hidden": 7168, "block_bytes": 512, "flag_bytes": 32}
    with pytest.raises(error, match=words):
        P.WireFormat(**{**good, **kwargs})


def test_bad_call_arguments_are_named():
    fmt = fmt_of("tff", 16, 8, hidden=8)
    rows = torch.zeros(2, 8, dtype=torch.bfloat16)
    wire, _ = P.encode(fmt, rows, 1)
    with pytest.raises(TypeError, match="rows_NH must be a torch.bfloat16"):
        P.encode(fmt, rows.float(), 1)
    with pytest.raises(ValueError, match=r"rows_NH must have shape \[N, 8\]"):
        P.encode(fmt, torch.zeros(2, 16, dtype=torch.bfloat16), 1)
    with pytest.raises(ValueError, match="epoch must be in"):
        P.encode(fmt, rows, 0)
    with pytest.raises(TypeError, match="wire_NS must be a torch.uint8"):
        P.decode(fmt, wire.char(), 1)
    with pytest.raises(ValueError, match=r"wire_NS must be a contiguous \[N, 32\]"):
        P.arrived_blocks(fmt, wire[:, :16], 1)
    with pytest.raises(ValueError, match="record must be None"):
        P.arrived_rows(fmt, wire, torch.zeros(16, dtype=torch.uint8), 1)
    sw = fmt_of("sw", 16, 0, hidden=8)
    with pytest.raises(TypeError, match="record must be a uint8"):
        P.arrived_rows(sw, P.encode(sw, rows, 1)[0], None, 1)
    with pytest.raises(ValueError, match="no per-block predicate"):
        P.arrived_blocks(sw, P.encode(sw, rows, 1)[0], 1)
    with pytest.raises(ValueError, match="fmt.mode must be 'sp'"):
        P.sentinel_fill(fmt, wire)
    with pytest.raises(ValueError, match="num_rows must be an int"):
        P.empty_receive(fmt, -1)
    with pytest.raises(ValueError, match="fmt.mode must be 'dc' for a checksum"):
        P.checksum(fmt, wire, 1)
    with pytest.raises(ValueError, match="epoch must be in"):
        P.mask_words(0, 4)
