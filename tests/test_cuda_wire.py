"""The CUDA backend's wire images equal ``ubep.protocol.encode`` byte for byte (one GPU).

The kernels below run the backend's own row writer and reader (``wire.copy_row``,
``wire.take_tiles``) on random bit patterns, NaNs and infinities included, so a misplaced flag,
marker mask, payload byte or padding byte shows up; ``dc`` rows must also give the protocol's
checksum through the writer's lanes, and ``sp`` rows holding the sentinel must be counted.
"""

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import triton.language as tl  # noqa: E402

from ubep import protocol  # noqa: E402
from ubep.backends.cuda import checksum, sync, wire  # noqa: E402
from ubep.backends.cuda.geometry import INT_VIEW  # noqa: E402
from ubep.protocol.words import MASK32, fmix32  # noqa: E402

pytestmark = pytest.mark.cuda
FLAG_BYTES = {"sw": 0, "tff": wire.FLAG_BYTES, "dc": checksum.MARK_BYTES.value,
              "sp": checksum.MARK_BYTES.value}


@triton.jit
def _encode_rows(src_ptr, dst_ptr, lanes_ptr, epoch_ptr, HIDDEN: tl.constexpr, BE: tl.constexpr,
                 FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, MODE: tl.constexpr,
                 SENTINEL: tl.constexpr):
    r = tl.program_id(0)
    a, b = wire.copy_row(src_ptr + r.to(tl.int64) * HIDDEN, dst_ptr + r.to(tl.int64) * (NB * BE),
                         tl.load(epoch_ptr), r, HIDDEN, BE, FE, NB, CB, MODE, SENTINEL)
    tl.store(lanes_ptr + r * 2, a.to(tl.int64))
    tl.store(lanes_ptr + r * 2 + 1, b.to(tl.int64))


@triton.jit
def _decode_rows(wire_ptr, dst_ptr, epoch_ptr, err_addr, HIDDEN: tl.constexpr, BE: tl.constexpr,
                 FE: tl.constexpr, NB: tl.constexpr, CB: tl.constexpr, MODE: tl.constexpr,
                 SENTINEL: tl.constexpr):
    """Rows read back as the receivers read them (``wire.take_tiles``); ``sp``'s fallback record is
    the epoch word itself, so a row holding the sentinel is taken too."""
    r = tl.program_id(0)
    epoch = tl.load(epoch_ptr)
    deadline = sync.now_ns() + 10_000_000_000  # never reached: every row is whole
    for c in range(0, tl.cdiv(NB, CB)):
        values, p_off, is_payload = wire.take_tiles(wire_ptr + r.to(tl.int64) * (NB * BE), c,
                                                    epoch, deadline, err_addr, 0, 0, r, epoch_ptr, True,
                                                    HIDDEN, BE, FE, NB, CB, 1, MODE, SENTINEL)
        tl.store(dst_ptr + r.to(tl.int64) * HIDDEN + p_off, values, mask=is_payload)


def _rows(dtype, hidden, seed, mode):
    es = dtype.itemsize
    gen = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2 ** (8 * es - 1)), 2 ** (8 * es - 1), (3, hidden), generator=gen,
                         dtype=torch.int64).to(INT_VIEW[es])
    if mode == "sp":  # row 1's first block carries the sentinel marker: it collides
        sentinel = protocol.sentinel_candidates(dtype)[0]
        bits[1, : checksum.MARK_BYTES.value // es] = torch.tensor(sentinel, dtype=torch.int64).to(bits.dtype)
    return bits


@pytest.mark.parametrize("mode", list(wire.MODE_CODES))
@pytest.mark.parametrize(("dtype", "hidden"), [(torch.bfloat16, 7168), (torch.float16, 8),
                                               (torch.float32, 40), (torch.bfloat16, 200)])
@pytest.mark.parametrize("epoch", [1, 6, 2**40 + 3])
def test_wire_image_matches_protocol(mode, dtype, hidden, epoch):
    es = dtype.itemsize
    bits = _rows(dtype, hidden, hidden + epoch, mode)
    be, fe, nb = wire.geometry(mode, hidden, es)
    out = torch.full((3, nb * be), 0x55, dtype=INT_VIEW[es], device="cuda")  # not zero: padding shows
    lanes = torch.zeros(3, 2, dtype=torch.int64, device="cuda")
    sentinel = checksum.sentinel_word(dtype) if mode == "sp" else 0
    epoch_t = torch.tensor([epoch], device="cuda")  # int64, as the kernels' epochs are
    _encode_rows[(3,)](bits.cuda(), out, lanes, epoch_t, HIDDEN=hidden, BE=be, FE=fe, NB=nb, CB=4,
                       MODE=wire.MODE_CODES[mode], SENTINEL=sentinel)
    fmt = protocol.WireFormat(mode=mode, dtype=dtype, hidden=hidden, block_bytes=wire.BLOCK_BYTES,
                              flag_bytes=FLAG_BYTES[mode])
    want, record = protocol.encode(fmt, bits.view(dtype), epoch)
    got = out.cpu().view(torch.uint8).view(3, -1)
    assert torch.equal(got, want)
    lanes = lanes.cpu()
    if mode == "dc":
        lane_a, lane_b = (int(v) & MASK32 for v in lanes.sum(0))
        value = (fmix32(lane_b ^ fmix32(3 * nb)) << 32) | fmix32(lane_a ^ protocol.epoch_digest(epoch))
        assert value == protocol.read_record(record)[1]
    if mode == "sp":
        assert (lanes[:, 0] > 0).tolist() == protocol.row_collides(fmt, bits.view(dtype)).tolist()
    decoded = torch.zeros_like(bits, device="cuda")
    errors = torch.zeros(3, dtype=torch.int64, pin_memory=True)  # the host error word
    block = torch.tensor([0, errors.data_ptr()], dtype=torch.int64, device="cuda")  # sync's err_addr
    _decode_rows[(3,)](out, decoded, epoch_t, block.data_ptr(), HIDDEN=hidden, BE=be, FE=fe, NB=nb, CB=4,
                       MODE=wire.MODE_CODES[mode], SENTINEL=sentinel)
    assert torch.equal(decoded.cpu(), bits)
    assert errors.tolist() == [0, 0, 0]
