// Host tiling: the byte layout of the windows and workspaces (EpTiling) for a layer shape, the
// tiling of a dispatch, combine or window preparation (the torch ops and the CANN ops' tiling
// functions both use DispatchTiling / CombineTiling / PrepareTiling), the dispatch's worker split
// (split.h), the sp sentinels, and the message for a kernel that gave up waiting. Plain C++, no torch.
//
// Example: W = 2, H = 40 bf16, E = 8, K = 2, T_max = 4: a dispatch row is 80 token bytes + 28
// route bytes -> 112 bytes (56 elements), one 512-byte block in sw/dc/sp and tff alike; a count
// entry is 512 bytes; a slot holds 2 * 512 count bytes, 2 * 4 dispatch rows, 2 * 8 combine rows
// and 2 * 8 pair-value rows of 512 bytes each, plus records; the window is a 4096-byte header (2 * 2
// tokens and 64 call counters of 32 bytes, rounded up) and two slots.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ep_tiling.h"
#include "split.h"

namespace ubep_ascend {

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

inline ubep::Mode ModeOf(const std::string& sync) {
  if (sync == "sw") return ubep::Mode::SW;
  if (sync == "tff") return ubep::Mode::TFF;
  if (sync == "dc") return ubep::Mode::DC;
  if (sync == "sp") return ubep::Mode::SP;
  throw std::invalid_argument("sync must be one of sw, tff, dc, sp; got '" + sync + "'");
}

// sp sentinel candidate 0 of docs/PROTOCOL.md (a signaling NaN no arithmetic produces).
inline int64_t Sentinel(int64_t elem_bytes, bool bf16) {
  if (elem_bytes == 4) return 0xFFA5A5A5;
  return bf16 ? 0xFFA5 : 0xFDA5;
}

inline int64_t ElemBytes(RowDtype d) { return d == ROW_FP32 ? 4 : 2; }

// Geometry and workspace of a layer; the per-call fields (num_tokens, call_code, reduce, groups,
// timeout) are left for the op to fill.
inline EpTiling MakeTiling(int64_t world, int64_t rank, int64_t hidden, int64_t num_experts, int64_t top_k,
                           int64_t max_tokens, RowDtype dtype, const std::string& sync) {
  if (world < 1 || rank < 0 || rank >= world || hidden < 1 || top_k < 1 || max_tokens < 1 ||
      num_experts % world || dtype < ROW_FP32 || dtype > ROW_BF16) {
    throw std::invalid_argument("ubep_ascend: inconsistent layer shape");
  }
  const int64_t elem_bytes = ElemBytes(dtype);
  EpTiling t{};
  t.world = world;
  t.rank = rank;
  t.hidden = hidden;
  t.num_experts = num_experts;
  t.local_experts = num_experts / world;
  t.top_k = top_k;
  t.max_tokens = max_tokens;
  t.elem_bytes = elem_bytes;
  t.mode = static_cast<int64_t>(ModeOf(sync));
  t.sentinel = Sentinel(elem_bytes, dtype == ROW_BF16);
  t.sentinel_f32 = Sentinel(4, false);
  t.route_bytes = 4 + 12 * top_k;
  t.disp_hidden = RoundUp(hidden * elem_bytes + t.route_bytes, 16) / elem_bytes;
  t.cnt_stride = RoundUp(32 + RoundUp((2 + t.local_experts) * 8, 32), BLOCK_BYTES);
  t.disp_rows = max_tokens;
  t.comb_rows = max_tokens * top_k;
  const int64_t records = RoundUp(world * RECORD_STRIDE, BLOCK_BYTES);
  t.slots_off = RoundUp((2 * world + MAX_AIVS) * TOKEN_STRIDE, 4096);
  t.cnt_off = 0;
  t.disp_off = world * t.cnt_stride;
  t.disp_rec_off = t.disp_off + world * t.disp_rows * dispatch_format(t).row_stride();
  t.comb_off = t.disp_rec_off + records;
  t.comb_rec_off = t.comb_off + world * t.comb_rows * combine_format(t).row_stride();
  t.pair_off = t.comb_rec_off + records;
  t.pair_rec_off = t.pair_off + world * t.comb_rows * pair_format(t).row_stride();
  t.slot_bytes = RoundUp(t.pair_rec_off + records, 4096);
  t.window_bytes = t.slots_off + 2 * t.slot_bytes;
  // workspace: status [0, 32), counters, per-destination collision flag and dc lanes, data, bases
  t.ws_counters = 64;
  t.ws_collide = RoundUp(t.ws_counters + 8 * COUNTER_STRIDE, BLOCK_BYTES);
  t.ws_data = RoundUp(t.ws_collide + world * 32, BLOCK_BYTES);
  const int64_t count_rows = world * RoundUp(2 + t.local_experts, 4) * 8;
  const int64_t kept_rows = max_tokens * (top_k > world ? top_k : world) * (hidden * elem_bytes > 4 ? hidden * elem_bytes : 4);
  t.ws_bases = RoundUp(t.ws_data + (count_rows > kept_rows ? count_rows : kept_rows), BLOCK_BYTES);
  t.ws_bytes = RoundUp(t.ws_bases + num_experts * 8, BLOCK_BYTES);
  return t;
}

// The dispatch's count/token AIV split for a layer: the cost model's best on a CM384-like fabric of
// `world` dies, for full batches of `max_tokens` rows of hidden * elem_bytes bytes.
// Example: 256 dies, H = 7168 bf16, E = 256, K = 8, T_max = 64, 48 AIVs: 12 count + 36 token AIVs.
inline Split LayerSplit(int64_t world, int64_t hidden, int64_t num_experts, int64_t top_k, int64_t max_tokens,
                        int64_t elem_bytes, int64_t n_workers) {
  return BestSplit(max_tokens, num_experts, top_k, hidden * elem_bytes, n_workers, world);
}

constexpr double CYCLES_PER_SECOND = 50e6;  // GetSystemCycle rate

// What one dispatch or combine call asks for, as the torch ops' arguments and the CANN ops'
// attributes carry it.
struct CallAttrs {
  int64_t world, rank, num_experts, max_tokens;
  std::string sync;
  int64_t call_code, n_workers;  // call_code: the call's code, shifted above CALL_NUMBER_BITS
  double timeout_s;
};

inline Reduce ReduceOf(const std::string& reduce) {
  if (reduce == "source") return REDUCE_SOURCE;
  if (reduce == "expert_rank") return REDUCE_EXPERT_RANK;
  if (reduce == "pairs") return REDUCE_PAIRS;
  throw std::invalid_argument("ubep_ascend.combine: reduce must be source, expert_rank or pairs, got '" + reduce +
                              "'");
}

inline int64_t TimeoutCycles(double timeout_s) {
  if (!(timeout_s > 0)) throw std::invalid_argument("ubep_ascend: timeout_s must be > 0");
  return static_cast<int64_t>(timeout_s * CYCLES_PER_SECOND);
}

// The layer's geometry (MakeTiling) and the fields every call fills.
inline EpTiling CallTiling(const CallAttrs& c, int64_t hidden, int64_t top_k, RowDtype layer, int64_t num_tokens) {
  if (c.call_code < 0 || (static_cast<uint64_t>(c.call_code) & CALL_NUMBER_MASK) != 0) {
    throw std::invalid_argument("ubep_ascend: call_code must be a code shifted above bit " +
                                std::to_string(CALL_NUMBER_BITS) + ", got " + std::to_string(c.call_code));
  }
  if (c.n_workers > MAX_AIVS) {
    throw std::invalid_argument("ubep_ascend: n_workers must be <= " + std::to_string(MAX_AIVS) +
                                " (the window header's call counters)");
  }
  if (num_tokens > c.max_tokens) throw std::invalid_argument("ubep_ascend: more tokens than max_tokens");
  EpTiling t = MakeTiling(c.world, c.rank, hidden, c.num_experts, top_k, c.max_tokens, layer, c.sync);
  t.call_code = c.call_code;
  t.timeout_cycles = TimeoutCycles(c.timeout_s);
  t.num_tokens = num_tokens;
  return t;
}

// What one window preparation asks for; its token (the group's nonce, the preparation's number on the
// group) travels as the op's input tensor.
struct PrepareAttrs {
  int64_t world, rank, hidden, num_experts, top_k, max_tokens;
  RowDtype dtype;  // the layer's
  std::string sync;
  int64_t n_workers;
  double timeout_s;
};

// A window preparation for the layer on n_workers AIVs; its workspace is the status words and the
// counters only.
inline EpTiling PrepareTiling(const PrepareAttrs& p) {
  if (p.n_workers < 1 || p.n_workers > MAX_AIVS) {
    throw std::invalid_argument("ubep_ascend.prepare: n_workers must be in [1, " + std::to_string(MAX_AIVS) + "]");
  }
  EpTiling t = MakeTiling(p.world, p.rank, p.hidden, p.num_experts, p.top_k, p.max_tokens, p.dtype, p.sync);
  t.timeout_cycles = TimeoutCycles(p.timeout_s);
  t.ws_bytes = t.ws_collide;
  return t;
}

// The probe of the tear-free 512-byte write (probe_kernel.cpp): a preparation for the probe's layer
// (`prepare`: the caller's choice; its slot 0 must hold a row of `blocks` blocks for each writing
// AIV, n_workers / 2), then `rounds` writes of every row.
inline EpTiling ProbeTiling(const PrepareAttrs& prepare, int64_t rounds, int64_t blocks) {
  if (prepare.n_workers < 2) {
    throw std::invalid_argument("ubep_ascend.probe: n_workers must be >= 2 (writers and readers)");
  }
  if (rounds < 1 || rounds > INT32_MAX) throw std::invalid_argument("ubep_ascend.probe: rounds must be in [1, 2^31)");
  if (blocks < 1 || blocks > PROBE_MAX_BLOCKS) {
    throw std::invalid_argument("ubep_ascend.probe: blocks must be in [1, " + std::to_string(PROBE_MAX_BLOCKS) + "]");
  }
  EpTiling t = PrepareTiling(prepare);
  if (prepare.n_workers / 2 * blocks * BLOCK_BYTES > t.slot_bytes) {
    throw std::invalid_argument("ubep_ascend.probe: the probe's layer has a slot of " + std::to_string(t.slot_bytes) +
                                " bytes, too small for its rows");
  }
  t.probe_rounds = rounds;
  t.probe_blocks = blocks;
  return t;
}

// A dispatch of num_tokens rows of [hidden] `dtype`, top_k experts each, on n_workers AIVs.
inline EpTiling DispatchTiling(const CallAttrs& c, bool padded, int64_t hidden, int64_t top_k, RowDtype dtype,
                               int64_t num_tokens) {
  if (c.n_workers < 2) {
    throw std::invalid_argument("ubep_ascend.dispatch: n_workers must be >= 2 (a count and a token group)");
  }
  EpTiling t = CallTiling(c, hidden, top_k, dtype, num_tokens);
  t.capacity = padded ? c.world * c.max_tokens : 0;
  const Split split = LayerSplit(c.world, hidden, c.num_experts, top_k, c.max_tokens, t.elem_bytes, c.n_workers);
  t.n_count = split.n_count;
  t.n_token = split.n_token;
  t.dies_per_npu = kCm384.dies_per_npu;
  t.dies_per_board = kCm384.dies_per_board;
  return t;
}

// A combine back to num_tokens tokens of a layer of `layer` rows (PAIRS: fp32 rows).
inline EpTiling CombineTiling(const CallAttrs& c, int64_t hidden, int64_t top_k, RowDtype layer, int64_t num_tokens,
                              Reduce reduce, bool weighted) {
  if (c.n_workers < 1) throw std::invalid_argument("ubep_ascend.combine: n_workers must be >= 1");
  EpTiling t = CallTiling(c, hidden, top_k, layer, num_tokens);
  t.reduce = reduce;
  t.weighted = weighted ? 1 : 0;
  t.rows_dtype = reduce == REDUCE_PAIRS ? ROW_FP32 : layer;
  return t;
}

// What a kernel that gave up was waiting for (status words phase, peer).
inline std::string PhaseName(int64_t phase, int64_t peer) {
  const std::string from = " from rank " + std::to_string(peer);
  switch (phase) {
    case PHASE_COUNTS: return peer >= 0 ? "dispatch: wait for counts" + from : "dispatch: gather counts";
    case PHASE_TOKENS: return "dispatch: wait for tokens" + from;
    case PHASE_OFFSETS: return "dispatch: wait for the count group's row offsets";
    case PHASE_SENT: return "wait for this rank's senders";
    case PHASE_HELLO: return "combine: wait for the handshake" + from;
    case PHASE_RETURN: return "combine: wait for returned rows" + from;
    case PHASE_ARRIVE: return "prepare: wait for rank " + std::to_string(peer) + " to arrive";
    case PHASE_READY: return "prepare: wait for rank " + std::to_string(peer) + " to fill its window";
    case PHASE_PROBE: return "probe: wait for the last round of rank " + std::to_string(peer) + "'s blocks";
    default: return "unknown phase " + std::to_string(phase);
  }
}

}  // namespace ubep_ascend
