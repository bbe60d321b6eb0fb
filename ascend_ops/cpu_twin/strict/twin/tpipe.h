// TPipe, TQueBind, TQue and TBuf (docs/ASCEND.md, "Pipes and synchronization on A2/A3"). Buffers
// are carved from the usable UB in 32-byte units. A queue's buffers synchronize exactly as the 2201
// library does, through real flags from the TPipe's event pool (kernel_tquebind_impl.h):
//   AllocTensor: WaitFlag<freeBufEvt> if the buffer was freed     EnQue: SetFlag<enQueEvt>
//   DeQue:       WaitFlag<enQueEvt>                               FreeTensor: SetFlag<freeBufEvt>
// with (enQueEvt, freeBufEvt) = (MTE2_V, V_MTE2) for TQue<VECIN>, (V_MTE3, MTE3_V) for
// TQue<VECOUT>, (MTE2_MTE3, MTE3_MTE2) for TQueBind<VECIN, VECOUT>; nothing involving PIPE_S.
// TBuf::Get synchronizes nothing. The TPipe's destructor waits for the free flags still set and
// then for every pipe (TPipe::Destroy).
#pragma once

#include <cstdint>
#include <vector>

#include "sync.h"

namespace AscendC {

class TPipe;
template <TPosition pos = TPosition::LCM>
class TBuf;

namespace twin {

constexpr bool IsUb(TPosition p) { return p == TPosition::VECIN || p == TPosition::VECOUT || p == TPosition::VECCALC; }

// (A2/A3: GetQueEvt, kernel_event.h:540-645.)
constexpr HardEvent QueEvt(TPosition src, TPosition dst, bool forward) {
  if (src == TPosition::GM && IsUb(dst)) return forward ? HardEvent::MTE2_V : HardEvent::V_MTE2;
  if (IsUb(src) && dst == TPosition::GM) return forward ? HardEvent::V_MTE3 : HardEvent::MTE3_V;
  if (IsUb(src) && IsUb(dst)) return forward ? HardEvent::MTE2_MTE3 : HardEvent::MTE3_MTE2;
  return HardEvent::MAX;
}

// (A2/A3: GetBufferLogicPos, kernel_event.h:478-507.)
constexpr TPosition LogicPos(TPosition pos, bool is_src) {
  return pos == TPosition::VECIN ? (is_src ? TPosition::GM : TPosition::VECIN)
                                 : (is_src ? TPosition::VECOUT : TPosition::GM);
}

enum class BufState : uint8_t { FREE, OCCUPIED, ENQUE, DEQUE };

// A queue buffer's state; it lives in the TPipe, as in the library, so it outlives the queue.
struct QueBuffer {
  uint32_t offset, bytes;
  BufState state = BufState::FREE;
  HardEvent free_evt = HardEvent::MAX;
  int8_t free_id = -1, enque_id = -1;
};

TPipe& CurrentPipe();

}  // namespace twin

class TPipe {
 public:
  TPipe() {
    twin::Core& c = twin::Me();
    if (c.tpipe) {
      twin::Fail("a second TPipe while one is alive: a kernel initializes exactly one TPipe; several hang or behave "
                 "randomly on the chip (TPipe doc)");
    }
    c.tpipe = this;
  }
  ~TPipe() { Destroy(); }
  TPipe(const TPipe&) = delete;
  TPipe& operator=(const TPipe&) = delete;

  // num buffers of len bytes each (len rounded up to 32 B) for a TQue / TQueBind.
  template <class T>
  bool InitBuffer(T& que, uint8_t num, uint32_t len) {
    if (num == 0) twin::Fail("TPipe::InitBuffer: a queue needs at least one buffer");
    const uint32_t bytes = Round(len);
    if (static_cast<int32_t>(bufs_.size()) + num > QBUF_MAX_LEN) {
      twin::Fail(twin::Format("TPipe::InitBuffer: more than %d buffers in one TPipe", QBUF_MAX_LEN));
    }
    que.Bind(this, static_cast<uint32_t>(bufs_.size()), num);
    for (int i = 0; i < num; ++i) bufs_.push_back({Take(bytes, "queue"), bytes});
    return true;
  }
  template <TPosition pos>
  bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    const uint32_t bytes = Round(len);
    buf.Bind(Take(bytes, "TBuf"), bytes);
    return true;
  }

  TEventID FetchEventID(HardEvent evt) { return Free(evt, "FetchEventID"); }
  template <HardEvent evt>
  TEventID FetchEventID() {
    return Free(evt, "FetchEventID");
  }
  template <HardEvent evt>
  TEventID AllocEventID() {
    const TEventID id = Free(evt, "AllocEventID");
    occupy_[static_cast<int>(evt)] |= 1u << id;
    return id;
  }
  template <HardEvent evt>
  void ReleaseEventID(TEventID id) {
    occupy_[static_cast<int>(evt)] &= ~(1u << id);
  }

  void Destroy() {
    if (destroyed_) return;
    destroyed_ = true;
    twin::Core& c = twin::Me();
    const uint32_t site = twin::Sites::Intern("TPipe::Destroy", twin::Loc::current());
    for (twin::QueBuffer& b : bufs_) {
      if (b.state == twin::BufState::FREE && b.free_id >= 0) twin::WaitFlagAt(c, b.free_evt, b.free_id, site);
      b.free_id = -1;
    }
    c.BarrierAll();
    c.tpipe = nullptr;
  }

  // The twin's: the buffers of queues, by index.
  twin::QueBuffer& Buffer(uint32_t i) { return bufs_[i]; }

 private:
  static uint32_t Round(uint32_t len) { return (len + ONE_BLK_SIZE - 1) / ONE_BLK_SIZE * ONE_BLK_SIZE; }
  uint32_t Take(uint32_t bytes, const char* what) {
    if (static_cast<uint64_t>(used_) + bytes > TOTAL_UB_SIZE) {
      twin::Fail(twin::Format("TPipe::InitBuffer: a %s of %u bytes does not fit: %u of the %u usable UB bytes are "
                              "taken (A2/A3: 192 KiB - 256 B - 8 KiB reserved)",
                              what, bytes, used_, TOTAL_UB_SIZE));
    }
    const uint32_t at = used_;
    used_ += bytes;
    return at;
  }
  TEventID Free(HardEvent evt, const char* api) {
    const uint32_t busy = occupy_[static_cast<int>(evt)];
    for (int id = 0; id < QUE_MAX_EVENT; ++id) {
      if (!(busy >> id & 1)) return static_cast<TEventID>(id);
    }
    twin::Fail(twin::Format("TPipe::%s: all %d ids of HardEvent::%s are allocated", api, QUE_MAX_EVENT,
                            twin::Info(evt).name));
  }

  uint32_t used_ = 0;
  bool destroyed_ = false;
  uint32_t occupy_[static_cast<int>(HardEvent::MAX)] = {};
  std::vector<twin::QueBuffer> bufs_;
};

inline TPipe* GetTPipePtr() { return &twin::CurrentPipe(); }

namespace twin {
inline TPipe& CurrentPipe() {
  void* p = Me().tpipe;
  if (!p) Fail("no TPipe is alive on this AIV");
  return *static_cast<TPipe*>(p);
}
}  // namespace twin

}  // namespace AscendC
