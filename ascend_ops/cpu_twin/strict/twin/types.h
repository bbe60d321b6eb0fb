// Language-level names of Ascend C as the A2/A3 (NPU arch 2201) toolchain spells them: keywords,
// GM_ADDR, the builtin enums pipe_t / event_t, and AscendC's TPosition, HardEvent, CacheLine,
// DcciDst, RoundMode, MemDsbT, KernelMetaType (docs/ASCEND.md, "The Ascend C API the kernels
// use"). half and bfloat16_t are host types here.
#pragma once

#include <cstdint>
#include <cstring>

// Address-space keywords. g++ cannot make them distinct types, so they are empty unless a
// checker defines them first: the clang parse of tests/test_ascend_address_spaces.py defines
// __gm__ as address_space(1) and __ubuf__ as address_space(3), and every header here parses in
// that mode (signatures that take GM pointers say __gm__; internals cast explicitly).
#ifndef __aicore__
#define __aicore__
#endif
#ifndef __global__
#define __global__
#endif
#ifndef __gm__
#define __gm__
#endif
#ifndef __ubuf__
#define __ubuf__
#endif
#ifndef __inout_pipe__
#define __inout_pipe__(...)
#endif

// A macro, not a typedef (A2/A3: kernel_utils_macros.h:24): `const GM_ADDR p` is a pointer to const.
#define GM_ADDR __gm__ uint8_t*

// Compiler builtins. The numeric values are the twin's; the headers read do not define them.
enum pipe_t : uint8_t {
  PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_MTE4, PIPE_MTE5, PIPE_V2, PIPE_FIX
};
enum event_t : int32_t {
  EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7
};

// (A2/A3: kernel_utils_macros.h:88-100.) KERNEL_TYPE_AIV_ONLY kernels get no inter-core scheduling.
enum KernelMetaType : uint8_t {
  KERNEL_TYPE_AIV_ONLY,
  KERNEL_TYPE_AIC_ONLY,
  KERNEL_TYPE_MIX_AIV_1_0,
  KERNEL_TYPE_MIX_AIC_1_0,
  KERNEL_TYPE_MIX_AIC_1_1,
  KERNEL_TYPE_MIX_AIC_1_2,
  KERNEL_TYPE_AICORE,
  KERNEL_TYPE_VECTORCORE,
  KERNEL_TYPE_MIX_AICORE,
  KERNEL_TYPE_MIX_VECTOR_CORE,
  KERNEL_TYPE_MAX,
};

using half = _Float16;

// bf16 by its bit pattern; from float it rounds to nearest even, as Cast(CAST_RINT) does.
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float v) : bits(FromFloat(v)) {}  // NOLINT: implicit, as the toolchain's type
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static bfloat16_t FromBits(uint16_t b) {
    bfloat16_t r;
    r.bits = b;
    return r;
  }

 private:
  static uint16_t FromFloat(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu)) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

namespace AscendC {

using TEventID = int8_t;

// (A2/A3: asc-tools kernel_event.h:27-47.) VECIN, VECOUT and VECCALC all live in UB.
enum class TPosition : uint8_t {
  GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM = SPM, TSCM,
  C2PIPE2GM, C2PIPE2LOCAL, MAX,
};
using QuePosition = TPosition;

// <src>_<dst>: dst waits for src (A2/A3: kernel_event.h:38-80).
enum class HardEvent : uint8_t {
  MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V, MTE3_MTE1, MTE1_MTE3,
  MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2, MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S,
  MTE2_FIX, FIX_MTE2, FIX_S, M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX,
};

enum class CacheLine : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
// CACHELINE_ATOMIC is "not yet supported" on A2/A3 (DataCacheCleanAndInvalid doc).
enum class DcciDst : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
enum class MemDsbT : uint8_t { ALL = 0, DDR, UB, SEQ };
// CAST_HYBRID/EVEN/ZERO exist only on other archs (A2/A3: kernel_utils_mode.h:94-106).
enum class RoundMode : uint8_t { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };

// A2/A3 AIV: 192 KiB UB less 256 B (ASC_UB_SIZE) less the 8 KiB the toolchain reserves unless
// built with --cce-disable-asc-reserved-ubuf (asc-devkit include/utils/base/sys_constants.h; the
// 2201 architecture spec, 编程指南/高级编程/硬件实现/架构规格/NPU架构版本2201.md).
constexpr uint32_t TOTAL_UB_SIZE = 192 * 1024 - 256 - 8192;
constexpr uint32_t ONE_BLK_SIZE = 32;
constexpr int32_t QUE_MAX_EVENT = 8;       // event ids per HardEvent (A2/A3: kernel_macros.h:102)
constexpr int32_t QBUF_MAX_LEN = 64;       // buffers one TPipe manages
constexpr int32_t DEFAULT_BLK_NUM = 8;     // int32 per core in SyncAll's soft workspace

namespace twin {

// The AIV's four pipes, as indices of the race checker's clocks.
enum Pipe : int { kS = 0, kV = 1, kMte2 = 2, kMte3 = 3, kPipes = 4, kNoPipe = -1 };

constexpr Pipe PipeOf(pipe_t p) {
  return p == PIPE_S ? kS : p == PIPE_V ? kV : p == PIPE_MTE2 ? kMte2 : p == PIPE_MTE3 ? kMte3 : kNoPipe;
}
inline const char* PipeName(int p) {
  static const char* const names[] = {"PIPE_S", "PIPE_V", "PIPE_MTE2", "PIPE_MTE3"};
  return p >= 0 && p < kPipes ? names[p] : "PIPE_?";
}

struct EventInfo {
  const char* name;
  Pipe src, dst;  // kNoPipe for events an AIV does not have
};

constexpr EventInfo Info(HardEvent e) {
  switch (e) {
    case HardEvent::MTE2_V: return {"MTE2_V", kMte2, kV};
    case HardEvent::V_MTE2: return {"V_MTE2", kV, kMte2};
    case HardEvent::MTE3_V: return {"MTE3_V", kMte3, kV};
    case HardEvent::V_MTE3: return {"V_MTE3", kV, kMte3};
    case HardEvent::V_V: return {"V_V", kV, kV};
    case HardEvent::MTE3_MTE2: return {"MTE3_MTE2", kMte3, kMte2};
    case HardEvent::MTE2_MTE3: return {"MTE2_MTE3", kMte2, kMte3};
    case HardEvent::S_V: return {"S_V", kS, kV};
    case HardEvent::V_S: return {"V_S", kV, kS};
    case HardEvent::S_MTE2: return {"S_MTE2", kS, kMte2};
    case HardEvent::MTE2_S: return {"MTE2_S", kMte2, kS};
    case HardEvent::S_MTE3: return {"S_MTE3", kS, kMte3};
    case HardEvent::MTE3_S: return {"MTE3_S", kMte3, kS};
    default: return {"(not an AIV event)", kNoPipe, kNoPipe};
  }
}
// The AIV subset HardEventAiv (A2/A3: kernel_event.h:111-127); others are filtered out on an AIV.
constexpr bool IsAivEvent(HardEvent e) { return Info(e).src != kNoPipe; }

}  // namespace twin
}  // namespace AscendC
