// Deterministic receive rows (the twin of ubep/layout.py; same running example).
//
// W = 2 ranks, E = 4 experts (2 per rank), K = 2; source 0 routes
//   topk_idx = [[1, 2], [0, 1], [3, -1]],   count matrix C = [[1, 2, 1, 1], [2, 0, 1, 1]]
// -> expert_counts = [1, 2, 1, 1]; local_order = [[0, 0], [0, 1], [0, -1]];
//    row_base (compact) = [[0, 3, 0, 2], [1, 5, 1, 3]]; pair_rows of source 0 = [[3, 0], [0, 4], [2, -1]].
#pragma once

#include "ubep/qualifiers.h"

namespace ubep {

// counts_E[e] = pairs of topk_idx_TK ([T * K], -1 = none) routed to expert e.
UBEP_FN void expert_counts(const int64_t* topk_idx_TK, int64_t num_pairs, int64_t num_experts,
                           int64_t* counts_E) {
  for (int64_t e = 0; e < num_experts; ++e) counts_E[e] = 0;
  for (int64_t p = 0; p < num_pairs; ++p) {
    if (topk_idx_TK[p] >= 0) ++counts_E[topk_idx_TK[p]];
  }
}

// order_TK[p] = how many earlier pairs (row-major (t, k) order) go to the same expert; -1 for -1.
// seen_E is caller scratch of num_experts entries.
UBEP_FN void local_order(const int64_t* topk_idx_TK, int64_t num_pairs, int64_t num_experts,
                         int64_t* seen_E, int64_t* order_TK) {
  for (int64_t e = 0; e < num_experts; ++e) seen_E[e] = 0;
  for (int64_t p = 0; p < num_pairs; ++p) {
    const int64_t e = topk_idx_TK[p];
    order_TK[p] = e >= 0 ? seen_E[e]++ : -1;
  }
}

// base_WE[s * E + e] = receive row, on the rank holding e, of source s's first pair for e.
// Rows go by (local expert, source, token): the rows of earlier local experts (compact layout,
// expert_capacity <= 0) or local_expert * expert_capacity (padded), plus the pairs of earlier
// sources for e.
UBEP_FN void row_base(const int64_t* count_matrix_WE, int64_t world_size, int64_t num_experts,
                      int64_t num_local_experts, int64_t expert_capacity, int64_t* base_WE) {
  for (int64_t e = 0; e < num_experts; ++e) {
    int64_t start = 0;
    const int64_t local = e % num_local_experts;
    if (expert_capacity > 0) {
      start = local * expert_capacity;
    } else {
      for (int64_t earlier = e - local; earlier < e; ++earlier) {
        for (int64_t s = 0; s < world_size; ++s) start += count_matrix_WE[s * num_experts + earlier];
      }
    }
    for (int64_t s = 0; s < world_size; ++s) {
      base_WE[s * num_experts + e] = start;
      start += count_matrix_WE[s * num_experts + e];
    }
  }
}

// rows_TK[p] = base_E[e] + local order of pair p (base_E: this source's row of row_base), or -1.
UBEP_FN void pair_rows(const int64_t* topk_idx_TK, int64_t num_pairs, int64_t num_experts,
                       const int64_t* base_E, int64_t* seen_E, int64_t* rows_TK) {
  local_order(topk_idx_TK, num_pairs, num_experts, seen_E, rows_TK);
  for (int64_t p = 0; p < num_pairs; ++p) {
    if (topk_idx_TK[p] >= 0) rows_TK[p] += base_E[topk_idx_TK[p]];
  }
}

}  // namespace ubep
