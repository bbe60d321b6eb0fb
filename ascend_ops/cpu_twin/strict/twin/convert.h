// Cast's conversions on A2/A3 (Cast.md tables for A2 and A3; precision_conversion.md):
// the (dst, src) pairs and round modes the chip has, and their rounding. The exact source value
// is taken as a long double (64-bit mantissa: exact for every source type) and rounded once.
// - CAST_RINT: nearest, ties to even; FLOOR/CEIL/TRUNC: toward -inf/+inf/0; ROUND: nearest, ties
//   away from zero; ODD: to odd; NONE: exact when it can be, else RINT.
// - Overflow saturates (precision_conversion.md: "saturation by default"). NaN stays NaN in a
//   float type, becomes 0 in an integer one [unverified].
// - float -> float with RINT..TRUNC rounds to an integral value; with CAST_NONE the 2201 build
//   issues no instruction (dst keeps its old bytes), so the twin aborts.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "types.h"

namespace AscendC {
namespace twin {

constexpr uint32_t Mode(RoundMode m) { return 1u << static_cast<int>(m); }
constexpr uint32_t kNone = Mode(RoundMode::CAST_NONE), kOdd = Mode(RoundMode::CAST_ODD);
constexpr uint32_t kRounding = Mode(RoundMode::CAST_RINT) | Mode(RoundMode::CAST_FLOOR) | Mode(RoundMode::CAST_CEIL) |
                               Mode(RoundMode::CAST_ROUND) | Mode(RoundMode::CAST_TRUNC);

// Modes of Cast<D, S> on A2/A3; 0: no such pair. int32 -> half needs SetDeqScale (not modelled).
template <typename D, typename S>
constexpr uint32_t CastModes() {
  auto is = [](auto d, auto s) { return std::is_same_v<D, decltype(d)> && std::is_same_v<S, decltype(s)>; };
  if (is(half{}, int8_t{}) || is(half{}, uint8_t{}) || is(float{}, int16_t{})) return kNone;
  if (is(half{}, int16_t{})) return kRounding | kNone;
  if (is(int8_t{}, half{}) || is(uint8_t{}, half{})) return kRounding | kNone;
  if (is(int16_t{}, half{}) || is(int32_t{}, half{}) || is(int32_t{}, bfloat16_t{})) return kRounding;
  if (is(float{}, half{}) || is(float{}, bfloat16_t{})) return kNone;
  if (is(int16_t{}, int32_t{}) || is(int64_t{}, int32_t{}) || is(int32_t{}, int64_t{})) return kNone;
  if (is(float{}, int32_t{})) return kRounding | kNone;
  if (is(half{}, float{})) return kRounding | kNone | kOdd;
  if (is(int16_t{}, float{}) || is(bfloat16_t{}, float{}) || is(int32_t{}, float{}) || is(float{}, float{}) ||
      is(int64_t{}, float{}) || is(float{}, int64_t{})) {
    return kRounding;
  }
  return 0;
}

template <typename S>
long double Exact(S v) {
  if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16_t>) {
    return static_cast<long double>(static_cast<float>(v));
  } else {
    return static_cast<long double>(v);
  }
}

inline long double RoundToIntegral(long double x, RoundMode m) {
  switch (m) {
    case RoundMode::CAST_FLOOR: return std::floor(x);
    case RoundMode::CAST_CEIL: return std::ceil(x);
    case RoundMode::CAST_TRUNC: return std::trunc(x);
    case RoundMode::CAST_ROUND: return std::round(x);
    case RoundMode::CAST_ODD: {
      const long double t = std::trunc(x);
      return t == x || std::fmod(t, 2.0L) != 0 ? t : t + std::copysign(1.0L, x);
    }
    default: return std::nearbyint(x);  // RINT, NONE: ties to even (the default FP environment)
  }
}

// x rounded to a binary format of p significand bits, minimum normal exponent emin, largest
// finite value max (saturating).
inline long double RoundToFormat(long double x, int p, int emin, long double max, RoundMode m) {
  if (x == 0 || std::isnan(x) || std::isinf(x)) return x;
  const int e = std::max(std::ilogb(x), emin);
  const long double y = std::ldexp(RoundToIntegral(std::ldexp(x, p - 1 - e), m), e - (p - 1));
  return std::fabs(y) > max ? std::copysign(max, y) : y;
}

template <typename D>
D Convert(long double x, RoundMode m) {
  if constexpr (std::is_integral_v<D>) {
    if (std::isnan(x)) return 0;
    const long double r = RoundToIntegral(x, m);
    if (r <= static_cast<long double>(std::numeric_limits<D>::min())) return std::numeric_limits<D>::min();
    if (r >= static_cast<long double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return static_cast<D>(r);
  } else if constexpr (std::is_same_v<D, float>) {
    return static_cast<float>(RoundToFormat(x, 24, -126, FLT_MAX, m));
  } else if constexpr (std::is_same_v<D, half>) {
    return static_cast<half>(static_cast<float>(RoundToFormat(x, 11, -14, 65504.0L, m)));
  } else {
    static_assert(std::is_same_v<D, bfloat16_t>);
    if (std::isnan(x)) return bfloat16_t(static_cast<float>(x));
    const float f = static_cast<float>(RoundToFormat(x, 8, -126, std::ldexp(255.0L, 120), m));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return bfloat16_t::FromBits(static_cast<uint16_t>(u >> 16));  // exact: the low half is zero
  }
}

}  // namespace twin
}  // namespace AscendC
