// The shapes of the ops' outputs, in the ops' output order, from the call's tiling and its inputs'
// sizes: what the torch ops allocate (ep_ops.h) and what the MC2 ops' InferShape give a GE graph
// (mc2/ep_mc2.h), so the two cannot disagree. Plain C++.
#pragma once

#include <cstdint>
#include <vector>

#include "tiling.h"

namespace ubep_ascend {

using Dims = std::vector<int64_t>;

// Rows a dispatch's recv_x may hold: padded, every local expert's capacity; compact, the worst case
// (every token of every source to this rank, once per local expert it picked).
inline int64_t MaxRecvRows(int64_t world, int64_t num_experts, int64_t top_k, int64_t max_tokens, bool padded) {
  const int64_t local = num_experts / world;
  return padded ? local * world * max_tokens : world * max_tokens * (top_k < local ? top_k : local);
}

// recv_x [rows, H], recv_weights [rows], tokens_per_expert [E_local], recv_rows, recv_pair_weights
// [W, T_max, K], recv_pair_base [W, T_max], recv_counts [W, 2], scratch [ws_bytes].
inline std::vector<Dims> DispatchShapes(const EpTiling& t, bool padded) {
  const int64_t rows = MaxRecvRows(t.world, t.num_experts, t.top_k, t.max_tokens, padded);
  return {{rows, t.hidden},           {rows},          {t.local_experts}, {t.world, t.max_tokens, t.top_k},
          {t.world, t.max_tokens, t.top_k}, {t.world, t.max_tokens}, {t.world, 2}, {t.ws_bytes}};
}

// y [T, H] (pairs: [T, K]), scratch [ws_bytes].
inline std::vector<Dims> CombineShapes(const EpTiling& t) {
  return {{t.num_tokens, t.reduce == REDUCE_PAIRS ? t.top_k : t.hidden}, {t.ws_bytes}};
}

// scratch [ws_bytes].
inline std::vector<Dims> PrepareShapes(const EpTiling& t) { return {{t.ws_bytes}}; }

// counts [n_workers, 4], scratch [ws_bytes].
inline std::vector<Dims> ProbeShapes(const EpTiling& t, int64_t n_workers) { return {{n_workers, 4}, {t.ws_bytes}}; }

}  // namespace ubep_ascend
