// The dispatch's index math on UB tensors: ubep::row_base (scheduler/include/ubep/layout.h) and
// one worker's share of ubep::hop_balanced (mapping.h), written over LocalTensor because the kernels
// keep these W- and E-sized arrays in UB, where the scalar reaches them only through
// GetValue/SetValue. Same results as the shared helpers, which host code and the C++ tests use.
#pragma once

#include "kernel_operator.h"
#include "ubep/mapping.h"

namespace ubep_ascend {

using AscendC::LocalTensor;

// ubep::row_base for one die's local experts: base[s * L + l], the first receive row of source s's
// pairs for local expert l, from counts[s * stride + first + l]; tpe[l], the pairs of expert l.
// Rows go by (local expert, source, token): compact (capacity <= 0) after the rows of earlier
// experts, padded at l * capacity.
__aicore__ inline void RowBase(const LocalTensor<int64_t>& counts, int64_t stride, int64_t first, int64_t W,
                               int64_t L, int64_t capacity, const LocalTensor<int64_t>& base,
                               const LocalTensor<int64_t>& tpe) {
  int64_t earlier = 0;  // rows of experts before l (compact)
  for (int64_t l = 0; l < L; ++l) {
    int64_t start = capacity > 0 ? l * capacity : earlier, total = 0;
    for (int64_t s = 0; s < W; ++s) {
      base.SetValue(static_cast<uint32_t>(s * L + l), start);
      const int64_t c = counts.GetValue(static_cast<uint32_t>(s * stride + first + l));
      start += c;
      total += c;
    }
    tpe.SetValue(static_cast<uint32_t>(l), total);
    earlier += total;
  }
}

struct Located {
  int64_t position;  // #{i : cumsum[i] <= t}: the destination holding token t (D for t = M)
  int64_t offset;    // t minus the first token of that destination
};

// ubep::quaternary_search: three pivots per step narrow [lo, hi) to a quarter.
__aicore__ inline Located QuaternarySearch(const LocalTensor<int64_t>& cumsum, int64_t D, int64_t target) {
  int64_t lo = 0, hi = D;
  while (lo < hi) {
    const int64_t w = hi - lo, p1 = lo + w / 4, p2 = lo + w / 2, p3 = lo + 3 * w / 4;
    int64_t c = 0;
    const int64_t pivots[3] = {p1, p2, p3};
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t at = pivots[i] < D - 1 ? pivots[i] : D - 1;
      c += cumsum.GetValue(static_cast<uint32_t>(at)) <= target ? 1 : 0;
    }
    if (c == 0) {
      hi = p1;
    } else if (c == 1) {
      lo = p1 + 1;
      hi = p2;
    } else if (c == 2) {
      lo = p2 + 1;
      hi = p3;
    } else {
      lo = p3 + 1;
    }
  }
  return Located{lo, target - (lo > 0 ? cumsum.GetValue(static_cast<uint32_t>(lo - 1)) : 0)};
}

constexpr int64_t HOP_CLASSES = 3;  // the same NPU, the same board, across the second switch tier

// The hop class of die d seen from die `rank` on a CM384-like fabric (ubep.topology.cm384).
__aicore__ inline int64_t HopClass(int64_t rank, int64_t d, int64_t dies_per_npu, int64_t dies_per_board) {
  if (d / dies_per_npu == rank / dies_per_npu) return 0;
  return d / dies_per_board == rank / dies_per_board ? 1 : 2;
}

// Worker `me`'s pieces of ubep::hop_balanced(counts[0, D), the hop classes from die `rank`, n):
// destinations taken class by class (index order within a class), each class's tokens cut into n
// slices (ubep::hop_balanced_slice), so no worker carries more than ceil(V_h / n) tokens of class h.
// Piece i is (pieces[3i], pieces[3i + 1], pieces[3i + 2]) = (destination, first token, length).
// Returns the number of pieces (at most D: a destination belongs to one class, whose slice is one
// run of the class's destinations). order, cumsum: D entries of scratch each.
__aicore__ inline int64_t HopBalancedPieces(const LocalTensor<int64_t>& counts, int64_t D, int64_t rank,
                                            int64_t dies_per_npu, int64_t dies_per_board, int64_t n, int64_t me,
                                            const LocalTensor<int64_t>& order, const LocalTensor<int64_t>& cumsum,
                                            const LocalTensor<int64_t>& pieces) {
  int64_t totals[HOP_CLASSES] = {0, 0, 0};
  int64_t i = 0, total = 0;
  for (int64_t h = 0; h < HOP_CLASSES; ++h) {
    for (int64_t d = 0; d < D; ++d) {
      if (HopClass(rank, d, dies_per_npu, dies_per_board) != h) continue;
      order.SetValue(static_cast<uint32_t>(i), d);
      total += counts.GetValue(static_cast<uint32_t>(d));
      cumsum.SetValue(static_cast<uint32_t>(i++), total);
      totals[h] += counts.GetValue(static_cast<uint32_t>(d));
    }
  }
  int64_t num = 0;
  for (int64_t h = 0; h < HOP_CLASSES; ++h) {
    int64_t lo = 0, hi = 0;
    ubep::hop_balanced_slice(totals, HOP_CLASSES, n, me, h, &lo, &hi);
    if (hi <= lo) continue;
    const Located a = QuaternarySearch(cumsum, D, lo), b = QuaternarySearch(cumsum, D, hi);
    const int64_t last = b.position - (b.offset == 0 ? 1 : 0);
    for (int64_t pos = a.position; pos <= last; ++pos) {
      const int64_t dest = order.GetValue(static_cast<uint32_t>(pos));
      const int64_t first = pos == a.position ? a.offset : 0;
      const int64_t end = pos == b.position ? b.offset : counts.GetValue(static_cast<uint32_t>(dest));
      if (end > first) {
        pieces.SetValue(static_cast<uint32_t>(3 * num), dest);
        pieces.SetValue(static_cast<uint32_t>(3 * num + 1), first);
        pieces.SetValue(static_cast<uint32_t>(3 * num + 2), end - first);
        ++num;
      }
    }
  }
  return num;
}

}  // namespace ubep_ascend
