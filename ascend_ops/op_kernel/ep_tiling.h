// Tiling of the EP kernels: the layer shape, the call, the worker groups and the byte layout of
// every die's window and of the kernel's workspace (the op's zeroed `scratch` output).
// op_host/tiling.h fills it; the kernels only read it. Plain int64 fields, so the struct is the same
// bytes on the host and on the AIV.
//
// Window of one die (identical geometry on every die): [header | slot 0 | slot 1], call e in slot
// e & 1 at slots_off + (e & 1) * slot_bytes.
//   header: never filled by a preparation; its place depends on W only, so every layer on a group
//           finds it. The preparation's tokens (prepare_kernel.cpp): W arrival entries, then W ready
//           entries, TOKEN_STRIDE bytes each, die s's at s * TOKEN_STRIDE: u64 nonce, u64 epoch. Then
//           MAX_AIVS call counters, TOKEN_STRIDE bytes each, AIV i's at (2 W + i) * TOKEN_STRIDE: u64
//           the number of the last call it took part in (Ctx::TakeCallNumber).
//   slot = [count area | dispatch rows | dispatch records | combine rows | combine records |
//           pair-value rows | pair-value records]
//   count area:  W entries of cnt_stride bytes, entry s written by source s: u64 epoch at 0
//                (written last, after a fence), then from byte 32 the payload (u64 words).
//   rows:        W batches (one per source) of max_rows rows of the area's wire row stride.
//   records:     W 32-byte entries, the 16-byte batch record of docs/PROTOCOL.md.
#pragma once

#include "ubep/protocol.h"

namespace ubep_ascend {

constexpr int64_t BLOCK_BYTES = 512;  // CM384 transaction; every mode's block
constexpr int64_t FLAG_BYTES = 32;    // tff flag, dc/sp marker bytes
constexpr int64_t RECORD_STRIDE = 32;
constexpr int64_t COUNTER_STRIDE = 32;  // one int32 counter per 32-byte unit (DataCopy granularity)
constexpr int64_t TOKEN_STRIDE = 32;    // a header entry: u64 nonce, u64 epoch, 16 bytes of 0
constexpr int64_t MAX_AIVS = 64;        // call counters in the header: the most AIVs a launch may have
constexpr int64_t CALL_NUMBER_BITS = 40;  // a call's number, below its code (ubep/backends/base.py)
constexpr int64_t PROBE_MAX_BLOCKS = 32;  // blocks of a probe row (probe_kernel.cpp)
constexpr uint64_t CALL_NUMBER_MASK = (uint64_t{1} << CALL_NUMBER_BITS) - 1;

// The header's two areas: the preparation's arrival tokens, then its ready tokens.
enum TokenArea : int64_t { AREA_ARRIVE = 0, AREA_READY = 1 };

enum Reduce : int64_t { REDUCE_SOURCE = 0, REDUCE_EXPERT_RANK = 1, REDUCE_PAIRS = 2 };

// Row dtypes: of the layer (window geometry) and of the rows a combine call reduces.
enum RowDtype : int64_t { ROW_FP32 = 0, ROW_FP16 = 1, ROW_BF16 = 2 };

// Where a kernel was waiting when it gave up (names: PhaseName in op_host/tiling.h).
enum Phase : int64_t {
  PHASE_NONE = 0,
  PHASE_COUNTS = 1,       // dispatch: count message from a peer
  PHASE_TOKENS = 2,       // dispatch: token rows from a peer
  PHASE_OFFSETS = 3,      // dispatch: token group waits for the count group's row offsets
  PHASE_SENT = 4,         // a group waits for its own senders before writing batch records
  PHASE_HELLO = 5,        // combine: the call's handshake from a peer
  PHASE_RETURN = 6,       // combine: returned rows from a peer
  PHASE_ARRIVE = 7,       // prepare: a peer's arrival token
  PHASE_READY = 8,        // prepare: a peer's ready token (its window filled)
  PHASE_PROBE = 9,        // probe: a peer's last round of probe blocks
};

struct EpTiling {
  // layer
  int64_t world, rank, hidden, num_experts, local_experts, top_k, max_tokens;
  int64_t elem_bytes;     // 2 (bf16, fp16) or 4 (fp32)
  int64_t capacity;       // padded layout: rows per local expert; compact: 0
  // call
  int64_t num_tokens;     // T of this die
  int64_t call_code;      // the call's code above bit CALL_NUMBER_BITS (u64 bits); its number comes
                          // from the die's call counters, so a replayed launch gets a new one
  int64_t mode;           // ubep::Mode
  int64_t sentinel;       // sp sentinel of the row dtype
  int64_t sentinel_f32;   // sp sentinel of fp32 pair values
  int64_t reduce, weighted;
  int64_t rows_dtype;     // combine: RowDtype of the rows (fp32 for REDUCE_PAIRS), picks the kernel
  int64_t n_count, n_token;  // dispatch: count group AIVs [0, n_count), token group after them
  int64_t dies_per_npu, dies_per_board;  // the fabric's hop classes, for the token group's mapper
  int64_t timeout_cycles;
  int64_t probe_rounds, probe_blocks;  // probe: writes of each probe row, 512-byte blocks per row
  // geometry
  int64_t route_bytes;    // per dispatch row: pair base, K local experts, K orders, K weights
  int64_t disp_hidden;    // dispatch wire row in elements: token row + route, rounded to 16 bytes
  int64_t cnt_stride, cnt_off, disp_off, disp_rec_off, comb_off, comb_rec_off, pair_off, pair_rec_off;
  int64_t disp_rows, comb_rows;  // rows per batch: max_tokens and max_tokens * top_k
  int64_t slots_off, slot_bytes, window_bytes;  // slots_off: the header's bytes
  // workspace (this die's `scratch` output, zeroed before each call)
  int64_t ws_counters, ws_collide, ws_data, ws_bases, ws_bytes;  // ws_data: dispatch counts, combine rows
};

UBEP_FN ubep::WireFormat dispatch_format(const EpTiling& t) {
  return ubep::WireFormat{static_cast<ubep::Mode>(t.mode), t.elem_bytes, t.disp_hidden, BLOCK_BYTES,
                          FLAG_BYTES, static_cast<uint32_t>(t.sentinel)};
}

UBEP_FN ubep::WireFormat combine_format(const EpTiling& t) {
  return ubep::WireFormat{static_cast<ubep::Mode>(t.mode), t.elem_bytes, t.hidden, BLOCK_BYTES,
                          FLAG_BYTES, static_cast<uint32_t>(t.sentinel)};
}

UBEP_FN ubep::WireFormat pair_format(const EpTiling& t) {
  return ubep::WireFormat{static_cast<ubep::Mode>(t.mode), 4, 1, BLOCK_BYTES, FLAG_BYTES,
                          static_cast<uint32_t>(t.sentinel_f32)};
}

}  // namespace ubep_ascend
