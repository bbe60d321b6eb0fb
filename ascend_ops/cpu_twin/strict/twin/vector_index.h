// The vector operations that index or reduce, on PIPE_V (docs/ASCEND.md, "The Ascend C API the
// kernels use"), count forms, with the A2/A3 data types as static_asserts:
// - CreateVecIndex: dst[i] = firstValue + i.
// - Gather: dst[i] = src[(srcBaseAddr + srcOffset[i]) / sizeof(T)], byte offsets from src's start;
//   each offset aligned to sizeof(T) and inside src (the twin reads no further than its tensor);
//   dst and src must not share memory (Gather.md).
// - ReduceSum: dst[0] = the sum of src[0, count). The count form on A2/A3 sums each 256-byte repeat
//   as a binary tree and the repeats in order (ReduceSum.md, 方式一), which the twin does not
//   reproduce: it accepts only sums whose order cannot matter (integer-valued elements whose
//   magnitudes add up below 2^24 for float, 2^11 for half) and aborts on any other.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vector.h"

namespace AscendC {

template <typename T>
void CreateVecIndex(LocalTensor<T> dst, const T& firstValue, uint32_t count, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "CreateVecIndex: A2/A3 support int16_t, half, int32_t, float");
  const T first = firstValue;
  int64_t i = 0;
  twin::Elementwise("CreateVecIndex", loc, dst, count, [&]() { return twin::Sum(first, static_cast<T>(i++)); });
}

template <typename T>
void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<uint32_t>& srcOffset,
            const uint32_t srcBaseAddr, const uint32_t count, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kOneOf<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float>,
                "Gather: A2/A3 support int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kV, "Gather", loc);
  const uint64_t d = twin::VecOperand(dst, count, op), o = twin::VecOperand(srcOffset, count, op);
  const uint64_t s = twin::VecOperand(src, 0, op), s_bytes = uint64_t{src.GetSize()} * sizeof(T);
  if (d < s + s_bytes && s < d + count * sizeof(T)) {
    twin::Fail(twin::Format("%s: dst and src share UB", twin::Sites::Describe(op.site).c_str()));
  }
  c.Ub(op, o, count * 4ull, false);
  std::vector<T> out(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t at = uint64_t{srcBaseAddr} + twin::Load<uint32_t>(c, o, i);
    if (at % sizeof(T) || at + sizeof(T) > s_bytes) {
      twin::Fail(twin::Format("%s: element %u's offset %" PRIu64 " is not a %zu-byte-aligned element of src (%" PRIu64
                              " bytes)", twin::Sites::Describe(op.site).c_str(), i, at, sizeof(T), s_bytes));
    }
    c.Ub(op, s + at, sizeof(T), false);
    out[i] = twin::Load<T>(c, s + at, 0);
  }
  c.Ub(op, d, count * sizeof(T), true);
  if (count) std::memcpy(c.UbPtr(d), out.data(), count * sizeof(T));
}

template <typename T, bool isSetMask = true>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& sharedTmpBuffer,
               const int32_t count, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kOneOf<T, half, float>, "ReduceSum: A2/A3 support half, float");
  (void)sharedTmpBuffer;  // unused by the A2/A3 count form
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kV, "ReduceSum", loc);
  if (count <= 0) return;  // a NOP on A2/A3
  const uint64_t d = twin::VecOperand(dst, 1, op), s = twin::VecOperand(src, count, op);
  c.Ub(op, s, count * sizeof(T), false);
  const double limit = std::is_same_v<T, float> ? 16777216.0 : 2048.0;
  double sum = 0, magnitude = 0;
  for (int32_t i = 0; i < count; ++i) {
    const double v = static_cast<double>(twin::Load<T>(c, s, i));
    if (v != std::floor(v) || std::isinf(v)) {
      twin::Fail(twin::Format("%s: element %d is %g; the twin sums integer values only, whose order cannot matter",
                              twin::Sites::Describe(op.site).c_str(), i, v));
    }
    sum += v;
    magnitude += std::fabs(v);
  }
  if (magnitude >= limit) {
    twin::Fail(twin::Format("%s: the magnitudes add up to %g, past %g, where the summation order can round",
                            twin::Sites::Describe(op.site).c_str(), magnitude, limit));
  }
  c.Ub(op, d, sizeof(T), true);
  const T r = static_cast<T>(sum);
  std::memcpy(c.UbPtr(d), &r, sizeof(T));
}

}  // namespace AscendC
