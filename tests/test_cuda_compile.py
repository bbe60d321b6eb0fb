"""The CUDA backend's kernels compile for an H100/H200 (sm_90) in every variant, on any machine with
Triton: no GPU is needed to build PTX and a cubin, so CPU runs catch kernel build errors too."""

import re
from collections import Counter

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ubep.backends.cuda import checksum, wire  # noqa: E402
from ubep.backends.cuda import combine_kernels as ck  # noqa: E402
from ubep.backends.cuda import dispatch_kernels as dk  # noqa: E402

MODES = list(wire.MODE_CODES)

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = {
    "dispatch": {"x_ptr": "*i16", "idx_ptr": "*i64", "w_ptr": "*fp32", "sent_ptr": "*i8",
                 "out_ptr": "*i16", "out_w_ptr": "*fp32", "pair_w_ptr": "*fp32"},
    "combine": {"out_ptr": "*bf16", "out_bits_ptr": "*i16", "idx_ptr": "*i64", "w_ptr": "*fp32",
                "pair_w_ptr": "*fp32", "sent_ptr": "*i8", "y_ptr": "*bf16"},
}
SCALARS = {"timeout_ns": "i64", "err_addr": "i64"}


def _compile(fn, pointers, constants) -> Counter:
    """Build ``fn`` as the runtime would for 16-byte-aligned pointer arguments; the count of each
    global load and store instruction in its PTX."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr") or name.endswith("_ptrs"):
            signature[name] = pointers.get(name, "*i64")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = SCALARS.get(name, "i32")
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=TARGET,
                            options={"num_warps": 8})
    assert kernel.asm["cubin"]
    return Counter(m.group(1) for m in re.finditer(r"\b((?:ld|st)\.[\w.]*global[\w.]*)",
                                                    kernel.asm["ptx"]))


def _rows(mode, hidden, elem_bytes):
    be, fe, nb = wire.geometry(mode, hidden, elem_bytes)
    return {"HIDDEN": hidden, "BE": be, "FE": fe, "NB": nb, "NB_BLOCK": triton.next_power_of_2(nb),
            "CB": min(32, triton.next_power_of_2(nb))}


def _assert_rows_move_in_16_bytes(ops: Counter) -> None:
    """bf16 rows cross the link in 16-byte stores (one warp instruction per 128-byte block, which
    ``tff`` relies on) and are read back in 16-byte loads; no 2-byte access of a row is left."""
    assert ops["st.global.v4.b32"] > 0, ops
    assert not [op for op in ops if op.endswith(".b16")], ops


def _mode(mode, dtype):
    return {"MODE": wire.MODE_CODES[mode],
            "SENTINEL": checksum.sentinel_word(dtype) if mode == "sp" else 0}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("like", "replicate"), [(False, False), (False, True), (True, True)])
def test_dispatch_compiles(mode, like, replicate):
    constants = {"WORLD": 2, "E_LOCAL": 128, "W_BLOCK": 2, "L_BLOCK": 128, "TOP_K": 8, "K_BLOCK": 8,
                 "PAIR_BLOCK": 1024, **_mode(mode, torch.bfloat16), "LIKE": like,
                 "RECORDS": (not like) or mode == "sw", "REPLICATE": replicate,
                 "VERIFY": replicate and mode == "dc", "FINAL": replicate, "PROFILE": replicate, **_rows(mode, 7168, 2)}
    _assert_rows_move_in_16_bytes(_compile(dk.dispatch, POINTERS["dispatch"], constants))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("partial", "gather"), [(False, False), (True, False), (False, True)])
def test_combine_compiles(mode, partial, gather):
    pointers = dict(POINTERS["combine"])
    rows = _rows(mode, 7168, 2)
    if gather:
        pointers.update(out_ptr="*fp32", out_bits_ptr="*i32", y_ptr="*fp32")
        rows = _rows(mode, 1, torch.float32.itemsize)
    constants = {"WORLD": 8, "W_BLOCK": 8, "E_LOCAL": 32, "TOP_K": 8, "K_BLOCK": 8,
                 **_mode(mode, torch.bfloat16),
                 "PARTIAL": partial, "WEIGHTED": partial, "SUM_WEIGHTED": not partial and not gather,
                 "GATHER": gather, "VERIFY": mode == "dc", "FINAL": not gather, "PROFILE": partial,
                 **rows}
    ops = _compile(ck.combine, pointers, constants)
    if not gather:
        _assert_rows_move_in_16_bytes(ops)
