// DataCopy and DataCopyPad between GM and UB (docs/ASCEND.md, "The Ascend C API the kernels use"):
// GM->UB on PIPE_MTE2, UB->GM on PIPE_MTE3, UB->UB on PIPE_V (asc_copy_ub2ub: "流水类型 PIPE_V").
// Each copy checks the A2/A3 rules, records its UB and GM bytes with the race checker, then moves
// the data.
// - DataCopy: UB address 32-byte aligned, GM address aligned to sizeof(T), count * sizeof(T) a
//   multiple of 32 (the NPU silently rounds down; the twin aborts). DataCopyParams: blockLen and
//   both gaps in 32-byte blocks.
// - DataCopyPad: UB 32-byte aligned, GM unaligned; blockLen in bytes, a multiple of sizeof(T);
//   GM->UB: srcStride in bytes, dstStride in 32-byte blocks, each block padded to 32 bytes in UB;
//   UB->GM: srcStride in 32-byte blocks, dstStride in bytes, only blockLen bytes reach GM.
// - blockCount or blockLen 0 is a no-op. After SetAtomicAdd<T>, copies to GM add.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "sync.h"

namespace AscendC {

struct DataCopyParams {
  DataCopyParams() {}
  DataCopyParams(const uint16_t count, const uint16_t len, const uint16_t srcStrideIn, const uint16_t dstStrideIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
  uint16_t blockCount = 1;
  uint16_t blockLen = 0;  // 32-byte blocks
  union {
    uint16_t srcGap = 0;
    uint16_t srcStride;
  };
  union {
    uint16_t dstGap = 0;
    uint16_t dstStride;
  };
};

struct DataCopyExtParams {
  DataCopyExtParams() {}
  DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn, const uint32_t dstStrideIn,
                    const uint32_t rsvIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;  // bytes
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
  DataCopyPadExtParams() {}
  DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue, T padValue)
      : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
  bool isPad = false;
  uint8_t leftPadding = 0;   // elements
  uint8_t rightPadding = 0;  // elements
  T paddingValue = 0;
};

namespace twin {

template <typename T>
constexpr bool kDmaType = std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t> || std::is_same_v<T, int16_t> ||
                          std::is_same_v<T, uint16_t> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t> ||
                          std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t> || std::is_same_v<T, float> ||
                          std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> || std::is_same_v<T, double>;

constexpr uint8_t kGarbage = 0xCD;  // what the chip leaves where the docs say "random"

// One burst: `bytes` between UB offset `ub` and GM address `gm`.
struct Block {
  uint64_t ub, gm, bytes;
};

inline uint64_t Round32(uint64_t n) { return (n + 31) / 32 * 32; }

template <typename T>
uint64_t UbStart(const LocalTensor<T>& t, const Op& op) {
  const uint64_t off = t.UbOffset(op);
  if (off % ONE_BLK_SIZE) {
    Fail(Format("%s: the UB address 0x%" PRIx64 " is not 32-byte aligned", Sites::Describe(op.site).c_str(), off));
  }
  return off;
}
// [ub_first, ub_end) must lie inside the LocalTensor (the chip would spill into its neighbours).
template <typename T>
void CheckInside(const LocalTensor<T>& t, uint64_t ub_end, const Op& op) {
  const uint64_t end = t.GetPhyAddr() + uint64_t{t.GetSize()} * sizeof(T);
  if (ub_end > end) {
    Fail(Format("%s: the copy reaches UB 0x%" PRIx64 ", past the end of its LocalTensor (0x%" PRIx64 ", %u elements)",
                Sites::Describe(op.site).c_str(), ub_end, end, t.GetSize()));
  }
}
inline void CheckGmAligned(uint64_t gm, uint64_t size, const Op& op) {
  if (gm == 0) Fail(Format("%s: a GlobalTensor used before SetGlobalBuffer", Sites::Describe(op.site).c_str()));
  if (gm % size) {
    Fail(Format("%s: the GM address 0x%" PRIx64 " is not aligned to the element size %" PRIu64,
                Sites::Describe(op.site).c_str(), gm, size));
  }
}

// Whether a DataCopyParams copy moves anything (blockCount or blockLen 0: a no-op); blockCount is
// checked against its 4095 limit.
inline bool Strided(const DataCopyParams& p, const Op& op) {
  if (p.blockCount == 0 || p.blockLen == 0) return false;
  if (p.blockCount > 4095) {
    Fail(Format("%s: blockCount %u > 4095", Sites::Describe(op.site).c_str(), p.blockCount));
  }
  return true;
}

// GM -> UB (MTE2). `ub_bytes` per block is what the copy writes in UB (data and padding).
inline void CopyIn(Core& c, const Op& op, const std::vector<Block>& blocks, uint64_t ub_bytes) {
  for (const Block& b : blocks) {
    c.Gm(op, b.gm, b.bytes, false);
    c.Ub(op, b.ub, ub_bytes, true);
  }
  std::vector<Seen>& seen = c.pub.Scratch();
  for (const Block& b : blocks) {
    GmRead(c.UbPtr(b.ub), reinterpret_cast<const uint8_t*>(b.gm), static_cast<int64_t>(b.bytes), seen);
  }
  c.pub.CheckRead(op.site, seen);  // the cross-core publication check (xcore.h)
}

// UB -> GM (MTE3), adding if SetAtomicAdd is on.
template <typename T>
void CopyOut(Core& c, Op op, const std::vector<Block>& blocks) {
  if (c.atomic_bytes) {
    if (c.atomic_bytes != sizeof(T) || c.atomic_float == std::is_integral_v<T>) {
      Fail(Format("%s: SetAtomicAdd<%s> is on but the copy moves %s", Sites::Describe(op.site).c_str(),
                  c.atomic_type, TypeName<T>()));
    }
    op.int_atomic = !c.atomic_float;
  }
  for (const Block& b : blocks) {
    c.Ub(op, b.ub, b.bytes, false);
    c.Gm(op, b.gm, b.bytes, true);
  }
  const Stamp st = c.pub.NextWrite(op.site);  // one MTE3 write, whatever its blocks (xcore.h)
  for (const Block& b : blocks) {
    GmWrite(c.pub, st, reinterpret_cast<uint8_t*>(b.gm), c.UbPtr(b.ub), static_cast<int64_t>(b.bytes),
            c.atomic_bytes ? c.atomic_add : nullptr, sizeof(T));
  }
}

}  // namespace twin

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte2, "DataCopy(GM->UB)", loc);
  const uint64_t bytes = uint64_t{count} * sizeof(T), ub = twin::UbStart(dst, op), gm = (uint64_t)src.GetPhyAddr();
  if (bytes % ONE_BLK_SIZE) {
    twin::Fail(twin::Format("%s: %u elements of %zu bytes are not a multiple of 32 bytes (the NPU rounds the copy "
                            "down; use DataCopyPad)", twin::Sites::Describe(op.site).c_str(), count, sizeof(T)));
  }
  twin::CheckGmAligned(gm, sizeof(T), op);
  twin::CheckInside(dst, ub + bytes, op);
  twin::CopyIn(c, op, {{ub, gm, bytes}}, bytes);
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte3, "DataCopy(UB->GM)", loc);
  const uint64_t bytes = uint64_t{count} * sizeof(T), ub = twin::UbStart(src, op), gm = (uint64_t)dst.GetPhyAddr();
  if (bytes % ONE_BLK_SIZE) {
    twin::Fail(twin::Format("%s: %u elements of %zu bytes are not a multiple of 32 bytes (the NPU rounds the copy "
                            "down; use DataCopyPad)", twin::Sites::Describe(op.site).c_str(), count, sizeof(T)));
  }
  twin::CheckGmAligned(gm, sizeof(T), op);
  twin::CheckInside(src, ub + bytes, op);
  twin::CopyOut<T>(c, op, {{ub, gm, bytes}});
}

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kV, "DataCopy(UB->UB)", loc);
  const uint64_t bytes = uint64_t{count} * sizeof(T), d = twin::UbStart(dst, op), s = twin::UbStart(src, op);
  if (bytes % ONE_BLK_SIZE) {
    twin::Fail(twin::Format("%s: %" PRIu64 " bytes are not a multiple of 32", twin::Sites::Describe(op.site).c_str(),
                            bytes));
  }
  twin::CheckInside(dst, d + bytes, op);
  twin::CheckInside(src, s + bytes, op);
  c.Ub(op, s, bytes, false);
  c.Ub(op, d, bytes, true);
  std::memmove(c.UbPtr(d), c.UbPtr(s), bytes);
}

// Strided: blockCount blocks of blockLen 32-byte units, gaps in 32-byte units on both sides.
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte2, "DataCopy(GM->UB, DataCopyParams)", loc);
  if (!twin::Strided(p, op)) return;
  const uint64_t ub = twin::UbStart(dst, op), gm = (uint64_t)src.GetPhyAddr(), len = p.blockLen * 32ull;
  twin::CheckGmAligned(gm, sizeof(T), op);
  std::vector<twin::Block> blocks;
  for (uint64_t b = 0; b < p.blockCount; ++b) {
    blocks.push_back({ub + b * (len + p.dstGap * 32ull), gm + b * (len + p.srcGap * 32ull), len});
  }
  twin::CheckInside(dst, blocks.back().ub + len, op);
  twin::CopyIn(c, op, blocks, len);
}

// UB -> UB, strided (PIPE_V): both sides in 32-byte units; blocks must not overlap each other.
template <typename T>
void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kV, "DataCopy(UB->UB, DataCopyParams)", loc);
  if (!twin::Strided(p, op)) return;
  const uint64_t d = twin::UbStart(dst, op), s = twin::UbStart(src, op), len = p.blockLen * 32ull;
  const uint64_t d_step = len + p.dstGap * 32ull, s_step = len + p.srcGap * 32ull;
  twin::CheckInside(dst, d + (p.blockCount - 1) * d_step + len, op);
  twin::CheckInside(src, s + (p.blockCount - 1) * s_step + len, op);
  for (uint64_t b = 0; b < p.blockCount; ++b) {
    c.Ub(op, s + b * s_step, len, false);
    c.Ub(op, d + b * d_step, len, true);
  }
  const uint64_t d_end = d + (p.blockCount - 1) * d_step + len, s_end = s + (p.blockCount - 1) * s_step + len;
  if (d < s_end && s < d_end) {
    twin::Fail(twin::Format("%s: the source and destination ranges overlap", twin::Sites::Describe(op.site).c_str()));
  }
  for (uint64_t b = 0; b < p.blockCount; ++b) std::memcpy(c.UbPtr(d + b * d_step), c.UbPtr(s + b * s_step), len);
}

template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p,
              twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopy: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte3, "DataCopy(UB->GM, DataCopyParams)", loc);
  if (!twin::Strided(p, op)) return;
  const uint64_t ub = twin::UbStart(src, op), gm = (uint64_t)dst.GetPhyAddr(), len = p.blockLen * 32ull;
  twin::CheckGmAligned(gm, sizeof(T), op);
  std::vector<twin::Block> blocks;
  for (uint64_t b = 0; b < p.blockCount; ++b) {
    blocks.push_back({ub + b * (len + p.srcGap * 32ull), gm + b * (len + p.dstGap * 32ull), len});
  }
  twin::CheckInside(src, blocks.back().ub + len, op);
  twin::CopyOut<T>(c, op, blocks);
}

}  // namespace AscendC

