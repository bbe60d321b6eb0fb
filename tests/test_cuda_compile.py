"""The CUDA backend's kernels compile for an H100/H200 (sm_90) in every variant, on any machine with
Triton: no GPU is needed to build PTX and a cubin, so CPU runs catch kernel build errors too."""

import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from ubep.backends.cuda import checksum, sync, wire  # noqa: E402
from ubep.backends.cuda import combine_kernels as ck  # noqa: E402
from ubep.backends.cuda import dispatch_kernels as dk  # noqa: E402
from ubep.backends.cuda.geometry import (  # noqa: E402
    NUM_WARPS,
    recv_parts,
    reduce_rows,
    reduce_step_blocks,
    row_meta,
    step_rows,
    verify_step,
)
from ubep.backends.cuda.tuning import Tuning  # noqa: E402
from ubep.backends.cuda.verify import RETURNED_ROWS, STAGED_TOKENS  # noqa: E402

MODES = list(wire.MODE_CODES)
TUNING = Tuning.h200()

TARGET = GPUTarget("cuda", 90, 32)
POINTERS = {
    "dispatch": {"x_ptr": "*i16", "idx_ptr": "*i64", "w_ptr": "*fp32", "sent_ptr": "*i8",
                 "out_ptr": "*i16", "out_w_ptr": "*fp32", "pair_w_ptr": "*fp32"},
    "combine": {"out_ptr": "*bf16", "out_bits_ptr": "*i16", "idx_ptr": "*i64", "w_ptr": "*fp32",
                "pair_w_ptr": "*fp32", "sent_ptr": "*i8", "y_ptr": "*bf16"},
}
SCALARS = {"timeout_ns": "i64", "err_addr": "i64"}


def _build(fn, pointers, constants, maxnreg=None):
    """Build ``fn`` as the runtime would for 16-byte-aligned pointer arguments (and a register
    budget per thread, if given)."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr") or name.endswith("_ptrs"):
            signature[name] = pointers.get(name, "*i64")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = SCALARS.get(name, "i32")
    options = {"num_warps": NUM_WARPS, **({"maxnreg": maxnreg} if maxnreg else {})}
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=TARGET,
                            options=options)
    assert kernel.asm["cubin"]
    return kernel


def _compile(fn, pointers, constants) -> Counter:
    """The count of each global load and store instruction in ``fn``'s PTX (built by ``_build``)."""
    kernel = _build(fn, pointers, constants)
    return Counter(m.group(1) for m in re.finditer(r"\b((?:ld|st)\.[\w.]*global[\w.]*)",
                                                    kernel.asm["ptx"]))


def _assert_rows_move_in_16_bytes(ops: Counter) -> None:
    """bf16 rows cross the link in 16-byte stores (one warp instruction per 128-byte block, which
    ``tff`` relies on) and are read back in 16-byte loads; no 2-byte access of a row is left."""
    assert ops["st.global.v4.b32"] > 0, ops
    assert not [op for op in ops if op.endswith(".b16")], ops


def _mode(mode, dtype):
    return {"MODE": wire.MODE_CODES[mode],
            "SENTINEL": checksum.sentinel_word(dtype) if mode == "sp" else 0}


def _dispatch_constants(mode, *, like, replicate, tokens, counts_first, profile):
    """The dispatch kernel's constants at W = 2, 256 experts, top-8, 7168 bf16, for a call of
    ``tokens`` tokens (row steps); two receivers per row (ignored by launches without receivers)."""
    meta = row_meta(mode, 7168, 2, tokens)
    return {"WORLD": 2, "E_LOCAL": 128, "W_BLOCK": 2, "L_BLOCK": 128, "TOP_K": 8, "K_BLOCK": 8,
            "E_BLOCK": 256, "CHUNK": TUNING.count_step, "J_BLOCK": 16, "N_BLOCK": 256, "PREFIX": 2048,
            **_mode(mode, torch.bfloat16), "LIKE": like, "RECORDS": (not like) or mode == "sw",
            "REPLICATE": replicate, "VERIFY": replicate and mode == "dc", "SPLIT": 8,
            "VERIFY_STEP": verify_step(tokens, 8, STAGED_TOKENS),
            "FINAL": replicate, "PROFILE": profile, "COUNTS_FIRST": counts_first, **meta,
            "ROWS": step_rows(meta), "RECV_ROWS": step_rows(meta), "RECV_PARTS": 2}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("like", "replicate"), [(False, False), (False, True), (True, True)])
def test_dispatch_compiles(mode, like, replicate):
    """The compact layout's writers, the padded layout's one launch and ``dispatch_like``."""
    constants = _dispatch_constants(mode, like=like, replicate=replicate, tokens=0,
                                    counts_first=mode == "tff" and not like, profile=replicate)
    _assert_rows_move_in_16_bytes(_compile(dk.dispatch, POINTERS["dispatch"], constants))


@pytest.mark.parametrize("mode", ["sw", "tff", "sp"])
def test_two_receivers_per_item_cost_no_registers(mode):
    """The padded layout's one launch of a 128-token call at W = 2 (one row per sender and
    receiver step): two receivers per item must not make the kernel heavier, or the doubled
    receivers would find fewer programs per SM (``geometry.RECV_PARTS``). ptxas may keep a few
    values in local memory to fit more programs per SM (``sp``: 64 registers and 16 bytes of
    stack, four programs per SM, where 80 and none fit three); a tile spilled would take more."""
    constants = _dispatch_constants(mode, like=False, replicate=True, tokens=128,
                                    counts_first=mode == "tff", profile=False)
    used = [_resources(_build(dk.dispatch, POINTERS["dispatch"],
                              dict(constants, ROWS=1, RECV_ROWS=1, RECV_PARTS=parts)).asm["cubin"])
            for parts in (1, 2)]
    assert used[1]["REG"] <= used[0]["REG"] and used[1]["STACK"] <= 16, used


@pytest.mark.parametrize("mode", MODES)
def test_releases_to_the_peers_leave_at_once(mode):
    """At W = 8 the record, the ack and (``sp``) the fallback records each reach every peer in one
    system-scope release instruction, one lane per peer (``sync.peer_words``): a release per peer
    from one thread would order each behind the one before it."""
    constants = dict(_dispatch_constants(mode, like=False, replicate=True, tokens=128,
                                         counts_first=mode == "tff", profile=False),
                     WORLD=8, W_BLOCK=8, E_LOCAL=32, L_BLOCK=32)
    ptx = _build(dk.dispatch, POINTERS["dispatch"], constants).asm["ptx"]
    releases = re.findall(r"\batom\.global\.sys\.release\.", ptx)
    assert len(releases) == (3 if mode == "sp" else 2), len(releases)


@pytest.mark.parametrize("mode", MODES)
def test_senders_choose_ranks_without_a_reduction_per_rank(mode):
    """A sender tests each rank a token goes to with a shift of bits computed once per step, and
    builds a chunk's wire image and batch record shares once for all ranks (``_send_role``), so the
    decode dispatch holds no more reductions at W = 4 and 8 than at W = 2: two per rank and chunk
    would hold the last rank's stores behind W of them."""
    reductions = []
    for world in (2, 4, 8):
        constants = dict(_dispatch_constants(mode, like=False, replicate=True, tokens=128,
                                             counts_first=mode == "tff", profile=False),
                         WORLD=world, W_BLOCK=world, E_LOCAL=256 // world, L_BLOCK=256 // world)
        ttgir = _build(dk.dispatch, POINTERS["dispatch"], constants).asm["ttgir"]
        reductions.append(ttgir.count('"tt.reduce"'))
    assert max(reductions) == reductions[0], reductions


@pytest.mark.parametrize("mode", ["sw", "tff", "sp"])
def test_count_step_leaves_two_writers_per_sm(mode):
    """The dispatch is one kernel for all its groups, so the count step's ``[CHUNK, CHUNK]``
    comparison sets the token senders' registers too: the compact writers' launch (a 4096-token
    call) needs at most 128 per thread, two programs of 8 warps per SM, so that senders run beside
    the count programs (128-pair steps need 236, one program per SM). ``dc``'s senders keep batch
    records and take more whatever the step."""
    constants = _dispatch_constants(mode, like=False, replicate=False, tokens=4096,
                                    counts_first=False, profile=False)
    used = _resources(_build(dk.dispatch, POINTERS["dispatch"], constants).asm["cubin"])
    assert used["REG"] <= 128 and used["STACK"] == 0, used


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("partial", "gather"), [(False, False), (True, False), (False, True)])
def test_combine_compiles(mode, partial, gather):
    pointers = dict(POINTERS["combine"])
    rows = row_meta(mode, 7168, 2)
    if gather:
        pointers.update(out_ptr="*fp32", out_bits_ptr="*i32", y_ptr="*fp32")
        rows = row_meta(mode, 1, torch.float32.itemsize)
    constants = {"WORLD": 8, "W_BLOCK": 8, "E_LOCAL": 32, "TOP_K": 8, "K_BLOCK": 8,
                 **_mode(mode, torch.bfloat16),
                 "PARTIAL": partial, "WEIGHTED": partial, "SUM_WEIGHTED": not partial and not gather,
                 "GATHER": gather, "VERIFY": mode == "dc", "SPLIT": 8, "FINAL": not gather,
                 "VERIFY_STEP": RETURNED_ROWS if partial else RETURNED_ROWS // 8,
                 "PROFILE": partial,
                 **rows, "ROWS": min(8, step_rows(rows)), "R_BLOCK": 8,
                 "RCB": reduce_step_blocks(rows, 8), "RECV_PARTS": 1 if gather else 2}
    ops = _compile(ck.combine, pointers, constants)
    if not gather:
        _assert_rows_move_in_16_bytes(ops)


def _resources(cubin: bytes) -> dict:
    """``{"REG": registers per thread, "STACK": bytes of stack per thread}`` of a one-kernel cubin."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK):(\d+)", out)}


@pytest.mark.parametrize("mode", sorted(dict(TUNING.combine_registers)))
@pytest.mark.parametrize(("partial", "tokens", "parts", "top_k"),
                         [(False, 4096, 1, 8), (True, 128, 2, 8), (False, 4096, 1, 16)])
def test_combine_fits_its_register_budget(mode, partial, tokens, parts, top_k):
    """A budget that makes ptxas spill a reducer's row tile to the stack costs more than the second
    program per SM it buys: the budgeted combine kernels at W = 2 (top-8 rows of 7168 bf16: the
    source reduction of a 4096-token call, and the partial sums of a 128-token call with two
    reducers per token; top-16's source reduction) keep at most 64 bytes on the stack (`sw`'s
    partial sums: 16). `sw` takes a top-16 token's 16 rows as one tile, 88 bytes on the stack and
    faster than in groups (`REDUCE_ROWS`): at most 96; `tff` would spill 712 that way."""
    rows = row_meta(mode, 7168, 2, tokens)
    r_block = reduce_rows(mode, 2 if partial else top_k)  # W partial sums, or the K pair rows
    constants = {"WORLD": 2, "W_BLOCK": 2, "E_LOCAL": 128, "TOP_K": top_k, "K_BLOCK": top_k,
                 **_mode(mode, torch.bfloat16), "PARTIAL": partial, "WEIGHTED": partial,
                 "SUM_WEIGHTED": not partial, "GATHER": False, "VERIFY": mode == "dc", "SPLIT": 8,
                 "FINAL": True, "VERIFY_STEP": RETURNED_ROWS // top_k,
                 "PROFILE": False, **rows, "ROWS": min(top_k, step_rows(rows)), "R_BLOCK": r_block,
                 "RCB": reduce_step_blocks(rows, r_block), "RECV_PARTS": parts}
    budget = TUNING.registers(mode)
    stack = 96 if (mode, top_k) == ("sw", 16) else 64
    used = _resources(_build(ck.combine, POINTERS["combine"], constants, budget).asm["cubin"])
    assert used["REG"] <= budget and used["STACK"] <= stack, used


def _tile_layouts(ttgir: str, shape: str) -> list[tuple[list[int], list[int], list[int]]]:
    """``(sizePerThread, threadsPerWarp, warpsPerCTA)`` of every wire access of an integer row tile
    of ``shape`` (``"CBxBE"``) in ``ttgir``: loads and stores, but not the stores of received rows
    into their destination (masked by the payload lanes, ``is_payload`` or ``is_placed``: any layout
    will do there)."""
    layouts = {m.group(1): tuple([int(v) for v in m.group(i).split(",")] for i in (2, 3, 4))
               for m in re.finditer(r"^(#blocked\d*) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], "
                                    r"threadsPerWarp = \[([\d, ]+)\], warpsPerCTA = \[([\d, ]+)\]",
                                    ttgir, re.M)}
    accesses = re.finditer(rf"(tt\.load|tt\.store) (.*)tensor<{shape}x!tt\.ptr<i\d+>, (#blocked\d*)>",
                           ttgir)
    return [layouts[m.group(3)] for m in accesses
            if not (m.group(1) == "tt.store" and re.search(r"%is_(payload|placed)", m.group(2)))]


@pytest.mark.parametrize("mode", ["tff", "sp"])
@pytest.mark.parametrize(("hidden", "elem_bytes", "tokens"),
                         [(40, 2, 0), (136, 2, 0), (7168, 2, 0), (7168, 2, 4096), (24, 4, 0)])
def test_each_block_moves_in_one_warp_instruction(mode, hidden, elem_bytes, tokens):
    """``tff`` and ``sp`` trust a 128-byte block whose marker they loaded: every load and store of a
    row tile must give each block to 8 lanes of one warp, 16 bytes each. Checked at small rows too,
    where a tile of fewer blocks would be spread over the warps, each block's halves in two warps
    (one half may then be read stale); and at the large calls' 16 KiB steps; and in the tiles of
    several rows (senders' and receivers') and the combine reducers' tiles of a token's rows."""
    rows = row_meta(mode, hidden, elem_bytes, tokens)
    int_type, float_type = {2: ("*i16", "*bf16"), 4: ("*i32", "*fp32")}[elem_bytes]
    dispatch = {"WORLD": 2, "E_LOCAL": 4, "W_BLOCK": 2, "L_BLOCK": 4, "TOP_K": 2, "K_BLOCK": 2,
                "E_BLOCK": 8, "CHUNK": 128, "J_BLOCK": 512, "N_BLOCK": 256, "PREFIX": 2048,
                **_mode(mode, torch.bfloat16), "LIKE": False, "RECORDS": True,
                "REPLICATE": True, "VERIFY": False, "SPLIT": 1, "VERIFY_STEP": 1, "FINAL": True,
                "PROFILE": False,
                "COUNTS_FIRST": mode == "tff",
                "RECV_PARTS": recv_parts(2, 1, rows["NB"], rows["CB"]), **rows}
    combine = {"WORLD": 1, "W_BLOCK": 1, "E_LOCAL": 8, "TOP_K": 1, "K_BLOCK": 2,
               **_mode(mode, torch.bfloat16), "PARTIAL": False, "WEIGHTED": False,
               "SUM_WEIGHTED": True, "GATHER": False, "VERIFY": False, "SPLIT": 1, "VERIFY_STEP": 1,
               "FINAL": True,
               "PROFILE": False, **rows, "ROWS": min(2, step_rows(rows)), "R_BLOCK": 8,
               "RCB": reduce_step_blocks(rows, 8),
               "RECV_PARTS": recv_parts(2, 1, rows["NB"], reduce_step_blocks(rows, 8))}
    dispatch_pointers = dict(POINTERS["dispatch"], x_ptr=int_type, out_ptr=int_type)
    several = step_rows(rows)
    cb, rcb = rows["CB"], combine["RCB"]
    # each build, with the block-rows of the row tiles it must hold: one row's and several rows'
    builds = [(dk.dispatch, dispatch_pointers, dict(dispatch, ROWS=several, RECV_ROWS=1),
               {cb, several * cb}),
              (dk.dispatch, dispatch_pointers, dict(dispatch, ROWS=1, RECV_ROWS=several),
               {cb, several * cb}),
              (ck.combine, dict(POINTERS["combine"], out_ptr=float_type, out_bits_ptr=int_type,
                                y_ptr=float_type), combine, {combine["ROWS"] * cb, 8 * rcb})]
    for fn, pointers, constants, tile_heights in builds:
        ttgir = _build(fn, pointers, constants).asm["ttgir"]
        layouts = []
        for height in tile_heights:
            tiles = _tile_layouts(ttgir, f"{height}x{rows['BE']}")
            assert tiles, f"{fn.__name__}: no row tile of {height} blocks found"
            layouts += tiles
        lanes_per_block = wire.BLOCK_BYTES // 16
        for per_thread, per_warp, warps in layouts:
            assert per_thread[-1] * elem_bytes == 16 and per_warp[-1] == lanes_per_block, (
                fn.__name__, per_thread, per_warp, warps)
            assert warps[-1] == 1, (fn.__name__, per_thread, per_warp, warps)


def test_program_threads_match_the_launches():
    """The waits' first look and the dc share reads span one word per thread of a program."""
    assert sync.PROGRAM_THREADS == NUM_WARPS * 32


@triton.jit
def _wait_for_words(base_ptr, timeout_ns, err_addr, WORLD: tl.constexpr, W_BLOCK: tl.constexpr,
                    N_BLOCK: tl.constexpr, ONCE: tl.constexpr):
    sync.wait_words(base_ptr, N_BLOCK, N_BLOCK, 5, timeout_ns, err_addr, sync.WAIT_COUNTS, 5, WORLD,
                    W_BLOCK, N_BLOCK, False, ONCE)


@pytest.mark.parametrize("once", [False, True])
@pytest.mark.parametrize(("world", "words"), [(1, 1), (2, 1), (8, 1), (1, 256)])
def test_every_warp_decides_alike_whether_to_poll(world, words, once):
    """A wait's poll loop that holds a barrier (a sum over the program's warps) must be entered by
    all warps or none: then a barrier also precedes the branch into it (the decision crosses the
    warps too). Where each thread branches on its own first read and the loop holds barriers,
    warps that see a record being released skip the loop that others enter, their barriers pair
    wrongly, and the receivers read rows that have not arrived."""
    constants = {"WORLD": world, "W_BLOCK": world, "N_BLOCK": words, "ONCE": once}
    ptx = _build(_wait_for_words, {}, constants).asm["ptx"]
    body = ptx[ptx.index(".entry"):]  # the kernel is the wait: its first branch is the decision
    branch = re.search(r"@%p\d+ bra", body)
    assert branch, body
    if "bar.sync" in body[branch.start():]:
        assert "bar.sync" in body[:branch.start()], body
