// DataCopyPad, both directions (DataCopyPad（GMToUB/UBToGM非对齐数据搬运）.md). In UB
// every block takes leftPadding elements, blockLen bytes, rightPadding elements, rounded up to
// 32 bytes ("dummy"). The padding is paddingValue when isPad, else unspecified ("random", the twin
// writes 0xCD bytes); the dummy repeats the block's first element when there is no padding.
#pragma once

#include "data_copy.h"

namespace AscendC {

template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad, twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopyPad: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte2, "DataCopyPad(GM->UB)", loc);
  auto at = [&] { return twin::Sites::Describe(op.site); };
  if (p.blockCount == 0 || p.blockLen == 0) return;
  if (p.blockCount > 4095 || p.blockLen > 2097151) twin::Fail(at() + ": blockCount <= 4095 and blockLen <= 2097151");
  if (p.blockLen % sizeof(T)) {
    twin::Fail(twin::Format("%s: blockLen %u is not a multiple of sizeof(T) = %zu", at().c_str(), p.blockLen,
                            sizeof(T)));
  }
  const uint64_t left = pad.leftPadding * sizeof(T), right = pad.rightPadding * sizeof(T);
  if (left > 32 || right > 32) twin::Fail(at() + ": leftPadding and rightPadding take at most 32 bytes each");
  if constexpr (sizeof(T) == 8) {
    if (pad.isPad && pad.paddingValue != T(0)) twin::Fail(at() + ": paddingValue must be 0 for 64-bit T");
  }
  const uint64_t ub = twin::UbStart(dst, op), gm = (uint64_t)src.GetPhyAddr();
  twin::CheckGmAligned(gm, 1, op);  // GM needs no alignment here
  const uint64_t block = twin::Round32(left + p.blockLen + right), step = block + 32ull * p.dstStride;
  std::vector<twin::Block> blocks;
  for (uint64_t b = 0; b < p.blockCount; ++b) {
    blocks.push_back({ub + b * step, gm + b * (uint64_t{p.blockLen} + p.srcStride), p.blockLen});
  }
  twin::CheckInside(dst, blocks.back().ub + block, op);
  for (const twin::Block& b : blocks) {  // the data lands after the left padding
    c.Gm(op, b.gm, b.bytes, false);
    c.Ub(op, b.ub, block, true);
  }
  std::vector<twin::Seen>& seen = c.pub.Scratch();
  for (const twin::Block& b : blocks) {
    uint8_t* u = c.UbPtr(b.ub);
    twin::GmRead(u + left, reinterpret_cast<const uint8_t*>(b.gm), static_cast<int64_t>(b.bytes), seen);
    const bool plain = left == 0 && right == 0;
    for (uint64_t i = 0; i < block; i += sizeof(T)) {
      if (i >= left && i < left + p.blockLen) continue;
      if (plain) {
        std::memmove(u + i, u, sizeof(T) <= block - i ? sizeof(T) : block - i);  // dummy: the first element
      } else if (pad.isPad) {
        std::memcpy(u + i, &pad.paddingValue, sizeof(T));
      } else {
        std::memset(u + i, twin::kGarbage, sizeof(T));
      }
    }
  }
  c.pub.CheckRead(op.site, seen);  // the cross-core publication check (xcore.h)
}

template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p,
                 twin::Loc loc = twin::Loc::current()) {
  static_assert(twin::kDmaType<T>, "DataCopyPad: not an A2/A3 data type");
  twin::Core& c = twin::Me();
  const twin::Op op = c.Begin(twin::kMte3, "DataCopyPad(UB->GM)", loc);
  auto at = [&] { return twin::Sites::Describe(op.site); };
  if (p.blockCount == 0 || p.blockLen == 0) return;
  if (p.blockCount > 4095 || p.blockLen > 2097151) twin::Fail(at() + ": blockCount <= 4095 and blockLen <= 2097151");
  if (p.blockLen % sizeof(T)) {
    twin::Fail(twin::Format("%s: blockLen %u is not a multiple of sizeof(T) = %zu", at().c_str(), p.blockLen,
                            sizeof(T)));
  }
  const uint64_t ub = twin::UbStart(src, op), gm = (uint64_t)dst.GetPhyAddr();
  twin::CheckGmAligned(gm, 1, op);  // GM needs no alignment here
  const uint64_t step = twin::Round32(p.blockLen) + 32ull * p.srcStride;
  std::vector<twin::Block> blocks;
  for (uint64_t b = 0; b < p.blockCount; ++b) {
    blocks.push_back({ub + b * step, gm + b * (uint64_t{p.blockLen} + p.dstStride), p.blockLen});
  }
  twin::CheckInside(src, blocks.back().ub + p.blockLen, op);
  twin::CopyOut<T>(c, op, blocks);
}

}  // namespace AscendC
