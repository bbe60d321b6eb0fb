// The dispatch's index math on UB tensors: ubep::row_base (scheduler/include/ubep/layout.h) and
// one worker's share of ubep::hop_aware (mapping.h), written over LocalTensor because the kernels
// keep these W- and E-sized arrays in UB, where the scalar reaches them only through
// GetValue/SetValue. Same results as the shared helpers, which host code and the C++ tests use.
#pragma once

#include "kernel_operator.h"

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

// Worker `me`'s pieces of ubep::hop_aware(counts[0, D), D, n): destinations in transposed order
// (rows of n read by column), the token sequence cut into n equal slices; piece i is
// (pieces[3i], pieces[3i + 1], pieces[3i + 2]) = (destination, first token, length). Returns the
// number of pieces (at most D). order, cumsum: D entries of scratch each.
__aicore__ inline int64_t HopAwarePieces(const LocalTensor<int64_t>& counts, int64_t D, int64_t n, int64_t me,
                                         const LocalTensor<int64_t>& order, const LocalTensor<int64_t>& cumsum,
                                         const LocalTensor<int64_t>& pieces) {
  int64_t i = 0, total = 0;
  for (int64_t column = 0; column < n; ++column) {
    for (int64_t d = column; d < D; d += n) order.SetValue(static_cast<uint32_t>(i++), d);
  }
  for (int64_t p = 0; p < D; ++p) {
    total += counts.GetValue(static_cast<uint32_t>(order.GetValue(static_cast<uint32_t>(p))));
    cumsum.SetValue(static_cast<uint32_t>(p), total);
  }
  const int64_t q = total / n, r = total % n;
  const int64_t lo = me * q + (me < r ? me : r), hi = (me + 1) * q + (me + 1 < r ? me + 1 : r);
  const Located a = QuaternarySearch(cumsum, D, lo), b = QuaternarySearch(cumsum, D, hi);
  const int64_t last = b.position - (b.offset == 0 ? 1 : 0);
  int64_t num = 0;
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
  return num;
}

}  // namespace ubep_ascend
