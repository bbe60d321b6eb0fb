"""How a call's work is cut into pieces, as pure functions of its sizes: a row's blocks, flags and
steps per sync mode (``row_meta``), the tiles a program moves per step, the programs that share a
received item or a reduced token, and ``dc``'s verifier shares. The backend (``backend``) turns them
into each launch's compile-time constants; the constants' reasons, measured on an H200, sit beside
them.
"""

from __future__ import annotations

import functools

import torch

from ubep.backends.cuda import wire

INT_VIEW = {2: torch.int16, 4: torch.int32}  # rows move as integers of their element width
# Bytes of a row a program moves per step: few round trips per row. Calls of many tokens take 16 KiB
# steps (a 7168-element bf16 row in one step): faster at 4096 tokens, slower at 128 (BENCHMARKS.md,
# "Row steps").
CHUNK_BYTES, LARGE_CHUNK_BYTES, LARGE_CHUNK_TOKENS = 8192, 16384, 1024
# Bytes of rows that a program with several to move loads per step, as one tile (senders, receivers):
# one program copied 24-27 GB/s one 14 KiB row at a time and 43-47 GB/s with two to four rows
# in flight on an H200 (benchmarks/probe_copy_rate.py); more spilled registers. Only where a program
# has more than one row: with one, the wider tile only cost time (128-token tff graph replay
# 25.5 -> 29.5 µs at W = 1).
SEND_TILE_BYTES = 32768
NUM_WARPS = 8
# Blocks of a row tile, at least one 16-byte vector per thread: Triton then gives each 128-byte block
# to 8 lanes of one warp, so a block moves in one warp instruction, which tff and sp rely on. Smaller
# tiles were spread over the warps, a block's halves in two warps (on an H200 the second 64 bytes of a
# block were read stale while its flag was new; tests/test_cuda_compile.py checks the layouts).
MIN_TILE_BLOCKS = NUM_WARPS * 32 * 16 // wire.BLOCK_BYTES
# Rows of one token a tff combine reducer takes as one tile (more rows, top-16, in groups of this
# many): a tile of 16 rows put 712 bytes of the kernel on the stack under its register budget, and
# top-16 source combines took twice as long as in sw; in groups of 8, 1.6-1.9x less at 128 and 4096
# tokens. sw and sp (no spill of note) got up to 19 % slower in groups: they take all rows at once.
# Fewer blocks per row instead (RCB 16 or 8 with 16 rows) made every mode 2.4-19x slower (W = 1,
# H200, session 30).
REDUCE_ROWS = 8
# Receivers (and combine reducers) that share one item's row, each every RECV_PARTS-th step of it,
# where there are that many programs per item and the row's steps divide among them. A program
# stores about 57 GB/s whatever it keeps in flight, and no faster through TMA bulk stores
# (benchmarks/probe_copy_rate.py, sessions 12 and 31): a decode receiver at W = 1 writes its token 8
# times, 115 KB for a 7168-element bf16 row, 2 µs of stores on one SM. Without an SM budget a buffer
# of at most PARTS_ITEMS items has RECV_PARTS receivers per item, but in dc, whose receivers wait
# for SMs behind the verifiers (its kernels hold one program per SM). Measured at W = 1 (queued
# graph replays, BENCHMARKS.md, sessions 26 and 28): 16 tokens, dispatch 15.6 against 19.6 µs (sw);
# 128 tokens (256 receivers) held back the record they waited for while each of their warps polled
# it (19.1-20.2 against 17.5-18.4); with the record read by one thread of each and two receivers per
# item up to 128 items, 17.0 µs (sw) and 17.7 (tff), against 18.1 and 19.0 with every warp polling
# and 64 items. ptxas for sm_90 (7168 bf16, top-8, a 128-token call's geometry): the decode dispatch
# kernel takes fewer registers with two receivers per item (W = 2: sw 108 -> 64, tff 131 -> 100, sp
# 125 -> 80), the combine kernel as many, but in sp at W = 2 (expert_rank: 128 -> 146, one program
# per SM instead of two): sp's reducers take whole tokens.
RECV_PARTS = 2
PARTS_ITEMS = 128
# dc without an SM budget: verifier programs in all, one per VERIFY_TOKENS tokens of the call,
# within [VERIFY_MIN, VERIFY_MAX] (verify_split). A pass over a share is slow (two steps of 32 rows
# of 7168 bf16, 8 hashes a block: about 16 µs, session 23 stamps) while the other SMs wait for it:
# spread it wide. W = 1, 7168 bf16, top-8 (H200): 4096 tokens, combine verify done at 1089 / 787 /
# 709 µs with 16 / 32 / 64 verifiers (session 20); 128 tokens, combine verify done at 34.6 µs with
# 16, 28.9 with 64, dispatch verify 15.1 / 15.7 (session 23). At most 64 per source: the last
# verifier reads the others' shares in one round (records.SHARE_WORDS).
VERIFY_MIN, VERIFY_MAX, VERIFY_TOKENS = 16, 64, 2


def row_meta(sync_mode: str, hidden: int, elem_bytes: int, tokens: int = 0) -> dict:
    """Compile-time geometry of rows of ``hidden`` elements of ``elem_bytes`` bytes in a call of
    ``tokens`` tokens: block and flag elements, blocks per row, ``CB`` blocks per tile; ``NB_BLOCK``,
    the dc verifiers' and sp's marker-reset width (whole rows, not tiles). One dict per geometry,
    shared between calls: read it, do not modify it."""
    return _row_meta(sync_mode, hidden, elem_bytes, tokens >= LARGE_CHUNK_TOKENS)


@functools.cache  # asked on every launch; the host's time per eager call matters
def _row_meta(sync_mode: str, hidden: int, elem_bytes: int, large: bool) -> dict:
    be, fe, nb = wire.geometry(sync_mode, hidden, elem_bytes)
    step = LARGE_CHUNK_BYTES if large else CHUNK_BYTES
    chunk = max(MIN_TILE_BLOCKS, min(pow2_at_least(nb), step // wire.BLOCK_BYTES))
    return {"HIDDEN": hidden, "BE": be, "FE": fe, "NB": nb, "NB_BLOCK": pow2_at_least(nb),
            "CB": chunk}


def step_rows(meta: dict) -> int:
    """Rows per step of a program that has several to move (senders' ``ROWS``, receivers'
    ``RECV_ROWS``), for the :func:`row_meta` geometry ``meta``."""
    return max(1, SEND_TILE_BYTES // (meta["CB"] * wire.BLOCK_BYTES))


def reduce_step_blocks(meta: dict, rows: int) -> int:
    """Blocks of each of a token's ``rows`` rows a combine reducer takes per step (``RCB``): all of
    them as one tile of at most ``SEND_TILE_BYTES``, never fewer than ``MIN_TILE_BLOCKS``."""
    return max(MIN_TILE_BLOCKS, min(meta["CB"], SEND_TILE_BYTES // (rows * wire.BLOCK_BYTES)))


def reduce_rows(sync: str, rows: int) -> int:
    """A combine reducer's tile of a token's ``rows`` rows (``R_BLOCK``: its W partial sums or K
    pair rows): a power of two, at least 2 lanes, and in ``tff`` at most ``REDUCE_ROWS``."""
    r_block = pow2_at_least(max(rows, 2))
    return min(r_block, REDUCE_ROWS) if sync == "tff" else r_block


def reducer_tile(sync: str, meta: dict, rows: int, shared: bool) -> tuple[int, int, int]:
    """A combine reducer's ``(R_BLOCK, RCB, RECV_PARTS)`` for tokens of ``rows`` rows (W partial
    sums or K pair rows) of the :func:`row_meta` geometry ``meta``: its tile of rows, the blocks of
    each it takes per step, and the reducers per token (``RECV_PARTS`` where ``shared`` and they
    divide the steps, else 1)."""
    r_block = reduce_rows(sync, rows)
    rcb = reduce_step_blocks(meta, r_block)
    return r_block, rcb, RECV_PARTS if shared and parts_divide(meta["NB"], rcb) else 1


def recv_parts(receivers: int, items: int, blocks: int, step_blocks: int) -> int:
    """Programs per item of a receiving group (``RECV_PARTS`` of the kernels): ``RECV_PARTS`` where
    ``receivers`` hold that many for each of ``items`` and they divide the steps of ``step_blocks``
    of a row of ``blocks`` among them, else 1."""
    return RECV_PARTS if receivers >= RECV_PARTS * items and parts_divide(blocks, step_blocks) else 1


def parts_divide(blocks: int, step_blocks: int) -> bool:
    """Whether ``RECV_PARTS`` programs divide the steps of ``step_blocks`` of a row of ``blocks``."""
    return -(-blocks // step_blocks) % RECV_PARTS == 0


def verify_split(world: int, num_sms: int | None, num_tokens: int) -> int:
    """``dc``: verifier programs per source for a call of ``num_tokens`` tokens, a power of two: in
    all one per ``VERIFY_TOKENS`` tokens within ``[VERIFY_MIN, VERIFY_MAX]``, at most about a quarter
    of an SM budget, at least one per source. One program hashing every marker of a batch would
    bound the call (``verify``); idle ones cost a small call little (each publishes an empty share,
    read with the others in one round)."""
    programs = min(VERIFY_MAX, max(VERIFY_MIN, pow2_at_least(-(-num_tokens // VERIFY_TOKENS))))
    if num_sms is not None:
        programs = min(programs, num_sms // 4)
    per_source = max(1, programs // world)
    return 1 << (per_source.bit_length() - 1)


def verify_step(num_tokens: int, split: int, most: int) -> int:
    """``dc``: tokens per step of a verifier's share of a ``num_tokens``-token batch (``verify``):
    the largest power of two up to ``most`` that still gives each of a source's ``split`` verifiers
    a step (a pass over a share of rows is slow, and the verifiers without rows wait for it)."""
    per = max(1, num_tokens // split)
    return min(most, 1 << (per.bit_length() - 1))


def pow2_at_least(n: int) -> int:
    """The least power of two >= ``n`` (>= 1). Triton's own helper is a JIT function: about 15 µs
    per call from the host, several per launch."""
    return 1 << max(n - 1, 0).bit_length()
