"""How a call's work is cut into pieces, as pure functions of its sizes: a row's blocks, flags and
steps per sync mode (``row_meta``), the tiles a program moves per step, the programs that share a
received item or a reduced token, and ``dc``'s verifier shares. The planner (``plan``) turns them
into each launch's compile-time constants; each constant's reason sits beside it.
"""

from __future__ import annotations

import functools

import torch

from ubep.backends.cuda import wire
from ubep.backends.cuda.tuning import Tuning

DEFAULT = Tuning()

INT_VIEW = {2: torch.int16, 4: torch.int32}  # rows move as integers of their element width
# Bytes of a row a program moves per step; calls of at least LARGE_CHUNK_TOKENS tokens take the
# larger step, which pays off only in large calls (docs/BENCHMARKS.md).
CHUNK_BYTES, LARGE_CHUNK_BYTES, LARGE_CHUNK_TOKENS = 8192, 16384, 1024
# Bytes of rows a program with several to move loads per step as one tile (senders, receivers):
# rows in flight together raise its copy rate; wider tiles spill (docs/BENCHMARKS.md).
SEND_TILE_BYTES = 32768
NUM_WARPS = 8
# Blocks of a row tile, at least one 16-byte vector per thread, so that each 128-byte block moves in
# one warp instruction, which tff and sp rely on (tests/test_cuda_compile.py checks the layouts).
MIN_TILE_BLOCKS = NUM_WARPS * 32 * 16 // wire.BLOCK_BYTES
# Rows of one token a tff combine reducer takes as one tile (top-16 in groups of this many): a tile
# of 16 spills the tff kernel under its register cap (docs/BENCHMARKS.md). sw and sp take all rows.
REDUCE_ROWS = 8
# Receivers (and combine reducers) that share one item's row, each every RECV_PARTS-th step of it,
# where there are that many programs per item and the steps divide among them: one program's stores
# bound a decode receiver (benchmarks/probe_copy_rate.py). Without an SM budget a buffer of at most
# PARTS_ITEMS items has RECV_PARTS per item, but in dc, whose receivers wait behind the verifiers
# (docs/BENCHMARKS.md). sp's reducers take whole tokens: sharing costs its combine kernel registers.
RECV_PARTS = 2
PARTS_ITEMS = 128


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


def verify_split(world: int, num_sms: int | None, num_tokens: int, tuning: Tuning = DEFAULT) -> int:
    """``dc``: verifier programs per source for a call of ``num_tokens`` tokens, a power of two: in
    all one per ``tuning.verify_tokens`` tokens within ``[verify_min, verify_max]``, at most about a
    quarter of an SM budget, at least one per source. One program hashing every marker of a batch
    would bound the call (``verify``); idle ones cost a small call little (each publishes an empty
    share, read with the others in one round)."""
    per = pow2_at_least(-(-num_tokens // tuning.verify_tokens))
    programs = min(tuning.verify_max, max(tuning.verify_min, per))
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
