// The vector operations the kernels use, on PIPE_V (docs/ASCEND.md, "The Ascend C API the kernels
// use"), count forms, with the A2/A3 data types as static_asserts. Operands start 32-byte aligned
// in UB; a source may be the destination itself (100 % overlap) but not overlap it partly
// (通用说明和约束.md). Each result rounds once (no fused multiply-add; build with -ffp-contract=off);
// integer arithmetic wraps [unverified].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "convert.h"
#include "sync.h"

namespace AscendC {
namespace twin {

template <typename T, typename... A>
constexpr bool kOneOf = (std::is_same_v<T, A> || ...);

// A vector operand: its UB bytes, checked aligned and inside its tensor.
template <typename T>
uint64_t VecOperand(const LocalTensor<T>& t, int64_t count, const Op& op) {
  const uint64_t off = t.UbOffset(op);
  if (off % ONE_BLK_SIZE) {
    Fail(Format("%s: operand at UB 0x%" PRIx64 " is not 32-byte aligned", Sites::Describe(op.site).c_str(), off));
  }
  if (count < 0 || static_cast<uint64_t>(count) > t.GetSize()) {
    Fail(Format("%s: count %" PRId64 " for an operand of %u elements", Sites::Describe(op.site).c_str(), count,
                t.GetSize()));
  }
  return off;
}

inline void CheckOverlap(uint64_t d, uint64_t dn, uint64_t s, uint64_t sn, const Op& op) {
  const bool disjoint = d + dn <= s || s + sn <= d, same = d == s && dn == sn;
  if (!disjoint && !same) {
    Fail(Format("%s: destination UB [0x%" PRIx64 ", 0x%" PRIx64 ") partly overlaps source [0x%" PRIx64 ", 0x%" PRIx64
                "); only 100%% overlap is allowed",
                Sites::Describe(op.site).c_str(), d, d + dn, s, s + sn));
  }
}

template <typename T>
T Load(Core& c, uint64_t off, int64_t i) {
  T v;
  std::memcpy(&v, c.UbPtr(off) + i * sizeof(T), sizeof(T));
  return v;
}

// Element-wise dst[i] = f(src_k[i]...) over UB, reading all sources before writing.
template <typename D, typename F, typename... S, size_t... I>
void ElementwiseImpl(const char* api, const Loc& loc, const LocalTensor<D>& dst, int64_t count, F f,
                     std::index_sequence<I...>, const LocalTensor<S>&... src) {
  Core& c = Me();
  const Op op = c.Begin(kV, api, loc);
  const uint64_t d = VecOperand(dst, count, op), dn = count * sizeof(D);
  const uint64_t s[] = {VecOperand(src, count, op)..., 0};
  const uint64_t sn[] = {count * sizeof(S)..., 0};
  for (size_t k = 0; k < sizeof...(S); ++k) {
    CheckOverlap(d, dn, s[k], sn[k], op);
    c.Ub(op, s[k], sn[k], false);
  }
  c.Ub(op, d, dn, true);
  std::vector<D> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = f(Load<S>(c, s[I], i)...);
  if (count) std::memcpy(c.UbPtr(d), out.data(), dn);
}
template <typename D, typename F, typename... S>
void Elementwise(const char* api, const Loc& loc, const LocalTensor<D>& dst, int64_t count, F f,
                 const LocalTensor<S>&... src) {
  ElementwiseImpl(api, loc, dst, count, f, std::index_sequence_for<S...>{}, src...);
}

template <typename T>
T Wrap(int64_t v) {
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(v));
}
template <typename T>
T Mul(T a, T b) {
  if constexpr (std::is_same_v<T, half>) return static_cast<half>(static_cast<double>(a) * static_cast<double>(b));
  else if constexpr (std::is_integral_v<T>) return Wrap<T>(static_cast<int64_t>(a) * b);
  else return a * b;
}
template <typename T>
T Sum(T a, T b) {
  if constexpr (std::is_same_v<T, half>) return static_cast<half>(static_cast<double>(a) + static_cast<double>(b));
  else if constexpr (std::is_integral_v<T>) return Wrap<T>(static_cast<int64_t>(a) + b);
  else return a + b;
}
template <typename T>
T Diff(T a, T b) {
  if constexpr (std::is_same_v<T, half>) return static_cast<half>(static_cast<double>(a) - static_cast<double>(b));
  else if constexpr (std::is_integral_v<T>) return Wrap<T>(static_cast<int64_t>(a) - b);
  else return a - b;
}
// The smaller of a and b; a NaN operand gives NaN [unverified].
template <typename T>
T Min(T a, T b) {
  if constexpr (std::is_integral_v<T>) return a < b ? a : b;
  else {
    const double x = static_cast<double>(a), y = static_cast<double>(b);
    return x != x ? a : y != y ? b : x < y ? a : b;
  }
}

template <typename T>
constexpr bool kArith = kOneOf<T, int16_t, half, int32_t, float>;  // Add, Sub, Mul, Adds, Muls, Mins on A2/A3

}  // namespace twin

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count,
               twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kOneOf<T, half, bfloat16_t, int16_t, uint16_t, int32_t, uint32_t, float>,
                "Duplicate: A2/A3 support half, bfloat16_t, int16_t, uint16_t, int32_t, uint32_t, float (no 8- or "
                "64-bit types)");
  const T v = scalarValue;
  twin::Elementwise("Duplicate", loc, dst, count, [&]() { return v; });
}

template <typename T, bool isSetMask = true>
void Muls(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count,
          twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Muls: A2/A3 support int16_t, half, int32_t, float");
  const T s = scalarValue;
  twin::Elementwise("Muls", loc, dst, count, [&](T a) { return twin::Mul(a, s); }, src);
}

template <typename T, bool isSetMask = true>
void Adds(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count,
          twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Adds: A2/A3 support int16_t, half, int32_t, float");
  const T s = scalarValue;
  twin::Elementwise("Adds", loc, dst, count, [&](T a) { return twin::Sum(a, s); }, src);
}

template <typename T, bool isSetMask = true>
void Mins(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue, const int32_t& count,
          twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Mins: A2/A3 support int16_t, half, int32_t, float");
  const T s = scalarValue;
  twin::Elementwise("Mins", loc, dst, count, [&](T a) { return twin::Min(a, s); }, src);
}

template <typename T>
void Abs(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count,
         twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kOneOf<T, half, float>, "Abs: A2/A3 support half, float");
  twin::Elementwise("Abs", loc, dst, count, [](T a) {
    if constexpr (std::is_same_v<T, float>) return std::fabs(a);
    else return static_cast<half>(std::fabs(static_cast<float>(a)));
  }, src);
}

template <typename T>
void Add(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count,
         twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Add: A2/A3 support int16_t, half, int32_t, float");
  twin::Elementwise("Add", loc, dst, count, [](T a, T b) { return twin::Sum(a, b); }, src0, src1);
}

template <typename T>
void Sub(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count,
         twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Sub: A2/A3 support int16_t, half, int32_t, float");
  twin::Elementwise("Sub", loc, dst, count, [](T a, T b) { return twin::Diff(a, b); }, src0, src1);
}

template <typename T>
void Mul(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, const int32_t& count,
         twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kArith<T>, "Mul: A2/A3 support int16_t, half, int32_t, float");
  twin::Elementwise("Mul", loc, dst, count, [](T a, T b) { return twin::Mul(a, b); }, src0, src1);
}

template <typename T, typename U>
void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& roundMode, const uint32_t count,
          twin::Loc loc = twin::Loc::current()) {
  constexpr uint32_t modes = twin::CastModes<T, U>();
  static_assert(modes != 0, "Cast: not a (dst, src) pair of A2/A3");
  const RoundMode m = roundMode;
  if (std::is_same_v<T, float> && std::is_same_v<U, float> && m == RoundMode::CAST_NONE) {
    twin::Fail(twin::Format("Cast<float, float> with CAST_NONE (%s) is not supported on A2/A3: the release build "
                            "issues no instruction and dst keeps its old contents; use the float buffer directly",
                            twin::Where(loc).c_str()));
  }
  if (!(modes & twin::Mode(m))) {
    twin::Fail(twin::Format("Cast (%s): round mode %d is not supported for this pair on A2/A3",
                            twin::Where(loc).c_str(), static_cast<int>(m)));
  }
  twin::Elementwise("Cast", loc, dst, count, [&](U v) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<U, float>) {
      return static_cast<float>(twin::RoundToIntegral(v, m));  // float -> float rounds to an integral value
    } else {
      return twin::Convert<T>(twin::Exact(v), m);
    }
  }, src);
}

}  // namespace AscendC
