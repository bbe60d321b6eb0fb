"""The CUDA backend's wire images equal ``ubep.protocol.encode`` byte for byte (one GPU).

The kernel below runs the backend's own row writer (``wire.copy_row``) on random bit patterns,
NaNs and infinities included, so a misplaced flag, payload byte or padding byte shows up.
"""

import pytest
import torch

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import triton.language as tl  # noqa: E402

from ubep import protocol  # noqa: E402
from ubep.backends.cuda import wire  # noqa: E402
from ubep.backends.cuda.backend import INT_VIEW  # noqa: E402

pytestmark = pytest.mark.cuda


@triton.jit
def _encode_rows(src_ptr, dst_ptr, epoch, HIDDEN: tl.constexpr, BE: tl.constexpr, FE: tl.constexpr,
                 NB: tl.constexpr, CB: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    wire.copy_row(src_ptr + r * HIDDEN, dst_ptr + r * (NB * BE), epoch, HIDDEN, BE, FE, NB, CB)


@pytest.mark.parametrize("mode", ["sw", "tff"])
@pytest.mark.parametrize(("dtype", "hidden"), [(torch.bfloat16, 7168), (torch.float16, 8),
                                               (torch.float32, 40), (torch.bfloat16, 200)])
@pytest.mark.parametrize("epoch", [1, 6, 2**40 + 3])
def test_wire_image_matches_protocol(mode, dtype, hidden, epoch):
    es = dtype.itemsize
    gen = torch.Generator().manual_seed(hidden + epoch)
    bits = torch.randint(-(2 ** (8 * es - 1)), 2 ** (8 * es - 1), (3, hidden), generator=gen,
                         dtype=torch.int64).to(INT_VIEW[es])
    be, fe, nb = wire.geometry(mode, hidden, es)
    out = torch.full((3, nb * be), 0x55, dtype=INT_VIEW[es], device="cuda")  # not zero: padding shows
    _encode_rows[(3,)](bits.cuda(), out, epoch, HIDDEN=hidden, BE=be, FE=fe, NB=nb, CB=4)
    fmt = protocol.WireFormat(mode=mode, dtype=dtype, hidden=hidden, block_bytes=wire.BLOCK_BYTES,
                              flag_bytes=wire.FLAG_BYTES if mode == "tff" else 0)
    want, _ = protocol.encode(fmt, bits.view(dtype), epoch)
    assert torch.equal(out.cpu().view(torch.uint8).view(3, -1), want)
