// Ordering inside one AIV. Its pipes (S: the scalar unit and LocalTensor GetValue/SetValue; V:
// vector ops; MTE2: GM -> UB copies; MTE3: UB -> GM copies) run asynchronously: an operation may
// still read or write its UB or GM bytes when a later operation of another pipe starts, and one of
// the same pipe may start before the earlier one finished (docs/ASCEND.md, "Pipes and
// synchronization on A2/A3"). So every UB buffer that passes from one pipe to another is handed
// over with a flag, Sync<SRC_DST>(): SetFlag runs on SRC once SRC's earlier operations completed,
// WaitFlag holds DST until then. Dependent operations of one pipe are separated by
// PipeBarrier<pipe>.
//
// Sync is the MC2 kernels' SyncFunc: set and wait at once. Each event uses one fixed id (ids 0-5
// are the user's on A2/A3); no flag stays set across calls and the kernels own no TQue, so no
// library code holds ids.
#pragma once

#include "kernel_operator.h"

namespace ubep_ascend {

using AscendC::HardEvent;

constexpr int32_t SYNC_EVENT_ID = 0;

template <HardEvent E>
__aicore__ inline void Sync() {
  AscendC::SetFlag<E>(SYNC_EVENT_ID);
  AscendC::WaitFlag<E>(SYNC_EVENT_ID);
}

// Unaligned copies of `bytes` between GM and UB (one block; MTE3 writes exactly `bytes` to GM, so
// AIVs may write neighbouring bytes of one output; MTE2 pads the UB block to 32 bytes with
// undefined bytes).
template <typename T>
__aicore__ inline void CopyIn(const AscendC::LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src, int64_t bytes) {
  AscendC::DataCopyPad(dst, src, AscendC::DataCopyExtParams{1, static_cast<uint32_t>(bytes), 0, 0, 0},
                       AscendC::DataCopyPadExtParams<T>{});
}
template <typename T>
__aicore__ inline void CopyOut(const AscendC::GlobalTensor<T>& dst, const AscendC::LocalTensor<T>& src, int64_t bytes) {
  AscendC::DataCopyPad(dst, src, AscendC::DataCopyExtParams{1, static_cast<uint32_t>(bytes), 0, 0, 0});
}

// A GM tensor over `bytes` bytes at `p`.
template <typename T>
__aicore__ inline AscendC::GlobalTensor<T> Gm(__gm__ uint8_t* p, int64_t bytes) {
  AscendC::GlobalTensor<T> g;
  g.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(p), static_cast<uint64_t>(bytes) / sizeof(T));
  return g;
}

__aicore__ constexpr inline int64_t RoundUp32(int64_t n) { return (n + 31) / 32 * 32; }

}  // namespace ubep_ascend
